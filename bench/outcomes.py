"""``fleetmedic whatif`` at the sizes it must handle: the StepFun history through all three policies,
and a synthetic year of a 20,000-node fleet.

    .venv/bin/python bench/outcomes.py [--synthetic-nodes 20000] [--synthetic-days 365] [--max-cpu 600] [--json FILE]

Each run is a fresh process (its peak RSS is its own) and is timed in process CPU time:

- **stepfun**: the packaged StepFun trace (400 nodes, 348 days, 584 faults) through ``manual``,
  ``npd-draino`` and ``fleetmedic`` (shipped defaults). Targets: <= 60 s of CPU for all three
  together, <= 1 GB peak RSS.
- **synthetic**: ``--synthetic-nodes`` nodes for ``--synthetic-days`` days with the StepFun trace's
  fault process scaled to that fleet (its per-node rate of each category; repair durations drawn
  from its own, seeded), through the three policies. Target at 20,000 nodes and a year: <= 10 min.
  A synthetic run past ``--max-cpu`` seconds (checked at each thousandth of the history) stops and
  reports the simulated day it reached instead of an ETTR.

The baseline measured in the same run is the manual policy on the same history: the engine's share
of the cost is fleetmedic's CPU over manual's (the event-driven cluster alone).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fleetmedic.sim.whatif.history import History, HistoryFault
from fleetmedic.sim.whatif.shipped import shipped_history


def synthetic(nodes: int, days: float, seed: int = 0) -> History:
    """The StepFun fault process scaled to ``nodes`` for ``days``."""
    base = shipped_history("stepfun")
    rng = random.Random(f"synthetic:{seed}")
    scale = nodes / 400 * days / base.days
    n_faults = round(len(base.faults) * scale)
    faults = []
    start = base.start
    for _ in range(n_faults):
        model = rng.choice(base.faults)
        t = start + rng.uniform(0, days * 86400.0)
        node = f"node-{rng.randrange(nodes):05d}"
        faults.append(HistoryFault(node, t, t + (model.repair_s or 0.0), model.category))
    faults.sort(key=lambda f: (f.start, f.node))
    names = list(dict.fromkeys(f.node for f in faults))
    return History(faults, "csv", start, start + days * 86400.0, names, [], f"synthetic-{nodes}")


class _OverBudget(Exception):
    def __init__(self, done: float) -> None:
        super().__init__(f"past the CPU budget at {done:.0%} of the history")
        self.done = done


def one(kind: str, policy: str, nodes: int, days: float, max_cpu: float = 0.0) -> dict[str, Any]:
    """Run in this process (the child): one history, one policy; a run past ``max_cpu`` seconds
    (0: no limit) stops at the next thousandth of the history."""
    from fleetmedic.config import Settings
    from fleetmedic.sim.whatif.mapping import load_mapping
    from fleetmedic.sim.whatif.replay import PolicySpec, replay
    from fleetmedic.sim.whatif.world import Assumptions

    history = shipped_history("stepfun") if kind == "stepfun" else synthetic(nodes, days)
    t0 = time.process_time()

    def budget(_name: str, done: float) -> None:
        if max_cpu and time.process_time() - t0 > max_cpu:
            raise _OverBudget(done)

    figures: dict[str, Any] = {"faults": len(history.faults)}
    try:
        res = replay(history, load_mapping("stepfun"), Assumptions(nodes=400 if kind == "stepfun" else nodes),
                     [PolicySpec(policy, policy, Settings() if policy == "fleetmedic" else None)], progress=budget)
        figures |= {"ettr": res["policies"][policy]["ettr"], "finished": True}
    except _OverBudget as stop:
        figures |= {"ettr": None, "finished": False, "day_reached": round(stop.done * history.days, 1)}
    return figures | {"cpu_s": round(time.process_time() - t0, 2),
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def child(kind: str, policy: str, nodes: int, days: float, max_cpu: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", kind, policy, str(nodes), str(days), str(max_cpu)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--synthetic-nodes", type=int, default=20_000)
    p.add_argument("--synthetic-days", type=float, default=365.0)
    p.add_argument("--skip-synthetic", action="store_true")
    p.add_argument("--max-cpu", type=float, default=600.0,
                   help="stop a synthetic run past this many CPU seconds and report the day it reached (0: no limit)")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        kind, policy, nodes, days, max_cpu = args.child
        print(json.dumps(one(kind, policy, int(nodes), float(days), float(max_cpu))))
        return 0
    figures: dict[str, Any] = {}
    runs = [("stepfun", 400, 0.0)]
    if not args.skip_synthetic:
        runs.append(("synthetic", args.synthetic_nodes, args.synthetic_days))
    for kind, nodes, days in runs:
        limit = args.max_cpu if kind == "synthetic" else 0.0
        rows = {policy: child(kind, policy, nodes, days, limit) for policy in ("manual", "npd-draino", "fleetmedic")}
        total = sum(r["cpu_s"] for r in rows.values())
        peak = max(r["peak_rss_mb"] for r in rows.values())
        base = max(rows["manual"]["cpu_s"], 0.01)
        figures[kind] = {"nodes": nodes, "runs": rows, "cpu_s_all_three": round(total, 1), "peak_rss_mb": peak,
                         "fleetmedic_over_manual": round(rows["fleetmedic"]["cpu_s"] / base, 1)}
        target = 60.0 if kind == "stepfun" else 600.0
        stopped = [k for k, v in rows.items() if not v["finished"]]
        figures[kind]["within_target"] = not stopped and total <= target
        print(f"{kind}: {rows['manual']['faults']} faults on {nodes} nodes; CPU all three {total:.1f} s "
              f"(target <= {target:.0f} s{'; not finished: ' + ', '.join(stopped) if stopped else ''}), "
              f"peak RSS {peak:.0f} MB (target <= 1024 MB); "
              + ", ".join(f"{k} {v['cpu_s']:.1f} s " + (f"(ETTR {v['ettr']:.4f})" if v["finished"] else
                                                        f"(stopped at day {v['day_reached']} of {days:g})")
                          for k, v in rows.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
