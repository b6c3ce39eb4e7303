"""Pure part of the NVML exporter: GPU readings -> one node's GpuTelemetry."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import msgspec

from fleetmedic import records as r
from fleetmedic.connectors.nvml.seam import GpuReading


def build_record(node: str, ts: float, readings: Iterable[GpuReading], lost: Iterable[int],
                 xids: Iterable[r.XidEvent], driver_version: str = "", boot_id: str = "",
                 skipped: Callable[[str], None] = lambda reason: None) -> r.GpuTelemetry:
    """The node's record: GPUs in index order, one column per metric any GPU reported. A value the
    record schema rejects (an NVML reading out of physical range) is dropped and ``skipped``."""
    by_index: dict[int, GpuReading] = {g.index: g for g in readings}
    for index in lost:
        by_index.setdefault(index, GpuReading(index))
    gpus = sorted(by_index)
    values = [dict(by_index[g].values) for g in gpus]
    while True:
        metrics = {m: [v.get(m) for v in values] for m in r.GPU_METRICS if any(m in v for v in values)}
        doc = {"node": node, "ts": ts, "gpus": gpus, "metrics": metrics, "source": "nvml",
               "uuids": [by_index[g].uuid for g in gpus] if all(by_index[g].uuid for g in gpus) else [],
               "xids": [msgspec.to_builtins(x) for x in xids], "sku": next((by_index[g].name for g in gpus
                                                                      if by_index[g].name), ""),
               "driver_version": driver_version, "boot_id": boot_id}
        try:
            return r.convert(r.GpuTelemetry, doc)
        except r.InvalidRecord as exc:
            bad = _metric_at(exc.path)
            if bad is None:
                raise
            metric, position = bad
            skipped(f"{metric}: {exc.reason}")
            values[position].pop(metric, None)


def _metric_at(path: str) -> tuple[str, int] | None:
    """``$.metrics.gpu_temp[1]`` -> (gpu_temp, 1)."""
    if not path.startswith("$.metrics.") or "[" not in path:
        return None
    name, _, rest = path[len("$.metrics."):].partition("[")
    index = rest.rstrip("]")
    return (name, int(index)) if index.isdigit() else None
