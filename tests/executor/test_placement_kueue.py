"""restart_job on a Kueue-managed Job goes through its Kueue Workload (fleetmedic.executor.kueue).

Kueue's controller cannot run here, so these tests prove what can be proven on the real API
server: detection (the ``workloads.kueue.x-k8s.io`` API served, the queue-name label, a Workload
owned by the Job), the calls on the Workload (``spec.active`` false, then true again), that
nothing is left inactive when no controller evicts it, and (with the test doing Kueue's part: on
``active: false`` it suspends the Job, on ``active: true`` it resumes it, as Kueue's eviction and
admission would) that the placement is written while the Job is suspended, between the two.
The Workload CRD installed here is a minimal one written for these tests (group, version, kind and
plural as Kueue serves them; schema not checked), not Kueue's own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, watch

from fleetmedic.config import Settings
from fleetmedic.devenv import fleet as fl
from fleetmedic.executor import kueue
from fleetmedic.executor.capacity import PlacementRestarter
from fleetmedic.executor.workloads_plan import excluded_nodes
from tests.executor.test_workloads_support import gpu_job, live_pods, quarantine, running, wait

VERSION = "v1beta1"
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": f"workloads.{kueue.GROUP}"},
    "spec": {"group": kueue.GROUP, "scope": "Namespaced",
             "names": {"plural": "workloads", "singular": "workload", "kind": "Workload", "listKind": "WorkloadList"},
             "versions": [{"name": VERSION, "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}


@pytest.fixture(scope="module")
def workload_crd(kube_api: client.ApiClient) -> str:
    ext = client.ApiextensionsV1Api(kube_api)
    try:
        ext.create_custom_resource_definition(client.V1CustomResourceDefinition.from_dict(CRD))
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    wait("Workload API served", lambda: kueue.served_version(kube_api), 30)
    return kueue.served_version(kube_api)


def _queued_job(api: client.ApiClient, namespace: str, fleet: fl.Fleet, name: str, workload: bool) -> dict[str, Any]:
    manifest = gpu_job(name, fleet, 2)
    manifest["metadata"]["labels"] = {kueue.QUEUE_LABEL: "team-a"}
    job = client.BatchV1Api(api).create_namespaced_job(namespace, client.V1Job.from_dict(manifest))
    wait("2 Running pods", lambda: running(api, namespace, f"app={name}", 2))
    if workload:
        body = {"apiVersion": f"{kueue.GROUP}/{VERSION}", "kind": "Workload",
                "metadata": {"name": f"job-{name}-1a2b3", "ownerReferences": [
                    {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job.metadata.uid,
                     "controller": True, "blockOwnerDeletion": True}]},
                "spec": {"active": True, "queueName": "team-a", "priority": 100,
                         "podSets": [{"name": "main", "count": 2}]}}
        client.CustomObjectsApi(api).create_namespaced_custom_object(kueue.GROUP, VERSION, namespace, "workloads", body)
    return {"uid": job.metadata.uid, "workload": f"job-{name}-1a2b3"}


class WorkloadWatch:
    """Records ``spec.active`` of the namespace's Workloads as the API server reports each change;
    with ``act_as_kueue``, suspends the Job on ``active: false`` and resumes it on ``true``."""

    def __init__(self, api: client.ApiClient, namespace: str, job: str, act_as_kueue: bool) -> None:
        self.api, self.namespace, self.job, self.act = api, namespace, job, act_as_kueue
        self.active: list[bool] = []
        self.template_at_reactivation: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        custom = client.CustomObjectsApi(self.api)
        while not self._stop.is_set():
            w = watch.Watch()
            for ev in w.stream(custom.list_namespaced_custom_object, kueue.GROUP, VERSION, self.namespace,
                               "workloads", timeout_seconds=1):
                active = bool(ev["object"].get("spec", {}).get("active", True))
                if ev["type"] != "MODIFIED" or (self.active and self.active[-1] == active):
                    continue
                self.active.append(active)
                if self.act:
                    batch = client.BatchV1Api(self.api)
                    if active:
                        job = batch.read_namespaced_job(self.job, self.namespace)
                        self.template_at_reactivation = client.ApiClient().sanitize_for_serialization(
                            job.spec.template.spec)
                    batch.patch_namespaced_job(self.job, self.namespace, {"spec": {"suspend": not active}})

    def stop(self) -> list[bool]:
        time.sleep(0.5)
        self._stop.set()
        self._thread.join(timeout=5)
        return self.active


@pytest.fixture
def fleet4(make_fleet: Callable[..., fl.Fleet]) -> Iterator[fl.Fleet]:
    yield make_fleet(4)


def test_detection_dry_run_and_no_controller_leaves_the_workload_active(
    kube_api: client.ApiClient, namespace: str, fleet4: fl.Fleet, workload_crd: str
) -> None:
    info = _queued_job(kube_api, namespace, fleet4, "queued", workload=True)
    assert kueue.owning_workload(kube_api, workload_crd, namespace, info["uid"])["metadata"]["name"] == info["workload"]
    restarter = PlacementRestarter(kube_api, Settings())
    before = {p.metadata.uid for p in live_pods(kube_api, namespace, "app=queued")}
    suspect = next(p.spec.node_name for p in live_pods(kube_api, namespace, "app=queued"))
    quarantine(kube_api, suspect)

    dry = restarter.restart(f"{namespace}/queued", action="restart_job", exclude_nodes=[suspect], params={},
                            dry_run=True, actor="t")
    assert dry.outcome == "skipped" and "through Kueue Workload" in dry.reason
    assert dry.details["kueue_workload"] == f"{namespace}/{info['workload']}"

    seen = WorkloadWatch(kube_api, namespace, "queued", act_as_kueue=False)
    out = restarter.restart(f"{namespace}/queued", action="restart_job", exclude_nodes=[suspect],
                            params={"timeout_s": "2"}, dry_run=False, actor="t")
    assert out.outcome == "failed" and "Kueue did not evict" in out.reason and "set active again" in out.reason
    assert seen.stop() == [False, True]  # deactivated, then restored
    w = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(kueue.GROUP, workload_crd, namespace,
                                                                      "workloads", info["workload"])
    assert w["spec"]["active"] is True
    job = client.BatchV1Api(kube_api).read_namespaced_job("queued", namespace)
    assert not job.spec.suspend and {p.metadata.uid for p in live_pods(kube_api, namespace, "app=queued")} == before


def test_requeue_through_the_workload_writes_the_placement_while_evicted(
    kube_api: client.ApiClient, namespace: str, fleet4: fl.Fleet, workload_crd: str
) -> None:
    info = _queued_job(kube_api, namespace, fleet4, "queued", workload=True)
    pods = live_pods(kube_api, namespace, "app=queued")
    suspect = pods[0].spec.node_name
    quarantine(kube_api, suspect)
    seen = WorkloadWatch(kube_api, namespace, "queued", act_as_kueue=True)

    out = PlacementRestarter(kube_api, Settings()).restart(f"{namespace}/queued", action="restart_job",
                                                           exclude_nodes=[suspect], params={}, dry_run=False,
                                                           actor="t")

    assert out.outcome == "applied", out.reason
    assert out.details["mechanism"] == "kueue_workload" and out.details["capacity"] == "sufficient"
    assert seen.stop() == [False, True]
    # the exclusion and the preference were on the template when the Workload was reactivated
    assert seen.template_at_reactivation is not None
    assert excluded_nodes(seen.template_at_reactivation["affinity"]) == {suspect}
    assert seen.template_at_reactivation["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    after = wait("2 new Running pods", lambda: running(kube_api, namespace, "app=queued", 2,
                                                       {p.metadata.uid for p in pods}))
    assert suspect not in {p.spec.node_name for p in after}
    del info


def test_a_queue_label_without_a_workload_restarts_the_ordinary_way(
    kube_api: client.ApiClient, namespace: str, fleet4: fl.Fleet, workload_crd: str
) -> None:
    _queued_job(kube_api, namespace, fleet4, "plain", workload=False)
    suspect = live_pods(kube_api, namespace, "app=plain")[0].spec.node_name
    quarantine(kube_api, suspect)
    out = PlacementRestarter(kube_api, Settings()).restart(f"{namespace}/plain", action="restart_job",
                                                           exclude_nodes=[suspect], params={}, dry_run=False,
                                                           actor="t")
    assert out.outcome == "applied" and out.details["mechanism"] == "suspend_resume", out.reason
