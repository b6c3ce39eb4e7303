"""Classifying job-failure log lines: which failure signature a line shows, and what it suggests.

A :class:`PatternLibrary` is data (YAML, see ``fleetmedic/data/log_patterns.yaml`` for the format
and the shipped defaults): named regular expressions, each with the incident class it suggests, a
priority, a ``signal`` name that policy rules can match, and ``symptom`` for lines that follow from
a failure elsewhere (a collective timing out because a peer died). NVIDIA driver XID lines are
classified through fleetmedic's XID catalog (:mod:`fleetmedic.models.xid_catalog`, the same action
classes the detectors use), and so are lines in which the driver reports an XID in its own words
(a pattern's ``xid``: a GSP timeout banner, a GPU fallen off the bus without its Xid line). The
library also extracts the rank and host a line names, so triage can map a line to a node through
the job's placement.

Kernel and driver lines (the node-local kernel-log exporter, :mod:`fleetmedic.connectors.kernel.kmsg_map`)
use three more keys of a pattern: ``device`` (what the line is about: gpu, nvswitch, pcie, nic,
cpu, memory), ``severity`` (info, warning, critical) and the regular expression's named groups
(``pci`` for the device's PCI address, ``code``, ``port``...), returned in :attr:`LineMatch.groups`.

Pure: the library is built from text; :func:`default_library` reads package data once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any, Final, cast, get_args

import yaml

from fleetmedic.models.xid_catalog import XidCatalog, default_catalog
from fleetmedic.records import IncidentClass

CLASSES: Final = frozenset(get_args(IncidentClass))
MAX_LINE: Final = 4096
#: what a kernel or driver line is about (a pattern's ``device``)
DEVICES: Final = frozenset({"gpu", "nvswitch", "pcie", "nic", "cpu", "memory"})
SEVERITIES: Final = ("info", "warning", "critical")


class PatternError(ValueError):
    """A pattern library that cannot be used; the message names the entry and the reason."""


@dataclass(frozen=True)
class Pattern:
    name: str
    incident_class: IncidentClass
    regex: re.Pattern[str]
    priority: int
    signal: str
    symptom: bool = False
    examples: tuple[str, ...] = ()
    device: str = ""
    severity: str = ""
    xid: int | None = None  # the XID the line reports in the driver's own words


@dataclass(frozen=True)
class LineMatch:
    """The verdict on one line. ``pattern`` is ``None`` when nothing matched (class ``unknown``)."""

    line: str
    pattern: str | None
    incident_class: IncidentClass
    signal: str = ""
    symptom: bool = False
    priority: int = 0
    rank: int | None = None
    host: str = ""
    xid: int | None = None  # an XID line's code, or the XID a line reports in the driver's own words
    hint: str = ""  # remediation hint for hardware XIDs: reset_gpu | reboot_node
    device: str = ""  # gpu | nvswitch | pcie | nic | cpu | memory, for kernel and driver lines
    severity: str = ""  # info | warning | critical
    groups: tuple[tuple[str, str], ...] = ()  # the pattern's named groups that matched (pci, code...)

    @property
    def distinctive(self) -> bool:
        """A matched line that is a cause, not a symptom of a failure elsewhere."""
        return self.pattern is not None and not self.symptom

    def group(self, name: str) -> str:
        """A named group of the pattern that matched (``""`` when absent)."""
        return next((v for k, v in self.groups if k == name), "")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"class": self.incident_class, "pattern": self.pattern, "line": self.line}
        for key in ("signal", "symptom", "priority", "rank", "host", "xid", "hint", "device", "severity"):
            value = getattr(self, key)
            if value not in (None, "", False, 0) or key in ("symptom", "priority"):
                out[key] = value
        if self.groups:
            out["groups"] = dict(self.groups)
        return out


@dataclass(frozen=True)
class XidRule:
    """XID lines: the class of each code comes from the catalog (plus overrides)."""

    regex: re.Pattern[str]
    priorities: Mapping[str, int]
    symptom_priority: int
    catalog: XidCatalog
    overrides: Mapping[int, IncidentClass] = field(default_factory=dict)
    examples: tuple[str, ...] = ()

    def verdict(self, xid: int) -> tuple[IncidentClass, bool, str, int]:
        """(class, symptom, hint, priority) of an XID code."""
        klass, symptom, hint = _ACTION_CLASSES[self.catalog.lookup(xid).action]
        if xid in self.overrides:
            klass, symptom, hint = self.overrides[xid], False, hint if self.overrides[xid] == "hardware" else ""
        return klass, symptom, hint, self.symptom_priority if symptom else self.priorities.get(klass, 100)

    def severity(self, xid: int) -> str:
        """As the GPU detector rates an XID: critical when its action isolates, warning when it is to
        be investigated, info otherwise."""
        info = self.catalog.lookup(xid)
        if xid in self.overrides:
            return "critical" if self.overrides[xid] == "hardware" else "info"
        return "critical" if info.isolates else "warning" if info.action == "investigate" else "info"


class PatternLibrary:
    """An ordered set of patterns; :meth:`classify` returns the strongest match of a line."""

    def __init__(
        self,
        patterns: Iterable[Pattern],
        xid: XidRule | None = None,
        rank_patterns: Iterable[re.Pattern[str]] = (),
        host_patterns: Iterable[re.Pattern[str]] = (),
    ) -> None:
        # stable sort: equal priorities keep file order
        self.patterns: tuple[Pattern, ...] = tuple(sorted(patterns, key=lambda p: -p.priority))
        self.xid = xid
        self.rank_patterns = tuple(rank_patterns)
        self.host_patterns = tuple(host_patterns)

    # --- building ---------------------------------------------------------------------------------

    @classmethod
    def from_yaml(cls, text: str, source: str = "patterns", xid_catalog: XidCatalog | None = None) -> PatternLibrary:
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise PatternError(f"{source}: not valid YAML: {exc}") from None
        if not isinstance(doc, dict):
            raise PatternError(f"{source}: the document must be a mapping")
        unknown = set(doc) - {"version", "patterns", "xid", "rank_patterns", "host_patterns"}
        if unknown:
            raise PatternError(f"{source}: unknown key(s): {', '.join(sorted(unknown))}")
        raw = doc.get("patterns") or []
        if not isinstance(raw, list):
            raise PatternError(f"{source}: patterns: must be a list")
        patterns = [_pattern(entry, f"{source}: patterns[{i}]") for i, entry in enumerate(raw)]
        names = [p.name for p in patterns]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise PatternError(f"{source}: pattern names must be unique, repeated: {', '.join(dupes)}")
        xid = None
        if doc.get("xid") is not None:
            xid = _xid_rule(doc["xid"], f"{source}: xid", xid_catalog or default_catalog())
        ranks = [_regex(r, f"{source}: rank_patterns[{i}]", "rank") for i, r in enumerate(_list(doc, "rank_patterns"))]
        hosts = [_regex(r, f"{source}: host_patterns[{i}]", "host") for i, r in enumerate(_list(doc, "host_patterns"))]
        return cls(patterns, xid, ranks, hosts)

    # --- classifying ------------------------------------------------------------------------------

    def classify(self, line: str) -> LineMatch:
        line = line.rstrip("\r\n")[:MAX_LINE]
        rank = self._rank(line)
        host = self._host(line)
        best: LineMatch | None = None
        if self.xid is not None:
            m = self.xid.regex.search(line)
            if m:
                code = int(m.group("xid"))
                klass, symptom, hint, priority = self.xid.verdict(code)
                best = LineMatch(line, f"xid_{code}", klass, f"xid:{code}", symptom, priority, rank, host, code, hint,
                                 "gpu", self.xid.severity(code), _groups(m, "xid"))
        for p in self.patterns:
            if best is not None and p.priority <= best.priority:
                break
            m = p.regex.search(line)
            if m:
                best = self._match(p, m, line, rank, host)
                break
        return best or LineMatch(line, None, "unknown", rank=rank, host=host)

    def _match(self, p: Pattern, m: re.Match[str], line: str, rank: int | None, host: str) -> LineMatch:
        klass, hint, severity = p.incident_class, "", p.severity
        if p.xid is not None and self.xid is not None:  # the driver's own words for an XID: as that XID
            klass, _, hint, _ = self.xid.verdict(p.xid)
            severity = severity or self.xid.severity(p.xid)
        if not severity:
            severity = "info" if p.symptom else _CLASS_SEVERITY.get(klass, "info")
        return LineMatch(line, p.name, klass, p.signal, p.symptom, p.priority, rank, host, p.xid, hint, p.device,
                         severity, _groups(m))

    def classify_all(self, lines: Iterable[str]) -> list[LineMatch]:
        return [self.classify(line) for line in lines]

    @staticmethod
    def strongest(matches: Iterable[LineMatch]) -> LineMatch | None:
        """The failure's signature: the highest-priority distinctive line, else the strongest symptom."""
        best: LineMatch | None = None
        for m in matches:
            if m.pattern is None:
                continue
            key = (m.distinctive, m.priority)
            if best is None or key > (best.distinctive, best.priority):
                best = m
        return best

    def self_check(self) -> list[str]:
        """Problems with the library's own examples: each must classify as the pattern it illustrates."""
        problems = []
        for p in self.patterns:
            for ex in p.examples:
                got = self.classify(ex).pattern
                if got != p.name:
                    problems.append(f"pattern `{p.name}`: example classified as `{got}`: {ex}")
        if self.xid is not None:
            for ex in self.xid.examples:
                if self.classify(ex).xid is None:
                    problems.append(f"xid: example not recognised as an XID line: {ex}")
        return problems

    def _rank(self, line: str) -> int | None:
        for r in self.rank_patterns:
            m = r.search(line)
            if m:
                return int(m.group("rank"))
        return None

    def _host(self, line: str) -> str:
        for r in self.host_patterns:
            m = r.search(line)
            if m:
                return m.group("host")
        return ""


