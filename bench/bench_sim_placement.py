"""Topology-aware re-placement in the simulator's closed loop: do restarted jobs stay in their leaf?

    PYTHONPATH=. .venv/bin/python bench/bench_sim_placement.py            # 64 nodes, 8 leaves, 4 seeds x 24 h
    PYTHONPATH=. .venv/bin/python bench/bench_sim_placement.py --seeds 1 --hours 6   # quick look

The simulated fleet has ``--nodes`` nodes in ``--leaves`` scalable units (a leaf per SU and rail, so
"same leaf" = "same SU"), racks of 4, jobs asking for ``--utilization`` of the nodes, and ``--faults`` hardware
faults. An oracle operator plays a perfect fleetmedic so that only placement differs: on every job
failure whose job ran on a node with an active fault, it cordons that node and sends ``restart_job``
excluding it, 3 s later; it uncordons the node once no fault is active on it (checked every 10
simulated minutes: the technician's repair). Two arms on the same seeds:

- ``placement``: fleetmedic's restarts prefer the surviving ranks' leaf, then rack (the executor's
  preferred node affinity, ``WorkloadSpec.topology_preference="fleetmedic"``);
- ``baseline``: the same commands with no preference (``placement.enabled: false``: the suspect is
  excluded, the scheduler packs the replacements where most nodes are free).

Prints, per arm: re-placements by fleetmedic, how many had room in the original leaf, replacement
nodes in the original leaf over those with room, placements on suspect and excluded nodes (every
restarter, the job controller's included), the wait for capacity (p50/max) and MTTR p50; then the
ratio of leaf locality placement / baseline. The simulator does not slow a job down for being spread
over leaves, so MTTR and the effective training time ratio do not show the benefit; the locality does.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from fleetmedic.records import RemediationCommand
from fleetmedic.sim.engine import SimConfig, Simulator
from fleetmedic.sim.fleet import FleetSpec
from fleetmedic.sim.telemetry import NoiseSpec
from fleetmedic.sim.workload import WorkloadSpec


def run_arm(seed: int, nodes: int, leaves: int, hours: float, faults: str, utilization: float,
            preference: str) -> dict[str, Any]:
    sim = Simulator(SimConfig(fleet=FleetSpec(nodes=nodes, nodes_per_su=nodes // leaves, nodes_per_rack=4),
                              duration_s=hours * 3600.0, seed=seed, faults=faults, noise=NoiseSpec.named("none"),
                              ports=False,
                              workload=WorkloadSpec(target_utilization=utilization, topology_preference=preference)))
    cordoned: set[int] = set()
    n = 0
    for tick, out in enumerate(sim.run()):
        if tick % 60 == 0:  # every 10 simulated minutes: return nodes whose faults are over (repaired)
            for i in sorted(i for i in cordoned if not sim.faults_on(i, out.t)):
                cordoned.discard(i)
                n += 1
                sim.submit(_cmd(f"u{n}", "uncordon", out.t, node=sim.fleet.node_names[i]))
        for e in out.job_events:
            job = sim.workload.by_ref(e.job) if e.event == "failure" else None
            if job is None:
                continue
            bad = sorted(i for i in job.nodes if sim.faults_on(i, e.ts))
            if not bad:
                continue
            names = [sim.fleet.node_names[i] for i in bad]
            for i, name in zip(bad, names, strict=True):
                if i not in cordoned:
                    cordoned.add(i)
                    n += 1
                    sim.submit(_cmd(f"c{n}", "cordon", e.ts + 3, node=name))
            n += 1
            sim.submit(_cmd(f"r{n}", "restart_job", e.ts + 3, job=e.job, exclude_nodes=names))
    acc = sim.accounting()
    return {"placement": {k: v for k, v in acc.placement.items()}, "wait": acc.phases["wait_capacity"],
            "mttr": acc.phases["mttr"]}


def _cmd(cid: str, action: str, t: float, **kw: Any) -> RemediationCommand:
    return RemediationCommand(id=cid, action=action, incident_id="bench", reason="oracle", issued_at=t,
                              expires_at=t + 600, **kw)


def summarize(name: str, runs: list[dict[str, Any]]) -> float | None:
    def total(group: str, key: str) -> int:
        return sum(getattr(r["placement"][group], key) for r in runs if group in r["placement"])

    re_placed, room = total("fleetmedic", "re_placements"), total("fleetmedic", "with_room")
    in_leaf, repl = total("fleetmedic", "in_leaf"), total("fleetmedic", "replacements")
    frac = in_leaf / repl if repl else None
    waits = [r["wait"] for r in runs]
    print(f"{name:9s}: fleetmedic re-placements {re_placed} ({room} with room in the original leaf): "
          f"replacement nodes in the original leaf {in_leaf}/{repl} = {'-' if frac is None else f'{frac:.2f}'} "
          f"(room or not: {total('fleetmedic', 'in_leaf_any')}/{total('fleetmedic', 'replacements_any')}); "
          f"placements on suspect nodes {total('all', 'on_suspect')} (job controller "
          f"{total('job_controller', 'on_suspect')}), on excluded nodes {total('all', 'on_excluded')}; "
          f"wait for capacity p50 {_fmt([w.p50_s for w in waits])} s, "
          f"max {max((w.max_s or 0.0) for w in waits):.0f} s; "
          f"MTTR p50 {_fmt([r['mttr'].p50_s for r in runs])} s")
    return frac


def _fmt(xs: list[float | None]) -> str:
    vals = [x for x in xs if x is not None]
    return "/".join(f"{x:.0f}" for x in vals) or "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--leaves", type=int, default=8)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--faults", default="xid79:16,node_crash:8,nic_down:8,xid48:8")
    ap.add_argument("--utilization", type=float, default=0.75, help="share of nodes the jobs ask for")
    args = ap.parse_args()
    if args.nodes % args.leaves or (args.nodes // args.leaves) % 4:
        ap.error("--nodes must split into --leaves scalable units of a multiple of 4 nodes (racks of 4)")
    print(f"fleet: {args.nodes} nodes, {args.leaves} leaves, racks of 4; {args.hours:g} h x {args.seeds} seed(s); "
          f"faults {args.faults}; utilization {args.utilization:g}")
    fracs = {}
    for arm, pref in (("placement", "fleetmedic"), ("baseline", "none")):
        started = time.monotonic()
        runs = [run_arm(s, args.nodes, args.leaves, args.hours, args.faults, args.utilization, pref)
                for s in range(1, args.seeds + 1)]
        fracs[arm] = summarize(arm, runs)
        print(f"           ({time.monotonic() - started:.0f} s)")
    p, b = fracs["placement"], fracs["baseline"]
    print(f"leaf locality placement / baseline: {p / b:.2f}x" if p is not None and b else
          "leaf locality placement / baseline: - (no baseline replacement stayed in its leaf)")


if __name__ == "__main__":
    main()
