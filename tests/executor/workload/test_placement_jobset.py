"""Topology-aware restart_job of a **JobSet**, on the real control plane with the real JobSet
controller (v0.12.0, out of cluster) and its real webhooks, through
:class:`~fleetmedic.executor.workload.placement_apply.PlacementRestarter`.

The JobSet webhook refuses any affinity change on ``replicatedJobs``, so the placement goes onto
the suspended child Jobs: the same patch carries the exclusion of the suspect and the preferred
node affinity toward the surviving ranks' leaf/rack. A JobSet of two replicated jobs (3 pods of 8
GPUs) runs in one leaf of a 4-leaf fleet; one of its nodes is quarantined; a dry run changes
nothing; the restart puts every replacement back in the leaf (3 healthy nodes there, 12 free ones
in the other leaves) and none on the suspect, and every child Job carries the exclusion and the
preferred terms. With the child-Job preference switched off the test fails (checked: on the child
Jobs' terms always, on the leaf in some runs: the scheduler does not always scatter them).

Scarce capacity: a 4-pod JobSet on 4 nodes, one quarantined: ``capacity: insufficient`` with what
is missing, a Warning Event on the JobSet, the metric, one pod Pending; the same command again is
refused as thrashing (the exclusion is on the child Jobs, which the check reads).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry

from fleetmedic.config import PlacementSettings, Settings
from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.jobset import create_when_served, register_webhooks, unregister_webhooks
from fleetmedic.devenv.placement import leaves_of, set_cordon
from fleetmedic.devenv.waiting import wait
from fleetmedic.devenv.workloads import BindingWatch, live_pods, pod_spec, quarantine, running
from fleetmedic.executor.kube import KubeCluster
from fleetmedic.executor.workload.placement_apply import PlacementRestarter
from fleetmedic.executor.workload.placement_metrics import PlacementMetrics
from fleetmedic.executor.workload.plan import excluded_nodes
from fleetmedic.k8s_keys import (
    ANNOTATION_EXCLUDED_NODES,
    ANNOTATION_PLACEMENT,
    LABEL_LEAF,
    LABEL_POOL,
    LABEL_RACK,
    TAINT_QUARANTINE,
)
from tests.executor.workload.helpers_controllers import jobset_manager

_, pytestmark = jobset_manager()
JS_GROUP, JS_VERSION = "jobset.x-k8s.io", "v1alpha2"
SELECTOR = "jobset.sigs.k8s.io/jobset-name=placed"


def _jobset(fleet: fl.Fleet, workers: int = 2) -> dict[str, Any]:
    def rjob(name: str, replicas: int) -> dict[str, Any]:
        return {"name": name, "replicas": replicas, "template": {"spec": {
            "parallelism": 1, "completions": 1, "backoffLimit": 0,
            "template": {"spec": pod_spec(fleet, restart_policy="OnFailure")}}}}

    return {"apiVersion": f"{JS_GROUP}/{JS_VERSION}", "kind": "JobSet", "metadata": {"name": "placed"},
            "spec": {"replicatedJobs": [rjob("leader", 1), rjob("workers", workers)]}}


def _children(api: client.ApiClient, namespace: str) -> list[client.V1Job]:
    return client.BatchV1Api(api).list_namespaced_job(namespace, label_selector=SELECTOR).items


def test_a_jobset_restart_prefers_the_surviving_ranks_leaf_through_its_child_jobs(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet], jobset_controller: Path
) -> None:
    hooks = register_webhooks(kube_api, namespace, jobset_controller.parent)
    try:
        fleet = make_fleet(16, nodes_per_rack=2, racks_per_leaf=2)
        leaf_of = leaves_of(kube_api, fleet)
        leaf = min(leaf_of.values())
        others = [n for n, lf in leaf_of.items() if lf != leaf]
        custom = client.CustomObjectsApi(kube_api)
        set_cordon(kube_api, others, True)  # the JobSet starts in one leaf, with no affinity of its own
        try:
            wait("the webhook server to answer", lambda: create_when_served(custom, namespace, _jobset(fleet)))
            before = wait("3 Running pods", lambda: running(kube_api, namespace, SELECTOR, 3), timeout=90)
        finally:
            set_cordon(kube_api, others, False)
        assert {leaf_of[p.spec.node_name] for p in before} == {leaf}
        suspect = sorted(p.spec.node_name for p in before)[0]
        quarantine(kube_api, suspect)
        registry = CollectorRegistry()
        settings = Settings(placement=PlacementSettings(node_cache_s=0.0))  # sees the repair below at once
        restarter = PlacementRestarter(KubeCluster(kube_api), settings, PlacementMetrics(registry))
        # what a dry run must not change: spec (generation) and annotations; the controllers keep
        # updating status (and so resourceVersion) on their own
        versions = {j.metadata.name: (j.metadata.generation, j.metadata.annotations)
                    for j in _children(kube_api, namespace)}
        js_meta = custom.get_namespaced_custom_object(JS_GROUP, JS_VERSION, namespace, "jobsets", "placed")["metadata"]
        js_version = (js_meta["generation"], js_meta.get("annotations"))

        dry = restarter.restart(f"{namespace}/placed", action="restart_job", exclude_nodes=[suspect], params={},
                                dry_run=True, actor="t")

        assert dry.outcome == "skipped" and dry.details["dry_run"] == "true", dry.reason
        assert dry.details["preferred_domain"] == f"leaf={leaf}" and dry.details["capacity_pods"] == "3", dry.details
        assert {j.metadata.name: (j.metadata.generation, j.metadata.annotations)
                for j in _children(kube_api, namespace)} == versions
        js_meta = custom.get_namespaced_custom_object(JS_GROUP, JS_VERSION, namespace, "jobsets", "placed")["metadata"]
        assert (js_meta["generation"], js_meta.get("annotations")) == js_version
        assert running(kube_api, namespace, SELECTOR, 3) is not None

        old = {p.metadata.uid for p in before}
        watcher = BindingWatch(kube_api, namespace).start()
        out = restarter.restart(f"{namespace}/placed", action="restart_job", exclude_nodes=[suspect],
                                params={"command_id": "c-1"}, dry_run=False, actor="t")

        assert out.outcome == "applied", out.reason
        assert out.details["mechanism"] == "suspend_patch_children", out.details
        assert out.details["children_patched"] == "3", out.details
        assert out.details["capacity"] == "sufficient" and out.details["capacity_fit_in_domain"] == "3", out.details
        assert "preference" in out.details["note"]
        after = wait("3 replacement pods Running", lambda: running(kube_api, namespace, SELECTOR, 3, old), timeout=120)
        nodes_after = sorted(p.spec.node_name for p in after)
        assert suspect not in nodes_after
        assert [leaf_of[n] for n in nodes_after] == [leaf] * 3, f"replacements on {nodes_after}, leaf {leaf}"
        seen = [node for uid, _, node in watcher.stop() if uid not in old]
        assert seen and suspect not in seen
        for job in _children(kube_api, namespace):
            spec = job.spec.template.spec
            assert excluded_nodes(kube_api.sanitize_for_serialization(spec.affinity)) == {suspect}, job.metadata.name
            prefs = spec.affinity.node_affinity.preferred_during_scheduling_ignored_during_execution
            assert [(p.weight, p.preference.match_expressions[0].key) for p in prefs] == [
                (40, LABEL_LEAF), (20, LABEL_RACK), (5, LABEL_POOL)], job.metadata.name
            assert prefs[0].preference.match_expressions[0].values == [leaf]
        js = custom.get_namespaced_custom_object(JS_GROUP, JS_VERSION, namespace, "jobsets", "placed")
        assert not js["spec"].get("suspend")
        assert ANNOTATION_PLACEMENT in js["metadata"]["annotations"]
        assert js["metadata"]["annotations"][ANNOTATION_EXCLUDED_NODES] == suspect
        assert registry.get_sample_value("fleetmedic_executor_placements_total", {"capacity": "sufficient"}) == 1

        # the suspect is repaired and returned; another rank's node fails: its exclusion is lifted, the
        # new suspect excluded, and the terms replaced, not piled up, on the same child Jobs
        core = client.CoreV1Api(kube_api)
        core.patch_node(suspect, {"spec": {"unschedulable": False, "taints": [
            t.to_dict() for t in core.read_node(suspect).spec.taints or [] if t.key != TAINT_QUARANTINE]}})
        second = nodes_after[0]
        quarantine(kube_api, second)
        again = restarter.restart(f"{namespace}/placed", action="restart_job", exclude_nodes=[second],
                                  params={"command_id": "c-2"}, dry_run=False, actor="t")

        assert again.outcome == "applied", again.reason
        assert again.details["mechanism"] == "suspend_patch_children", again.details
        assert again.details.get("exclusion_released") == suspect, again.details
        final = wait("3 replacement pods Running", lambda: running(kube_api, namespace, SELECTOR, 3,
                                                                   {p.metadata.uid for p in after}), timeout=120)
        assert second not in {p.spec.node_name for p in final}
        assert {leaf_of[p.spec.node_name] for p in final} == {leaf}
        for job in _children(kube_api, namespace):
            spec = job.spec.template.spec
            assert excluded_nodes(kube_api.sanitize_for_serialization(spec.affinity)) == {second}, job.metadata.name
            prefs = spec.affinity.node_affinity.preferred_during_scheduling_ignored_during_execution
            assert len(prefs) == 3, job.metadata.name
    finally:
        unregister_webhooks(kube_api, hooks)


def test_a_jobset_without_healthy_capacity_is_reported_and_not_thrashed(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet], jobset_controller: Path
) -> None:
    hooks = register_webhooks(kube_api, namespace, jobset_controller.parent)
    try:
        fleet = make_fleet(4)
        custom = client.CustomObjectsApi(kube_api)
        wait("the webhook server to answer", lambda: create_when_served(custom, namespace, _jobset(fleet, 3)))
        before = wait("4 Running pods", lambda: running(kube_api, namespace, SELECTOR, 4), timeout=90)
        suspect = sorted(p.spec.node_name for p in before)[0]
        quarantine(kube_api, suspect)
        registry = CollectorRegistry()
        settings = Settings(placement=PlacementSettings(capacity_wait_s=0.5, capacity_poll_s=0.1))
        restarter = PlacementRestarter(KubeCluster(kube_api), settings, PlacementMetrics(registry))

        out = restarter.restart(f"{namespace}/placed", action="restart_job", exclude_nodes=[suspect], params={},
                                dry_run=False, actor="t")

        assert out.outcome == "applied", out.reason
        assert out.details["mechanism"] == "suspend_patch_children", out.details
        assert out.details["capacity"] == "insufficient", out.details
        assert out.details["capacity_missing"].startswith("1 of 4 pod(s) (32 GPU(s) in all) do not fit on the 3 "
                                                          "healthy"), out.details
        assert "no healthy capacity" in out.reason
        assert out.details["capacity_still_waiting"] == "true", out.details
        assert registry.get_sample_value("fleetmedic_executor_capacity_waits_total", {"action": "restart_job"}) == 1
        assert registry.get_sample_value("fleetmedic_executor_placements_total", {"capacity": "insufficient"}) == 1
        events = client.CoreV1Api(kube_api).list_namespaced_event(
            namespace, field_selector="involvedObject.kind=JobSet,involvedObject.name=placed").items
        assert any(e.reason == "FleetmedicCapacityWait" and e.type == "Warning" for e in events)
        wait("3 replacement pods Running", lambda: running(kube_api, namespace, SELECTOR, 3,
                                                           {p.metadata.uid for p in before}), timeout=120)
        pending = wait("1 Pending pod", lambda: [p for p in live_pods(kube_api, namespace, SELECTOR)
                                                 if p.status.phase == "Pending" and not p.spec.node_name])
        assert len(pending) == 1

        again = restarter.restart(f"{namespace}/placed", action="restart_job", exclude_nodes=[suspect], params={},
                                  dry_run=False, actor="t")

        assert again.outcome == "skipped" and again.details["capacity"] == "waiting", again.reason
        assert again.details["excluded_nodes"] == suspect
        assert [p.metadata.uid for p in live_pods(kube_api, namespace, SELECTOR) if not p.spec.node_name] == \
            [pending[0].metadata.uid]
    finally:
        unregister_webhooks(kube_api, hooks)
