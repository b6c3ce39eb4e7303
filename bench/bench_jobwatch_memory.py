"""The job watcher's memory over many job lifecycles: does anything keep growing once jobs are gone?

    .venv/bin/python bench/bench_jobwatch_memory.py [--rounds 24] [--jobs 100] [--ranks 8] [--nodes 2000]

Drives the watcher's pure parts, as ``fleetmedic watch-jobs`` feeds them, with ``rounds`` rounds of
``jobs`` Indexed GPU Jobs of ``ranks`` pods each. One round is a whole lifecycle per job: the Job,
its pods Pending -> scheduled -> Running, one rank failing and replaced by the Job controller, a
restart (fleetmedic's annotation, every pod deleted and made again), completion, then the pods and
the Job deleted. Beside them in each round: a job whose workload kind is not watched (its pods only,
then deleted), a long-lived Job whose rank fails and is replaced every round, and node heartbeats
(``nodes`` Node MODIFIED events, a condition flapping on a few). Each round's job names are new.

After every round it prints the tracker's structures (jobs, pods, tombstones, pods with reported
failures kept) and tracemalloc's current and peak bytes; the last line says how much the traced
size grew over the second half of the rounds. The clock advances 60 s a round, so the tombstones of
deleted workloads (``jobwatch.deleted_memory_s``, 600 s) level off after 11 rounds, as they do live.
"""

from __future__ import annotations

import argparse
import gc
import json
import tracemalloc
from typing import Any

from fleetmedic.config import ConditionRule, ConditionSettings, Settings
from fleetmedic.connectors.kube.jobs_map import JobTracker
from fleetmedic.connectors.kube.node_conditions import ConditionTracker
from fleetmedic.connectors.kube.nodes_map import NodeTracker

GPU = "nvidia.com/gpu"
FAILED = [{"name": "t", "restartCount": 0, "state": {"terminated": {"exitCode": 1, "reason": "Error",
                                                                     "message": "NCCL timeout"}}}]


def job_obj(name: str, uid: str, ranks: int, restarts: int = 0, done: bool = False) -> dict[str, Any]:
    status: dict[str, Any] = {"active": 0 if done else ranks}
    if done:
        status["conditions"] = [{"type": "Complete", "status": "True", "reason": "Completed"}]
    return {"metadata": {"name": name, "namespace": "ml", "uid": uid,
                         "annotations": {"fleetmedic.io/restart-attempts": str(restarts)}},
            "spec": {"parallelism": ranks, "completions": ranks, "completionMode": "Indexed"}, "status": status}


def pod_obj(job: str, job_uid: str, rank: int, uid: str, node: str, phase: str, failed: bool = False,
            label: str = "batch.kubernetes.io/job-name") -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if failed:
        status["containerStatuses"] = FAILED
    return {"metadata": {"name": f"{job}-{rank}-{uid[-5:]}", "namespace": "ml", "uid": uid,
                         "labels": {label: job, "batch.kubernetes.io/job-completion-index": str(rank)},
                         "ownerReferences": [{"kind": "Job", "name": job, "uid": job_uid, "controller": True}]},
            "spec": {"nodeName": node, "containers": [{"name": "t", "resources": {"limits": {GPU: "8"}}}]},
            "status": status}


def node_obj(i: int, flap: bool) -> dict[str, Any]:
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
    conditions = [ready, {"type": "GpuHealth", "status": "True" if flap else "False", "reason": "XID 79"}]
    return {"metadata": {"name": f"node-{i:05d}", "labels": {"topology.fleetmedic.io/rack": f"r{i // 16}"},
                         "annotations": {}},
            "spec": {}, "status": {"conditions": conditions}}


class Feed:
    """The tracker and the node trackers, fed as the watcher's consumer loop feeds them."""

    def __init__(self, settings: Settings) -> None:
        self.tracker = JobTracker(tombstone_s=settings.jobwatch.deleted_memory_s)
        self.nodes = NodeTracker.of(settings)
        self.conditions = ConditionTracker.of(settings)
        self.events = 0
        self.now = 0.0

    def pod(self, etype: str, obj: dict[str, Any]) -> None:
        # the watcher's queue carries objects decoded from JSON lines: copy as the decoder would
        self.events += len(self.tracker.observe_pod(etype, json.loads(json.dumps(obj)), self.now))

    def job(self, etype: str, obj: dict[str, Any]) -> None:
        self.events += len(self.tracker.observe_workload("Job", etype, json.loads(json.dumps(obj)), self.now))

    def node(self, obj: dict[str, Any]) -> None:
        self.nodes.observe("MODIFIED", obj, self.now)
        self.events += len(self.conditions.observe("MODIFIED", obj, self.now))


