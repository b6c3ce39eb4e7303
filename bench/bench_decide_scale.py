"""The decision stage at fleet scale: intake, steady findings, a storm, the snapshot, memory.

    .venv/bin/python bench/bench_decide_scale.py [--sizes 1000,5000,20000] [--findings 20000]

The decision stage is one partition by design (global budgets), so what it does per event must not
grow with the fleet. For each fleet size (8 GPUs a node, 32 nodes a leaf, 8 a rack), in a fresh
process so memory figures are its own, this drives :class:`~fleetmedic.remediation.engine.DecisionEngine`
as the decision stage does and times (process CPU time):

- **intake**: every node's first observation (``node_observed`` with rack/leaf/pool labels, as the
  executor's node watch reports them), then a wave that re-observes every node (a label on each
  tenth changed: a relabelling or a cordon wave), then one fleet-wide batch of stage 1's summaries
  (``nodes_seen``);
- **steady**: ``--findings`` findings from a healthy fleet (degradation and network warnings on
  random nodes and ports, info findings, a critical hard fault every 1,000th), 200 per second of
  event time, with the stage's tick every 5 s; findings/s through triage, policy and safety. They
  come from 1,000 nodes spread over the fleet at every size, so the work per finding is the same
  and only the fleet around it grows;
- **with jobs**: a job of 8 ranks on every 8 nodes (placement and start), then the same findings with a
  progress event of a random job beside each; findings/s (with their progress events);
- **storm**: 10 % of the fleet sends critical hard faults within one minute (ticking as it goes);
  the isolations the budget let through are printed (the bound holds at any size);
- **tick**: the stage's periodic tick with the storm's nodes waiting (the median of five);
- **snapshot**: the engine's bytes; the time to write it as the decision stage does (the engine's
  bytes in the stage's envelope with 50,000 finding ids, cut into parts of 1 MiB, what a broker
  with Kafka's default message limit takes) and to restore it (the parts put together and checked,
  the envelope decoded, the engine rebuilt);
- **memory**: the process's peak RSS and the Python heap the engine holds (tracemalloc, measured in
  a separate pass, as it slows everything down).

The baseline is the smallest fleet measured in the same run: each cost is printed per node and as
a ratio of that per-node cost to the baseline's (target: within 1.5x, i.e. linear overall).
Targets at 20,000 nodes: intake within 10 s, >= 5,000 findings/s, restore within 5 s.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import random
import resource
import time
import tracemalloc
from typing import Any

import msgspec

from fleetmedic.config import parse_config
from fleetmedic.records import Evidence, Finding, JobEvent, RankPlacement
from fleetmedic.remediation.engine import DecisionEngine
from fleetmedic.streams.snapshot_parts import SNAPSHOT_KEY, SnapshotScan, split
from fleetmedic.streams.state import DecideSnapshot, decode_snapshot

T0 = 1_790_000_000.0
NODES_PER_LEAF, NODES_PER_RACK = 32, 8
PART_BYTES = 1 << 20
SICK_NODES = 1000  # the steady findings come from this many nodes, spread over the fleet, at every size


def labels(i: int, generation: int = 0) -> dict[str, str]:
    return {"fleetmedic.io/rack": f"r{i // NODES_PER_RACK}", "fleetmedic.io/leaf": f"leaf-{i // NODES_PER_LEAF}",
            "fleetmedic.io/pool": "h100" if generation == 0 or i % 10 else f"h100-g{generation}"}


def finding(fid: int, node: str, now: float, kind: str, severity: str, detector: str, metric: str,
            gpu: int | None = 0, port: str = "", hint: str = "", value: float = 1.0) -> Finding:
    return Finding(id=f"f{fid}", ts=now, node=node, detector=detector, kind=kind,  # type: ignore[arg-type]
                   severity=severity, summary=f"{detector} {metric} on {node}",  # type: ignore[arg-type]
                   evidence=[Evidence(detector=detector, metric=metric, value=value, ts=now)], gpu=gpu, port=port,
                   action_hint=hint)


def steady_finding(rng: random.Random, fid: int, sick: list[int], now: float) -> Finding:
    node = f"node-{rng.choice(sick)}"
    roll = fid % 1000
    if roll == 0:
        return finding(fid, node, now, "hard_fault", "critical", "xid_rules", "xid", hint="reset_gpu", value=48.0)
    if roll % 4 == 0:
        return finding(fid, node, now, "network", "warning", "port_baseline", "symbol_error_rate", gpu=None,
                       port=f"{node}/mlx5_{rng.randrange(8)}")
    if roll % 4 == 1:
        return finding(fid, node, now, "degradation", "info", "gpu_baseline", "power_w", gpu=rng.randrange(8))
    return finding(fid, node, now, "degradation", "warning", "gpu_baseline", "sm_clock", gpu=rng.randrange(8))


def run_engine(n: int, findings: int) -> tuple[DecisionEngine, dict[str, Any]]:
    settings = parse_config("")
    cpu = time.process_time
    out: dict[str, Any] = {"nodes": n}
    engine = DecisionEngine(settings)
    now = T0

    t = cpu()
    for i in range(n):
        engine.node_observed(f"node-{i}", cordoned=False, cordoned_by_fleetmedic=False, labels=labels(i), now=now)
    out["intake_s"] = cpu() - t
    assert engine.fleet_size == n, engine.fleet_size

    t = cpu()
    for i in range(n):
        engine.node_observed(f"node-{i}", cordoned=False, cordoned_by_fleetmedic=False, labels=labels(i, 1), now=now)
    out["wave_s"] = cpu() - t

    t = cpu()
    engine.nodes_seen((f"node-{i}" for i in range(n)), now)
    out["summaries_s"] = cpu() - t

    rng = random.Random(1)
    sick = rng.sample(range(n), min(n, SICK_NODES))
    t = cpu()
    for k in range(findings):
        now = T0 + 10 + k / 200
        engine.on_finding(steady_finding(rng, k, sick, now), now)
        if k % 1000 == 999:
            engine.tick(now)
    out["steady_s"] = cpu() - t
    out["findings_per_s"] = findings / out["steady_s"]

    # the same findings with the fleet busy: a job of 8 ranks on every 8 nodes, and a progress
    # event of a job beside every finding (what the job watcher and the log connector send)
    jobs = max(1, n // 8)
    t = cpu()
    for j in range(jobs):
        ranks = [RankPlacement(rank=r, node=f"node-{(8 * j + r) % n}") for r in range(8)]
        engine.on_job_event(JobEvent(job=f"ml/job-{j}", event="placement", ts=now, world_size=8, placement=ranks), now)
        engine.on_job_event(JobEvent(job=f"ml/job-{j}", event="start", ts=now, world_size=8), now)
    out["jobs_intake_s"] = cpu() - t
    t = cpu()
    for k in range(findings):
        now += 1 / 200
        engine.on_job_event(JobEvent(job=f"ml/job-{rng.randrange(jobs)}", event="progress", ts=now, step=k,
                                     step_time_s=1.0), now)
        engine.on_finding(steady_finding(rng, 1_000_000 + k, sick, now), now)
        if k % 1000 == 999:
            engine.tick(now)
    out["with_jobs_s"] = cpu() - t
    out["findings_per_s_with_jobs"] = findings / out["with_jobs_s"]

    storm_nodes = rng.sample(range(n), n // 10)
    start = now + 60
    isolations = 0
    t = cpu()
    for j, i in enumerate(storm_nodes):
        now = start + 60 * j / len(storm_nodes)
        d = engine.on_finding(finding(findings + j, f"node-{i}", now, "hard_fault", "critical", "xid_rules", "xid",
                                      hint="reboot_node", value=79.0), now)
        isolations += sum(1 for c in d.commands if c.action == "cordon")
        if j % 100 == 99:
            d = engine.tick(now)
            isolations += sum(1 for c in d.commands if c.action == "cordon")
    out["storm_s"] = cpu() - t
    out["storm_findings"] = len(storm_nodes)
    out["storm_cordons"] = isolations
    out["budget_nodes"] = engine.report(now)["budget"]["max_held"]
    ticks = []
    for k in range(5):  # the stage's tick with the storm's nodes waiting (refused or settling)
        t = cpu()
        engine.tick(now + 5 * (k + 1))
        ticks.append(cpu() - t)
    out["tick_after_storm_s"] = sorted(ticks)[2]

    # the decision stage's snapshot: the engine, 50,000 finding ids with their times, in parts of
    # 1 MiB (what a broker with Kafka's default message limit takes), put together and restored
    t = cpu()
    data = engine.to_bytes()
    ids = [f"gpu-node-{k:05d}/xid_rules/{T0 + k:.3f}/0" for k in range(50_000)]
    snap = DecideSnapshot(engine=data, fleet=b"", offsets={"findings": {0: 1}}, commands_from=0,
                          seen_findings=ids, seen_finding_times=[T0 + k for k in range(len(ids))])
    parts, manifest = split(msgspec.msgpack.encode(snap), PART_BYTES, 0)
    out["snapshot_write_s"] = cpu() - t
    out["snapshot_bytes"] = len(data)
    out["snapshot_parts_1mib"] = len(parts)
    t = cpu()
    scan = SnapshotScan(3)
    for offset, (key, value) in enumerate([*parts, (SNAPSHOT_KEY, manifest)]):
        scan.take(offset, key, value)
    raw = scan.newest_first()[0][1]
    assert isinstance(raw, bytes)
    restored = DecisionEngine.from_bytes(decode_snapshot(raw).engine, settings)
    out["snapshot_restore_s"] = cpu() - t
    assert restored.fleet_size == engine.fleet_size
    return engine, out


def measure(n: int, findings: int) -> dict[str, Any]:
    _, out = run_engine(n, findings)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def heap(n: int) -> float:
    gc.collect()
    tracemalloc.start()
    engine, _ = run_engine(n, 2000)
    gc.collect()
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del engine
    return current / 2**20


def in_child(fn: Any, *args: Any) -> Any:
    with multiprocessing.get_context("fork").Pool(1) as pool:
        return pool.apply(fn, args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000,5000,20000")
    ap.add_argument("--findings", type=int, default=20_000)
    ap.add_argument("--no-heap", action="store_true", help="skip the tracemalloc pass")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for n in sizes:
        row = in_child(measure, n, args.findings)
        if not args.no_heap:
            row["engine_heap_mb"] = in_child(heap, n)
        rows.append(row)
        print(f"measured {n} nodes", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    base = rows[0]
    per_node = ["intake_s", "wave_s", "summaries_s", "jobs_intake_s", "snapshot_bytes", "snapshot_write_s",
                "snapshot_restore_s", "engine_heap_mb"]
    print(f"\n{'':24}" + "".join(f"{r['nodes']:>14,}" for r in rows) + f"   per-node ratio {rows[-1]['nodes']:,} / "
          f"{base['nodes']:,}")
    for key in ["intake_s", "wave_s", "summaries_s", "steady_s", "findings_per_s", "jobs_intake_s", "with_jobs_s",
                "findings_per_s_with_jobs", "storm_s", "storm_findings",
                "storm_cordons", "budget_nodes", "tick_after_storm_s", "snapshot_bytes", "snapshot_parts_1mib",
                "snapshot_write_s", "snapshot_restore_s", "peak_rss_mb", "engine_heap_mb"]:
        if key not in base:
            continue
        cells = "".join(f"{r[key]:>14,.3f}" if isinstance(r[key], float) else f"{r[key]!s:>14}" for r in rows)
        ratio = ""
        if key in per_node and base[key]:
            ratio = f"   {(rows[-1][key] / rows[-1]['nodes']) / (base[key] / base['nodes']):.2f}x"
        elif key in ("findings_per_s", "findings_per_s_with_jobs"):
            ratio = f"   {base[key] / rows[-1][key]:.2f}x slower per finding"
        print(f"{key:24}{cells}{ratio}")
    last = rows[-1]
    print(f"\ntargets at {last['nodes']:,} nodes: intake {last['intake_s']:.2f} s (<= 10), "
          f"{last['findings_per_s']:,.0f} findings/s (>= 5,000), restore {last['snapshot_restore_s']:.2f} s (<= 5)")


if __name__ == "__main__":
    main()
