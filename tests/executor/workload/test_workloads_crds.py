"""restart_workload on Kubeflow PyTorchJobs and JobSets against the real control plane.

The test cluster runs no training operator or JobSet controller: ``fleetmedic dev build`` does not
build them. The real ones run in test_workloads_pytorch_controller.py and
test_workloads_jobset_controller.py where they have been built; docs/workloads.md has the recipe.
So these tests **play the operator's part**, faithfully and only that part, in a background thread
(helpers_played_operators.py says how).
"""

from __future__ import annotations

from collections.abc import Callable

from kubernetes import client

from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.waiting import wait
from fleetmedic.devenv.workloads import (
    BindingWatch,
    live_pods,
    quarantine,
    running,
)
from fleetmedic.executor.kube import KubeCluster
from fleetmedic.executor.workload.apply import restart_workload
from fleetmedic.executor.workload.plan import HOSTNAME_LABEL, excluded_nodes
from fleetmedic.k8s_keys import ANNOTATION_LAST_COMMAND, ANNOTATION_RESTART_ATTEMPTS
from tests.executor.workload.helpers_played_operators import (
    JS,
    PT,
    jobset_manifest,
    played_operator,
    pytorchjob_manifest,
    reconcile_jobset,
    reconcile_pytorchjob,
)


def test_pytorchjob_tolerating_all_taints_is_replaced_off_the_suspect_by_its_operator(
    kube_api: client.ApiClient, namespace: str, crds: list[str], make_fleet: Callable[..., fl.Fleet]
) -> None:
    fleet = make_fleet(6)
    custom = client.CustomObjectsApi(kube_api)
    custom.create_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs",
                                           pytorchjob_manifest("llm", fleet))
    selector = f"{PT}/job-name=llm"
    with played_operator(reconcile_pytorchjob, kube_api, namespace, "llm"):
        before = wait("4 Running pods", lambda: running(kube_api, namespace, selector, 4))
        suspect = next(p.spec.node_name for p in before if p.metadata.labels[f"{PT}/replica-type"] == "master")
        quarantine(kube_api, suspect)
        old = {p.metadata.uid for p in before}
        dry = restart_workload(KubeCluster(kube_api), f"{namespace}/llm", action="restart_job", exclude_nodes=[suspect],
                               params={}, dry_run=True, actor="t")
        assert dry.outcome == "skipped" and dry.details["kind"] == "PyTorchJob"
        assert {p.metadata.uid for p in live_pods(kube_api, namespace, selector)} == old
        watcher = BindingWatch(kube_api, namespace).start()

        out = restart_workload(KubeCluster(kube_api), f"{namespace}/llm", action="restart_job", exclude_nodes=[suspect],
                               params={"command_id": "c-7"}, dry_run=False, actor="t")

        assert out.outcome == "applied", out.reason
        assert out.details["deleted"] == "4" and out.details["template_changed"] == "true"
        after = wait("4 new Running pods", lambda: running(kube_api, namespace, selector, 4, old))
        assert suspect not in {p.spec.node_name for p in after}
        seen = [node for uid, _, node in watcher.stop() if uid not in old]
        assert seen and suspect not in seen
        assert sorted(p.metadata.labels[f"{PT}/replica-index"] for p in after) == ["0", "0", "1", "2"]
    job = custom.get_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", "llm")
    for rspec in job["spec"]["pytorchReplicaSpecs"].values():
        assert excluded_nodes(rspec["template"]["spec"]["affinity"]) == {suspect}
    assert job["metadata"]["annotations"][ANNOTATION_LAST_COMMAND] == "c-7"
    missing = restart_workload(KubeCluster(kube_api), f"{namespace}/gone", action="restart_job", exclude_nodes=[],
                               params={"kind": "PyTorchJob"}, dry_run=False, actor="t")
    assert missing.outcome == "failed" and "not found (looked for PyTorchJob)" in missing.reason


def test_jobset_child_jobs_are_recreated_off_the_suspect_and_retry_in_place_keeps_nodes(
    kube_api: client.ApiClient, namespace: str, crds: list[str], make_fleet: Callable[..., fl.Fleet]
) -> None:
    fleet = make_fleet(6)
    custom = client.CustomObjectsApi(kube_api)
    custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets",
                                           jobset_manifest("js", fleet))
    selector = f"{JS}/jobset-name=js"
    with played_operator(reconcile_jobset, kube_api, namespace, "js"):
        before = wait("4 Running pods", lambda: running(kube_api, namespace, selector, 4))
        old = {p.metadata.uid for p in before}
        # retry in place: same nodes, nothing excluded
        out = restart_workload(KubeCluster(kube_api), f"{namespace}/js", action="retry_in_place", exclude_nodes=[],
                               params={}, dry_run=False, actor="t")
        assert out.outcome == "applied", out.reason
        assert out.details["kind"] == "JobSet" and out.details["deleted"] == "4"
        again = wait("4 new Running pods", lambda: running(kube_api, namespace, selector, 4, old), timeout=90)
        assert sorted(p.spec.node_name for p in again) == sorted(p.spec.node_name for p in before)

        # a child Job's name resolves to its JobSet; the taint keeps these pods off the suspect
        suspect = again[0].spec.node_name
        quarantine(kube_api, suspect)
        old = {p.metadata.uid for p in again}
        watcher = BindingWatch(kube_api, namespace).start()
        child = again[0].metadata.labels["batch.kubernetes.io/job-name"]
        out = restart_workload(KubeCluster(kube_api), f"{namespace}/{child}", action="restart_job",
                               exclude_nodes=[suspect], params={}, dry_run=False, actor="t")
        assert out.outcome == "applied", out.reason
        assert out.details["kind"] == "JobSet" and out.details["excluded_nodes"] == ""
        after = wait("4 new Running pods", lambda: running(kube_api, namespace, selector, 4, old), timeout=90)
        assert suspect not in {p.spec.node_name for p in after}
        seen = [node for uid, _, node in watcher.stop() if uid not in old]
        assert seen and suspect not in seen
    js = custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", "js")
    affinity = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"].get("affinity") or {}
    assert HOSTNAME_LABEL not in str(affinity)  # the in-place preference was dropped by the re-placement
    assert js["metadata"]["annotations"][ANNOTATION_RESTART_ATTEMPTS] == "2"
