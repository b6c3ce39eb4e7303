"""Prometheus text exposition and OpenMetrics (dcgm-exporter, node-exporter) -> fleetmedic records.

Reads what exporters and Prometheus write (tests/data/field/ holds samples of each, with their
sources):

- Prometheus text 0.0.4, with or without sample timestamps (integer milliseconds); a sample without
  one gets the scrape time the caller gives (``default_ts``);
- OpenMetrics 1.0: timestamps in (float) seconds, ``# EOF``, ``# UNIT``, ``_created`` samples
  (ignored), ``_total`` counters of series fleetmedic reads under their base name, exemplars
  (``# {...} value``, ignored);
- ``promtool tsdb dump`` lines (``{__name__="x", a="b"} value ts_ms``) and ``promtool tsdb
  dump-openmetrics``.

An integer timestamp is milliseconds, unless the input is OpenMetrics (the caller says so, e.g. for
a ``.om`` file, or the input shows it: a ``# UNIT`` line, a type only OpenMetrics has, ``# EOF``, a
timestamp with a decimal point), where it is seconds.

Samples map to :class:`~fleetmedic.records.GpuTelemetry` (``DCGM_FI_*`` series, GPU from the ``gpu``
label; XIDs from ``DCGM_FI_DEV_XID_ERRORS`` with or without ``err_code``/``err_msg``, or from
``DCGM_EXP_XID_ERRORS_COUNT``'s ``xid`` label; the clock-event bitmask under both of its names) and
:class:`~fleetmedic.records.PortTelemetry` (node-exporter's ``node_infiniband_*`` series, port from
the ``device`` and ``port`` labels; both state series). The node comes from the first label in
``node_labels`` that a sample has and whose value is not matched by ``node_label_ignore``
(``instance`` loses its ``:port``). Samples of one node within ``group_tolerance_s`` of each other
are one scrape and make one record (a series stamped a millisecond apart from the rest of its
scrape must not look like a GPU that stopped reporting).

Lines that cannot be parsed and bad values are skipped and counted per reason
(:attr:`ExpositionReader.skipped`); a bad line never stops the rest, and a value out of its range (or
one of DCGM's "blank" sentinels) drops that value, not the node's record. Series fleetmedic does not
read are counted in :attr:`ExpositionReader.ignored` (or, with ``ignore_unknown=False``, as skips).
Lengths are capped before any regex or number conversion (:data:`MAX_LINE_CHARS`,
:data:`MAX_LABEL_VALUE_CHARS`, :data:`MAX_VALUE_CHARS`, :data:`MAX_TS_DIGITS`), so a hostile line
costs bounded time and memory, and reasons never carry the offending value (a bounded set: they
become metric labels). Used by ``fleetmedic backtest``, the Prometheus connector and the Kafka
connector.

The caps and :func:`count` are shared by the other connectors' parsers.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Final

import msgspec

from fleetmedic import records as r
from fleetmedic.config import IngestSettings, PrometheusExporterSettings, Settings

_CommonColumns = Callable[[list[dict[str, float]], dict[str, tuple[bool, float, float, str]]],
                          tuple[dict[str, list[float | int | None]], list[str]]]
_native_common_columns: _CommonColumns | None
try:  # gpu_record's common columns in C (_gpu_record.c), built with the package where a compiler is found
    from fleetmedic.connectors.prometheus._gpu_record import common_columns as _native_common_columns
except ImportError:  # pragma: no cover - the Python loop does the same, slower
    _native_common_columns = None

#: the longest exposition line read (dcgm-exporter's are ~300 characters); longer ones are skipped
MAX_LINE_CHARS: Final = 65_536
#: the longest label value kept (node names are at most 253, UUIDs and model names far less)
MAX_LABEL_VALUE_CHARS: Final = 4096
#: the longest sample value read as a number ("-1.2345678901234567e+308" is 24)
MAX_VALUE_CHARS: Final = 64
#: the most digits of a sample timestamp (milliseconds: 13 digits until the year 2286)
MAX_TS_DIGITS: Final = 18
#: the most GPU index digits (GPU indices are 0-255)
MAX_GPU_DIGITS: Final = 3
#: distinct reasons a skip counter keeps; more are counted under :data:`OTHER_REASON`
MAX_REASONS: Final = 200
OTHER_REASON: Final = "other reasons (too many distinct reasons to list)"
#: the timestamps a record may carry (:data:`fleetmedic.records.Timestamp`)
TS_MIN, TS_MAX = 0.0, 4.0e9
#: a timestamp in milliseconds between these (the seconds of 2001-09-09 to 2096-10-02) was written
#: in seconds: read as milliseconds it would date its record in January 1970
SECONDS_AS_MS_MIN, SECONDS_AS_MS_MAX = 1.0e9, 4.0e9


def seconds_as_ms(ms: float) -> bool:
    """Whether the millisecond timestamp ``ms`` is a time in seconds (a sender's unit mistake)."""
    return SECONDS_AS_MS_MIN <= ms <= SECONDS_AS_MS_MAX


SECONDS_AS_MS_REASON: Final = "timestamp in seconds where milliseconds are expected"
#: the times (in seconds) a timestamp in seconds read as milliseconds gives
SECONDS_AS_MS_LOW, SECONDS_AS_MS_HIGH = SECONDS_AS_MS_MIN / 1000.0, SECONDS_AS_MS_MAX / 1000.0
#: DCGM writes "blank" sentinels for a field a GPU does not support: int64 ones from 0x7ffffffffffffff0
#: (as a float: 2**63) and float ones from 2**47 (dcgm_structs.h, DCGM_INT64_BLANK / DCGM_FP64_BLANK)
DCGM_INT64_BLANK: Final = float(0x7FFFFFFFFFFFFFF0)
DCGM_FP64_BLANK: Final = 140737488355328.0
#: the grouping tolerance when none is given (``exporters.prometheus.group_tolerance_ms``)
DEFAULT_GROUP_TOLERANCE_S: Final = 0.5

#: one exposition line, as the former reader matched it (kept as the benchmarks' regex floor)
_LINE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+(?P<ts>-?[0-9]+))?\s*$"
)
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# one label at a time, anchored where the previous one ended; possessive, so it never backtracks
# (the former `(?:[^"\\]|\\.)*` took ~170 bytes of regex stack per input byte)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]++|\\.)*+)"\s*(?:,\s*|(?=\}))')
_ESCAPE = re.compile(r"\\(.)")
_LABEL_CACHE_ENTRIES, _LABEL_CACHE_CHARS, _LABEL_CACHE_TEXT = 200_000, 16_000_000, 2048
_EMPTY: dict[str, str] = {}


