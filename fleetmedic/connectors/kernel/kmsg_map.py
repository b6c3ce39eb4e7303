"""Pure part of the kernel-log exporter: kernel log records -> classified kernel events -> records.

Three inputs, one :class:`KernelRecord` each:

- ``/dev/kmsg`` records (:func:`parse_kmsg`): ``PRI,SEQ,TS_USEC,FLAGS;message`` then continuation
  lines `` KEY=value`` (the device's dictionary: ``SUBSYSTEM``, ``DEVICE``). The kernel escapes
  non-printable bytes as ``\\xNN`` (a multi-line message's newlines too); they are unescaped.
  ``TS_USEC`` counts from boot, so a record's time is ``boot_time + TS_USEC``.
- ``journalctl -k -o json`` entries (:func:`parse_journal`): ``MESSAGE`` (a string, or a byte list
  when not UTF-8), ``__REALTIME_TIMESTAMP``, ``__CURSOR``, ``_BOOT_ID``, ``PRIORITY``.
- plain lines of a recorded log (``dmesg``, syslog): :class:`RecordReader` tells the three apart per
  line and joins continuation lines (a dict line after a kmsg record, an indented line after a
  ``dmesg`` line).

:class:`SequenceTracker` is what makes the exporter resume and survive overruns: records at or
below the last sequence number already handled are skipped (a restart never re-reports), and a jump
in sequence numbers is counted as records lost (overwritten in the ring buffer before they were
read, or while the exporter was stopped).

:class:`KmsgMapper` classifies a record's message with the log pattern library
(:mod:`fleetmedic.remediation.log_patterns`) and turns it into records: every line the library calls
a device fault (class hardware, network or degradation, not a symptom) becomes a
:class:`~fleetmedic.records.KernelEvent` keyed by the node (topic ``kernel.events``): an XID line
(or a line reporting an XID in the driver's own words, see ``xid`` in the library) with the GPU
index its PCI address maps to; an SXid with its NVSwitch; a PCIe AER error with the GPU or NIC port
its PCI address maps to; machine checks, EDAC, GSP and mlx5 errors as they are. An mlx5 port going
down or up becomes a :class:`~fleetmedic.records.PortTelemetry` of the node's NIC port with its
``link_state``. Stage 1 reads the kernel events: an XID seen in the kernel log and from NVML or
dcgm is one event (:mod:`fleetmedic.models.event_dedup`), an SXid points at its NVSwitch, an AER
error at its device (:mod:`fleetmedic.models.kernel_events`). The kernel log's XIDs do not ride
in ``GpuTelemetry`` records: a record without metrics would move the detector's clock.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast

import yaml

from fleetmedic import records as r
from fleetmedic.connectors.kernel.log_lines import stamp
from fleetmedic.remediation.log_patterns import LineMatch, PatternLibrary

SOURCE: Final = "kmsg"
MAX_MESSAGE: Final = 4096

_KMSG = re.compile(r"^(?P<pri>\d+),(?P<seq>\d+),(?P<ts>\d+),(?P<flags>[^;]*);(?P<msg>.*)$", re.DOTALL)
_DICT_LINE = re.compile(r"^ (?P<key>[A-Z_][A-Z0-9_]*)=(?P<value>.*)$")
_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")
_PCI = re.compile(r"^(?:(?P<dom>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})(?:\.[0-7])?$")
#: mlx5 port state changes: the netdev's "Link up/down", the IB port's "Port: 1 Link ACTIVE/DOWN/INIT"
_LINK = re.compile(r"mlx5_core (?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])(?: (?P<ifname>[\w.-]+))?: "
                   r"(?:Port: (?P<port>\d+) )?Link (?P<state>up|down|DOWN|ACTIVE|ACTIVE_DEFER|INIT|ARMED)\b")
_SWITCH = re.compile(r"\b(nvidia-nvswitch\d+):")
#: the classes of kernel lines published as KernelEvents (device faults); the others are counted
PUBLISHED_CLASSES: Final = frozenset({"hardware", "network", "degradation"})
_LINK_STATES: Final = {"up": "up", "ACTIVE": "up", "ACTIVE_DEFER": "up", "down": "down", "DOWN": "down",
                       "INIT": "init", "ARMED": "init"}


class BadRecord(ValueError):
    """A line or record that is not a kernel log record; the message is the skip reason."""


@dataclass(frozen=True)
class KernelRecord:
    """One kernel log message. ``seq`` is the kernel's sequence number (kmsg), ``cursor`` the
    journal's; ``ts`` Unix seconds (``None`` when the input had no time); ``message`` unescaped, a
    multi-line message's lines joined by newlines. ``facility`` is the syslog facility the record
    came with: 0 for the kernel's own messages, another (1, user, for ``logger --kmsg``) for what a
    process wrote into the kernel's log; ``None`` when the input does not say (a plain line)."""

    message: str
    seq: int | None = None
    ts: float | None = None
    level: int | None = None
    facility: int | None = None
    fields: tuple[tuple[str, str], ...] = ()
    cursor: str = ""
    boot_id: str = ""
    host: str = ""  # the host a recorded line names (a syslog or journal stamp's), "" when none

    @property
    def text(self) -> str:
        """The message on one line, as the patterns see it."""
        return " ".join(part.strip() for part in self.message.splitlines() if part.strip())


