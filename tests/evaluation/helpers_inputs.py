"""Backtest inputs for the evaluation tests (no tests here): GPU telemetry as JSONL and dcgm-exporter /
node-exporter text with timestamps, from ``T0`` on."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fleetmedic import records as r
from fleetmedic.devenv.synth import gpu_message

T0 = 1.79e9


def write_jsonl(path: Path, nodes: int = 6, ticks: int = 160) -> None:
    rng = np.random.default_rng(0)
    with path.open("wb") as fh:
        for k in range(ticks):
            for n in range(nodes):
                dbe = {"ecc_dbe_vol_total": [0, 0, 0, 0, 0, 0, 2, 0]} if (n == 4 and k >= 120) else None
                fh.write(r.encode(gpu_message(f"node-{n}", T0 + 10 * k, rng, counters=dbe)) + b"\n")
        fh.write(b'{"type":"gpu_telemetry","node":"x","ts":"bad"}\nnot json\n')
        fh.write(r.encode(r.JobEvent(job="ml/a", event="start", ts=T0 + 5)) + b"\n")


def prom_lines(ticks: int = 40) -> list[str]:
    lines = ["# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).", "# TYPE DCGM_FI_DEV_GPU_TEMP gauge"]
    for k in range(ticks):
        ts = int((T0 + 10 * k) * 1000)
        for g in range(8):
            lab = f'gpu="{g}",UUID="GPU-{g}",device="nvidia{g}",modelName="NVIDIA H100 80GB HBM3",Hostname="dgx-1"'
            lines.append(f"DCGM_FI_DEV_GPU_TEMP{{{lab}}} {55 + g * 0.5} {ts}")
            lines.append(f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{lab}}} {3 if (g == 2 and k >= 30) else 0} {ts}")
            lines.append(f'DCGM_FI_DEV_XID_ERRORS{{{lab},err_code="79"}} {79 if (g == 5 and k >= 35) else 0} {ts}')
        lines.append(
            f'node_infiniband_symbol_error_total{{device="mlx5_0",port="1",instance="dgx-1:9100"}} {k * 50} {ts}'
        )
        lines.append(f'node_infiniband_state_id{{device="mlx5_0",port="1",instance="dgx-1:9100"}} 4 {ts}')
    return lines