def count(skipped: Counter[str], reason: str, n: int = 1) -> None:
    """Count ``n`` skips for ``reason``; past :data:`MAX_REASONS` distinct reasons, new ones are
    counted as :data:`OTHER_REASON` (the counter stays small whatever the input)."""
    if reason not in skipped and len(skipped) >= MAX_REASONS:
        reason = OTHER_REASON
    skipped[reason] += n


def ascii_index(text: str, max_digits: int = MAX_GPU_DIGITS) -> int | None:
    """``text`` as a non-negative int when it is 1 to ``max_digits`` ASCII digits, else None
    (``str.isdigit`` alone accepts "²", which ``int()`` refuses)."""
    if 0 < len(text) <= max_digits and text.isascii() and text.isdigit():
        return int(text)
    return None


def number(text: str) -> float | None:
    """A sample value's text as a float (None: too long or not a number; NaN and infinities pass)."""
    if len(text) > MAX_VALUE_CHARS:
        return None
    try:
        return float(text)
    except ValueError:
        return None


class _Skip(Exception):
    """A line that is skipped; the argument is the reason."""


def _unescape(m: re.Match[str]) -> str:
    return "\n" if m.group(1) == "n" else m.group(1)


DCGM_TO_METRIC: dict[str, str] = {dcgm: metric for metric, dcgm in r.DCGM_NAMES.items()}
# DCGM renamed the clock-event field (3.3): dcgm-exporters before write the older name
DCGM_TO_METRIC["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"] = "clocks_event_reasons"
#: dcgm-exporter's windowed XID count (3.3.5-3.4.0 and later; label ``xid``, value: XIDs in the window)
XID_COUNT_SERIES: Final = "DCGM_EXP_XID_ERRORS_COUNT"

#: node-exporter's infiniband collector -> PortSample field (collector/infiniband_linux.go; the
#: names are checked against node-exporter's own e2e output in tests/data/field/node-exporter)
NODE_EXPORTER_IB: dict[str, str] = {
    "node_infiniband_symbol_error_total": "symbol_error_counter",
    "node_infiniband_link_error_recovery_total": "link_error_recovery_counter",
    "node_infiniband_link_downed_total": "link_downed_counter",
    "node_infiniband_port_errors_received_total": "port_rcv_errors",
    "node_infiniband_port_receive_remote_physical_errors_total": "port_rcv_remote_physical_errors",
    "node_infiniband_port_discards_transmitted_total": "port_xmit_discards",
    "node_infiniband_local_link_integrity_errors_total": "local_link_integrity_errors",
    "node_infiniband_excessive_buffer_overrun_errors_total": "excessive_buffer_overrun_errors",
    "node_infiniband_port_transmit_wait_total": "port_xmit_wait",
    "node_infiniband_port_data_transmitted_bytes_total": "port_xmit_data",
    "node_infiniband_port_data_received_bytes_total": "port_rcv_data",
}
#: the 32-bit legacy data counters: used only where a port has no 64-bit ones (older HCAs)
_IB_LEGACY: dict[str, str] = {
    "node_infiniband_legacy_data_transmitted_bytes_total": "port_xmit_data",
    "node_infiniband_legacy_data_received_bytes_total": "port_rcv_data",
}
_IB_STATE, _IB_PHYS, _IB_RATE = (
    "node_infiniband_state_id", "node_infiniband_physical_state_id", "node_infiniband_rate_bytes_per_second")
