"""Connector mapping throughput, against the parsing floor measured in the same run.

    .venv/bin/python bench/bench_connectors.py [--nodes 256] [--rounds 5]

(a) dcgm-exporter text (8 GPUs x 12 series per node, real format) -> GpuTelemetry through
    ExpositionReader, against matching each line with the exposition regex alone;
(b) Telegraf ``nvidia_smi`` JSON (one message per GPU) -> points -> per-node window records,
    against msgspec-decoding the same messages alone.
Prints GPU samples/s for each and the ratio to its floor. Single thread, process CPU time.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import msgspec

from fleetmedic.config import IngestSettings, KafkaTelemetrySettings
from fleetmedic.connectors.kafka_telemetry.exporter_map import PointMapper, Windows
from fleetmedic.connectors.prometheus.text import _LINE, ExpositionReader

SERIES = ["GPU_TEMP", "MEMORY_TEMP", "POWER_USAGE", "SM_CLOCK", "MEM_CLOCK", "GPU_UTIL", "FB_USED", "FB_FREE",
          "ECC_SBE_VOL_TOTAL", "ECC_DBE_VOL_TOTAL", "PCIE_REPLAY_COUNTER", "CLOCK_THROTTLE_REASONS"]


def dcgm_text(nodes: int) -> list[str]:
    lines = []
    for s in SERIES:
        lines += [f"# HELP DCGM_FI_DEV_{s} x", f"# TYPE DCGM_FI_DEV_{s} gauge"]
        for n in range(nodes):
            for g in range(8):
                lines.append(
                    f'DCGM_FI_DEV_{s}{{gpu="{g}",UUID="GPU-{n:08d}-{g}",pci_bus_id="00000000:{18 + g}:00.0",'
                    f'device="nvidia{g}",modelName="NVIDIA H100 80GB HBM3",Hostname="node-{n}",'
                    f'DCGM_FI_DRIVER_VERSION="550.54.15"}} {40 + g}')
    return lines


def telegraf_messages(nodes: int) -> list[bytes]:
    return [json.dumps({"name": "nvidia_smi", "tags": {"host": f"node-{n}", "index": str(g),
                                                        "uuid": f"GPU-{n}-{g}", "name": "NVIDIA H100"},
                        "fields": {"temperature_gpu": 40 + g, "power_draw": 650.5, "utilization_gpu": 99,
                                   "clocks_current_sm": 1980, "memory_used": 70000, "fan_speed": 0},
                        "timestamp": 1_700_000_000}).encode()
            for n in range(nodes) for g in range(8)]


def best(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    gpus = args.nodes * 8

    text = dcgm_text(args.nodes)
    floor = best(lambda: [_LINE.match(x) for x in text if not x.startswith("#")], args.rounds)
    mapped = best(lambda: list(ExpositionReader(IngestSettings()).read(text, default_ts=1.7e9)), args.rounds)
    records = list(ExpositionReader(IngestSettings()).read(text, default_ts=1.7e9))
    assert len(records) == args.nodes
    print(f"(a) dcgm text -> GpuTelemetry: {gpus / mapped:,.0f} GPU samples/s "
          f"({len(text):,} lines, {args.nodes} records); regex floor {gpus / floor:,.0f}/s; "
          f"ratio {floor / mapped:.2f}")

    messages = telegraf_messages(args.nodes)
    mapper = PointMapper(KafkaTelemetrySettings())
    decode = msgspec.json.decode
    floor_k = best(lambda: [decode(m) for m in messages], args.rounds)

    def kafka() -> int:
        windows = Windows(10.0, 0.0, IngestSettings(), "kafka-telegraf")
        for m in messages:
            for p in mapper.points(m):
                windows.add(p)
        return len(list(windows.due(float("inf"))))

    assert kafka() == args.nodes
    mapped_k = best(kafka, args.rounds)
    print(f"(b) Telegraf JSON -> GpuTelemetry: {gpus / mapped_k:,.0f} GPU samples/s "
          f"({len(messages):,} messages); decode floor {gpus / floor_k:,.0f}/s; ratio {floor_k / mapped_k:.2f}")


if __name__ == "__main__":
    main()
