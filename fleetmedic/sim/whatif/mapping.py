"""Mappings: a history's fault category -> what the cluster and each policy would see of it.

A mapping is YAML (shipped: ``stepfun`` and ``llama3``; ``--mapping FILE`` for your own)::

    name: stepfun
    categories:
      "GPU: GPU DBE(Double Bit ECC) > Threshold":
        evidence: xid:48          # what fleetmedic's detectors see (EVIDENCE below)
        effect: crash             # crash | slow | none: what it does to a job on the node
        diagnostics_confirm: true # whether dcgmi diag fails on it
        reason: the driver reports an uncorrectable ECC error as XID 48
      "Fan: Speed Critical (Sensor)":
        evidence: thermal_slowdown
        effect: slow
        slowdown: 0.3             # share of a lock-step job's step rate lost while it runs there
        then: node_condition:Ready=False   # a degradation left in service turns into this hard fault
        then_after_s: 86400
        reason: ...

Keys are matched exactly, then case-insensitively; ``"*"`` is the fallback (absent: the category
is reported as unmapped, with its count, and its faults are left out of the replay). Every entry
must carry a ``reason``: the mapping is an assumption that the report prints.

:data:`EVIDENCE` is the vocabulary of evidence with, for each, the detection delay fleetmedic's
detectors were measured to need (docs/quality.md, ``bench/quality.py``: onset to first finding,
p50 per fault kind), whether it reaches the kernel log (what node-problem-detector reads), and
whether it is a hard fault a person on call notices from the job's failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final, Literal

import yaml

Effect = Literal["crash", "slow", "none"]


@dataclass(frozen=True)
class EvidenceKind:
    """One kind of evidence: ``delay_s`` from onset to fleetmedic's first finding (measured),
    ``kernel_log``: the kernel log shows it (node-problem-detector's input), ``hard``: definitive
    or uncertain hard evidence (as opposed to a degradation that needs confirming), ``visible``:
    a person looking at the node (nvidia-smi, dmesg, ibstat, the BMC) sees it."""

    delay_s: float
    kernel_log: bool
    hard: bool
    visible: bool = True
    source: str = ""


#: name -> kind; ``xid:<code>`` is any XID (kernel-log line through the real classifier),
#: ``node_condition:<Type>[=<Status>]`` any Kubernetes node condition (the real condition rules).
EVIDENCE: Final[dict[str, EvidenceKind]] = {
    "xid": EvidenceKind(4.3, True, True, source="xid79/xid48/xid64/xid95/xid119: 3.3-5.8 s"),
    "ib_link_down": EvidenceKind(10.4, False, True, source="nic_down: 10.4 s"),
    "nic_speed_low": EvidenceKind(17.2, False, False, source="nic_speed_low: 17.2 s"),
    "pcie_width_low": EvidenceKind(4.8, False, False, source="pcie_degradation: 4.8 s"),
    "thermal_slowdown": EvidenceKind(34.7, False, False, source="straggler (thermal): 34.7 s"),
    "power_brake": EvidenceKind(3.1, False, True, source="psu_failure: 3.1 s"),
    "nvlink_errors": EvidenceKind(32.2, False, False, source="nvlink_errors: 32.2 s"),
    "ecc_sbe_rate": EvidenceKind(537.3, False, False, source="hbm_degradation: 537.3 s"),
    "straggler": EvidenceKind(34.7, False, False, visible=False,
                              source="straggler: 34.7 s (only while a job runs there)"),
    "node_condition": EvidenceKind(11.2, False, True, source="node_crash: 11.2 s"),
    "job_failure": EvidenceKind(0.0, False, False, visible=False, source="the job's failure itself"),
    "silent": EvidenceKind(0.0, False, False, visible=False, source="nothing until diagnostics"),
    "software": EvidenceKind(0.0, False, False, visible=False, source="the job's failure; the node is healthy"),
    "planned": EvidenceKind(0.0, False, False, source="an operator's cordon, the same for every policy"),
}
#: node conditions that node-problem-detector's kernel monitor writes from the kernel log
NPD_KERNEL_CONDITIONS: Final = frozenset({"KernelDeadlock", "ReadonlyFilesystem", "SysLogsGPUFallenOff",
                                          "SysLogsXIDError"})


class MappingError(ValueError):
    """A mapping that cannot be used (its message names the entry and the field)."""


@dataclass(frozen=True)
class Entry:
    category: str
    evidence: str
    effect: Effect
    reason: str
    slowdown: float = 0.0
    diagnostics_confirm: bool = True
    then: str = ""
    then_after_s: float = 0.0
    delay_s: float | None = None

    @property
    def kind(self) -> EvidenceKind:
        return EVIDENCE[self.evidence.split(":", 1)[0]]

    @property
    def detection_delay_s(self) -> float:
        return self.kind.delay_s if self.delay_s is None else self.delay_s

    def then_entry(self) -> Entry | None:
        """The hard fault this degradation turns into, once ``then_after_s`` passed in service."""
        if not self.then:
            return None
        return Entry(self.category, self.then, "crash", f"{self.reason} (turned hard)", 0.0,
                     self.diagnostics_confirm)


@dataclass
class Mapping:
    name: str
    entries: dict[str, Entry]
    fallback: Entry | None = None
    description: str = ""

    def __post_init__(self) -> None:
        self._folded = {k.casefold(): v for k, v in self.entries.items()}

    def lookup(self, category: str) -> Entry | None:
        e = self.entries.get(category) or self._folded.get(category.casefold())
        return e if e is not None else self.fallback


SHIPPED: Final = ("stepfun", "llama3")


def load_mapping(name_or_path: str) -> Mapping:
    """A shipped mapping by name, or a YAML file; :class:`MappingError` naming what is wrong."""
    if name_or_path in SHIPPED:
        text = resources.files("fleetmedic.sim").joinpath(f"data/whatif-{name_or_path}.yaml").read_text("utf-8")
        return parse_mapping(text, name_or_path)
    try:
        text = Path(name_or_path).read_text(encoding="utf-8")
    except OSError as exc:
        raise MappingError(f"--mapping {name_or_path}: neither a shipped mapping ({', '.join(SHIPPED)}) "
                           f"nor a readable file: {exc.strerror}") from None
    return parse_mapping(text, name_or_path)


def parse_mapping(text: str, source: str = "mapping") -> Mapping:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise MappingError(f"{source}: not YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("categories"), dict):
        raise MappingError(f"{source}: a mapping is a YAML object with `categories:` (category -> entry)")
    entries: dict[str, Entry] = {}
    fallback = None
    for category, raw in doc["categories"].items():
        entry = _entry(str(category), raw, source)
        if category == "*":
            fallback = entry
        else:
            entries[str(category)] = entry
    return Mapping(str(doc.get("name") or source), entries, fallback, str(doc.get("description") or ""))


_FIELDS: Final = {"evidence", "effect", "reason", "slowdown", "diagnostics_confirm", "then", "then_after_s", "delay_s"}


def _entry(category: str, raw: Any, source: str) -> Entry:
    where = f"{source}: category {category!r}"
    if not isinstance(raw, dict):
        raise MappingError(f"{where}: an entry is an object with evidence, effect and reason")
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise MappingError(f"{where}: unknown field(s) {', '.join(map(str, unknown))}")
    evidence = _evidence(raw.get("evidence"), f"{where}: evidence")
    effect = raw.get("effect", "crash")
    if effect not in ("crash", "slow", "none"):
        raise MappingError(f"{where}: effect must be crash, slow or none, not {effect!r}")
    reason = raw.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise MappingError(f"{where}: reason is required (why this category shows this evidence)")
    slowdown = _number(raw.get("slowdown", 0.0), f"{where}: slowdown", 0.0, 0.99)
    if effect == "slow" and slowdown <= 0:
        raise MappingError(f"{where}: effect slow needs a slowdown in (0, 0.99]")
    then = raw.get("then", "")
    if then:
        then = _evidence(then, f"{where}: then")
    then_after = _number(raw.get("then_after_s", 86_400.0 if then else 0.0), f"{where}: then_after_s", 0.0, 1e9)
    delay = raw.get("delay_s")
    delay_s = None if delay is None else _number(delay, f"{where}: delay_s", 0.0, 1e7)
    confirm = raw.get("diagnostics_confirm", True)
    if not isinstance(confirm, bool):
        raise MappingError(f"{where}: diagnostics_confirm must be true or false")
    return Entry(category, evidence, effect, reason.strip(), slowdown, confirm, then, then_after, delay_s)


def _evidence(value: Any, where: str) -> str:
    if not isinstance(value, str) or value.split(":", 1)[0] not in EVIDENCE:
        raise MappingError(f"{where}: {value!r} is not one of {', '.join(sorted(EVIDENCE))} "
                           "(xid:<code>, node_condition:<Type>[=<Status>])")
    head, _, arg = value.partition(":")
    if head == "xid" and not (arg.isdigit() and 0 < int(arg) < 1000):
        raise MappingError(f"{where}: xid needs its code, e.g. xid:79")
    if head == "node_condition" and not arg:
        raise MappingError(f"{where}: node_condition needs its type, e.g. node_condition:Ready=False")
    return value


def _number(value: Any, where: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= float(value) <= hi:
        raise MappingError(f"{where}: {value!r} is not a number in [{lo:g}, {hi:g}]")
    return float(value)
