"""Topology-aware recovery on the real control plane: does a restarted job stay in its leaf?

    FLEETMEDIC_KUBECONFIG=/tmp/fleetmedic-dev/kube/kubeconfig \\
        .venv/bin/python bench/bench_recovery_placement.py [--nodes 64] [--leaves 8] [--pods 4] [--rounds 3] \\
        [--kind Job|JobSet]

A labelled kwok fleet (``--nodes`` nodes in ``--leaves`` leaves, 4 nodes per rack) runs one
``--pods`` x 8-GPU batch Job per leaf, each started while only its leaf was schedulable (no
affinity of its own; ``podReplacementPolicy: Failed`` unless ``--replacement-policy`` says
otherwise). A round quarantines one node of every job (cordon + taint, as the executor
does) and restarts all jobs concurrently through ``PlacementRestarter`` (what the executor runs for
``restart_job``); ``--rounds`` rounds give ``leaves x rounds`` recoveries. Figures:

- leaf locality: replacement pods in the job's original leaf, over the recoveries whose leaf had
  room (as many healthy nodes without another job's pods as the job has pods); goal 1.0;
- repeat placements: pods a watch saw scheduled onto a node after its quarantine; goal 0;
- recovery time (restart call -> every replacement Running), p50 / p99, and capacity waits;
- the same on the same fleet with placement off (``placement.enabled: false``: exclusion only),
  the baseline, and the ratio of the locality fractions;
- scarce capacity: a job whose fleet has no healthy node left for one pod; a node's worth of GPUs
  is freed ``--free-after`` seconds later; the restarter's measured wait (``capacity_wait_s``);
- the per-restart cost of reading the cluster (list nodes, list pods), which the node cache spares.

``--kind JobSet``: one JobSet per leaf instead (a leader and ``--pods - 1`` workers, each a 1-pod
child Job), with the real JobSet controller (``FLEETMEDIC_JOBSET_MANAGER`` or what ``fleetmedic
dev build`` built) run out of cluster and its webhooks registered for the bench's namespaces, so
the placement goes the way a real cluster makes it go: onto the suspended child Jobs. The
scarce-capacity and read-cost figures are the Job's (``--scarce-trials 0`` skips the former).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from kubernetes import client

from fleetmedic.config import PlacementSettings, Settings
from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.jobset import JS_GROUP, JS_VERSION, register_webhooks, unregister_webhooks
from fleetmedic.devenv.jobset import jobset_controller as run_jobset_controller
from fleetmedic.devenv.kclient import connect
from fleetmedic.devenv.placement import (
    Recovery,
    ScheduleWatch,
    leaves_of,
    recover_round,
    repeat_placements,
    start_one_job_per_leaf,
)
from fleetmedic.devenv.waiting import wait
from fleetmedic.devenv.workloads import gpu_job, live_pods, quarantine
from fleetmedic.executor.kube import KubeCluster
from fleetmedic.executor.workload.placement_apply import PlacementRestarter


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


def new_namespace(core: client.CoreV1Api) -> str:
    name = f"bench-place-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    wait("default ServiceAccount", lambda: core.list_namespaced_service_account(
        name, field_selector="metadata.name=default").items, 30)
    return name


def scenario(api: client.ApiClient, nodes: int, topo: fl.Topology, pods: int, rounds: int, enabled: bool,
             policy: str, kind: str = "Job", controller_dir: Path | None = None) -> dict[str, Any]:
    """One phase on its own fresh fleet and namespace (nothing left over from another phase)."""
    core = client.CoreV1Api(api)
    fleet = fl.create_fleet(api, nodes, name=fl.new_fleet_name("bench-place"), topo=topo, timeout=180)
    ns = new_namespace(core)
    hooks = register_webhooks(api, ns, controller_dir) if controller_dir else []
    try:
        leaf_of = leaves_of(api, fleet)
        jobs = start_one_job_per_leaf(api, ns, fleet, pods, replacement_policy=policy, kind=kind)
        restarter = PlacementRestarter(KubeCluster(api), Settings(placement=PlacementSettings(enabled=enabled)))
        watcher = ScheduleWatch(api, ns).start()
        suspects: dict[str, float] = {}  # node -> when it was quarantined
        recoveries: list[Recovery] = []
        for r in range(rounds):
            recoveries += recover_round(api, restarter, ns, jobs, pods, leaf_of, suspects, pick=r)
        bindings = watcher.stop()
    finally:
        if kind == "JobSet":
            client.CustomObjectsApi(api).delete_collection_namespaced_custom_object(
                JS_GROUP, JS_VERSION, ns, "jobsets", propagation_policy="Background")
        unregister_webhooks(api, hooks)
        client.BatchV1Api(api).delete_collection_namespaced_job(ns, propagation_policy="Background")
        core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        core.delete_namespace(ns)
        fl.delete_fleet(api, fleet)
    repeats = repeat_placements(bindings, suspects)
    for x in recoveries:
        if x.outcome != "applied":
            print(f"  {x.job} ({'placement' if enabled else 'baseline'}): {x.outcome}: {x.reason[:600]}")
    if os.environ.get("BENCH_DEBUG"):
        print("repeats:", repeats)
        for x in recoveries:
            if x.in_leaf != len(x.nodes_after):
                print("miss:", x.job, x.leaf, x.suspect, x.nodes_after, x.details)
    counted = [x for x in recoveries if x.leaf_had_capacity]
    placed = sum(len(x.nodes_after) for x in counted)
    return {"recoveries": len(recoveries), "failed": sum(x.outcome != "applied" for x in recoveries),
            "with_capacity": len(counted), "in_leaf": sum(x.in_leaf for x in counted), "placed": placed,
            "repeats": len(repeats), "seconds": [x.seconds for x in recoveries],
            "waits": sum(x.details.get("capacity") == "insufficient" for x in recoveries),
            "routes": dict(Counter(x.details.get("mechanism", "?") for x in recoveries))}


def scarce(api: client.ApiClient, free_after: float, trials: int) -> list[float]:
    """A 4-pod job on 5 nodes; one node quarantined, one held by a filler pod: one pod short.
    The filler is deleted ``free_after`` s after the restart call; returns the measured waits."""
    core = client.CoreV1Api(api)
    waits = []
    for t in range(trials):
        fleet = fl.create_fleet(api, 5, name=fl.new_fleet_name("bench-scarce"))
        ns = new_namespace(core)
        try:
            client.BatchV1Api(api).create_namespaced_job(ns, client.V1Job.from_dict(gpu_job("big", fleet, 4)))
            pods = wait("4 Running", lambda n=ns: (x := [p for p in live_pods(api, n, "app=big")
                                                          if p.status.phase == "Running"]) and len(x) == 4 and x, 60)
            busy = {p.spec.node_name for p in pods}
            free = next(n for n in fleet.nodes if n not in busy)
            filler = gpu_job("filler", fleet, 1)["spec"]["template"]
            filler["spec"]["nodeName"] = free
            core.create_namespaced_pod(ns, client.V1Pod.from_dict(
                {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "filler"}, "spec": filler["spec"]}))
            suspect = sorted(busy)[0]
            quarantine(api, suspect)
            restarter = PlacementRestarter(KubeCluster(api), Settings(placement=PlacementSettings(capacity_wait_s=120.0,
                                                                                     capacity_poll_s=0.2)))
            timer = threading.Timer(free_after, core.delete_namespaced_pod, ("filler", ns),
                                    {"grace_period_seconds": 0})
            timer.start()
            out = restarter.restart(f"{ns}/big", action="restart_job", exclude_nodes=[suspect], params={},
                                    dry_run=False, actor="bench")
            assert out.details.get("capacity") == "insufficient", out.details
            assert out.details.get("capacity_still_waiting") == "false", out.details
            waits.append(float(out.details["capacity_wait_s"]))
            print(f"  scarce trial {t + 1}: {out.details['capacity_missing']}; waited {waits[-1]:.1f}s")
        finally:
            core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
            core.delete_namespace(ns)
            fl.delete_fleet(api, fleet)
    return waits


def read_cost(api: client.ApiClient, repeats: int = 10) -> tuple[int, float, int, float]:
    core = client.CoreV1Api(api)
    t0 = time.perf_counter()
    for _ in range(repeats):
        n = len(core.list_node().items)
    t_nodes = (time.perf_counter() - t0) / repeats
    t0 = time.perf_counter()
    for _ in range(repeats):
        m = len(core.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded,status.phase!=Failed").items)
    return n, t_nodes, m, (time.perf_counter() - t0) / repeats


def report(name: str, r: dict[str, Any]) -> float:
    frac = r["in_leaf"] / r["placed"] if r["placed"] else float("nan")
    s = r["seconds"]
    print(f"{name:9s}: {r['recoveries']} recoveries ({r['failed']} failed), {r['with_capacity']} with leaf capacity: "
          f"replacements in the original leaf {r['in_leaf']}/{r['placed']} = {frac:.2f}; repeat placements on "
          f"suspects {r['repeats']}; recovery p50 {statistics.median(s):.2f}s p99 {pct(s, 0.99):.2f}s; "
          f"capacity waits {r['waits']}; routes {r['routes']}")
    return frac


def jobset_controller(api: client.ApiClient, kubeconfig: Path, stack: contextlib.ExitStack) -> Path:
    """Start the real JobSet controller for the run (the CRDs installed first); its directory."""
    from fleetmedic.devenv import settings

    manager = os.environ.get("FLEETMEDIC_JOBSET_MANAGER") or str(settings.layout().jobset_manager)
    if not Path(manager).is_file():
        raise SystemExit(f"no JobSet controller binary at {manager} (fleetmedic dev build, or set "
                         "FLEETMEDIC_JOBSET_MANAGER)")
    fl.install_crds(api, sorted((Path(__file__).resolve().parents[1] / "tests" / "data" / "crds").glob("*.yaml")))
    workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-jobset-")))
    stack.enter_context(run_jobset_controller(manager, kubeconfig, workdir))
    return workdir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--leaves", type=int, default=8)
    ap.add_argument("--pods", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kind", choices=["Job", "JobSet"], default="Job")
    ap.add_argument("--free-after", type=float, default=3.0)
    ap.add_argument("--scarce-trials", type=int, default=3)
    ap.add_argument("--replacement-policy", choices=["Failed", "TerminatingOrFailed"], default="Failed",
                    help="the Jobs' podReplacementPolicy (TerminatingOrFailed: replacements may be created while "
                         "the old pods still hold their GPUs)")
    args = ap.parse_args()
    per_leaf = args.nodes // args.leaves
    if per_leaf % 4 or per_leaf - args.rounds < args.pods:
        ap.error("--nodes/--leaves must be a multiple of 4 with room for --pods after --rounds suspects")
    kubeconfig = os.environ.get("FLEETMEDIC_KUBECONFIG") or os.environ.get("KUBECONFIG")
    if not kubeconfig:
        print("set FLEETMEDIC_KUBECONFIG (fleetmedic dev up)", file=sys.stderr)
        return 2
    with connect(Path(kubeconfig)) as api, contextlib.ExitStack() as stack:
        topo = fl.Topology(nodes_per_rack=4, racks_per_leaf=per_leaf // 4)
        controller_dir = jobset_controller(api, Path(kubeconfig), stack) if args.kind == "JobSet" else None
        print(f"fleet: {args.nodes} nodes, {args.leaves} leaves, {per_leaf} nodes/leaf; "
              f"{args.leaves} {args.kind}s of {args.pods} x 8 GPUs (podReplacementPolicy {args.replacement_policy}), "
              f"{args.rounds} rounds; a fresh fleet per phase")
        placed = scenario(api, args.nodes, topo, args.pods, args.rounds, True, args.replacement_policy, args.kind,
                          controller_dir)
        base = scenario(api, args.nodes, topo, args.pods, args.rounds, False, args.replacement_policy, args.kind,
                        controller_dir)
        n_nodes, t_nodes, n_pods, t_pods = read_cost(api)
        waits = scarce(api, args.free_after, args.scarce_trials)
    f_placed = report("placement", placed)
    f_base = report("baseline", base)
    print(f"leaf locality placement / baseline: {f_placed / f_base:.2f}x" if f_base else
          "leaf locality placement / baseline: baseline kept no replacement in its leaf")
    if waits:
        print(f"scarce capacity: {len(waits)} waits, capacity freed after {args.free_after:.1f}s, waited p50 "
              f"{statistics.median(waits):.1f}s max {max(waits):.1f}s")
    print(f"cluster reads per restart: list {n_nodes} nodes {t_nodes * 1000:.1f} ms (cached "
          f"placement.node_cache_s), list {n_pods} live pods {t_pods * 1000:.1f} ms")
    return 0 if placed["repeats"] == 0 and placed["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
