"""Small hand-made telemetry for the detector and pipeline tests and the MTTR bench (the simulator
has its own, richer generator)."""

from __future__ import annotations

from typing import Any

import numpy as np

from fleetmedic import records as r


def gpu_message(
    node: str,
    ts: float,
    rng: np.random.Generator,
    *,
    load: float = 1.0,
    hot: dict[int, float] | None = None,
    slow: dict[int, float] | None = None,
    counters: dict[str, list[int]] | None = None,
    gauges: dict[str, list[Any]] | None = None,
    xids: list[r.XidEvent] | None = None,
    gpus: int = 8,
    boot_id: str = "boot-1",
) -> r.GpuTelemetry:
    """One node's 8 GPUs under a shared workload ``load`` (0 idle .. 1 busy) with per-GPU offsets."""
    offset = np.arange(gpus) * 0.4
    temp = 35 + 30 * load + offset + rng.normal(0, 0.6, gpus)
    power = 90 + 560 * load + rng.normal(0, 6, gpus)
    clock = 1980.0 - np.abs(rng.normal(0, 6, gpus)).round()
    for g, d in (hot or {}).items():
        temp[g] += d
    for g, f in (slow or {}).items():
        clock[g] *= 1 - f
    zero = [0] * gpus
    metrics: dict[str, Any] = dict(
        gpu_temp=temp.round(2).tolist(),
        memory_temp=(temp + 4).round(2).tolist(),
        power_usage=power.round(2).tolist(),
        sm_clock=clock.tolist(),
        mem_clock=[2619.0] * gpus,
        clocks_event_reasons=zero,
        ecc_sbe_vol_total=zero,
        ecc_dbe_vol_total=zero,
        pcie_replay_counter=zero,
        power_violation=zero,
        thermal_violation=zero,
        nvlink_crc_flit_error_count_total=zero,
        nvlink_crc_data_error_count_total=zero,
        nvlink_replay_error_count_total=zero,
        nvlink_recovery_error_count_total=zero,
        nvlink_links_down=zero,
        row_remap_failure=zero,
        row_remap_pending=zero,
        uncorrectable_remapped_rows=zero,
        pcie_link_width=[16] * gpus,
        xid_errors=zero,
    )
    metrics.update(counters or {})
    metrics.update(gauges or {})
    return r.GpuTelemetry(node=node, ts=ts, gpus=list(range(gpus)), metrics=r.GpuMetrics(**metrics), xids=xids or [],
                          boot_id=boot_id)


def only_gpus(msg: r.GpuTelemetry, keep: list[int], *, ts: float | None = None,
              xids: list[r.XidEvent] | None = None) -> r.GpuTelemetry:
    """``msg`` holding only the GPUs ``keep`` (a partial scrape, or one half of a misaligned one)."""
    pos = [msg.gpus.index(g) for g in keep]
    cols = {name: [col[p] for p in pos] for name in r.GPU_METRICS
            if (col := getattr(msg.metrics, name)) is not None}
    return r.GpuTelemetry(node=msg.node, ts=msg.ts if ts is None else ts, gpus=list(keep),
                          metrics=r.GpuMetrics(**cols), xids=msg.xids if xids is None else xids, boot_id=msg.boot_id)


def blank_gpu(msg: r.GpuTelemetry, gpu: int, *, xid: bool = False) -> r.GpuTelemetry:
    """``msg`` with ``gpu`` listed but reporting nothing, as the NVML exporter reports a lost GPU
    (NVML_ERROR_GPU_IS_LOST), with the XID 79 it synthesises when the loss is first seen."""
    p = msg.gpus.index(gpu)
    cols = {name: [None if i == p else v for i, v in enumerate(col)] for name in r.GPU_METRICS
            if (col := getattr(msg.metrics, name)) is not None}
    extra = [r.XidEvent(gpu=gpu, xid=79, ts=msg.ts, message="NVML: GPU is lost (fallen off the bus)")] if xid else []
    return r.GpuTelemetry(node=msg.node, ts=msg.ts, gpus=list(msg.gpus), metrics=r.GpuMetrics(**cols),
                          xids=[*msg.xids, *extra], boot_id=msg.boot_id)
