"""The job tracker sorts a job's ranks once per change of their order, not once per event, and
emits exactly what sorting on every event emits.

- Differential: random streams of pod and workload events (Indexed Jobs and JobSets; pods added,
  bound, moved, restarted, failed, relabelled to another rank, deleted; replicated jobs reordered)
  through the tracker and through a reference that sorts every time: the same JobEvents.
- A failure storm over one 400-rank job (every container restarts, then every pod fails) sorts a
  handful of times, not once per failure.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from fleetmedic.connectors.kube import jobs_map as m
from fleetmedic.connectors.kube.jobs_map import JobState, JobTracker, PodView

GPU = {"nvidia.com/gpu": "8"}


class SortEveryTime(JobTracker):
    """The ranking as it was: sorted afresh on every call (the reference)."""

    def _ranked(self, state: JobState) -> list[PodView]:
        rank_of_rjob = {name: i for i, name in enumerate(state.rjob_order)}

        def key(p: PodView) -> tuple[Any, ...]:
            if state.kind == "JobSet":
                return (rank_of_rjob.get(p.order[0], len(rank_of_rjob)), *p.order)
            return p.order

        return sorted((p for p in state.pods.values() if p.phase not in ("Succeeded", "Failed")), key=key)

    def _rank(self, state: JobState, uid: str) -> int | None:
        rank = next((r for r, p in enumerate(self._ranked(state)) if p.uid == uid), None)
        if rank is None:
            rank = next(r for r, p in enumerate(sorted(state.pods.values(), key=lambda p: p.order)) if p.uid == uid)
        return rank


def _pod(job: str, kind: str, uid: str, index: int, rjob: str, node: str, phase: str, restarts: int,
         failed: bool) -> dict[str, Any]:
    if kind == "JobSet":
        labels = {"jobset.sigs.k8s.io/jobset-name": job, "jobset.sigs.k8s.io/replicatedjob-name": rjob,
                  "jobset.sigs.k8s.io/job-index": "0", "batch.kubernetes.io/job-completion-index": str(index)}
    else:
        labels = {"batch.kubernetes.io/job-name": job, "batch.kubernetes.io/job-completion-index": str(index)}
    status: dict[str, Any] = {"phase": phase}
    if restarts or failed:
        term = {"exitCode": 1, "reason": "Error"}
        status["containerStatuses"] = [{"name": "t", "restartCount": restarts,
                                        "state": {"terminated": term} if failed else {"running": {}},
                                        "lastState": {"terminated": term} if restarts else {}}]
    return {"metadata": {"name": f"{job}-{uid}", "namespace": "ml", "uid": uid, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "t", "resources": {"limits": GPU}}]},
            "status": status}


def _workload(job: str, kind: str, size: int, rjobs: list[str]) -> dict[str, Any]:
    if kind == "JobSet":
        spec: dict[str, Any] = {"replicatedJobs": [{"name": r, "replicas": 1,
                                                    "template": {"spec": {"parallelism": size // len(rjobs)}}}
                                                   for r in rjobs]}
    else:
        spec = {"parallelism": size, "completions": size}
    return {"metadata": {"name": job, "namespace": "ml", "uid": f"w-{job}"}, "spec": spec, "status": {}}


def _stream(rng: random.Random, steps: int) -> list[tuple[str, str, str, dict[str, Any]]]:
    jobs = {"a": ("Job", 4, ["w"]), "b": ("JobSet", 6, ["x", "y"])}
    pods: dict[str, dict[str, Any]] = {}  # uid -> its fields
    out: list[tuple[str, str, str, dict[str, Any]]] = []
    for job, (kind, size, rjobs) in jobs.items():
        out.append(("w", kind, "ADDED", _workload(job, kind, size, rjobs)))
    for n in range(steps):
        roll = rng.random()
        job = rng.choice(sorted(jobs))
        kind, size, rjobs = jobs[job]
        if roll < 0.05:  # the replicated jobs reordered (or the parallelism changed)
            rjobs = rng.sample(rjobs, len(rjobs))
            jobs[job] = (kind, size, rjobs)
            out.append(("w", kind, "MODIFIED", _workload(job, kind, size, rjobs)))
            continue
        mine = [u for u, f in pods.items() if f["job"] == job]
        if roll < 0.3 or not mine:
            uid = f"{job}{n}"
            pods[uid] = {"job": job, "kind": kind, "uid": uid, "index": rng.randrange(size),
                         "rjob": rng.choice(rjobs), "node": "", "phase": "Pending", "restarts": 0, "failed": False}
            out.append(("p", kind, "ADDED", _pod(**{k: v for k, v in pods[uid].items()})))
            continue
        uid = rng.choice(mine)
        f = pods[uid]
        if roll < 0.4:
            out.append(("p", kind, "DELETED", _pod(**f)))
            del pods[uid]
            continue
        change = rng.choice(["bind", "run", "move", "restart", "fail", "succeed", "relabel", "same"])
        if change == "bind" or change == "move":
            f["node"] = f"n{rng.randrange(8)}"
        elif change == "run":
            f["phase"] = "Running"
        elif change == "restart":
            f["restarts"] += 1
        elif change == "fail":
            f["phase"], f["failed"] = "Failed", True
        elif change == "succeed":
            f["phase"] = "Succeeded"
        elif change == "relabel":
            f["index"] = rng.randrange(size)
        out.append(("p", kind, "MODIFIED", _pod(**f)))
    return out


def _feed(t: JobTracker, events: list[tuple[str, str, str, dict[str, Any]]]) -> list[Any]:
    out = []
    for i, (what, kind, etype, obj) in enumerate(events):
        got = (t.observe_pod(etype, obj, float(i)) if what == "p" else t.observe_workload(kind, etype, obj, float(i)))
        out.append([(e.job, e.event, e.rank, e.node, e.reason, e.attempt, e.world_size,
                     [(p.rank, p.node) for p in e.placement or []]) for e in got])
    return out


@pytest.mark.parametrize("seed", range(12))
def test_same_events_as_sorting_every_time(seed: int) -> None:
    events = _stream(random.Random(seed), 600)
    reference = _feed(SortEveryTime(), events)
    assert sum(len(x) for x in reference) > 20  # the stream does produce events
    assert _feed(JobTracker(), events) == reference


def test_a_failure_storm_sorts_a_few_times_not_once_per_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    sorts = [0]

    def counting_sorted(*args: Any, **kw: Any) -> list[Any]:
        sorts[0] += 1
        return sorted(*args, **kw)

    monkeypatch.setattr(m, "sorted", counting_sorted, raising=False)
    t, k = JobTracker(), 400
    t.observe_workload("Job", "ADDED", _workload("big", "Job", k, ["w"]), 0.0)
    for i in range(k):
        t.observe_pod("ADDED", _pod("big", "Job", f"u{i}", i, "w", f"n{i}", "Running", 0, False), 1.0)
    assert sorts[0] <= 2  # the placement, once every rank is placed
    sorts[0] = 0
    restarts = [t.observe_pod("MODIFIED", _pod("big", "Job", f"u{i}", i, "w", f"n{i}", "Running", 1, False), 2.0)
                for i in range(k)]
    failed = [t.observe_pod("MODIFIED", _pod("big", "Job", f"u{i}", i, "w", f"n{i}", "Failed", 1, True), 3.0)
              for i in range(k)]
    assert [e[0].rank for e in restarts] == list(range(k))
    assert [e[0].rank for e in failed] == list(range(k))
    assert sorts[0] <= 3, sorts[0]  # was one sort of 400 ranks per failure: 800
