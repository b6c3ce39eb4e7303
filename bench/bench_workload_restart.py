"""Job-side recovery time on the real control plane: restart_workload vs deleting the pods.

    FLEETMEDIC_KUBECONFIG=/tmp/fleetmedic-dev/kube/kubeconfig \\
        .venv/bin/python bench/bench_workload_restart.py [--trials 20] [--baseline-trials 5]

On a fresh 6-node kwok fleet, a 4-pod x 8-GPU batch Job runs; each trial quarantines the node of
one pod (cordon + ``fleetmedic.io/quarantine:NoSchedule``, as the executor does), then times from
the call to ``restart_workload(action="restart_job")`` until all 4 replacement pods are Running
off that node (call latency and time to Running, p50/p99), then returns the node to service.
The baseline, measured in the same run on a fresh Job per trial, is what a naive executor does:
delete the pods on the suspect node and wait for the Job controller to replace them (it waits its
pod-failure backoff first). Prints both and the ratio of the p50s. Needs a running dev cluster.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid

from kubernetes import client

from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.kclient import connect
from fleetmedic.devenv.workloads import QUARANTINE_TAINT, gpu_job, quarantine
from fleetmedic.executor.kube import KubeCluster
from fleetmedic.executor.workload.apply import restart_workload

PODS = 4


def _pods(core: client.CoreV1Api, ns: str, name: str) -> list[client.V1Pod]:
    return [p for p in core.list_namespaced_pod(ns, label_selector=f"app={name}").items
            if not p.metadata.deletion_timestamp]


def _wait_running(core: client.CoreV1Api, ns: str, name: str, old: set[str], avoid: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = [p for p in _pods(core, ns, name) if p.metadata.uid not in old and p.status.phase == "Running"]
        if len(pods) == PODS:
            assert avoid not in {p.spec.node_name for p in pods}, "a replacement landed on the quarantined node"
            return
        time.sleep(0.05)
    raise TimeoutError(f"{name}: {PODS} replacement pods not Running within {timeout}s")


def _release(core: client.CoreV1Api, node: str) -> None:
    taints = [t.to_dict() for t in core.read_node(node).spec.taints or [] if t.key != QUARANTINE_TAINT["key"]]
    core.patch_node(node, {"spec": {"unschedulable": False, "taints": taints}})


def _start(api: client.ApiClient, ns: str, fleet: fl.Fleet, name: str) -> list[client.V1Pod]:
    core = client.CoreV1Api(api)
    client.BatchV1Api(api).create_namespaced_job(ns, client.V1Job.from_dict(gpu_job(name, fleet, PODS)))
    _wait_running(core, ns, name, set(), "")
    return _pods(core, ns, name)


def _delete_job(api: client.ApiClient, ns: str, name: str) -> None:
    """Delete the Job and wait until its pods are gone (their GPUs free again)."""
    client.BatchV1Api(api).delete_namespaced_job(name, ns, propagation_policy="Foreground")
    core = client.CoreV1Api(api)
    while core.list_namespaced_pod(ns, label_selector=f"app={name}").items:
        time.sleep(0.1)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--baseline-trials", type=int, default=5)
    args = ap.parse_args()
    kubeconfig = os.environ.get("FLEETMEDIC_KUBECONFIG", "/tmp/fleetmedic-dev/kube/kubeconfig")
    with connect(kubeconfig) as api:
        core = client.CoreV1Api(api)
        ns = f"bench-{uuid.uuid4().hex[:6]}"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        while not core.list_namespaced_service_account(ns, field_selector="metadata.name=default").items:
            time.sleep(0.1)
        fleet = fl.create_fleet(api, 6, name=fl.new_fleet_name("bench"))
        try:
            calls, mttr = [], []
            pods = _start(api, ns, fleet, "train")
            for _ in range(args.trials):
                suspect = pods[0].spec.node_name
                quarantine(api, suspect)
                old = {p.metadata.uid for p in pods}
                t0 = time.monotonic()
                out = restart_workload(KubeCluster(api), f"{ns}/train", action="restart_job", exclude_nodes=[suspect],
                                       params={}, dry_run=False, actor="bench")
                t1 = time.monotonic()
                assert out.outcome == "applied", out.reason
                _wait_running(core, ns, "train", old, suspect)
                calls.append(t1 - t0)
                mttr.append(time.monotonic() - t0)
                _release(core, suspect)
                pods = _pods(core, ns, "train")
            _delete_job(api, ns, "train")
            base = []
            for i in range(args.baseline_trials):
                name = f"base-{i}"
                pods = _start(api, ns, fleet, name)
                suspect = pods[0].spec.node_name
                quarantine(api, suspect)
                old = {p.metadata.uid for p in pods}
                t0 = time.monotonic()
                for p in pods:
                    if p.spec.node_name == suspect:
                        core.delete_namespaced_pod(p.metadata.name, ns)
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:  # the 3 survivors stay; wait for the 1 replacement
                    live = [p for p in _pods(core, ns, name) if p.status.phase == "Running"]
                    if len(live) == PODS and len({p.metadata.uid for p in live} - old) == 1:
                        break
                    time.sleep(0.05)
                base.append(time.monotonic() - t0)
                _release(core, suspect)
                _delete_job(api, ns, name)
        finally:
            core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
            core.delete_namespace(ns)
            fl.delete_fleet(api, fleet)
    print(f"restart_workload (suspend/resume), {len(mttr)} trials, 4 pods x 8 GPUs, 6-node kwok fleet:")
    print(f"  call returns      p50 {statistics.median(calls):6.2f} s   p99 {pct(calls, 0.99):6.2f} s")
    print(f"  all pods Running  p50 {statistics.median(mttr):6.2f} s   p99 {pct(mttr, 0.99):6.2f} s")
    print(f"baseline: delete the suspect's pod, Job controller replaces it ({len(base)} trials):")
    print(f"  all pods Running  p50 {statistics.median(base):6.2f} s   p99 {pct(base, 0.99):6.2f} s")
    print(f"ratio baseline/restart_workload (p50): {statistics.median(base) / statistics.median(mttr):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
