"""Pure part of the Prometheus connector's api mode: a ``/api/v1/query`` answer -> samples, and the
per-target watermarks that publish each scrape once (see :mod:`fleetmedic.connectors.prometheus_ingest`).

An answer that is not a query result raises :class:`ApiAnswerError`; a bad entry or point in it is
skipped and counted (reasons name the series when fleetmedic reads it, never the bad value), with
lengths checked before any conversion as in :mod:`fleetmedic.connectors.prometheus_text`."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fleetmedic.connectors.prometheus_text import (
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