@lru_cache(maxsize=1)
def default_library() -> PatternLibrary:
    """The shipped library (``fleetmedic/data/log_patterns.yaml``)."""
    text = resources.files("fleetmedic").joinpath("data/log_patterns.yaml").read_text(encoding="utf-8")
    return PatternLibrary.from_yaml(text, "fleetmedic/data/log_patterns.yaml")


def load_library(path: str) -> PatternLibrary:
    """A library from a file (``""``: the shipped defaults). Raises :class:`PatternError`."""
    if not path:
        return default_library()
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise PatternError(f"{path}: cannot read: {exc.strerror}") from None
    return PatternLibrary.from_yaml(text, path)


# --- parsing helpers ------------------------------------------------------------------------------

_PATTERN_KEYS: Final = frozenset({"name", "class", "regex", "priority", "signal", "symptom", "examples", "device",
                                   "severity", "xid"})
_CLASS_SEVERITY: Final[dict[str, str]] = {"hardware": "critical", "network": "warning", "degradation": "warning"}


def _groups(m: re.Match[str], *skip: str) -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k, v in m.groupdict().items() if v is not None and k not in skip)


def _pattern(entry: Any, where: str) -> Pattern:
    if not isinstance(entry, dict):
        raise PatternError(f"{where}: must be a mapping")
    unknown = set(entry) - _PATTERN_KEYS
    if unknown:
        raise PatternError(f"{where}: unknown key(s): {', '.join(sorted(unknown))}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise PatternError(f"{where}.name: required, a non-empty string")
    where = f"{where} ({name})"
    klass = entry.get("class")
    if klass not in CLASSES:
        raise PatternError(f"{where}.class: must be one of {', '.join(sorted(CLASSES))}, got {klass!r}")
    priority = entry.get("priority", 100)
    if not isinstance(priority, int) or not 0 <= priority <= 1000:
        raise PatternError(f"{where}.priority: must be an integer in 0..1000")
    examples = entry.get("examples") or []
    if not isinstance(examples, list) or not all(isinstance(e, str) for e in examples):
        raise PatternError(f"{where}.examples: must be a list of strings")
    device = entry.get("device", "")
    if device and device not in DEVICES:
        raise PatternError(f"{where}.device: must be one of {', '.join(sorted(DEVICES))}, got {device!r}")
    severity = entry.get("severity", "")
    if severity and severity not in SEVERITIES:
        raise PatternError(f"{where}.severity: must be one of {', '.join(SEVERITIES)}, got {severity!r}")
    xid = entry.get("xid")
    if xid is not None and (not isinstance(xid, int) or isinstance(xid, bool) or not 0 <= xid <= 100_000):
        raise PatternError(f"{where}.xid: must be an XID code (an integer in 0..100000)")
    return Pattern(
        name=name,
        incident_class=cast(IncidentClass, klass),
        regex=_regex(entry.get("regex"), f"{where}.regex"),
        priority=priority,
        signal=str(entry.get("signal") or name),
        symptom=bool(entry.get("symptom", False)),
        examples=tuple(examples),
        device=str(device),
        severity=str(severity),
        xid=xid,
    )


def _list(doc: dict[str, Any], key: str) -> list[Any]:
    value = doc.get(key) or []
    if not isinstance(value, list):
        raise PatternError(f"{key}: must be a list")
    return value


def _regex(text: Any, where: str, group: str | None = None) -> re.Pattern[str]:
    if not isinstance(text, str) or not text:
        raise PatternError(f"{where}: required, a regular expression")
    try:
        rx = re.compile(text)
    except re.error as exc:
        raise PatternError(f"{where}: invalid regular expression: {exc}") from None
    if group and group not in rx.groupindex:
        raise PatternError(f"{where}: needs a named group `(?P<{group}>...)`")
    return rx


def _xid_rule(entry: Any, where: str, catalog: XidCatalog) -> XidRule:
    if not isinstance(entry, dict):
        raise PatternError(f"{where}: must be a mapping")
    unknown = set(entry) - {"regex", "priority", "symptom_priority", "overrides", "examples"}
    if unknown:
        raise PatternError(f"{where}: unknown key(s): {', '.join(sorted(unknown))}")
    rx = _regex(entry.get("regex"), f"{where}.regex", "xid")
    raw = entry.get("priority", 500)
    priorities: dict[str, Any] = raw if isinstance(raw, dict) else dict.fromkeys(CLASSES, raw)
    symptom_priority = entry.get("symptom_priority", 20)
    for key, value in [*priorities.items(), ("symptom_priority", symptom_priority)]:
        if not isinstance(value, int) or not 0 <= value <= 1000:
            raise PatternError(f"{where}.priority.{key}: must be an integer in 0..1000")
        if key not in CLASSES and key != "symptom_priority":
            raise PatternError(f"{where}.priority.{key}: not an incident class")
    overrides: dict[int, IncidentClass] = {}
    for code, klass in (entry.get("overrides") or {}).items():
        if klass not in CLASSES or not str(code).isdigit():
            raise PatternError(f"{where}.overrides.{code}: must map an XID to one of {', '.join(sorted(CLASSES))}")
        overrides[int(code)] = cast(IncidentClass, klass)
    examples = tuple(entry.get("examples") or [])
    return XidRule(rx, priorities, symptom_priority, catalog, overrides, examples)


_ACTION_CLASSES: Final[dict[str, tuple[IncidentClass, bool, str]]] = {
    "ignore": ("transient_software", True, ""),
    "restart_app": ("transient_software", False, ""),
    "reset_gpu": ("hardware", False, "reset_gpu"),
    "reboot_node": ("hardware", False, "reboot_node"),
    "isolate": ("hardware", False, ""),
    "investigate": ("unknown", False, ""),
}
