"""Pure part of the Prometheus connector's api mode: a ``/api/v1/query`` (or ``query_range``) answer
-> samples, and the per-target watermarks that publish each scrape once (see
:mod:`fleetmedic.connectors.prometheus.ingest`); and of ``backtest --prometheus``
(:mod:`fleetmedic.connectors.prometheus.history`): times and steps as Prometheus takes them
(:func:`parse_time`, :func:`parse_duration`) and the range cut into queries under the server's
points limit (:func:`plan_chunks`); and of scrape mode's pod discovery: exporter pods (the
Kubernetes API's JSON) -> scrape targets with their node (:func:`pod_targets`).

An answer that is not a query result raises :class:`ApiAnswerError`; a bad entry or point in it is
skipped and counted (reasons name the series when fleetmedic reads it, never the bad value), with
lengths checked before any conversion as in :mod:`fleetmedic.connectors.prometheus.text`."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fleetmedic.config import PodDiscoverySettings
from fleetmedic.connectors.prometheus.text import (
    MAX_LABEL_VALUE_CHARS,
    MAX_VALUE_CHARS,
    TS_MAX,
    TS_MIN,
    ExpositionReader,
    Sample,
    count,
    is_known_series,
)
from fleetmedic.records import GpuTelemetry, PortTelemetry


class ApiAnswerError(ValueError):
    """A Prometheus API answer that cannot be used; the message says why."""


def api_samples(doc: Any, skipped: Counter[str]) -> Iterator[Sample]:
    """Samples from a ``/api/v1/query`` answer (``vector`` or ``matrix``); bad entries counted."""
    if not isinstance(doc, dict):
        raise ApiAnswerError("answer is not a JSON object")
    if doc.get("status") != "success":
        status, kind, error = (str(doc.get(k, ""))[:200] for k in ("status", "errorType", "error"))
        raise ApiAnswerError(f"status {status!r}: {kind} {error}".strip())
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") not in ("vector", "matrix"):
        raise ApiAnswerError("data.resultType is not vector or matrix")
    results = data.get("result")
    if not isinstance(results, list):
        raise ApiAnswerError("data.result is not a list")
    for entry in results:
        labels = entry.get("metric") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or not isinstance(labels, dict) or not isinstance(labels.get("__name__"), str):
            count(skipped, "api result without metric.__name__")
            continue
        name = labels.pop("__name__")
        series = name if is_known_series(name) else "other series"  # a bounded set of reasons
        bad = _bad_labels(labels)
        if bad:
            count(skipped, f"{series}: {bad}")
            continue
        points = entry.get("values") if "values" in entry else [entry.get("value")]
        if not isinstance(points, list):
            count(skipped, f"{series}: api values is not a list")
            continue
        for point in points:
            # the answer's own shape ([float, "str"]) read inline; anything else through _point
            if type(point) is list and len(point) == 2 and type(point[0]) is float and type(point[1]) is str \
                    and len(point[1]) <= MAX_VALUE_CHARS:
                ts = point[0]
                try:
                    value = float(point[1])
                except ValueError:
                    count(skipped, f"{series}: api value is not [time, number]")
                    continue
            else:
                got = _point(point)
                if got is None:
                    count(skipped, f"{series}: api value is not [time, number]")
                    continue
                ts, value = got
            if not math.isfinite(value):
                count(skipped, f"{series}: value is {'NaN' if math.isnan(value) else 'infinite'}")
                continue
            if not TS_MIN <= ts <= TS_MAX:
                count(skipped, f"{series}: timestamp out of range")
                continue
            yield name, labels, value, ts


def _bad_labels(labels: dict[Any, Any]) -> str:
    """Why a result's labels cannot be used ("" when they can)."""
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            return "api labels are not strings"
        if len(value) > MAX_LABEL_VALUE_CHARS:
            return f"label {key[:64]} longer than {MAX_LABEL_VALUE_CHARS} characters"
    return ""


def _point(point: Any) -> tuple[float, float] | None:
    """``[time, "value"]`` as floats; None when it is not one (lengths checked before converting)."""
    if not isinstance(point, list | tuple) or len(point) != 2:
        return None
    ts, value = _number(point[0]), _number(point[1])
    if ts is None or value is None:
        return None
    return ts, value


def _number(x: Any) -> float | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, str):
        if len(x) > MAX_VALUE_CHARS:
            return None
    elif not isinstance(x, int | float):
        return None
    try:
        return float(x)
    except (ValueError, OverflowError):  # "x"; an int too large for a float
        return None


@dataclass
class Watermarks:
    """The newest timestamp already published per target (``job``, ``instance``)."""

    newest: dict[tuple[str, str], float] = field(default_factory=dict)

    def fresh(self, samples: Iterable[Sample]) -> list[Sample]:
        """Samples newer than their target's watermark; advances the watermarks."""
        out = [s for s in samples if s[3] is not None and s[3] > self.newest.get(_target(s[1]), -math.inf)]
        for s in out:
            key = _target(s[1])
            ts = s[3]
            assert ts is not None
            if ts > self.newest.get(key, -math.inf):
                self.newest[key] = ts
        return out


def _target(labels: dict[str, str]) -> tuple[str, str]:
    return labels.get("job", ""), labels.get("instance", "")


