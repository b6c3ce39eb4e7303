"""The pure job tracker: which pods belong to which training job and rank, events only on change,
failures once per termination, completion/restart from the workload, bad objects counted."""

from __future__ import annotations

from typing import Any

from fleetmedic.connectors.kube.jobs_map import JobTracker, job_of_pod

GPU = {"nvidia.com/gpu": "8"}


def pod(name: str, labels: dict[str, str], node: str = "", phase: str = "Pending", gpus: bool = True,
        uid: str = "", statuses: list[dict[str, Any]] | None = None, annotations: dict[str, str] | None = None,
        ) -> dict[str, Any]:
    res = {"limits": GPU} if gpus else {"requests": {"cpu": "1"}}
    return {"metadata": {"name": name, "namespace": "ml", "uid": uid or f"uid-{name}", "labels": labels,
                         "annotations": annotations or {}},
            "spec": {"nodeName": node, "containers": [{"name": "t", "resources": res}]},
            "status": {"phase": phase, "containerStatuses": statuses or []}}


def job_pod(i: int, node: str = "", phase: str = "Pending", **kw: Any) -> dict[str, Any]:
    labels = {"batch.kubernetes.io/job-name": "train", "batch.kubernetes.io/job-completion-index": str(i)}
    return pod(f"train-{i}", labels, node, phase, **kw)


def workload(spec: dict[str, Any], status: dict[str, Any] | None = None, uid: str = "w1",
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "train", "namespace": "ml", "uid": uid, "annotations": annotations or {}},
            "spec": spec, "status": status or {}}


def kinds(events: list[Any]) -> list[str]:
    return [e.event for e in events]


def test_placement_waits_for_every_rank_then_start_once_and_nothing_repeats() -> None:
    t = JobTracker()
    assert t.observe_workload("Job", "ADDED", workload({"parallelism": 3, "completions": 3}), 1.0) == []
    assert t.observe_pod("ADDED", job_pod(0, "n0"), 2.0) == []
    assert t.observe_pod("ADDED", job_pod(1, "n1"), 2.0) == []
    placed = t.observe_pod("ADDED", job_pod(2, "n2"), 3.0)
    assert kinds(placed) == ["placement"]
    assert [(r.rank, r.node) for r in placed[0].placement] == [(0, "n0"), (1, "n1"), (2, "n2")]
    assert placed[0].job == "ml/train" and placed[0].world_size == 3 and placed[0].ts == 3.0
    for i in range(2):
        assert t.observe_pod("MODIFIED", job_pod(i, f"n{i}", "Running"), 4.0) == []
    assert kinds(t.observe_pod("MODIFIED", job_pod(2, "n2", "Running"), 5.0)) == ["start"]
    assert t.observe_pod("MODIFIED", job_pod(2, "n2", "Running"), 6.0) == []  # no change, no event


def test_a_replaced_pod_on_another_node_gives_a_new_placement_and_start() -> None:
    t = JobTracker()
    t.observe_workload("Job", "ADDED", workload({"parallelism": 2}), 0.0)
    for i in range(2):
        t.observe_pod("ADDED", job_pod(i, f"n{i}", "Running"), 1.0)
    assert t.observe_pod("DELETED", job_pod(1, "n1", "Running"), 2.0) == []
    new = job_pod(1, "n9", "Running", uid="uid-new")
    assert kinds(t.observe_pod("ADDED", new, 3.0)) == ["placement", "start"]


