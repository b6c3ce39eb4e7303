"""Pure part of the Prometheus connector's api mode: a ``/api/v1/query`` answer -> samples, and the
per-target watermarks that publish each scrape once (see :mod:`fleetmedic.connectors.prometheus_ingest`)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fleetmedic.connectors.prometheus_text import ExpositionReader, Sample
from fleetmedic.records import GpuTelemetry, PortTelemetry


class ApiAnswerError(ValueError):
    """A Prometheus API answer that cannot be used; the message says why."""


def api_samples(doc: Any, skipped: Counter[str]) -> Iterator[Sample]:
    """Samples from a ``/api/v1/query`` answer (``vector`` or ``matrix``); bad entries counted."""
    if not isinstance(doc, dict):
        raise ApiAnswerError("answer is not a JSON object")
    if doc.get("status") != "success":
        raise ApiAnswerError(f"status {doc.get('status')!r}: {doc.get('errorType', '')} {doc.get('error', '')}".strip())
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") not in ("vector", "matrix"):
        raise ApiAnswerError("data.resultType is not vector or matrix")
    results = data.get("result")
    if not isinstance(results, list):
        raise ApiAnswerError("data.result is not a list")
    for entry in results:
        labels = entry.get("metric") if isinstance(entry, dict) else None
        if not isinstance(labels, dict) or not isinstance(labels.get("__name__"), str):
            skipped["api result without metric.__name__"] += 1
            continue
        name = labels.pop("__name__")
        points = entry.get("values") if "values" in entry else [entry.get("value")]
        for point in points or []:
            try:
                ts, value = float(point[0]), float(point[1])
            except (TypeError, ValueError, IndexError):
                skipped[f"{name}: api value {point!r} is not [time, number]"] += 1
                continue
            if not math.isfinite(value):
                skipped[f"{name}: value is {point[1]}"] += 1
                continue
            yield name, labels, value, ts


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
