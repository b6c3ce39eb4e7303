"""restart_workload on batch/v1 Jobs against the real control plane (kube-scheduler, the Job
controller of kube-controller-manager, kwok GPU nodes): a 4-pod x 8-GPU Job on a 6-node fleet.

- restart_job after the executor-style quarantine (cordon + ``fleetmedic.io/quarantine`` taint):
  every pod is recreated and Running on other nodes, and a watch sees no new pod bound to the
  quarantined node; the Job records the restart (annotations, attempt count, command id, Event).
- An Indexed Job whose pods tolerate every taint gets the required anti-affinity (the taint alone
  would not keep it off), keeps its completion indices, and stays off the node.
- retry_in_place brings the pods back on the same nodes; requeue_job recreates them all.
- dry-run changes nothing; a missing job fails with a reason; a Job suspended by someone else is
  left alone; a Job a crashed executor left suspended (its marker on it) is resumed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client

from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.waiting import wait
from fleetmedic.devenv.workloads import (
    TOLERATE_ALL,
    BindingWatch,
    gpu_job,
    live_pods,
    quarantine,
    running,
)
from fleetmedic.executor.kube import KubeCluster
from fleetmedic.executor.workload.apply import restart_workload
from fleetmedic.k8s_keys import (
    ANNOTATION_LAST_COMMAND,
    ANNOTATION_LAST_RESTART,
    ANNOTATION_RESTART_ATTEMPTS,
    ANNOTATION_RESTART_IN_PROGRESS,
)

INDEX = "batch.kubernetes.io/job-completion-index"


def _start(api: client.ApiClient, namespace: str, fleet: fl.Fleet, name: str, **kw: Any) -> list[client.V1Pod]:
    client.BatchV1Api(api).create_namespaced_job(namespace, client.V1Job.from_dict(gpu_job(name, fleet, **kw)))
    return wait("4 Running pods", lambda: running(api, namespace, f"app={name}", 4))  # type: ignore[no-any-return]


def _job(api: client.ApiClient, namespace: str, name: str) -> client.V1Job:
    return client.BatchV1Api(api).read_namespaced_job(name, namespace)


def test_restart_job_recreates_every_pod_off_the_quarantined_node_and_records_it(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    fleet = make_fleet(6)
    before = _start(kube_api, namespace, fleet, "train")
    suspect = before[0].spec.node_name
    quarantine(kube_api, suspect)
    watcher = BindingWatch(kube_api, namespace).start()
    old = {p.metadata.uid for p in before}

    out = restart_workload(KubeCluster(kube_api), f"{namespace}/train", action="restart_job", exclude_nodes=[suspect],
                           params={"command_id": "cmd-1"}, dry_run=False, actor="executor-0")

    assert out.outcome == "applied", out.reason
    assert out.details["kind"] == "Job" and out.details["mechanism"] == "suspend_resume"
    after = wait("4 new Running pods", lambda: running(kube_api, namespace, "app=train", 4, old))
    assert suspect not in {p.spec.node_name for p in after}
    new_bindings = [(name, node) for uid, name, node in watcher.stop() if uid not in old]
    assert new_bindings and all(node != suspect for _, node in new_bindings)
    job = _job(kube_api, namespace, "train")
    assert not job.spec.suspend
    annotations = job.metadata.annotations
    assert annotations[ANNOTATION_RESTART_ATTEMPTS] == "1" and annotations[ANNOTATION_LAST_COMMAND] == "cmd-1"
    assert '"action":"restart_job"' in annotations[ANNOTATION_LAST_RESTART]
    # the taint keeps these pods off: no anti-affinity was needed, the template is untouched
    assert out.details["template_changed"] == "false" and job.spec.template.spec.affinity is None
    events = client.CoreV1Api(kube_api).list_namespaced_event(
        namespace, field_selector="involvedObject.kind=Job,involvedObject.name=train").items
    assert any(e.reason == "FleetmedicReplaceJob" and e.reporting_instance == "executor-0" for e in events)


def test_indexed_job_tolerating_all_taints_gets_anti_affinity_and_keeps_its_indices(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    fleet = make_fleet(6)
    before = _start(kube_api, namespace, fleet, "idx", indexed=True, tolerations=TOLERATE_ALL)
    by_index = {p.metadata.annotations[INDEX]: p.spec.node_name for p in before}
    suspect = by_index["2"]
    quarantine(kube_api, suspect)
    watcher = BindingWatch(kube_api, namespace).start()
    old = {p.metadata.uid for p in before}

    out = restart_workload(KubeCluster(kube_api), f"{namespace}/idx", action="restart_job", exclude_nodes=[suspect],
                           params={"kind": "Job"}, dry_run=False, actor="t")

    assert out.outcome == "applied", out.reason
    assert out.details["template_changed"] == "true" and out.details["excluded_nodes"] == suspect
    after = wait("4 new Running pods", lambda: running(kube_api, namespace, "app=idx", 4, old))
    assert sorted(p.metadata.annotations[INDEX] for p in after) == ["0", "1", "2", "3"]
    assert suspect not in {p.spec.node_name for p in after}
    assert all(node != suspect for uid, _, node in watcher.stop() if uid not in old)
    terms = _job(kube_api, namespace, "idx").spec.template.spec.affinity.node_affinity \
        .required_during_scheduling_ignored_during_execution.node_selector_terms
    assert [(e.key, e.operator, e.values) for e in terms[0].match_expressions] == [
        ("kubernetes.io/hostname", "NotIn", [suspect])]

    # a second restart for another node accumulates the exclusion and counts the attempt
    other = next(p.spec.node_name for p in after)
    quarantine(kube_api, other)
    again = restart_workload(KubeCluster(kube_api), f"{namespace}/idx", action="restart_job", exclude_nodes=[other],
                             params={}, dry_run=False, actor="t")
    assert again.outcome == "applied", again.reason
    assert again.details["attempt"] == "2"
    assert again.details["excluded_nodes"] == ",".join(sorted([suspect, other]))


def test_retry_in_place_restarts_the_pods_on_the_same_nodes(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    fleet = make_fleet(6)
    before = _start(kube_api, namespace, fleet, "retry")
    old = {p.metadata.uid for p in before}

    out = restart_workload(KubeCluster(kube_api), f"{namespace}/retry", action="retry_in_place", exclude_nodes=[],
                           params={}, dry_run=False, actor="t")

    assert out.outcome == "applied", out.reason
    after = wait("4 new Running pods", lambda: running(kube_api, namespace, "app=retry", 4, old))
    assert sorted(p.spec.node_name for p in after) == sorted(p.spec.node_name for p in before)
    assert out.details["excluded_nodes"] == ""


def test_requeue_job_recreates_the_whole_job(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    fleet = make_fleet(6)
    before = _start(kube_api, namespace, fleet, "rq")
    out = restart_workload(KubeCluster(kube_api), f"{namespace}/rq", action="requeue_job", exclude_nodes=[],
                           params={}, dry_run=False, actor="t")
    assert out.outcome == "applied", out.reason
    wait("4 new Running pods", lambda: running(kube_api, namespace, "app=rq", 4, {p.metadata.uid for p in before}))


def test_dry_run_reports_the_plan_and_changes_nothing(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    fleet = make_fleet(6)
    before = _start(kube_api, namespace, fleet, "dry", tolerations=TOLERATE_ALL)
    suspect = before[0].spec.node_name
    rv = _job(kube_api, namespace, "dry").metadata.resource_version

    out = restart_workload(KubeCluster(kube_api), f"{namespace}/dry", action="restart_job", exclude_nodes=[suspect],
                           params={}, dry_run=True, actor="t")

    assert out.outcome == "skipped" and out.details["dry_run"] == "true"
    assert out.reason.startswith("dry run: would re-place Job") and suspect in out.reason
    assert _job(kube_api, namespace, "dry").metadata.resource_version == rv
    assert {p.metadata.uid for p in live_pods(kube_api, namespace, "app=dry")} == {p.metadata.uid for p in before}


def test_missing_job_fails_with_a_reason_and_a_foreign_suspension_is_left_alone(
    kube_api: client.ApiClient, namespace: str, crds: list[str], make_fleet: Callable[..., fl.Fleet]
) -> None:
    out = restart_workload(KubeCluster(kube_api), f"{namespace}/nope", action="restart_job", exclude_nodes=["n1"],
                           params={}, dry_run=False, actor="t")
    assert out.outcome == "failed" and "not found" in out.reason and f"{namespace}/nope" in out.reason
    bad = restart_workload(KubeCluster(kube_api), "no-slash", action="restart_job", exclude_nodes=[], params={},
                           dry_run=False, actor="t")
    assert bad.outcome == "failed" and bad.reason.startswith("job:")

    fleet = make_fleet(1)
    manifest = gpu_job("held", fleet, pods=1)
    manifest["spec"]["suspend"] = True
    client.BatchV1Api(kube_api).create_namespaced_job(namespace, client.V1Job.from_dict(manifest))
    held = restart_workload(KubeCluster(kube_api), f"{namespace}/held", action="restart_job", exclude_nodes=[],
                            params={}, dry_run=False, actor="t")
    assert held.outcome == "skipped" and "suspended by someone else" in held.reason
    assert _job(kube_api, namespace, "held").spec.suspend is True


def test_a_job_left_suspended_by_a_crashed_executor_is_resumed_by_the_next_command(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    fleet = make_fleet(6)
    before = _start(kube_api, namespace, fleet, "crash")
    # what the executor had done when it died: suspended the Job with its in-progress marker
    client.BatchV1Api(kube_api).patch_namespaced_job("crash", namespace, {
        "metadata": {"annotations": {ANNOTATION_RESTART_IN_PROGRESS: "re-place Job (attempt 1)"}},
        "spec": {"suspend": True}})
    wait("the pods gone", lambda: not live_pods(kube_api, namespace, "app=crash"))

    out = restart_workload(KubeCluster(kube_api), f"{namespace}/crash", action="restart_job", exclude_nodes=[],
                           params={}, dry_run=False, actor="executor-1")

    assert out.outcome == "applied", out.reason
    wait("4 new Running pods", lambda: running(kube_api, namespace, "app=crash", 4, {p.metadata.uid for p in before}))
    job = _job(kube_api, namespace, "crash")
    assert not job.spec.suspend and ANNOTATION_RESTART_IN_PROGRESS not in job.metadata.annotations
