"""restart_workload on a JobSet with the **real JobSet controller** (sigs.k8s.io/jobset v0.12.0, the
version of the committed CRD, built from the Go module proxy) running against the test cluster.

The controller binary is the one ``fleetmedic dev build`` builds, or ``FLEETMEDIC_JOBSET_MANAGER``
names a built ``manager`` binary (``go build`` of the module root; see docs/workloads.md); without it
this test is skipped, and fails under ``FLEETMEDIC_REQUIRE_SERVICES=1`` (CI). It runs the
controller out of cluster with its webhooks registered nowhere (certificates self-signed, internal
cert management off), which leaves its reconciler, the part fleetmedic depends on, exactly as
upstream ships it.

Proves that the operator the other JobSet tests play behaves like the real one: the controller
creates the child Jobs, and after restart_workload patches the replicated-job template (node
anti-affinity: the pods tolerate every taint) and deletes the child Jobs, it recreates them from
the patched template, and no replacement pod is bound to the quarantined node.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kubernetes import client

from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.jobset import create_when_served, register_webhooks
from fleetmedic.devenv.waiting import wait
from fleetmedic.devenv.workloads import (
    TOLERATE_ALL,
    BindingWatch,
    pod_spec,
    quarantine,
    running,
)
from fleetmedic.executor.kube import KubeCluster
from fleetmedic.executor.workload.apply import restart_workload
from fleetmedic.executor.workload.plan import excluded_nodes
from fleetmedic.k8s_keys import ANNOTATION_EXCLUDED_NODES, ANNOTATION_RESTART_IN_PROGRESS
from tests.executor.workload.helpers_controllers import jobset_manager

_, pytestmark = jobset_manager()
JS = "jobset.sigs.k8s.io"
# what the JobSet defaulting webhook (pkg/webhooks/jobset_webhook.go Default) adds; no webhook runs here
WEBHOOK_DEFAULTS = {"successPolicy": {"operator": "All"}, "startupPolicy": {"startupPolicyOrder": "AnyOrder"},
                    "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True}}


def test_real_jobset_controller_recreates_child_jobs_from_the_patched_template(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet], jobset_controller: Path
) -> None:
    fleet = make_fleet(6)
    custom = client.CustomObjectsApi(kube_api)
    custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "real"},
        "spec": {**WEBHOOK_DEFAULTS, "replicatedJobs": [{"name": "workers", "replicas": 4, "template": {"spec": {
            "parallelism": 1, "completions": 1, "backoffLimit": 0, "completionMode": "Indexed",
            "template": {"spec": pod_spec(fleet, TOLERATE_ALL, restart_policy="OnFailure")}}}}]}})
    selector = f"{JS}/jobset-name=real"
    before = wait("4 Running pods from the real controller's child Jobs",
                  lambda: running(kube_api, namespace, selector, 4), timeout=90)
    suspect = before[0].spec.node_name
    quarantine(kube_api, suspect)
    old = {p.metadata.uid for p in before}
    watcher = BindingWatch(kube_api, namespace).start()

    out = restart_workload(KubeCluster(kube_api), f"{namespace}/real", action="restart_job", exclude_nodes=[suspect],
                           params={}, dry_run=False, actor="t")

    assert out.outcome == "applied", out.reason
    assert out.details["deleted"] == "4" and out.details["template_changed"] == "true"
    after = wait("4 new Running pods", lambda: running(kube_api, namespace, selector, 4, old), timeout=120)
    assert suspect not in {p.spec.node_name for p in after}
    seen = [node for uid, _, node in watcher.stop() if uid not in old]
    assert seen and suspect not in seen
    for job in client.BatchV1Api(kube_api).list_namespaced_job(namespace, label_selector=selector).items:
        affinity = client.ApiClient().sanitize_for_serialization(job.spec.template.spec.affinity)
        assert excluded_nodes(affinity) == {suspect}, jobset_controller.read_text()[-2000:]


def test_with_the_real_jobset_webhooks_the_exclusion_goes_onto_the_suspended_child_jobs(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet], jobset_controller: Path
) -> None:
    names = register_webhooks(kube_api, namespace, jobset_controller.parent)
    reg = client.AdmissionregistrationV1Api(kube_api)
    try:
        fleet = make_fleet(6)
        custom = client.CustomObjectsApi(kube_api)
        manifest = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "hooked"},
                    "spec": {"replicatedJobs": [{"name": "workers", "replicas": 4, "template": {"spec": {
                        "parallelism": 1, "completions": 1, "backoffLimit": 0,
                        "template": {"spec": pod_spec(fleet, TOLERATE_ALL, restart_policy="OnFailure")}}}}]}}
        created = wait("the webhook server to answer", lambda: create_when_served(custom, namespace, manifest))
        assert created["spec"]["network"]["enableDNSHostnames"] is True  # defaulted by the real webhook
        selector = f"{JS}/jobset-name=hooked"
        before = wait("4 Running pods", lambda: running(kube_api, namespace, selector, 4), timeout=90)
        suspect = before[0].spec.node_name
        quarantine(kube_api, suspect)
        old = {p.metadata.uid for p in before}
        watcher = BindingWatch(kube_api, namespace).start()

        out = restart_workload(KubeCluster(kube_api), f"{namespace}/hooked", action="restart_job",
                               exclude_nodes=[suspect], params={"command_id": "c-1"}, dry_run=False, actor="t")

        assert out.outcome == "applied", out.reason
        assert out.details["mechanism"] == "suspend_patch_children", out.details
        assert 'webhook "vjobset.kb.io" denied' in out.details["template_refused"]
        assert out.details["children_patched"] == "4"
        after = wait("4 new Running pods", lambda: running(kube_api, namespace, selector, 4, old), timeout=120)
        assert suspect not in {p.spec.node_name for p in after}
        seen = [node for uid, _, node in watcher.stop() if uid not in old]
        assert seen and suspect not in seen
        js = custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", "hooked")
        assert not js["spec"].get("suspend")
        assert ANNOTATION_RESTART_IN_PROGRESS not in js["metadata"]["annotations"]
        assert js["metadata"]["annotations"][ANNOTATION_EXCLUDED_NODES] == suspect
    finally:
        for name in names:
            reg.delete_mutating_webhook_configuration(name)
            reg.delete_validating_webhook_configuration(name)