_INT_FIELDS = {
    f for f in r.PortSample.__struct_fields__ if f.endswith(("counter", "errors", "discards", "wait", "data"))
}
_PORT_SERIES = {*NODE_EXPORTER_IB, *_IB_LEGACY, _IB_STATE, _IB_PHYS, _IB_RATE}
_GPU_SERIES = {*DCGM_TO_METRIC, XID_COUNT_SERIES}
# node-exporter's state ids: logical 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE; physical 5 = LinkUp
_STATE = {1: "down", 2: "init", 3: "init", 4: "up"}
_PHYS_LINK_UP = 5
_OUR_PREFIXES = ("DCGM_", "node_infiniband_")
_OM_ONLY_TYPES = (" unknown", " stateset", " info", " gaugehistogram")


#: one sample: series name, labels, value, timestamp (Unix seconds; None = not given)
Sample = tuple[str, dict[str, str], float, float | None]


def is_known_series(name: str) -> bool:
    return name in _GPU_SERIES or name in _PORT_SERIES


def known_name(name: str) -> str | None:
    """The series fleetmedic reads that ``name`` is: itself, or the base of an OpenMetrics
    ``_total`` counter (None: not one fleetmedic reads)."""
    if name in _GPU_SERIES or name in _PORT_SERIES:
        return name
    if name.endswith("_total") and (name[:-6] in _GPU_SERIES or name[:-6] in _PORT_SERIES):
        return name[:-6]
    return None


def _bounds(struct: type[Any], list_items: bool) -> dict[str, tuple[bool, float, float]]:
    """field -> (integral, lowest, highest) from a record struct's annotations (msgspec Meta)."""
    ins = msgspec.inspect

    def plain(t: Any) -> Any:  # without Optional and descriptions
        while True:
            if isinstance(t, ins.Metadata):
                t = t.type
            elif isinstance(t, ins.UnionType):
                t = next((x for x in t.types if not isinstance(x, ins.NoneType)), None)
            else:
                return t

    out: dict[str, tuple[bool, float, float]] = {}
    info = ins.type_info(struct)
    assert isinstance(info, ins.StructType)
    for f in info.fields:
        t = plain(f.type)
        if list_items and isinstance(t, ins.ListType):
            t = plain(t.item_type)
        if isinstance(t, ins.IntType | ins.FloatType):
            lo = -math.inf if t.ge is None else float(t.ge)
            hi = math.inf if t.le is None else float(t.le)
            out[f.name] = (isinstance(t, ins.IntType), lo, hi)
    return out


_GPU_BOUNDS = _bounds(r.GpuMetrics, list_items=True)
_PORT_BOUNDS = _bounds(r.PortSample, list_items=False)


def node_labels_of(settings: Settings) -> list[str]:
    """The label order that names the node: ``exporters.prometheus.node_labels``, unless only the
    older ``ingest.node_labels`` was changed from its default (then that one)."""
    prom = settings.exporters.prometheus.node_labels
    if prom == PrometheusExporterSettings().node_labels and settings.ingest.node_labels != IngestSettings().node_labels:
        return list(settings.ingest.node_labels)
    return list(prom)


@dataclass(slots=True)
class _Series:
    """What a series' name and labels say (:meth:`ExpositionReader._series`)."""

    labels: Mapping[str, str]  # held, so the id() it is cached under cannot be reused meanwhile
    name: str | None = None  # the series fleetmedic reads (None: not one)
    node: str = ""
    problem: str = ""  # why its samples cannot be used ("" when they can)
    index: int = -1  # the GPU (-1: a port series)
    xid: int = -1  # DCGM_EXP_XID_ERRORS_COUNT's xid label (-1: another series)
    target: str = ""  # the GpuMetrics / PortSample field
    port: str = ""
    sku: str = ""
    driver: str = ""
    uuid: str = ""


#: a whole series: name, labels, (timestamp, value) points (:meth:`ExpositionReader.read_columns`)
Column = tuple[str, dict[str, str], list[tuple[float, float]]]
#: (series name, id of its labels dict) -> what the series says (:meth:`ExpositionReader.read_samples`)
SeriesCache = dict[tuple[str, int], _Series]