def test_failures_are_reported_once_per_termination_with_rank_node_exit_code() -> None:
    t = JobTracker()
    t.observe_workload("Job", "ADDED", workload({"parallelism": 2}), 0.0)
    t.observe_pod("ADDED", job_pod(0, "n0", "Running"), 1.0)
    crashed = {"name": "t", "restartCount": 0, "state": {"terminated": {"exitCode": 139, "reason": "Error",
                                                                        "message": "segfault"}}}
    out = t.observe_pod("MODIFIED", job_pod(1, "n1", "Running", statuses=[crashed]), 2.0)
    failure = next(e for e in out if e.event == "failure")
    assert (failure.rank, failure.node, failure.exit_code, failure.attempt) == (1, "n1", 139, 0)
    assert failure.reason == "train-1/t: Error: segfault"
    # restarted by the kubelet: the same termination now shows as lastState -> not reported again
    again = {"name": "t", "restartCount": 1, "state": {"running": {}},
             "lastState": {"terminated": {"exitCode": 139, "reason": "Error"}}}
    assert "failure" not in kinds(t.observe_pod("MODIFIED", job_pod(1, "n1", "Running", statuses=[again]), 3.0))
    ok = {"name": "t", "restartCount": 1, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
    assert "failure" not in kinds(t.observe_pod("MODIFIED", job_pod(0, "n0", "Running", statuses=[ok]), 4.0))
    failed = t.observe_pod("MODIFIED", job_pod(0, "n0", "Failed"), 5.0)
    assert [(e.event, e.rank, e.exit_code) for e in failed] == [("failure", 0, -1)]


def test_pytorchjob_ranks_master_first_and_jobset_by_replicated_job_then_index() -> None:
    def ptj(rtype: str, i: int, node: str) -> dict[str, Any]:
        return pod(f"p-{rtype}-{i}", {"training.kubeflow.org/job-name": "train",
                                      "training.kubeflow.org/replica-type": rtype,
                                      "training.kubeflow.org/replica-index": str(i)}, node)

    t = JobTracker()
    t.observe_workload("PyTorchJob", "ADDED", workload({"pytorchReplicaSpecs": {
        "Master": {"replicas": 1}, "Worker": {"replicas": 2}}}), 0.0)
    t.observe_pod("ADDED", ptj("worker", 1, "w1"), 1.0)
    t.observe_pod("ADDED", ptj("worker", 0, "w0"), 1.0)
    out = t.observe_pod("ADDED", ptj("master", 0, "m0"), 1.0)
    assert [(r.rank, r.node) for r in out[0].placement] == [(0, "m0"), (1, "w0"), (2, "w1")]
    assert out[0].workload_kind == "PyTorchJob"

    def js(rjob: str, job_index: int, node: str) -> dict[str, Any]:
        return pod(f"js-{rjob}-{job_index}", {"jobset.sigs.k8s.io/jobset-name": "train",
                                              "jobset.sigs.k8s.io/replicatedjob-name": rjob,
                                              "jobset.sigs.k8s.io/job-index": str(job_index),
                                              "batch.kubernetes.io/job-name": f"train-{rjob}-{job_index}"}, node)

    t = JobTracker()
    t.observe_workload("JobSet", "ADDED", workload({"replicatedJobs": [
        {"name": "driver", "replicas": 1, "template": {"spec": {"parallelism": 1}}},
        {"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 1}}}]}), 0.0)
    t.observe_pod("ADDED", js("workers", 1, "b"), 1.0)
    t.observe_pod("ADDED", js("workers", 0, "a"), 1.0)
    out = t.observe_pod("ADDED", js("driver", 0, "d"), 1.0)
    assert [(r.rank, r.node) for r in out[0].placement] == [(0, "d"), (1, "a"), (2, "b")]
    child = {"metadata": {"name": "train-workers-0", "namespace": "ml",
                          "ownerReferences": [{"kind": "JobSet", "name": "train", "controller": True}]},
             "spec": {"parallelism": 1}}
    assert t.observe_workload("Job", "ADDED", child, 2.0) == [] and "ml/train-workers-0" not in t.jobs


def test_completion_failure_and_restart_come_from_the_workload_once() -> None:
    t = JobTracker()
    t.observe_workload("JobSet", "ADDED", workload({"replicatedJobs": []}), 0.0)
    restarted = t.observe_workload("JobSet", "MODIFIED", workload({"replicatedJobs": []}, {"restarts": 2}), 1.0)
    assert [(e.event, e.attempt) for e in restarted] == [("restart", 2)]
    ours = t.observe_workload("JobSet", "MODIFIED", workload(
        {"replicatedJobs": []}, {"restarts": 2}, annotations={"fleetmedic.io/restart-attempts": "3"}), 2.0)
    assert [(e.event, e.attempt) for e in ours] == [("restart", 3)]
    failed = {"restarts": 2, "conditions": [{"type": "Failed", "status": "True", "reason": "FailurePolicy",
                                             "message": "maxRestarts reached"}]}
    out = t.observe_workload("JobSet", "MODIFIED", workload({"replicatedJobs": []}, failed), 3.0)
    assert [(e.event, e.reason) for e in out] == [("failure", "FailurePolicy: maxRestarts reached")]
    assert t.observe_workload("JobSet", "MODIFIED", workload({"replicatedJobs": []}, failed), 4.0) == []
    done = {"conditions": [{"type": "Complete", "status": "True"}]}
    assert kinds(t.observe_workload("Job", "MODIFIED", workload({}, done, uid="w2"), 5.0)) == ["completion"]


def test_cpu_pods_unlabelled_pods_and_bad_objects_are_skipped() -> None:
    t = JobTracker()
    assert t.observe_pod("ADDED", job_pod(0, "n0", gpus=False), 1.0) == [] and not t.jobs
    assert t.observe_pod("ADDED", pod("web", {"app": "web"}, "n0"), 1.0) == []
    assert job_of_pod(pod("web", {"app": "web"})) is None
    assert t.observe_pod("ADDED", {"metadata": {"name": "x"}}, 1.0) == []
    bad = job_pod(0, "n0")
    bad["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "eight"}}
    assert t.observe_pod("ADDED", bad, 1.0) == []
    assert t.observe_workload("PyTorchJob", "ADDED", {"metadata": {"name": "a", "namespace": "b"},
                                                      "spec": {"pytorchReplicaSpecs": ["not", "a", "map"]}}, 1.0) == []
    assert t.skipped == {("Pod", "no_metadata"): 1, ("Pod", "bad_gpu_request"): 1, ("PyTorchJob", "bad_spec"): 1}
    assert t.last_skip.startswith("PyTorchJob: bad_spec")
    untracked = JobTracker(gpu_only=False)
    assert kinds(untracked.observe_pod("ADDED", job_pod(0, "n0", gpus=False), 1.0)) == ["placement"]


def test_a_job_deleted_before_it_finished_ends_with_a_completion_and_a_finished_one_says_nothing_more() -> None:
    t = JobTracker()
    t.observe_workload("Job", "ADDED", workload({"parallelism": 2}), 0.0)
    for i in range(2):
        t.observe_pod("ADDED", job_pod(i, f"n{i}", "Running"), 1.0)
    gone = t.observe_workload("Job", "DELETED", workload({"parallelism": 2}), 2.0)
    assert [(e.event, e.job, e.ts) for e in gone] == [("completion", "ml/train", 2.0)]
    assert gone[0].reason.startswith("deleted:")
    assert "ml/train" not in t.jobs and not t.pod_jobs
    # its pods going away afterwards say nothing, and a deletion seen twice neither
    assert t.observe_pod("DELETED", job_pod(0, "n0", "Running"), 3.0) == []
    assert t.observe_workload("Job", "DELETED", workload({"parallelism": 2}), 3.0) == []
    # a job that completed (or failed) has said so: its deletion adds nothing
    done = {"conditions": [{"type": "Complete", "status": "True"}]}
    for status in (done, {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}):
        t.observe_workload("Job", "ADDED", workload({"parallelism": 1}), 4.0)
        assert kinds(t.observe_workload("Job", "MODIFIED", workload({"parallelism": 1}, status), 5.0)) in (
            ["completion"], ["failure"])
        assert t.observe_workload("Job", "DELETED", workload({"parallelism": 1}, status), 6.0) == []


def owned(p: dict[str, Any], uid: str, kind: str = "Job") -> dict[str, Any]:
    p["metadata"]["ownerReferences"] = [{"kind": kind, "name": "train", "uid": uid, "controller": True}]
    return p


def test_the_pods_of_a_deleted_job_updated_before_they_go_do_not_start_it_again() -> None:
    """After a Job is deleted its pods linger until the garbage collector deletes them, and the Job
    controller first strips their tracking finalizer: an update without a deletion mark (the real
    control plane did exactly this; the watcher then announced a new 1-rank placement and start)."""
    t = JobTracker(tombstone_s=60.0)
    t.observe_workload("Job", "ADDED", workload({"parallelism": 2}), 0.0)
    for i in range(2):
        t.observe_pod("ADDED", owned(job_pod(i, f"n{i}", "Running"), "w1"), 1.0)
    assert kinds(t.observe_workload("Job", "DELETED", workload({"parallelism": 2}), 2.0)) == ["completion"]
    assert t.observe_pod("MODIFIED", owned(job_pod(0, "n0", "Running"), "w1"), 3.0) == []
    assert t.observe_pod("MODIFIED", job_pod(1, "n1", "Running"), 3.0) == []  # no owner to tell: still the old one
    assert t.observe_workload("Job", "MODIFIED", workload({"parallelism": 2}), 3.5) == []  # a late event of it
    assert not t.jobs and not t.pod_jobs
    # made again under the same name: its pods (another controller uid) are a new job at once
    placed = t.observe_pod("ADDED", owned(job_pod(0, "n5", "Running", uid="p-new"), "w2"), 4.0)
    assert kinds(placed) == ["placement", "start"] and placed[0].world_size == 1
    assert "ml/train" not in t.tombstones
    # the workload seen again (ADDED) clears its tombstone too, and a tombstone expires
    t.observe_workload("Job", "DELETED", workload({"parallelism": 1}, uid="w2"), 5.0)
    t.observe_workload("Job", "ADDED", workload({"parallelism": 1}, uid="w3"), 6.0)
    assert "ml/train" not in t.tombstones
    t.observe_workload("Job", "DELETED", workload({"parallelism": 1}, uid="w3"), 7.0)
    assert t.observe_pod("MODIFIED", job_pod(0, "n5", "Running", uid="p-x"), 60.0) == []
    assert kinds(t.observe_pod("MODIFIED", job_pod(0, "n5", "Running", uid="p-x"), 68.0)) == ["placement", "start"]


def test_tombstones_stay_bounded_by_their_age() -> None:
    t = JobTracker(tombstone_s=10.0)
    for i in range(1000):
        w = workload({"parallelism": 1}, uid=f"w{i}")
        w["metadata"]["name"] = f"j{i}"
        t.observe_workload("Job", "DELETED", w, float(i))
    assert len(t.tombstones) <= 11


def test_a_long_lived_job_keeps_no_trace_of_the_failed_pods_that_are_gone() -> None:
    """A Job that runs for weeks while its ranks fail and are replaced: each failure is reported once,
    and what the tracker keeps stays the size of the live job, not of its history."""
    t = JobTracker()
    t.observe_workload("Job", "ADDED", workload({"parallelism": 2}), 0.0)
    t.observe_pod("ADDED", job_pod(0, "n0", "Running"), 0.0)
    crashed = [{"name": "t", "restartCount": 0, "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]
    failures = 0
    for i in range(200):
        live = job_pod(1, "n1", "Running", uid=f"p{i}")
        t.observe_pod("ADDED", live, float(i))
        failed = job_pod(1, "n1", "Failed", uid=f"p{i}", statuses=crashed)
        failures += kinds(t.observe_pod("MODIFIED", failed, float(i))).count("failure")
        assert t.observe_pod("MODIFIED", failed, float(i)) == []  # once per termination
        t.observe_pod("DELETED", failed, float(i))
    state = t.jobs["ml/train"]
    assert failures == 200
    assert len(state.pods) == 1 and len(t.pod_jobs) == 1 and len(state.reported) == 0


def test_a_job_known_only_by_its_pods_is_forgotten_with_its_last_pod() -> None:
    """Pods of a workload kind that is not watched make a job of their own; nothing would ever
    delete it, so the last pod's deletion does. Its next pods place it afresh."""
    t = JobTracker()
    for n in range(100):
        pods = [pod(f"w{n}-{i}", {"job-name": f"w{n}"}, f"n{i}", "Running", uid=f"w{n}-{i}") for i in range(2)]
        assert kinds(t.observe_pod("ADDED", pods[0], 1.0) + t.observe_pod("ADDED", pods[1], 1.0)) == [
            "placement", "start", "placement", "start"]  # no size known: each rank places it again
        for p in pods:
            t.observe_pod("DELETED", p, 2.0)
    assert not t.jobs and not t.pod_jobs
    again = pod("w0-new", {"job-name": "w0"}, "n0", "Running", uid="w0-new")
    assert kinds(t.observe_pod("ADDED", again, 3.0)) == ["placement", "start"]
    # a job whose workload is watched is kept while the workload lives, pods or none
    t.observe_workload("Job", "ADDED", workload({"parallelism": 1}), 4.0)
    t.observe_pod("ADDED", job_pod(0, "n0", "Running"), 4.0)
    t.observe_pod("DELETED", job_pod(0, "n0", "Running"), 5.0)
    assert "ml/train" in t.jobs


def test_what_the_watch_keeps_of_each_object_still_reports_its_deletion_after_a_relist() -> None:
    """The job watcher keeps a stub of every object (to report those deleted while it was not
    watching); the stubs are smaller than the objects, yet each deletion still lands."""
    from fleetmedic.config import Settings
    from fleetmedic.connectors.kube.jobs import _stub as _kept
    from fleetmedic.connectors.kube.jobs import _unstub

    def _stub(kind: str, obj: dict[str, Any]) -> dict[str, Any]:  # what a relist reports of it
        return _unstub(kind, _kept(kind, obj))
    from fleetmedic.connectors.kube.nodes_map import NodeTracker

    t = JobTracker()
    t.observe_workload("Job", "ADDED", workload({"parallelism": 2}), 0.0)
    pods = [job_pod(i, f"n{i}", "Running") for i in range(2)]
    for p in pods:
        t.observe_pod("ADDED", p, 1.0)
    stub = _stub("Pod", pods[1])
    assert "labels" not in stub["metadata"] and "spec" not in stub
    assert t.observe_pod("DELETED", stub, 2.0) == [] and "uid-train-1" not in t.pod_jobs
    assert list(t.jobs["ml/train"].pods) == ["uid-train-0"]
    replaced = job_pod(1, "n7", "Running", uid="uid-new")
    assert [e.event for e in t.observe_pod("ADDED", replaced, 3.0)] == ["placement", "start"]

    t.observe_workload("Job", "DELETED", _stub("Job", workload({"parallelism": 2})), 5.0)
    assert "ml/train" not in t.jobs and not t.pod_jobs

    nodes = NodeTracker.of(Settings())
    node = {"metadata": {"name": "gpu-1", "uid": "n1", "labels": {"fleetmedic.io/rack": "r1", "team": "ml"},
                         "annotations": {"a": "b"}}, "spec": {}, "status": {"conditions": []}}
    nodes.observe("ADDED", node, 0.0)
    gone = nodes.observe("DELETED", _stub("Node", node), 1.0)
    assert gone is not None and gone.deleted and gone.labels == {"fleetmedic.io/rack": "r1"}