def lifecycle(f: Feed, name: str, ranks: int, n_nodes: int) -> None:
    """One Job's whole life, from creation to deletion."""
    juid = f"{name}-uid"
    f.job("ADDED", job_obj(name, juid, ranks))
    pods = {r: f"{name}-p{r}-a" for r in range(ranks)}
    nodes = {r: f"node-{hash((name, r)) % n_nodes:05d}" for r in range(ranks)}
    for r, uid in pods.items():
        f.pod("ADDED", pod_obj(name, juid, r, uid, "", "Pending"))
        f.pod("MODIFIED", pod_obj(name, juid, r, uid, nodes[r], "Pending"))
    for r, uid in pods.items():
        f.pod("MODIFIED", pod_obj(name, juid, r, uid, nodes[r], "Running"))
    # rank 0 fails; the Job controller makes a replacement, then deletes the failed pod
    f.pod("MODIFIED", pod_obj(name, juid, 0, pods[0], nodes[0], "Failed", failed=True))
    old, pods[0] = pods[0], f"{name}-p0-b"
    f.pod("ADDED", pod_obj(name, juid, 0, pods[0], nodes[0], "Running"))
    f.pod("DELETED", pod_obj(name, juid, 0, old, nodes[0], "Failed", failed=True))
    # fleetmedic restarts it: the annotation, every pod deleted, made again
    f.job("MODIFIED", job_obj(name, juid, ranks, restarts=1))
    for r, uid in pods.items():
        f.pod("DELETED", pod_obj(name, juid, r, uid, nodes[r], "Running"))
    pods = {r: f"{name}-p{r}-c" for r in range(ranks)}
    for r, uid in pods.items():
        f.pod("ADDED", pod_obj(name, juid, r, uid, nodes[r], "Running"))
    for r, uid in pods.items():
        f.pod("MODIFIED", pod_obj(name, juid, r, uid, nodes[r], "Succeeded"))
    f.job("MODIFIED", job_obj(name, juid, ranks, restarts=1, done=True))
    for r, uid in pods.items():
        f.pod("DELETED", pod_obj(name, juid, r, uid, nodes[r], "Succeeded"))
    f.job("DELETED", job_obj(name, juid, ranks, restarts=1, done=True))


def pods_only(f: Feed, name: str, ranks: int) -> None:
    """A job whose workload kind is not watched: its pods come and go, the workload is never seen."""
    for r in range(ranks):
        f.pod("ADDED", pod_obj(name, "", r, f"{name}-q{r}", f"node-{r:05d}", "Running", label="job-name"))
    for r in range(ranks):
        f.pod("DELETED", pod_obj(name, "", r, f"{name}-q{r}", f"node-{r:05d}", "Running", label="job-name"))


def long_lived_failure(f: Feed, round_: int, ranks: int) -> None:
    """A Job that lives through every round; its rank 1 fails and is replaced each round."""
    name, juid = "long", "long-uid"
    if round_ == 0:
        f.job("ADDED", job_obj(name, juid, ranks))
        for r in range(ranks):
            f.pod("ADDED", pod_obj(name, juid, r, f"long-p{r}-0", f"node-{r:05d}", "Running"))
    uid = f"long-p1-{round_}"
    f.pod("MODIFIED", pod_obj(name, juid, 1, uid, "node-00001", "Failed", failed=True))
    f.pod("ADDED", pod_obj(name, juid, 1, f"long-p1-{round_ + 1}", "node-00001", "Running"))
    f.pod("DELETED", pod_obj(name, juid, 1, uid, "node-00001", "Failed", failed=True))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=2000)
    args = ap.parse_args()
    rule = ConditionRule(type="GpuHealth", status="False", severity="critical", kind="uncertain", component="gpu")
    settings = Settings(conditions=ConditionSettings(rules=[rule]))
    f = Feed(settings)
    tracemalloc.start()
    sizes = []
    for rnd in range(args.rounds):
        for j in range(args.jobs):
            lifecycle(f, f"r{rnd}-j{j}", args.ranks, args.nodes)
            pods_only(f, f"r{rnd}-orphan{j}", 2)
        long_lived_failure(f, rnd, args.ranks)
        for i in range(args.nodes):
            f.node(node_obj(i, flap=(i < 10 and rnd % 2 == 1)))
        f.now += 60.0
        gc.collect()
        size, peak = tracemalloc.get_traced_memory()
        sizes.append(size)
        t = f.tracker
        print(f"round {rnd + 1:3d}: jobs {len(t.jobs):5d}  pods {len(t.pod_jobs):5d}  tombstones "
              f"{len(t.tombstones):5d}  failed pods {sum(len(s.reported) for s in t.jobs.values()):5d}  "
              f"nodes {len(f.nodes.nodes):5d}  traced {size / 1024:8.1f} KiB  peak {peak / 1024:8.1f} KiB",
              flush=True)
    cycles = args.rounds * args.jobs
    half = len(sizes) // 2
    early, late = sizes[half - 1], sizes[-1]
    print(f"{cycles:,} job lifecycles ({cycles * args.ranks * 3:,} pods), {f.events:,} JobEvents; traced after "
          f"round {half}: {early / 1024:.1f} KiB, after round {args.rounds}: {late / 1024:.1f} KiB "
          f"({(late - early) / 1024 / max(1, args.rounds - half):+.1f} KiB a round over the second half)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