def unescape(text: str) -> str:
    """Undo /dev/kmsg's ``\\xNN`` escaping."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text) if "\\x" in text else text


def parse_kmsg(raw: bytes | str, boot_time: float | None) -> KernelRecord:
    """One /dev/kmsg record (what one read returns): the header line and its dictionary lines
    (``boot_time`` None: a record of an unknown boot, without a time)."""
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    head, *rest = text.rstrip("\n").split("\n")
    m = _KMSG.match(head)
    if m is None:
        raise BadRecord("kmsg: not a PRI,SEQ,TS_USEC,FLAGS;message record")
    fields = []
    for line in rest:
        d = _DICT_LINE.match(line)
        if d is None:
            raise BadRecord("kmsg: continuation line is not ' KEY=value'")
        fields.append((d.group("key"), unescape(d.group("value"))))
    pri, seq, usec = int(m.group("pri")), int(m.group("seq")), int(m.group("ts"))
    return KernelRecord(message=unescape(m.group("msg"))[:MAX_MESSAGE], seq=seq,
                        ts=None if boot_time is None else boot_time + usec / 1e6,
                        level=pri & 7, facility=pri >> 3, fields=tuple(fields))


def parse_journal(raw: bytes | str) -> KernelRecord:
    """One ``journalctl -o json`` line."""
    refused = r.json_limit_error(raw)
    if refused is not None:
        raise BadRecord(f"journal: {refused}")
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadRecord("journal: not JSON") from None
    if not isinstance(doc, dict):
        raise BadRecord("journal: not a JSON object")
    msg = doc.get("MESSAGE")
    if isinstance(msg, list) and all(isinstance(b, int) and 0 <= b < 256 for b in msg):
        msg = bytes(msg).decode("utf-8", errors="replace")
    if not isinstance(msg, str):
        raise BadRecord("journal: no MESSAGE")
    ts = None
    with contextlib.suppress(KeyError, TypeError, ValueError):
        ts = int(doc["__REALTIME_TIMESTAMP"]) / 1e6
    level = doc.get("PRIORITY")
    fields = tuple((k, str(doc[k])) for k in ("_KERNEL_SUBSYSTEM", "_KERNEL_DEVICE") if isinstance(doc.get(k), str))
    host = doc.get("_HOSTNAME")
    return KernelRecord(message=msg[:MAX_MESSAGE], ts=ts,
                        level=int(level) if isinstance(level, str) and level.isdigit() else None,
                        facility=_journal_facility(doc), fields=fields,
                        cursor=str(doc.get("__CURSOR") or ""), boot_id=journal_boot_id(str(doc.get("_BOOT_ID") or "")),
                        host=host[:253] if isinstance(host, str) else "")


def _journal_facility(doc: dict[str, Any]) -> int | None:
    """The facility of a journal entry: 0 where journald read it from the kernel (``_TRANSPORT``,
    which journald sets and a sender cannot), else ``SYSLOG_FACILITY`` (1 when the entry has none);
    ``None`` when the entry names neither."""
    transport, facility = doc.get("_TRANSPORT"), doc.get("SYSLOG_FACILITY")
    if transport == "kernel":
        return 0
    if isinstance(transport, str):
        return int(facility) if isinstance(facility, str) and facility.isdigit() and facility != "0" else 1
    return int(facility) if isinstance(facility, str) and facility.isdigit() else None


def journal_boot_id(value: str) -> str:
    """The journal's 32-hex boot id in /proc's dashed form (what the other exporters report)."""
    v = value.replace("-", "").lower()
    if len(v) != 32 or any(c not in "0123456789abcdef" for c in v):
        return value
    return f"{v[:8]}-{v[8:12]}-{v[12:16]}-{v[16:20]}-{v[20:]}"


class RecordReader:
    """Lines of a recorded kernel log -> records. Each line is a /dev/kmsg record (``cat
    /dev/kmsg``), a ``journalctl -o json`` entry or a plain ``dmesg``/syslog line; a kmsg record's
    `` KEY=value`` lines and a ``dmesg`` message's indented continuation lines are joined to it.
    Lines that cannot be read come back as :class:`BadRecord`.

    ``stamped``: a plain line's time and host are read from its stamps
    (:func:`fleetmedic.connectors.kernel.log_lines.stamp`; ``year`` for syslog stamps, ``boot_time``
    for the kernel's uptime stamps); else a plain line has no time (the exporter stamps it when it
    reads it). ``boot_time`` None: kmsg records and uptime stamps have no time either."""

    def __init__(self, boot_time: float | None, stamped: bool = False, year: int | None = None) -> None:
        self.boot_time = boot_time
        self.stamped = stamped
        self.year = year
        self._kmsg: list[str] = []  # a kmsg record and its dictionary lines
        self._text: list[str] = []  # a dmesg message and its continuation lines

    def feed(self, line: str) -> list[KernelRecord | BadRecord]:
        line = line.rstrip("\r\n")
        if self._kmsg and _DICT_LINE.match(line):
            self._kmsg.append(line)
            return []
        if self._text and line[:1] in (" ", "\t") and line.strip() and not _KMSG.match(line.strip()):
            self._text.append(line.strip())
            return []
        out = self.flush()
        if not line.strip():
            return out
        if _KMSG.match(line):
            self._kmsg = [line]
        elif line.lstrip().startswith("{"):
            out.append(_or_bad(parse_journal, line))
        else:
            self._text = [line]
        return out

    def flush(self) -> list[KernelRecord | BadRecord]:
        out: list[KernelRecord | BadRecord] = []
        if self._kmsg:
            out.append(_or_bad(lambda t: parse_kmsg(t, self.boot_time), "\n".join(self._kmsg)))
            self._kmsg = []
        if self._text:
            message = "\n".join(self._text)
            if self.stamped:
                line = stamp(message, self.year, self.boot_time)
                out.append(KernelRecord(message=line.message[:MAX_MESSAGE], ts=line.ts, host=line.host))
            else:
                out.append(KernelRecord(message=message[:MAX_MESSAGE]))
            self._text = []
        return out

    def read_all(self, lines: Iterable[str]) -> Iterator[KernelRecord | BadRecord]:
        for line in lines:
            yield from self.feed(line)
        yield from self.flush()


def _or_bad(parse: Any, raw: str) -> KernelRecord | BadRecord:
    try:
        return cast(KernelRecord, parse(raw))
    except BadRecord as exc:
        return exc


class SequenceTracker:
    """Which kmsg records are new, and how many were lost. ``last`` is the highest sequence number
    handled (``None``: nothing yet, e.g. a new boot)."""

    def __init__(self, last: int | None = None) -> None:
        self.last = last
        self.lost = 0

    def accept(self, seq: int) -> tuple[bool, int]:
        """(whether ``seq`` is new, records lost just before it)."""
        if self.last is not None and seq <= self.last:
            return False, 0
        lost = seq - self.last - 1 if self.last is not None else 0
        self.last = seq
        self.lost += lost
        return True, lost


# --- the GPU and NIC maps ----------------------------------------------------------------------------


def pci_key(address: str) -> str:
    """A PCI address as the GPU map keys it: ``dddd:bb:dd`` (lower case, function dropped), from
    NVML's ``00000000:3B:00.0``, an XID line's ``0000:3b:00`` or ``3b:00.0``; ``""`` if not one."""
    m = _PCI.match(address.strip().removeprefix("PCI:"))
    if m is None:
        return ""
    dom = int(m.group("dom") or "0", 16)
    return f"{dom:04x}:{m.group('bus').lower()}:{m.group('dev').lower()}"


def parse_pci_map(text: str) -> dict[str, int]:
    """A ``--pci-map`` file: a YAML/JSON mapping of PCI address -> GPU index, or the output of
    ``nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader`` (``0, 00000000:3B:00.0``).
    Raises ValueError naming the entry that cannot be read."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        doc = None
    out: dict[str, int] = {}
    if isinstance(doc, dict):
        for key, value in doc.items():
            pci, index = (str(key), value) if not isinstance(key, int) else (str(value), key)
            _put(out, pci, index, f"{key}: {value}")
        return out
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#") or line.lower().startswith("index"):
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2:
            raise ValueError(f"line {n}: expected 'index, pci.bus_id', got {line!r}")
        _put(out, parts[1], parts[0], f"line {n}")
    return out


