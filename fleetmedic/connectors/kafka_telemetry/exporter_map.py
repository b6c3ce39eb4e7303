"""Pure mapping for the Kafka telemetry connector: Telegraf / prometheus-kafka-adapter JSON -> points
-> per-node window records (see :mod:`fleetmedic.connectors.kafka_telemetry.exporter` for the behaviour).

:meth:`PointMapper.points` raises :class:`BadMessage` and nothing else, whatever the bytes: sizes,
value lengths and digit counts are checked before any conversion (as in
:mod:`fleetmedic.connectors.prometheus.text`), and timestamps must be in the records' range.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec

from fleetmedic import records as r
from fleetmedic.config import IngestSettings, KafkaTelemetrySettings
from fleetmedic.connectors.prometheus.text import (
    _IB_LEGACY,
    DCGM_TO_METRIC,
    MAX_VALUE_CHARS,
    NODE_EXPORTER_IB,
    TS_MAX,
    TS_MIN,
    ExpositionReader,
    ascii_index,
)

#: the port targets holding node-exporter's logical and physical state ids (not PortSample fields:
#: :meth:`ExpositionReader.port_record` makes ``link_state`` of them) and the legacy counters' prefix
STATE_ID, PHYSICAL_STATE_ID, LEGACY_PREFIX = "_state", "_phys", "_legacy."

_TELEGRAF_NVIDIA_SMI = {
    "temperature_gpu": "gpu_temp", "power_draw": "power_usage", "clocks_current_sm": "sm_clock",
    "clocks_current_memory": "mem_clock", "utilization_gpu": "gpu_util", "utilization_memory": "mem_copy_util",
    "memory_used": "fb_used", "memory_free": "fb_free", "pcie_link_gen_current": "pcie_link_gen",
    "pcie_link_width_current": "pcie_link_width",
}
_TELEGRAF_INFINIBAND = {  # sysfs counter names; data counters are 4-byte words there, as in PortSample
    "symbol_error": "symbol_error_counter", "link_error_recovery": "link_error_recovery_counter",
    "link_downed": "link_downed_counter", "port_rcv_errors": "port_rcv_errors",
    "port_rcv_remote_physical_errors": "port_rcv_remote_physical_errors", "port_xmit_discards": "port_xmit_discards",
    "local_link_integrity_errors": "local_link_integrity_errors", "port_xmit_wait": "port_xmit_wait",
    "excessive_buffer_overrun_errors": "excessive_buffer_overrun_errors", "port_xmit_data": "port_xmit_data",
    "port_rcv_data": "port_rcv_data",
}
#: metric (or ``name.field``) -> GPU metric, or ``port.<PortSample field>``
BUILTIN_MAP: dict[str, str] = {
    **DCGM_TO_METRIC,
    **{name: f"port.{f}" for name, f in NODE_EXPORTER_IB.items()},
    # both state series as their raw ids: a window's port gets its link state from them as the
    # exposition reader's (ExpositionReader.port_record: physical state not LinkUp -> down)
    "node_infiniband_state_id": f"port.{STATE_ID}",
    "node_infiniband_physical_state_id": f"port.{PHYSICAL_STATE_ID}",
    # the 32-bit legacy data counters: used only where the port has no 64-bit ones (as the reader does)
    **{name: f"port.{LEGACY_PREFIX}{f}" for name, f in _IB_LEGACY.items()},
    "node_infiniband_rate_bytes_per_second": "port.speed_gbps",
    **{f"nvidia_smi.{k}": v for k, v in _TELEGRAF_NVIDIA_SMI.items()},
    **{f"infiniband.{k}": f"port.{v}" for k, v in _TELEGRAF_INFINIBAND.items()},
}
_PROM_FIELDS = ("gauge", "counter", "value", "untyped")
_STATE = {1: "down", 2: "init", 3: "init", 4: "up"}
#: the largest message read (Kafka's default limit is 1 MB; a Telegraf batch of 1,000 metrics ~300 KB)
MAX_MESSAGE_BYTES = 16 << 20
_MAX_NODE_CHARS, _MAX_PORT_PART_CHARS, _MAX_TIME_TEXT = 253, 256, 64


class BadMessage(ValueError):
    """A message that cannot be read; the text names the field and the reason, ``label`` is the
    same without the offending value (a bounded metric label)."""

    def __init__(self, text: str, label: str = "") -> None:
        super().__init__(text)
        self.label = label or text


@dataclass(frozen=True)
class Point:
    """One value: for a GPU (``gpu`` set) or a port (``port`` = ``device/port``) of ``node``."""

    node: str
    target: str
    value: float | str
    ts: float
    gpu: int | None = None
    port: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)


def _seconds(ts: Any) -> float:
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise BadMessage(f"timestamp: {_short(ts)} is not a number", "timestamp: not a number")
    if isinstance(ts, int) and not -(10**20) < ts < 10**20:  # JSON integers have any length; float() overflows
        raise BadMessage("timestamp: out of range")
    t = float(ts)
    for limit, scale in ((1e17, 1e9), (1e14, 1e6), (1e11, 1e3)):
        if t > limit:
            t /= scale
            break
    return _in_range(t)


def _in_range(t: float) -> float:
    if not TS_MIN <= t <= TS_MAX:  # also NaN
        raise BadMessage("timestamp: out of range")
    return t


def _rfc3339(ts: Any) -> float:
    if not isinstance(ts, str):
        raise BadMessage(f"timestamp: {_short(ts)} is not an RFC 3339 string", "timestamp: not an RFC 3339 string")
    if len(ts) > _MAX_TIME_TEXT:
        raise BadMessage(f"timestamp: longer than {_MAX_TIME_TEXT} characters")
    try:
        t = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError, OSError):
        raise BadMessage(f"timestamp: {ts!r} is not an RFC 3339 time", "timestamp: not an RFC 3339 time") from None
    return _in_range(t)


def _short(value: Any) -> str:
    """``repr(value)`` for a message, at most 60 characters."""
    text = repr(value) if not isinstance(value, dict | list) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


class PointMapper:
    """Pure: a decoded message -> points, by the mapping and tag names in the settings."""

    def __init__(self, cfg: KafkaTelemetrySettings) -> None:
        self.cfg = cfg
        self.mapping = {**BUILTIN_MAP, **cfg.metric_map}

    def points(self, message: bytes) -> list[Point]:
        """The points of one message; :class:`BadMessage` (only) when it cannot be read."""
        if len(message) > MAX_MESSAGE_BYTES:
            raise BadMessage(f"message longer than {MAX_MESSAGE_BYTES} bytes")
        refused = r.json_limit_error(message, MAX_MESSAGE_BYTES)
        if refused is not None:
            raise BadMessage(f"refused: {refused}", "nested too deeply")
        try:
            return self._points(message)
        except BadMessage:
            raise
        except Exception as exc:  # a mapping bug must cost this message, not the consumer
            name = type(exc).__name__
            raise BadMessage(f"unreadable ({name}: {str(exc)[:200]})", f"unreadable ({name})") from None

    def _points(self, message: bytes) -> list[Point]:
        try:
            doc = msgspec.json.decode(message)
        except msgspec.DecodeError as exc:
            raise BadMessage(f"not valid JSON ({exc})", "not valid JSON") from None
        if not isinstance(doc, dict):
            raise BadMessage("the message is not a JSON object")
        if self.cfg.format == "prometheus_kafka_adapter":
            return self._adapter(doc)
        metrics = doc["metrics"] if isinstance(doc.get("metrics"), list) else [doc]
        out: list[Point] = []
        for m in metrics:
            out += self._telegraf(m)
        return out

    def _telegraf(self, m: Any) -> list[Point]:
        if not isinstance(m, dict):
            raise BadMessage("metrics[]: not an object")
        name, tags, fields = m.get("name"), m.get("tags", {}), m.get("fields")
        if not isinstance(name, str) or not name:
            raise BadMessage("name: missing or not a string")
        if not isinstance(fields, dict):
            raise BadMessage(f"{name}: fields: missing or not an object", "fields: missing or not an object")
        if not isinstance(tags, dict):
            raise BadMessage(f"{name}: tags: not an object", "tags: not an object")
        ts = _seconds(m.get("timestamp"))
        out: list[Point] = []
        str_tags: dict[str, str] | None = None
        for key, value in fields.items():
            target = self.mapping.get(f"{name}.{key}") or self.mapping.get(key)
            if target is None and key in _PROM_FIELDS:
                target = self.mapping.get(name)
            if target is None:
                continue
            source = name if key in _PROM_FIELDS else key
            if str_tags is None:
                str_tags = {str(k): str(v) for k, v in tags.items()}
            out.append(self._point(source, target, value, ts, str_tags))
        return out

    def _adapter(self, doc: dict[str, Any]) -> list[Point]:
        name, labels = doc.get("name"), doc.get("labels", {})
        if not isinstance(name, str) or not name:
            raise BadMessage("name: missing or not a string")
        if not isinstance(labels, dict):
            raise BadMessage(f"{name}: labels: not an object", "labels: not an object")
        target = self.mapping.get(name)
        if target is None:
            return []
        return [self._point(name, target, doc.get("value"), _rfc3339(doc.get("timestamp")),
                            {str(k): str(v) for k, v in labels.items()})]

    def _point(self, source: str, target: str, raw: Any, ts: float, tags: dict[str, str]) -> Point:
        if isinstance(raw, str) and len(raw) > MAX_VALUE_CHARS:
            raise BadMessage(f"{source}: value longer than {MAX_VALUE_CHARS} characters")
        try:
            value = float(raw)
        except (TypeError, ValueError, OverflowError):  # OverflowError: an int too large for a float
            raise BadMessage(f"{source}: value {_short(raw)} is not a number",
                             f"{source}: value is not a number") from None
        if not math.isfinite(value):
            raise BadMessage(f"{source}: value is {'NaN' if math.isnan(value) else 'infinite'}")
        node = ""
        for t in self.cfg.node_tags:
            node = tags.get(t, "")
            if node:
                node = node.rsplit(":", 1)[0] if t == "instance" else node
                break
        if not node:
            raise BadMessage(f"{source}: no node tag ({', '.join(self.cfg.node_tags)})")
        if len(node) > _MAX_NODE_CHARS:
            raise BadMessage(f"{source}: node tag longer than {_MAX_NODE_CHARS} characters")
        if target.startswith("port."):
            device, port = tags.get(self.cfg.port_device_tag, "?"), tags.get(self.cfg.port_tag, "?")
            if len(device) > _MAX_PORT_PART_CHARS or len(port) > _MAX_PORT_PART_CHARS:
                raise BadMessage(f"{source}: port tag longer than {_MAX_PORT_PART_CHARS} characters")
            fieldname, out_value = target[5:], _port_value(source, target[5:], value)
            return Point(node, fieldname, out_value, ts, port=f"{device}/{port}", labels=tags)
        gpu = next((tags[t] for t in self.cfg.gpu_tags if tags.get(t)), "")
        if not gpu:
            raise BadMessage(f"{source}: no GPU index tag ({', '.join(self.cfg.gpu_tags)})")
        index = ascii_index(gpu)
        if index is None or index > 255:
            raise BadMessage(f"{source}: GPU index tag {_short(gpu)} is not 0-255",
                             f"{source}: GPU index tag is not 0-255")
        return Point(node, target, value, ts, gpu=index, labels=tags)


def _port_value(source: str, fieldname: str, value: float) -> float | str:
    if fieldname in (STATE_ID, PHYSICAL_STATE_ID):
        return value  # the raw id: the window's record decides the link state from both
    if fieldname == "link_state":  # a series a user maps onto link_state: a logical state id
        return _STATE.get(int(value), "unknown")
    if fieldname == "speed_gbps" and source.endswith("bytes_per_second"):
        return value * 8 / 1e9
    if source.endswith("_bytes_total"):
        return value / 4  # node-exporter counts bytes; PortSample counts 4-byte words
    return value


@dataclass
class Windows:
    """Points grouped per node and ``window_s`` window; :meth:`due` hands back closed windows."""

    window_s: float
    grace_s: float
    ingest: IngestSettings
    source: str
    skipped: Counter[str] = field(default_factory=Counter)
    _open: dict[tuple[str, float], list[Point]] = field(default_factory=lambda: defaultdict(list))

    def add(self, point: Point) -> None:
        start = math.floor(point.ts / self.window_s) * self.window_s
        self._open[(point.node, start)].append(point)

    def due(self, now: float) -> Iterator[r.GpuTelemetry | r.PortTelemetry]:
        """Records of windows that ended more than ``grace_s`` before ``now`` (math.inf: all)."""
        for key in sorted(k for k in self._open if k[1] + self.window_s + self.grace_s <= now):
            yield from self._records(key[0], self._open.pop(key))

    def _records(self, node: str, points: list[Point]) -> Iterator[r.GpuTelemetry | r.PortTelemetry]:
        reader = ExpositionReader(self.ingest, skipped=self.skipped, source=self.source)
        ts = max(p.ts for p in points)
        by_gpu: dict[int, dict[str, float]] = defaultdict(dict)
        by_port: dict[str, dict[str, float | str]] = defaultdict(dict)
        legacy: dict[str, dict[str, float | str]] = {}
        info: dict[str, str] = {}
        for p in sorted(points, key=lambda p: p.ts):  # the newest value of a metric wins
            if p.gpu is not None:
                assert isinstance(p.value, float)
                by_gpu[p.gpu][p.target] = p.value
                info.setdefault("sku", p.labels.get("modelName", p.labels.get("name", "")))
                uuid = p.labels.get("UUID", p.labels.get("uuid", ""))
                if uuid:
                    info[f"uuid{p.gpu}"] = uuid
            elif p.target.startswith(LEGACY_PREFIX):
                legacy.setdefault(p.port, {})[p.target[len(LEGACY_PREFIX):]] = p.value
            else:
                by_port[p.port][p.target] = p.value
        for port_id, counters in legacy.items():  # the 64-bit counter wins when the port has it
            for target, value in counters.items():
                by_port[port_id].setdefault(target, value)
        if by_gpu:
            gpu = reader.gpu_record((node, ts), by_gpu, info)
            if gpu is not None:
                yield gpu
        if by_port:
            port = reader.port_record((node, ts), by_port)
            if port is not None:
                yield port