@dataclass
class _Group:
    """The samples of one node within the grouping tolerance: one scrape, one record."""

    anchor: float  # the first sample's timestamp: later ones join within the tolerance of it
    ts: float  # the earliest sample's: the record's
    gpu: dict[int, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    xid_counts: dict[int, dict[int, float]] = field(default_factory=lambda: defaultdict(dict))
    meta: dict[str, str] = field(default_factory=dict)
    ports: dict[str, dict[str, float | str]] = field(default_factory=lambda: defaultdict(dict))


@dataclass
class ExpositionReader:
    """Maps dcgm-exporter / node-exporter samples to records. ``ignore_unknown`` leaves series
    fleetmedic does not read out of :attr:`skipped` (they are counted in :attr:`ignored`);
    ``source`` is written into the records. ``node_labels`` (default: ``ingest.node_labels``),
    ``node_label_ignore`` and ``group_tolerance_s`` say how samples become nodes and records
    (:meth:`for_settings` takes them from ``exporters.prometheus``)."""

    ingest: IngestSettings
    skipped: Counter[str] = field(default_factory=Counter)
    source: str = "prometheus"
    ignore_unknown: bool = False
    #: :meth:`parse` yields every series, not only those fleetmedic reads (tests, benchmarks)
    keep_all: bool = False
    node_labels: list[str] | None = None
    node_label_ignore: str = ""
    group_tolerance_s: float = DEFAULT_GROUP_TOLERANCE_S
    #: samples of series fleetmedic does not read (fleetmedic-like names kept by name, bounded)
    ignored: Counter[str] = field(default_factory=Counter)
    #: samples :meth:`parse` read without a timestamp (they got ``default_ts``; the summary says so)
    samples_without_ts: int = 0
    _label_cache: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)
    _label_cache_chars: int = field(default=0, repr=False)
    _ignore_re: re.Pattern[str] | None = field(default=None, repr=False)
    _openmetrics: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        if self.node_labels is None:
            self.node_labels = list(self.ingest.node_labels)
        self._ignore_re = re.compile(self.node_label_ignore) if self.node_label_ignore else None

    @classmethod
    def for_settings(cls, settings: Settings, **kw: Any) -> ExpositionReader:
        """A reader with the node labels, the ignore pattern and the grouping tolerance of
        ``exporters.prometheus``."""
        p = settings.exporters.prometheus
        args: dict[str, Any] = {"node_labels": node_labels_of(settings), "node_label_ignore": p.node_label_ignore,
                                "group_tolerance_s": p.group_tolerance_ms / 1000.0}
        return cls(settings.ingest, **{**args, **kw})

    def node_of(self, labels: Mapping[str, str]) -> str | None:
        ignore = self._ignore_re
        for key in self.node_labels or ():
            value = labels.get(key)
            if not value:
                continue
            if key == "instance":
                value = _host_of(value)
                if not value:
                    continue
            if ignore is not None and ignore.search(value):
                continue
            return value
        return None

    def read(
        self, lines: Iterable[str], default_ts: float | None = None, flush_lag_s: float = 120.0,
        extra_labels: Mapping[str, str] | None = None,
    ) -> Iterator[r.GpuTelemetry | r.PortTelemetry]:
        """Records per node and scrape from exposition text.

        Input is expected roughly in time order (scrapes appended to a file): groups older than
        ``flush_lag_s`` behind the newest sample are emitted as reading goes on, so memory stays
        bounded; samples arriving later than that for an emitted group are counted as skipped."""
        return self.read_samples(self.parse(lines, default_ts, extra_labels), flush_lag_s)

    # --- lines -> samples -------------------------------------------------------------------

    def parse(self, lines: Iterable[str], default_ts: float | None = None,
              extra_labels: Mapping[str, str] | None = None, openmetrics: bool = False,
              default_node: str = "") -> Iterator[Sample]:
        """Samples of the series fleetmedic reads; bad lines counted in :attr:`skipped` (a line
        never raises). ``extra_labels`` are added to every sample as Prometheus adds its target
        labels (a label the exporter also wrote is kept as ``exported_<name>``). ``default_node``
        names the node of a sample whose labels name none (a raw node-exporter scrape: the target
        it came from is known only from where it was saved). ``openmetrics``:
        the input is known to be OpenMetrics (integer timestamps are seconds from the first line;
        otherwise that is known from a ``# UNIT``, ``# EOF``, OpenMetrics-only ``# TYPE`` or a
        float timestamp on)."""
        self._openmetrics = openmetrics
        merged: dict[int, tuple[dict[str, str], dict[str, str]]] = {}
        for line in lines:
            if len(line) > MAX_LINE_CHARS:  # before anything copies or matches it
                count(self.skipped, f"line longer than {MAX_LINE_CHARS} characters")
                continue
            line = line.strip()
            if not line:
                continue
            if line[0] == "#":
                if line.startswith(("# EOF", "# UNIT ")) or (
                        line.startswith("# TYPE ") and line.endswith(_OM_ONLY_TYPES)):
                    self._openmetrics = True
                continue
            try:
                sample = self._sample(line, default_ts)
            except _Skip as skip:
                count(self.skipped, str(skip))
                continue
            except Exception as exc:  # a bug, not the input's fault: the line is lost, not the rest
                count(self.skipped, f"line failed: {type(exc).__name__}")
                continue
            if sample is None:
                continue
            if extra_labels or default_node:
                labels = sample[1]
                hit = merged.get(id(labels))
                if hit is None or hit[0] is not labels:
                    if len(merged) > 100_000:
                        merged.clear()
                    # the entry holds the original too, so its id cannot be reused while cached
                    hit = merged[id(labels)] = (labels, self._relabelled(labels, extra_labels, default_node))
                sample = (sample[0], hit[1], sample[2], sample[3])
            yield sample

    def _relabelled(self, labels: dict[str, str], extra_labels: Mapping[str, str] | None,
                    default_node: str) -> dict[str, str]:
        """``labels`` with the target labels added, and ``default_node`` as its node when none names one."""
        out = _with_target_labels(labels, extra_labels) if extra_labels else labels
        if default_node and self.node_labels and self.node_of(out) is None:
            out = {**out, self.node_labels[0]: default_node}
        return out

    def _sample(self, line: str, default_ts: float | None) -> Sample | None:
        if line[0] == "{":  # promtool tsdb dump: {__name__="x", a="b"} value ts
            labels, rest = self._label_set(line, 0, "")
            name = labels.get("__name__", "")
            if not name:
                raise _Skip("unparsable line")
            # __name__ stays in the (cached) label set: nothing reads it
        else:
            m = _NAME.match(line)
            if m is None:
                raise _Skip("unparsable line")
            name, end = m.group(), m.end()
            if end < len(line) and line[end] == "{":
                labels, rest = self._label_set(line, end, name)
            else:
                labels, rest = _EMPTY, line[end:]
                if rest and not rest[0].isspace():
                    raise _Skip("unparsable line")
        tokens = rest.split()
        if "#" in tokens:  # an OpenMetrics exemplar: ignored
            tokens = tokens[: tokens.index("#")]
        if not tokens or len(tokens) > 2 or (len(tokens) == 2 and tokens[1][0] not in "-0123456789"):
            raise _Skip("unparsable line")
        known = known_name(name)
        if known is not None:
            name = known
        elif not self.keep_all:
            if name.endswith("_created"):  # OpenMetrics counter creation times: not telemetry
                return None
            if not self.ignore_unknown:
                raise _Skip(f"unknown series {name}")
            if name.startswith(_OUR_PREFIXES):
                count(self.ignored, name)
            else:
                self.ignored["other series"] += 1
            return None
        value = number(tokens[0])
        if value is None:
            raise _Skip(f"{name}: value is not a number")
        if not math.isfinite(value):
            raise _Skip(f"{name}: value is {'NaN' if math.isnan(value) else 'infinite'}")
        ts: float | None
        if len(tokens) == 2:
            ts = self._timestamp(name, tokens[1])
        else:
            ts = default_ts
            self.samples_without_ts += 1
        return name, labels, value, ts

    def _timestamp(self, name: str, text: str) -> float:
        digits = text.lstrip("-")
        if len(digits) > MAX_TS_DIGITS:
            if "." in text and len(digits.split(".", 1)[0]) <= MAX_TS_DIGITS:
                text = text[: MAX_TS_DIGITS + 8]  # sub-microsecond digits of float seconds: dropped
            else:
                raise _Skip(f"{name}: timestamp has more than {MAX_TS_DIGITS} digits")
        if text.isascii() and (text.isdigit() or (text[0] == "-" and text[1:].isdigit())):
            if self._openmetrics:
                return float(int(text))
            ms = int(text)
            if seconds_as_ms(ms):
                raise _Skip(f"{name}: {SECONDS_AS_MS_REASON}")
            return ms / 1000.0
        try:
            ts = float(text)  # float seconds: OpenMetrics
        except ValueError:
            raise _Skip(f"{name}: timestamp is not a number") from None
        self._openmetrics = True
        return ts

    def _label_set(self, line: str, start: int, name: str) -> tuple[dict[str, str], str]:
        """The label set opening at ``line[start]`` (``{``) and the rest of the line after its
        ``}``. Exporters repeat the same sets every series and scrape, so they are cached (callers
        must not modify the dict). Raises :class:`_Skip` for a malformed set or a value longer
        than :data:`MAX_LABEL_VALUE_CHARS`."""
        close = line.find("}", start + 1)
        if close > 0:
            cached = self._label_cache.get(line[start + 1 : close])
            if cached is not None:
                return cached, line[close + 1 :]
        what = name or "promtool dump line"
        got: dict[str, str] = {}
        pos = start + 1
        while True:
            while pos < len(line) and line[pos] in " \t":
                pos += 1
            if pos >= len(line):
                raise _Skip(f"{what}: malformed labels")
            if line[pos] == "}":
                break
            m = _LABEL.match(line, pos)
            if m is None:
                raise _Skip(f"{what}: malformed labels")
            key, value = m.groups()
            if len(value) > MAX_LABEL_VALUE_CHARS:
                raise _Skip(f"{what}: label {key[:64]} longer than {MAX_LABEL_VALUE_CHARS} characters")
            got[key] = _ESCAPE.sub(_unescape, value) if "\\" in value else value
            pos = m.end()
        text = line[start + 1 : pos]
        if len(text) <= _LABEL_CACHE_TEXT and "}" not in text:
            if len(self._label_cache) >= _LABEL_CACHE_ENTRIES or self._label_cache_chars > _LABEL_CACHE_CHARS:
                self._label_cache.clear()
                self._label_cache_chars = 0
            self._label_cache[text] = got
            self._label_cache_chars += len(text)
        return got, line[pos + 1 :]

    # --- samples -> records -----------------------------------------------------------------

    def read_samples(
        self, samples: Iterable[Sample], flush_lag_s: float = 120.0
    ) -> Iterator[r.GpuTelemetry | r.PortTelemetry]:
        """Records per node and scrape from samples (parsed text, or a Prometheus API answer)."""
        groups: dict[tuple[str, bool], list[_Group]] = {}  # (node, is GPU) -> open groups, oldest first
        tol = max(0.0, self.group_tolerance_s)
        newest, flushed_before = float("-inf"), float("-inf")
        skipped = self.skipped
        # what a series' name and labels say (node, GPU or port, target field...), worked out once per
        # series: exporters and range queries repeat the same label set object sample after sample
        seen: SeriesCache = {}
        for n, (raw_name, labels, value, ts) in enumerate(samples, 1):
            if n % 20_000 == 0 and newest - flush_lag_s > flushed_before:
                flushed_before = newest - flush_lag_s
                yield from self._flush(groups, before=flushed_before)
            key = (raw_name, id(labels))
            series = seen.get(key)
            if series is None or series.labels is not labels:
                if len(seen) >= _LABEL_CACHE_ENTRIES:
                    seen.clear()
                series = seen[key] = self._series(raw_name, labels)
            name = series.name
            if name is None:
                if not self.ignore_unknown:
                    count(skipped, f"unknown series {raw_name}")
                continue
            if ts is None:
                count(skipped, f"{name}: no timestamp")
                continue
            if not TS_MIN <= ts <= TS_MAX:  # also NaN; a far-future one would make every other sample "old"
                count(skipped, f"{name}: timestamp out of range")
                continue
            if ts < flushed_before:
                count(skipped, f"{name}: sample older than {flush_lag_s:g} s behind the newest")
                continue
            if ts > newest:
                newest = ts
            if series.problem:
                count(skipped, series.problem)
                continue
            self._put(_group_for(groups, (series.node, series.index >= 0), ts, tol), series, value)
        yield from self._flush(groups, before=float("inf"))

    def read_columns(self, columns: Iterable[Column]) -> Iterator[r.GpuTelemetry | r.PortTelemetry]:
        """Records from whole series, each ``(name, labels, [(timestamp, value), ...])`` with its
        points checked (finite, in range) by the caller: a range query's matrix. The same mapping
        as :meth:`read_samples`, but the points of one node at the same timestamp are one scrape
        (a range query evaluates every series at the same step times), so there is nothing to sort
        and no sample tuple per point. All records come at the end, in time order."""
        by_key: dict[tuple[str, bool, float], _Group] = {}
        skipped = self.skipped
        for raw_name, labels, points in columns:
            series = self._series(raw_name, labels)
            if series.name is None:
                if not self.ignore_unknown and points:
                    count(skipped, f"unknown series {raw_name}", len(points))
                continue
            if series.problem:
                if points:
                    count(skipped, series.problem, len(points))
                continue
            node, is_gpu = series.node, series.index >= 0
            if is_gpu and series.xid < 0:  # most series: _put's GPU branch, inline
                index, target, uuid = series.index, series.target, series.uuid
                uuid_key, sku, driver = f"uuid{index}", series.sku, series.driver
                for ts, value in points:
                    g = by_key.get((node, True, ts))
                    if g is None:
                        g = by_key[(node, True, ts)] = _Group(anchor=ts, ts=ts)
                    g.gpu[index][target] = value
                    info = g.meta
                    if "sku" not in info:
                        info["sku"], info["driver"] = sku, driver
                    if uuid:
                        info[uuid_key] = uuid
                continue
            put = self._put
            for ts, value in points:
                g = by_key.get((node, is_gpu, ts))
                if g is None:
                    g = by_key[(node, is_gpu, ts)] = _Group(anchor=ts, ts=ts)
                put(g, series, value)
        groups: dict[tuple[str, bool], list[_Group]] = {}
        for (node, is_gpu, _), g in by_key.items():
            groups.setdefault((node, is_gpu), []).append(g)
        yield from self._flush(groups, before=math.inf)

    @staticmethod
    def _put(g: _Group, series: _Series, value: float) -> None:
        """One sample's value into its scrape's group."""
        if series.index >= 0:
            index = series.index
            if series.xid >= 0:
                g.xid_counts[index][series.xid] = value
                g.gpu.setdefault(index, {})  # the GPU is in the record even when it reports nothing else
            else:
                g.gpu[index][series.target] = value
            info = g.meta
            if "sku" not in info:
                info["sku"], info["driver"] = series.sku, series.driver
            if series.uuid:
                info[f"uuid{index}"] = series.uuid
        else:
            slot = g.ports[series.port]
            target = series.target
            name = series.name
            assert name is not None
            if name in _IB_LEGACY:
                slot.setdefault(target, value / 4)  # the 64-bit counter wins when present
            elif target == "speed_gbps":
                slot[target] = value * 8 / 1e9
            elif name.endswith("_bytes_total"):
                slot[target] = value / 4  # PortSample counts 4-byte words, as IB does
            else:
                slot[target] = value

    def _series(self, raw_name: str, labels: Mapping[str, str]) -> _Series:
        """What one series' name and labels say, or why its samples cannot be used."""
        name = known_name(raw_name)
        if name is None:
            return _Series(labels)
        node = self.node_of(labels)
        if node is None:
            return _Series(labels, name, problem=f"{name}: no node label ({', '.join(self.node_labels or ())})")
        if name not in _GPU_SERIES:
            port = f"{labels.get(self.ingest.port_device_label, '?')}/{labels.get(self.ingest.port_label, '?')}"
            target = {_IB_STATE: "_state", _IB_PHYS: "_phys", _IB_RATE: "speed_gbps"}.get(name) or (
                _IB_LEGACY.get(name) or NODE_EXPORTER_IB[name])
            return _Series(labels, name, node, port=port, target=target)
        gpu_label = self.ingest.gpu_label
        gpu_text = labels.get(gpu_label, "")
        index = ascii_index(gpu_text)
        if index is None or index > 255:
            return _Series(labels, name, node, problem=f"{name}: no {gpu_label} label" if not gpu_text
                           else f"{name}: {gpu_label} label is not a GPU index")
        xid = -1
        if name == XID_COUNT_SERIES:
            got_xid = ascii_index(labels.get("xid", "0") or "0", 6)
            if got_xid is None:
                return _Series(labels, name, node, problem=f"{name}: xid label is not an XID")
            xid = got_xid
        return _Series(labels, name, node, index=index, xid=xid, target=DCGM_TO_METRIC.get(name, ""),
                       sku=labels.get("modelName", ""), driver=labels.get("DCGM_FI_DRIVER_VERSION", ""),
                       uuid=labels.get("UUID") or labels.get("uuid") or "")

    def _flush(self, groups: dict[tuple[str, bool], list[_Group]], before: float
               ) -> Iterator[r.GpuTelemetry | r.PortTelemetry]:
        due: list[tuple[float, str, bool, _Group]] = []
        for key in list(groups):
            keep = []
            for g in groups[key]:
                if g.ts < before:
                    due.append((g.ts, key[0], key[1], g))
                else:
                    keep.append(g)
            if keep:
                groups[key] = keep
            else:
                del groups[key]
        due.sort(key=lambda d: (d[0], d[1], not d[2]))
        for ts, node, is_gpu, g in due:
            if is_gpu:
                for index, counts in g.xid_counts.items():
                    if "xid_errors" not in g.gpu[index]:
                        active = [x for x, c in counts.items() if c > 0 and x > 0]
                        g.gpu[index]["xid_errors"] = float(max(active)) if active else 0.0
                rec = self.gpu_record((node, ts), g.gpu, g.meta)
                if rec is not None:
                    yield rec
            else:
                rec_p = self.port_record((node, ts), g.ports)
                if rec_p is not None:
                    yield rec_p

    def _checked(self, field_name: str, v: float, bounds: tuple[bool, float, float], series: str
                 ) -> float | int | None:
        """``v`` as the record field takes it, or None (counted) when it is a DCGM blank or out of
        the field's range: the value is dropped, the record kept."""
        checked, reason = _verdict(v, bounds)
        if reason:
            count(self.skipped, f"{series}: {reason}")
        return checked

    def gpu_record(
        self, key: tuple[str, float], by_gpu: dict[int, dict[str, float]], info: dict[str, str]
    ) -> r.GpuTelemetry | None:
        node, ts = key
        gpus = sorted(by_gpu)
        per_gpu = [by_gpu[g] for g in gpus]
        columns: dict[str, list[float | int | None]]
        if _native_common_columns is not None:  # the common columns in C; the rest below, the same way
            columns, rest = _native_common_columns(per_gpu, _GPU_CHECKS)
            if len(rest) > 1:  # reasons are counted in the fields' order, as below
                rest.sort(key=_GPU_ORDER.__getitem__)
        else:
            columns, present = {}, set().union(*per_gpu)
            rest = [metric for metric in r.GPU_METRICS if metric in present]
        for metric in rest:
            raw: list[float | None] = list(map(dict.get, per_gpu, repeat(metric)))  # None where a GPU did not report it
            integral, lo, top, series = _GPU_CHECKS[metric]
            if None not in raw and all(lo <= v <= top for v in raw):  # type: ignore[operator]
                # the common case (min/max would let a NaN after the first value through to int())
                columns[metric] = list(map(int, raw)) if integral else raw  # type: ignore[arg-type]
                continue
            bad = [v for v in raw if v is not None and not lo <= v <= top]
            col: list[float | int | None] = [
                None if v is None or not lo <= v <= top else int(v) if integral else v for v in raw]
            blank = sum(1 for v in bad if v >= DCGM_INT64_BLANK or (not integral and v >= DCGM_FP64_BLANK))
            # counted as _checked counts them, once per column (the first reason met first)
            reasons = [(f"{series}: DCGM blank value (not supported by the GPU)", blank),
                       (f"{series}: value out of range", len(bad) - blank)]
            if bad and _verdict(bad[0], _GPU_BOUNDS.get(metric, _UNBOUNDED))[1] != _BLANK:
                reasons.reverse()
            for reason, k in reasons:
                if k:
                    count(self.skipped, reason, k)
            if any(v is not None for v in col):
                columns[metric] = col
        if not columns:  # every value was bad: nothing to say about this node (the reasons are counted)
            return None
        uuid_keys = [_UUID_KEYS[g] if g < len(_UUID_KEYS) else f"uuid{g}" for g in gpus]
        doc = {
            "node": node,
            "ts": ts,
            "gpus": gpus,
            "metrics": columns,
            "sku": info.get("sku", ""),
            "driver_version": info.get("driver", ""),
            "source": self.source,
            "uuids": [info.get(k, "") for k in uuid_keys] if any(k in info for k in uuid_keys) else [],
        }
        try:
            return r.convert(r.GpuTelemetry, doc)
        except r.InvalidRecord as exc:
            count(self.skipped, f"GpuTelemetry {exc.path}: {exc.reason}")
            return None

    def port_record(
        self, key: tuple[str, float], by_port: dict[str, dict[str, float | str]]
    ) -> r.PortTelemetry | None:
        node, ts = key
        samples = []
        for port, fields in sorted(by_port.items()):
            doc: dict[str, Any] = {"port": port, "node": node}
            state, phys = fields.get("_state"), fields.get("_phys")
            if state is not None or phys is not None:
                doc["link_state"] = _link_state(state, phys)
            for k, v in fields.items():
                if k.startswith("_"):
                    continue
                if k == "link_state" or isinstance(v, str):
                    doc[k] = v
                    continue
                bounds = _PORT_BOUNDS.get(k, (k in _INT_FIELDS, 0.0, math.inf))
                checked = self._checked(k, v, bounds, f"port {k}")
                if checked is not None:
                    doc[k] = checked
            samples.append(doc)
        try:
            return r.convert(
                r.PortTelemetry,
                {"device": node, "device_kind": "host", "ts": ts, "ports": samples, "source": self.source},
            )
        except r.InvalidRecord as exc:
            count(self.skipped, f"PortTelemetry {exc.path}: {exc.reason}")
            return None