def _put(out: dict[str, int], pci: str, index: Any, where: str) -> None:
    key = pci_key(pci)
    if not key:
        raise ValueError(f"{where}: {pci!r} is not a PCI address")
    try:
        gpu = int(index)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: GPU index {index!r} is not an integer") from None
    if not 0 <= gpu <= 255:
        raise ValueError(f"{where}: GPU index {gpu} out of range 0..255")
    out[key] = gpu


# --- classifying and mapping ------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelEvent:
    """A classified kernel line (what its :class:`~fleetmedic.records.KernelEvent` record is made of)."""

    ts: float
    signal: str
    incident_class: str
    severity: str
    device: str  # gpu | nvswitch | pcie | nic | cpu | memory | ""
    pattern: str
    message: str
    seq: int | None = None
    pci: str = ""
    gpu: int | None = None
    xid: int | None = None
    xid_line: bool = False  # an "NVRM: Xid" line (not an XID in the driver's own words)
    code: str = ""
    symptom: bool = False

    @classmethod
    def of(cls, rec: KernelRecord, m: LineMatch, ts: float, gpus: Mapping[str, int]) -> KernelEvent:
        pci = m.group("pci")
        gpu = gpus.get(pci_key(pci)) if pci and m.device == "gpu" else None
        return cls(ts=ts, signal=m.signal, incident_class=m.incident_class, severity=m.severity, device=m.device,
                   pattern=m.pattern or "", message=m.line, seq=rec.seq, pci=pci, gpu=gpu, xid=m.xid,
                   xid_line=bool(m.pattern and m.pattern.startswith("xid_")), code=m.group("code"),
                   symptom=m.symptom)


