"""Prometheus text exposition (dcgm-exporter, node-exporter) -> fleetmedic records.

Reads samples as dcgm-exporter and node-exporter write them, with or without sample timestamps
(milliseconds), and groups them per node and timestamp into
:class:`~fleetmedic.records.GpuTelemetry` (``DCGM_FI_*`` series, GPU from the ``gpu`` label) and
:class:`~fleetmedic.records.PortTelemetry` (``node_infiniband_*`` series, port from the ``device``
and ``port`` labels). The node comes from the first label in ``ingest.node_labels`` that a sample
has (``Hostname``, ``node``, ``instance`` with its ``:port`` removed).

Lines that cannot be parsed, unknown series and values out of range are skipped and counted per
reason (:attr:`ExpositionReader.skipped`); a bad line never stops the rest. Lengths are capped before
any regex or number conversion (:data:`MAX_LINE_CHARS`, :data:`MAX_LABEL_VALUE_CHARS`,
:data:`MAX_VALUE_CHARS`, :data:`MAX_TS_DIGITS`), so a hostile line costs bounded time and memory,
and reasons never carry the offending value (a bounded set: they become metric labels). Used by
``fleetmedic backtest`` and by the Prometheus ingest connector.

The caps and :func:`count` are shared by the other connectors' parsers.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final

from fleetmedic import records as r
from fleetmedic.config import IngestSettings

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

_LINE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+(?P<ts>-?[0-9]+))?\s*$"
)
# one label at a time, anchored where the previous one ended; possessive, so it never backtracks
# (the former `(?:[^"\\]|\\.)*` took ~170 bytes of regex stack per input byte)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]++|\\.)*+)"\s*(?:,|$)')
_ESCAPE = re.compile(r"\\(.)")
_LABEL_CACHE_ENTRIES, _LABEL_CACHE_CHARS, _LABEL_CACHE_TEXT = 200_000, 16_000_000, 2048


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
DCGM_TO_METRIC["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"] = "clocks_event_reasons"  # older dcgm-exporters

#: node-exporter's infiniband collector -> PortSample field
NODE_EXPORTER_IB: dict[str, str] = {
    "node_infiniband_symbol_error_total": "symbol_error_counter",
    "node_infiniband_link_error_recovery_total": "link_error_recovery_counter",
    "node_infiniband_link_downed_total": "link_downed_counter",
    "node_infiniband_port_errors_received_total": "port_rcv_errors",
    "node_infiniband_port_receive_remote_physical_errors_total": "port_rcv_remote_physical_errors",
    "node_infiniband_port_transmit_discards_total": "port_xmit_discards",
    "node_infiniband_local_link_integrity_errors_total": "local_link_integrity_errors",
    "node_infiniband_excessive_buffer_overrun_errors_total": "excessive_buffer_overrun_errors",
    "node_infiniband_port_transmit_wait_total": "port_xmit_wait",
    "node_infiniband_port_data_transmitted_bytes_total": "port_xmit_data",
    "node_infiniband_port_data_received_bytes_total": "port_rcv_data",
}
_INT_FIELDS = {
    f for f in r.PortSample.__struct_fields__ if f.endswith(("counter", "errors", "discards", "wait", "data"))
}
_PORT_SERIES = {*NODE_EXPORTER_IB, "node_infiniband_state_id", "node_infiniband_rate_bytes_per_second"}
# node-exporter's infiniband state ids: 4 = ACTIVE; physical 5 = LinkUp
_STATE = {"4": "up", "1": "down", "2": "init", "3": "init"}


#: one sample: series name, labels, value, timestamp (Unix seconds; None = not given)
Sample = tuple[str, dict[str, str], float, float | None]


def is_known_series(name: str) -> bool:
    return name in DCGM_TO_METRIC or name in _PORT_SERIES


@dataclass
class ExpositionReader:
    """Maps dcgm-exporter / node-exporter samples to records. ``ignore_unknown`` leaves series
    fleetmedic does not read out of :attr:`skipped` (a whole node-exporter scrape is mostly those);
    ``source`` is written into the records."""

    ingest: IngestSettings
    skipped: Counter[str] = field(default_factory=Counter)
    source: str = "prometheus"
    ignore_unknown: bool = False
    _label_cache: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)
    _label_cache_chars: int = field(default=0, repr=False)

    def node_of(self, labels: dict[str, str]) -> str | None:
        for key in self.ingest.node_labels:
            value = labels.get(key)
            if value:
                return value.rsplit(":", 1)[0] if key == "instance" else value
        return None

    def read(
        self, lines: Iterable[str], default_ts: float | None = None, flush_lag_s: float = 120.0
    ) -> Iterator[r.GpuTelemetry | r.PortTelemetry]:
        """Records per (node, timestamp) from exposition text.

        Input is expected roughly in time order (scrapes appended to a file): groups older than
        ``flush_lag_s`` behind the newest sample are emitted as reading goes on, so memory stays
        bounded; samples arriving later than that for an emitted group are counted as skipped."""
        return self.read_samples(self.parse(lines, default_ts), flush_lag_s)

    def parse(self, lines: Iterable[str], default_ts: float | None = None) -> Iterator[Sample]:
        """Samples of the series fleetmedic reads; bad lines counted in :attr:`skipped` (a line
        never raises)."""
        for line in lines:
            if len(line) > MAX_LINE_CHARS:  # before anything copies or matches it
                count(self.skipped, f"line longer than {MAX_LINE_CHARS} characters")
                continue
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                sample = self._sample(line, default_ts)
            except _Skip as skip:
                count(self.skipped, str(skip))
                continue
            except Exception as exc:  # a bug, not the input's fault: the line is lost, not the rest
                count(self.skipped, f"line failed: {type(exc).__name__}")
                continue
            if sample is not None:
                yield sample

    def _sample(self, line: str, default_ts: float | None) -> Sample | None:
        m = _LINE.match(line)
        if m is None:
            raise _Skip("unparsable line")
        name, value_text = m.group("name"), m.group("value")
        if not is_known_series(name):
            if not self.ignore_unknown:
                raise _Skip(f"unknown series {name}")
            return None
        value = number(value_text)
        if value is None:
            raise _Skip(f"{name}: value is not a number")
        if not math.isfinite(value):
            raise _Skip(f"{name}: value is {'NaN' if math.isnan(value) else 'infinite'}")
        ts_text = m.group("ts")
        ts = default_ts
        if ts_text:
            if len(ts_text.lstrip("-")) > MAX_TS_DIGITS:
                raise _Skip(f"{name}: timestamp has more than {MAX_TS_DIGITS} digits")
            ts = int(ts_text) / 1000.0
        return name, self._labels(name, m.group("labels") or ""), value, ts

    def _labels(self, name: str, text: str) -> dict[str, str]:
        """Parsed label set; exporters repeat the same sets every series and scrape, so they are
        cached (callers must not modify the dict). Raises :class:`_Skip` for a malformed set or
        a value longer than :data:`MAX_LABEL_VALUE_CHARS`."""
        got = self._label_cache.get(text)
        if got is None:
            got = {}
            pos, end = 0, len(text.rstrip())
            while pos < end:
                m = _LABEL.match(text, pos)
                if m is None:
                    raise _Skip(f"{name}: malformed labels")
                key, value = m.groups()
                if len(value) > MAX_LABEL_VALUE_CHARS:
                    raise _Skip(f"{name}: label {key[:64]} longer than {MAX_LABEL_VALUE_CHARS} characters")
                got[key] = _ESCAPE.sub(_unescape, value) if "\\" in value else value
                pos = m.end()
            if len(text) <= _LABEL_CACHE_TEXT:
                if len(self._label_cache) >= _LABEL_CACHE_ENTRIES or self._label_cache_chars > _LABEL_CACHE_CHARS:
                    self._label_cache.clear()
                    self._label_cache_chars = 0
                self._label_cache[text] = got
                self._label_cache_chars += len(text)
        return got

    def read_samples(
        self, samples: Iterable[Sample], flush_lag_s: float = 120.0
    ) -> Iterator[r.GpuTelemetry | r.PortTelemetry]:
        """Records per (node, timestamp) from samples (parsed text, or a Prometheus API answer)."""
        gpu: dict[tuple[str, float], dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
        meta: dict[tuple[str, float], dict[str, str]] = {}
        ports: dict[tuple[str, float], dict[str, dict[str, float | str]]] = defaultdict(lambda: defaultdict(dict))
        newest, flushed_before = float("-inf"), float("-inf")
        device_label, port_label = self.ingest.port_device_label, self.ingest.port_label
        skipped = self.skipped
        for n, (name, labels, value, ts) in enumerate(samples, 1):
            if n % 20_000 == 0 and newest - flush_lag_s > flushed_before:
                flushed_before = newest - flush_lag_s
                yield from self._flush(gpu, meta, ports, before=flushed_before)
            if not is_known_series(name):
                if not self.ignore_unknown:
                    count(skipped, f"unknown series {name}")
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
            newest = max(newest, ts)
            node = self.node_of(labels)
            if node is None:
                count(skipped, f"{name}: no node label ({', '.join(self.ingest.node_labels)})")
                continue
            if name in DCGM_TO_METRIC:
                gpu_label = labels.get(self.ingest.gpu_label, "")
                index = ascii_index(gpu_label)
                if index is None or index > 255:
                    count(skipped, f"{name}: no {self.ingest.gpu_label} label" if not gpu_label
                          else f"{name}: {self.ingest.gpu_label} label is not a GPU index")
                    continue
                gpu[(node, ts)][index][DCGM_TO_METRIC[name]] = value
                info = meta.setdefault((node, ts), {})
                info.setdefault("sku", labels.get("modelName", ""))
                info.setdefault("driver", labels.get("DCGM_FI_DRIVER_VERSION", ""))
                if labels.get("UUID"):
                    info[f"uuid{index}"] = labels["UUID"]
            else:
                port = f"{labels.get(device_label, '?')}/{labels.get(port_label, '?')}"
                slot = ports[(node, ts)][port]
                if name == "node_infiniband_state_id":
                    slot["link_state"] = _STATE.get(str(int(value)), "unknown")
                elif name == "node_infiniband_rate_bytes_per_second":
                    slot["speed_gbps"] = value * 8 / 1e9
                elif name.endswith("_bytes_total"):
                    slot[NODE_EXPORTER_IB[name]] = value / 4  # PortSample counts 4-byte words, as IB does
                else:
                    slot[NODE_EXPORTER_IB[name]] = value
        yield from self._flush(gpu, meta, ports, before=float("inf"))

    def _flush(
        self,
        gpu: dict[tuple[str, float], dict[int, dict[str, float]]],
        meta: dict[tuple[str, float], dict[str, str]],
        ports: dict[tuple[str, float], dict[str, dict[str, float | str]]],
        before: float,
    ) -> Iterator[r.GpuTelemetry | r.PortTelemetry]:
        keys = sorted((k for k in set(gpu) | set(ports) if k[1] < before), key=lambda k: (k[1], k[0]))
        for key in keys:
            if key in gpu:
                rec = self.gpu_record(key, gpu.pop(key), meta.pop(key, {}))
                if rec is not None:
                    yield rec
            if key in ports:
                rec_p = self.port_record(key, ports.pop(key))
                if rec_p is not None:
                    yield rec_p

    def gpu_record(
        self, key: tuple[str, float], by_gpu: dict[int, dict[str, float]], info: dict[str, str]
    ) -> r.GpuTelemetry | None:
        node, ts = key
        gpus = sorted(by_gpu)
        columns: dict[str, list[float | int | None]] = {}
        for metric in r.GPU_METRICS:
            if any(metric in by_gpu[g] for g in gpus):
                col = [by_gpu[g].get(metric) for g in gpus]
                integral = (
                    metric in r.COUNTER_METRICS
                    or metric in r.PERSISTENT_COUNT_METRICS
                    or metric
                    in ("clocks_event_reasons", "xid_errors", "pcie_link_gen", "pcie_link_width", "nvlink_links_down")
                )
                columns[metric] = [int(v) if (integral and v is not None) else v for v in col]
        doc = {
            "node": node,
            "ts": ts,
            "gpus": gpus,
            "metrics": columns,
            "sku": info.get("sku", ""),
            "driver_version": info.get("driver", ""),
            "source": self.source,
            "uuids": [info.get(f"uuid{g}", "") for g in gpus] if any(f"uuid{g}" in info for g in gpus) else [],
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
            doc = {k: (int(v) if k in _INT_FIELDS and isinstance(v, float) else v) for k, v in fields.items()}
            samples.append({"port": port, "node": node, **doc})
        try:
            return r.convert(
                r.PortTelemetry,
                {"device": node, "device_kind": "host", "ts": ts, "ports": samples, "source": self.source},
            )
        except r.InvalidRecord as exc:
            count(self.skipped, f"PortTelemetry {exc.path}: {exc.reason}")
            return None