_UNBOUNDED: Final = (False, -math.inf, math.inf)
#: the DCGM blank a float field's value must be under
_FLOAT_BLANK: Final = min(DCGM_INT64_BLANK, DCGM_FP64_BLANK)
_UUID_KEYS: Final = [f"uuid{g}" for g in range(256)]
_BLANK: Final = "DCGM blank value (not supported by the GPU)"
#: metric -> (integral, lowest, highest value kept: the field's highest, under the DCGM blanks, series)
_GPU_CHECKS: Final = {
    m: (integral, lo, min(hi, math.nextafter(DCGM_INT64_BLANK if integral else _FLOAT_BLANK, -math.inf)),
        r.DCGM_NAMES[m])
    for m, (integral, lo, hi) in ((m, _GPU_BOUNDS.get(m, _UNBOUNDED)) for m in r.GPU_METRICS)}
_GPU_ORDER: Final = {m: k for k, m in enumerate(r.GPU_METRICS)}


def _verdict(v: float, bounds: tuple[bool, float, float]) -> tuple[float | int | None, str]:
    """``v`` as a record field with ``bounds`` takes it and "", or None and why not (a DCGM blank,
    out of range): the value is dropped, the record kept."""
    integral, lo, hi = bounds
    if v >= DCGM_INT64_BLANK or (not integral and v >= DCGM_FP64_BLANK):
        return None, _BLANK
    if not lo <= v <= hi:
        return None, "value out of range"
    return (int(v) if integral else v), ""