@dataclass(frozen=True)
class PortChange:
    ts: float
    port: str
    link_state: str
    pci: str
    seq: int | None = None


@dataclass
class Mapped:
    """What a batch of records became: records to publish, events classified, and counts per
    reason of what was read but not published."""

    records: list[r.Record] = field(default_factory=list)
    events: list[KernelEvent] = field(default_factory=list)
    unpublished: Counter[str] = field(default_factory=Counter)
    first_seq: int | None = None  # the lowest sequence number the records came from


class XidJoiner:
    """An XID the driver reports in its own words (a GPU fallen off the bus without its Xid line)
    and the Xid line itself are one event: a words-XID waits ``window_s`` (by the caller's clock)
    and is dropped if an Xid line with the same GPU (its index, or its PCI address where no map
    gives the index) and code comes within ``window_s`` of it (by the kernel's time); Xid lines
    always pass."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._real: dict[tuple[int | str, int], float] = {}
        self._pending: list[tuple[float, KernelEvent]] = []

    @staticmethod
    def _key(ev: KernelEvent) -> tuple[int | str, int]:
        assert ev.xid is not None
        return (ev.gpu if ev.gpu is not None else pci_key(ev.pci), ev.xid)

    def add(self, ev: KernelEvent, now: float) -> list[KernelEvent]:
        key = self._key(ev)
        if ev.xid_line:
            self._real[key] = ev.ts
            self._pending = [(t, p) for t, p in self._pending
                             if self._key(p) != key or abs(p.ts - ev.ts) > self.window_s]
            return [ev]
        seen = self._real.get(key)
        if seen is not None and abs(seen - ev.ts) <= self.window_s:
            return []
        self._pending.append((now, ev))
        return []

    def due(self, now: float, flush: bool = False) -> list[KernelEvent]:
        out = [ev for t, ev in self._pending if flush or now - t >= self.window_s]
        self._pending = [(t, ev) for t, ev in self._pending if not (flush or now - t >= self.window_s)]
        horizon = max(self._real.values(), default=0.0) - 10 * self.window_s
        self._real = {k: v for k, v in self._real.items() if v >= horizon}
        return out

    def __len__(self) -> int:
        return len(self._pending)

    def recent(self) -> list[list[Any]]:
        """The Xid lines seen lately, ``[gpu, xid, ts]`` (``gpu`` the PCI address where no map gives
        the index): kept in the state file, so that a words-XID read after a restart still joins the
        Xid line read before it."""
        return [[gpu, xid, ts] for (gpu, xid), ts in sorted(self._real.items(), key=lambda kv: str(kv[0]))]

    def restore(self, recent: Iterable[Any]) -> None:
        for item in recent:
            with contextlib.suppress(TypeError, ValueError):
                gpu, xid, ts = item
                self._real[(gpu if isinstance(gpu, str) else int(gpu), int(xid))] = float(ts)

    def earliest_seq(self) -> int | None:
        """The lowest sequence number of the events held (what a checkpoint must not pass)."""
        return min((ev.seq for _, ev in self._pending if ev.seq is not None), default=None)


class KmsgMapper:
    """Classifies kernel records and builds the node's records (see the module docstring).

    ``gpus``: PCI address (:func:`pci_key`) -> GPU index, from NVML or ``--pci-map``; an XID on a
    GPU the map does not know is published with its PCI address and no index (the node is what is
    isolated). ``nics``: a NIC's PCI address (``dddd:bb:dd.f``) -> its port as the port connectors
    name it (``mlx5_0/1``).

    Only the kernel's own records (facility 0) are device evidence: a record a process wrote into
    the kernel log (``logger --kmsg``: facility user) is counted as refused, whatever it reads. An
    event equal to one published less than ``coalesce_s`` before it (by the kernel's time: the
    same signal, device, PCI address, GPU, XID and code) is counted as coalesced, not published
    again: a storm of one XID is one event a window."""

    def __init__(self, node: str, library: PatternLibrary, gpus: Mapping[str, int] | None = None,
                 nics: Mapping[str, str] | None = None, boot_id: str = "", xid_window_s: float = 30.0,
                 source: str = SOURCE, coalesce_s: float = 60.0) -> None:
        self.node = node
        self.source = source
        self.library = library
        self.gpus = dict(gpus or {})
        self.nics = dict(nics or {})
        self.boot_id = boot_id
        self.joiner = XidJoiner(xid_window_s)
        self.coalesce_s = coalesce_s
        self._published: dict[tuple[Any, ...], float] = {}  # an event's identity -> kernel time last published

    def map(self, recs: Iterable[KernelRecord], now: float) -> Mapped:
        """Classify ``recs`` (already accepted by the sequence tracker) into records and events."""
        out = Mapped()
        xids: list[KernelEvent] = []
        others: list[KernelEvent] = []
        ports: list[PortChange] = []
        for rec in recs:
            if rec.facility not in (None, 0):
                out.unpublished[f"not from the kernel (facility {rec.facility}): no device evidence"] += 1
                continue
            ts = rec.ts if rec.ts is not None else now
            text = rec.text
            link = _LINK.search(text)
            if link is not None:
                ports.append(self._port_change(link, ts, rec.seq))
            m = self.library.classify(text)
            if m.pattern is None:
                continue
            ev = KernelEvent.of(rec, m, ts, self.gpus)
            out.events.append(ev)
            if ev.xid is not None and ev.device == "gpu":
                if ev.gpu is None and not ev.pci:
                    out.unpublished["xid: the line names no PCI address"] += 1
                    continue
                xids += self.joiner.add(ev, now)
            elif link is not None:
                continue  # published as the port's state
            elif ev.symptom or ev.incident_class not in PUBLISHED_CLASSES:
                out.unpublished[f"{ev.signal} ({ev.incident_class}): not a device fault"] += 1
            else:
                others.append(ev)
        xids = self._coalesced(sorted(xids + self.joiner.due(now), key=lambda e: e.ts), out.unpublished)
        others = self._coalesced(others, out.unpublished)
        out.records += (self._event_records(xids, out.unpublished)
                        + self._event_records(others, out.unpublished) + self._port_records(ports, out.unpublished))
        out.first_seq = _first_seq([ev.seq for ev in xids + others] + [ch.seq for ch in ports])
        return out

    def due(self, now: float, flush: bool = False) -> Mapped:
        """Records of the words-XIDs whose wait is over (all of them with ``flush``: at the end of a
        recorded log, or on stopping)."""
        out = Mapped()
        xids = self._coalesced(self.joiner.due(now, flush), out.unpublished)
        out.records += self._event_records(xids, out.unpublished)
        out.first_seq = _first_seq([ev.seq for ev in xids])
        return out

    def _coalesced(self, events: list[KernelEvent], unpublished: Counter[str]) -> list[KernelEvent]:
        """``events`` less those equal to one published within ``coalesce_s`` (counted)."""
        out: list[KernelEvent] = []
        seen = self._published
        for ev in events:
            key = (ev.signal, ev.device, ev.pci, ev.gpu, ev.xid, ev.code)
            last = seen.get(key)
            if last is not None and 0.0 <= ev.ts - last < self.coalesce_s:
                unpublished[f"{ev.signal}: coalesced (the same event within {self.coalesce_s:g} s)"] += 1
                continue
            seen[key] = ev.ts
            out.append(ev)
        if len(seen) > 4096:  # keep only what can still coalesce: events inside the window
            horizon = max(seen.values()) - self.coalesce_s
            self._published = {k: t for k, t in seen.items() if t >= horizon}
        return out

    def _event_records(self, events: list[KernelEvent], unpublished: Counter[str]) -> list[r.Record]:
        out: list[r.Record] = []
        gpus = sorted(set(self.gpus.values()))
        for ev in events:
            gpu, port = ev.gpu, ""
            if ev.pci and ev.device in ("pcie", "nic"):  # an AER error or a NIC line: the device at that address
                gpu = self.gpus.get(pci_key(ev.pci)) if ev.device == "pcie" else None
                port = "" if gpu is not None else self.nics.get(ev.pci.lower(), "")
            switch = _SWITCH.search(ev.message) if ev.device == "nvswitch" else None
            doc = {"node": self.node, "ts": ev.ts, "signal": ev.signal or ev.pattern, "class": ev.incident_class,
                   "severity": ev.severity or "warning", "message": ev.message[:MAX_MESSAGE], "device": ev.device,
                   "pattern": ev.pattern, "pci": ev.pci, "gpu": gpu, "port": port, "xid": ev.xid, "code": ev.code,
                   "switch": switch.group(1) if switch else "", "gpus": gpus, "seq": ev.seq, "boot_id": self.boot_id,
                   "source": self.source}
            out += _checked(r.KernelEvent, doc, 1, unpublished)
        return out

    def _port_change(self, m: re.Match[str], ts: float, seq: int | None) -> PortChange:
        pci, ifname, port = m.group("pci").lower(), m.group("ifname") or "", m.group("port")
        # the IB device itself ("mlx5_5: Port: 1 Link DOWN"), else the netdev's NIC as sysfs names it
        name = f"{ifname}/{port}" if ifname.startswith("mlx5_") and port else self.nics.get(pci) or ifname or pci
        return PortChange(ts, name, _LINK_STATES[m.group("state")], pci, seq)

    def _port_records(self, changes: list[PortChange], unpublished: Counter[str]) -> list[r.Record]:
        out: list[r.Record] = []
        for ch in changes:  # one record per change: a flap within a batch stays a flap
            doc = {"device": self.node, "device_kind": "host", "ts": ch.ts, "boot_id": self.boot_id, "source": SOURCE,
                   "ports": [{"port": ch.port, "node": self.node, "link_state": ch.link_state}]}
            out += _checked(r.PortTelemetry, doc, 1, unpublished)
        return out


def _first_seq(seqs: Iterable[int | None]) -> int | None:
    return min((s for s in seqs if s is not None), default=None)


def _checked(record_type: type[r.Record], doc: dict[str, Any], n: int, unpublished: Counter[str]) -> list[r.Record]:
    try:
        return [r.convert(record_type, doc)]
    except r.InvalidRecord as exc:
        unpublished[f"{record_type.__name__} {exc.path}: {exc.reason}"] += n
        return []
