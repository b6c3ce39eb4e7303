"""Simulator throughput, on one core, against baselines measured in the same run.

    .venv/bin/python bench/bench_simulator.py [--nodes 1000] [--minutes 30] [--quick]

Prints GPU samples per second (a GPU sample = one GPU's full dcgm field set at one timestamp) for:

1. the whole in-process generator (fleet, workload, faults, GPU and port telemetry, closed-loop
   accounting), producing columnar :class:`~fleetmedic.sim.batch.GpuBatch` batches;
2. the same without port telemetry;
3. materialising those batches as :class:`~fleetmedic.records.GpuTelemetry` records;
4. records -> JSON lines;

and two baselines: (a) merely constructing the same records with msgspec from ready Python lists
(no simulation at all) and encoding them, (b) a naive generator: one Python loop iteration per GPU
sample drawing each field with ``random``. Ratios are against those baselines. The target is
>= 500k GPU samples/s for (1).

Rates use this process's CPU time (``time.process_time``), so other load on a shared machine
disturbs them less than wall time would; the generator runs are best of ``--repeat``.
"""

from __future__ import annotations

import argparse
import random
import time

import msgspec

from fleetmedic.records import GpuMetrics, GpuTelemetry, encode
from fleetmedic.sim.batch import GPU_FIELDS, GPU_INT_MASK
from fleetmedic.sim.engine import SimConfig, Simulator
from fleetmedic.sim.fleet import FleetSpec

_clock = time.process_time


def _sim(nodes: int, minutes: float, ports: bool) -> Simulator:
    return Simulator(SimConfig(fleet=FleetSpec(nodes=nodes), duration_s=minutes * 60, seed=1,
                               faults=f"mix:{max(4, nodes // 50)}", ports=ports))


def bench_generator(nodes: int, minutes: float, ports: bool) -> tuple[float, int, list]:  # type: ignore[type-arg]
    sim = _sim(nodes, minutes, ports)
    kept = []
    samples = 0
    t0 = _clock()
    for out in sim.run():
        assert out.gpu is not None
        samples += out.gpu.samples
        if len(kept) < 6:
            kept.append(out.gpu)
    dt = _clock() - t0
    return samples / dt, samples, kept


def bench_records(batches: list) -> tuple[float, float, list[GpuTelemetry]]:  # type: ignore[type-arg]
    t0 = _clock()
    recs: list[GpuTelemetry] = []
    samples = 0
    for b in batches:
        recs += b.to_records()
        samples += b.samples
    t1 = _clock()
    b"".join(encode(r) + b"\n" for r in recs)
    t2 = _clock()
    return samples / (t1 - t0), samples / (t2 - t0), recs


def baseline_construct(recs: list[GpuTelemetry]) -> float:
    """Construct + encode the same records from plain Python lists: the floor of materialising."""
    plain = [(r.node, r.ts, list(r.gpus), msgspec.structs.asdict(r.metrics), list(r.uuids), r.sku, r.boot_id)
             for r in recs]
    samples = sum(len(p[2]) for p in plain)
    t0 = _clock()
    out = [encode(GpuTelemetry(node=n, ts=ts, gpus=g, metrics=GpuMetrics(**m), uuids=u, sku=s, boot_id=b))
           for n, ts, g, m, u, s, b in plain]
    dt = _clock() - t0
    assert out
    return samples / dt


def baseline_naive(samples: int) -> float:
    """One Python iteration per GPU sample, one random draw per field: a non-vectorised generator."""
    rnd = random.Random(1)
    ints = [bool(x) for x in GPU_INT_MASK]
    t0 = _clock()
    acc = 0.0
    for _ in range(samples):
        row = {}
        for name, is_int in zip(GPU_FIELDS, ints, strict=True):
            v = rnd.gauss(50.0, 5.0)
            row[name] = int(v) if is_int else v
        acc += row["gpu_temp"]
    dt = _clock() - t0
    return samples / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--minutes", type=float, default=30.0, help="simulated minutes (default 30: 180 rounds)")
    ap.add_argument("--quick", action="store_true", help="smaller run (200 nodes, 10 minutes)")
    ap.add_argument("--repeat", type=int, default=2, help="best of this many generator runs (default 2)")
    args = ap.parse_args()
    nodes, minutes = (200, 10.0) if args.quick else (args.nodes, args.minutes)

    runs = [bench_generator(nodes, minutes, ports=True) for _ in range(max(1, args.repeat))]
    full, n_full, batches = max(runs, key=lambda r: r[0])
    gpu_only = max(bench_generator(nodes, minutes, ports=False)[0] for _ in range(max(1, args.repeat)))
    rec_rate, json_rate, recs = bench_records(batches)
    base_construct = baseline_construct(recs)
    base_naive = baseline_naive(min(40_000, n_full))

    print(f"fleet: {nodes} nodes x 8 GPUs, {minutes:g} simulated minutes at 10 s ({n_full:,} GPU samples), seed 1; "
          "rates in CPU time of one process")
    rows = [
        ("generator, columnar, with port telemetry", full),
        ("generator, columnar, GPU telemetry only", gpu_only),
        ("columnar -> GpuTelemetry records", rec_rate),
        ("columnar -> records -> JSON lines", json_rate),
        ("baseline: construct+encode same records", base_construct),
        ("baseline: naive per-sample Python loop", base_naive),
    ]
    for name, rate in rows:
        print(f"  {name:44s} {rate:>12,.0f} GPU samples/s")
    print(f"ratio generator (full) / naive loop:          {full / base_naive:6.1f}x")
    print(f"ratio generator (full) / construct+encode:    {full / base_construct:6.1f}x")
    print(f"ratio records / construct+encode baseline:    {rec_rate / base_construct:6.2f}x "
          "(arrays -> records, against building the same records from ready lists)")
    print(f"target >= 500,000 GPU samples/s in-process (columnar): {'met' if full >= 500_000 else 'NOT met'}")


if __name__ == "__main__":
    main()