def _group_for(groups: dict[tuple[str, bool], list[_Group]], key: tuple[str, bool], ts: float, tol: float) -> _Group:
    """The open group of ``key`` that ``ts`` belongs to (within ``tol`` of its first sample), or a new one."""
    lst = groups.get(key)
    if lst is None:
        g = _Group(anchor=ts, ts=ts)
        groups[key] = [g]
        return g
    for g in reversed(lst):  # the newest first: input comes roughly in time order
        if abs(ts - g.anchor) <= tol:
            if ts < g.ts:
                g.ts = ts
            return g
    g = _Group(anchor=ts, ts=ts)
    lst.append(g)
    return g


def _link_state(state: float | str | None, phys: float | str | None) -> str:
    """A port's link state from node-exporter's logical and physical state ids."""
    if isinstance(phys, float) and int(phys) != _PHYS_LINK_UP:
        return "down"  # no physical link: whatever the logical state says
    if isinstance(state, float):
        return _STATE.get(int(state), "unknown")
    return "up" if isinstance(phys, float) else "unknown"


def _host_of(instance: str) -> str:
    """``instance`` without its port: ``gpu-node-1:9100`` -> ``gpu-node-1``, ``[fd00::1]:9100`` -> ``fd00::1``."""
    if instance.startswith("["):
        end = instance.find("]")
        return instance[1:end] if end > 0 else instance
    host, sep, port = instance.rpartition(":")
    if sep and port.isdigit() and ":" not in host:
        return host
    return instance


def _with_target_labels(labels: Mapping[str, str], target: Mapping[str, str]) -> dict[str, str]:
    """``labels`` with Prometheus's target labels added (``honor_labels: false``): an exporter's
    label of the same name is kept as ``exported_<name>``."""
    out = dict(labels)
    for k, v in target.items():
        if k in out and out[k] != v:
            out[f"exported_{k}"] = out[k]
        out[k] = v
    return out