def map_samples(reader: ExpositionReader, samples: Iterable[Sample]) -> list[GpuTelemetry | PortTelemetry]:
    return list(reader.read_samples(samples, flush_lag_s=math.inf))


# --- history: range queries (``fleetmedic backtest --prometheus``) ------------------------------

#: the most points per series Prometheus returns for one range query (its "exceeded maximum
#: resolution of 11,000 points per timeseries")
SERVER_MAX_POINTS = 11_000


def parse_time(text: str) -> float:
    """A time as Prometheus's API takes it: RFC 3339 (``2024-05-01T12:00:00Z``, offsets and
    fractions allowed) or Unix seconds (``1714564800``, ``1714564800.5``). Raises ValueError."""
    from datetime import UTC, datetime

    t = text.strip()
    if not t or len(t) > 64:
        raise ValueError(f"time {text[:64]!r}: expected RFC 3339 or Unix seconds")
    try:
        value = float(t)
    except ValueError:
        pass
    else:
        if not (math.isfinite(value) and TS_MIN <= value <= TS_MAX):
            raise ValueError(f"time {t!r}: out of range")
        return value
    try:
        when = datetime.fromisoformat(t.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"time {t!r}: expected RFC 3339 (2024-05-01T12:00:00Z) or Unix seconds") from None
    if when.tzinfo is None:
        raise ValueError(f"time {t!r}: RFC 3339 needs a time zone (Z or +hh:mm)")
    return when.astimezone(UTC).timestamp()


def parse_duration(text: str) -> float:
    """A step as Prometheus takes it: seconds (``30``, ``0.5``) or a duration (``30s``, ``1m``, ``1h30m``)."""
    t = text.strip()
    try:
        value = float(t)
    except ValueError:
        units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
        parts = _DURATION.findall(t)
        if not parts or "".join(n + u for n, u in parts) != t:
            raise ValueError(f"duration {text[:64]!r}: expected seconds or e.g. 30s, 1m, 1h30m") from None
        value = sum(float(n) * units[u] for n, u in parts)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"duration {text[:64]!r}: must be positive")
    return value


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def plan_chunks(start: float, end: float, step: float, max_points: int, max_chunk_s: float = 3600.0
                ) -> list[tuple[float, float]]:
    """``[start, end]`` cut into consecutive range queries of at most ``max_points`` points per
    series (and ``max_chunk_s`` seconds, so one answer stays small), each starting one step after
    the previous one ended (no point twice)."""
    if not (end >= start and step > 0):
        raise ValueError("range: need end >= start and a positive step")
    if max_points < 1:
        raise ValueError("range: max_points must be at least 1")
    span = min((max_points - 1) * step, max(max_chunk_s, step))
    span = max(step * math.floor(span / step), 0.0)
    chunks = []
    t = start
    while t <= end:
        last = min(t + span, end)
        chunks.append((t, last))
        t = last + step
    return chunks


# --- pod discovery (scrape mode) --------------------------------------------------------------------


@dataclass(frozen=True)
class ScrapeTarget:
    """A URL to scrape and the target labels added to each of its samples, as Prometheus adds
    them (``instance``; for a discovered pod also its node under ``discovery.node_label``)."""

    url: str
    labels: dict[str, str]
    pod: str = ""  # namespace/name of a discovered pod


def pod_targets(pods: Iterable[Any], d: PodDiscoverySettings, skipped: Counter[str]) -> list[ScrapeTarget]:
    """Scrape targets of the exporter pods in a pod list (JSON dicts as the API serves them): a
    running pod with an IP and a node, at ``d.port`` or its container port named ``d.port_name``;
    the pod's ``spec.nodeName`` becomes the target label ``d.node_label``, as Prometheus's
    kubernetes_sd relabelled from ``__meta_kubernetes_pod_node_name``. Pods that cannot be
    scraped are counted per reason."""
    out: dict[str, ScrapeTarget] = {}
    for pod in pods:
        if not isinstance(pod, dict):
            count(skipped, "discovery: not a pod object")
            continue
        meta, spec, status = (_dict(pod.get(k)) for k in ("metadata", "spec", "status"))
        name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if meta.get("deletionTimestamp") or status.get("phase") != "Running":
            count(skipped, "discovery: pod not running")
            continue
        ip, node = status.get("podIP"), spec.get("nodeName")
        if not isinstance(ip, str) or not ip:
            count(skipped, "discovery: pod without an IP")
            continue
        if not isinstance(node, str) or not node:
            count(skipped, "discovery: pod without a node")
            continue
        port = d.port or _named_port(spec, d.port_name)
        if not port:
            count(skipped, f"discovery: pod without a container port named {d.port_name[:64]}")
            continue
        host = f"[{ip}]" if ":" in ip else ip
        url = f"{d.scheme}://{host}:{port}{d.path}"
        out[url] = ScrapeTarget(url, {"instance": f"{host}:{port}", d.node_label: node}, name)
    return [out[u] for u in sorted(out)]


def _dict(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def _named_port(spec: dict[str, Any], name: str) -> int:
    for container in spec.get("containers") or []:
        for port in (container.get("ports") or []) if isinstance(container, dict) else []:
            if isinstance(port, dict) and port.get("name") == name and isinstance(port.get("containerPort"), int):
                number: int = port["containerPort"]
                if 0 < number < 65536:
                    return number
    return 0
