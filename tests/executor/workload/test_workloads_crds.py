"""restart_workload on Kubeflow PyTorchJobs and JobSets against the real control plane.

The test cluster runs no training operator or JobSet controller: ``fleetmedic dev build`` does not
build them. The real ones run in test_workloads_pytorch_controller.py and
test_workloads_jobset_controller.py where they have been built; docs/workloads.md has the recipe.
So these tests **play the operator's part**, faithfully and only that part, in a background thread:

- PyTorchJob (training-operator v1): for every replica type and index of ``pytorchReplicaSpecs``
  without a live pod, create pod ``<job>-<type>-<index>`` from the replica template, with the
  operator's labels (``training.kubeflow.org/job-name``, ``replica-type``, ``replica-index``,
  ``job-role: master`` on the master, ``operator-name``), its rank environment (``MASTER_ADDR``,
  ``WORLD_SIZE``, ``RANK``) and a controller owner reference to the PyTorchJob.
- JobSet: for every replicated job and index without a live child Job, create batch Job
  ``<jobset>-<replicatedJob>-<index>`` from the template with the JobSet labels
  (``jobset.sigs.k8s.io/jobset-name``, ``replicatedjob-name``, ``job-index``) on the Job and its
  pod template, ``subdomain`` = the JobSet name, and a controller owner reference; the real Job
  controller then creates the pods.

Each operator reads the current spec on every pass, so it recreates what restart_workload deleted
from the templates restart_workload patched, as the real controllers do.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException

from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.waiting import wait
from fleetmedic.devenv.workloads import (
    TOLERATE_ALL,
    BindingWatch,
    live_pods,
    pod_spec,
    quarantine,
    running,
)
from fleetmedic.executor.kube import KubeCluster
from fleetmedic.executor.workload.apply import restart_workload
from fleetmedic.executor.workload.plan import HOSTNAME_LABEL, JOBSET, PYTORCHJOB, excluded_nodes
from fleetmedic.k8s_keys import ANNOTATION_LAST_COMMAND, ANNOTATION_RESTART_ATTEMPTS

PT = "training.kubeflow.org"
JS = "jobset.sigs.k8s.io"


def _owner(kind: str, api_version: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}


def _reconcile_pytorchjob(api: client.ApiClient, namespace: str, name: str) -> None:
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    job = custom.get_namespaced_custom_object(PYTORCHJOB.group, PYTORCHJOB.version, namespace, "pytorchjobs", name)
    pods = core.list_namespaced_pod(namespace, label_selector=f"{PT}/job-name={name}").items
    existing = {p.metadata.name for p in pods}
    specs = job["spec"]["pytorchReplicaSpecs"]
    world = sum(int(s.get("replicas", 1)) for s in specs.values())
    for rtype, rspec in specs.items():
        for index in range(int(rspec.get("replicas", 1))):
            pod_name = f"{name}-{rtype.lower()}-{index}"
            if pod_name in existing:
                continue
            template = copy.deepcopy(rspec["template"])
            labels = {**template.get("metadata", {}).get("labels", {}), f"{PT}/job-name": name,
                      f"{PT}/operator-name": "pytorchjob-controller", f"{PT}/replica-type": rtype.lower(),
                      f"{PT}/replica-index": str(index)}
            if rtype == "Master":
                labels[f"{PT}/job-role"] = "master"
            rank = index if rtype == "Master" else index + int(specs.get("Master", {}).get("replicas", 0))
            spec = template["spec"]
            spec["restartPolicy"] = "OnFailure" if rspec.get("restartPolicy") == "OnFailure" else "Never"
            for c in spec["containers"]:
                c["env"] = [*c.get("env", []), {"name": "MASTER_ADDR", "value": f"{name}-master-0"},
                            {"name": "MASTER_PORT", "value": "23456"}, {"name": "WORLD_SIZE", "value": str(world)},
                            {"name": "RANK", "value": str(rank)}]
            body = {"metadata": {"name": pod_name, "labels": labels,
                                 "ownerReferences": [_owner("PyTorchJob", "kubeflow.org/v1", job)]}, "spec": spec}
            _create(lambda b=body: core.create_namespaced_pod(namespace, client.V1Pod.from_dict(b)))


def _reconcile_jobset(api: client.ApiClient, namespace: str, name: str) -> None:
    custom, batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
    js = custom.get_namespaced_custom_object(JOBSET.group, JOBSET.version, namespace, "jobsets", name)
    jobs = batch.list_namespaced_job(namespace, label_selector=f"{JS}/jobset-name={name}").items
    existing = {j.metadata.name for j in jobs}
    for rjob in js["spec"]["replicatedJobs"]:
        for index in range(int(rjob.get("replicas", 1))):
            job_name = f"{name}-{rjob['name']}-{index}"
            if job_name in existing:
                continue
            labels = {f"{JS}/jobset-name": name, f"{JS}/replicatedjob-name": rjob["name"],
                      f"{JS}/job-index": str(index), f"{JS}/replicatedjob-replicas": str(rjob.get("replicas", 1))}
            spec = copy.deepcopy(rjob["template"]["spec"])
            tmeta = spec["template"].setdefault("metadata", {})
            tmeta["labels"] = {**tmeta.get("labels", {}), **labels}
            tmeta["annotations"] = {**tmeta.get("annotations", {}), **labels}
            spec["template"]["spec"]["subdomain"] = name
            body = {"metadata": {"name": job_name, "labels": labels, "annotations": labels,
                                 "ownerReferences": [_owner("JobSet", "jobset.x-k8s.io/v1alpha2", js)]}, "spec": spec}
            _create(lambda b=body: batch.create_namespaced_job(namespace, client.V1Job.from_dict(b)))


def _create(call: Callable[[], object]) -> None:
    try:
        call()
    except ApiException as exc:
        if exc.status != 409:  # an old object of that name is still being deleted: next pass
            raise


@contextmanager
def played_operator(reconcile: Callable[[client.ApiClient, str, str], None], api: client.ApiClient,
                    namespace: str, name: str) -> Iterator[None]:
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        while not stop.wait(0.2):
            try:
                reconcile(api, namespace, name)
            except BaseException as exc:  # surfaced by the test below
                errors.append(exc)
                return

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not errors, errors


def _pytorchjob(name: str, fleet: fl.Fleet) -> dict[str, Any]:
    def replica(n: int) -> dict[str, Any]:
        return {"replicas": n, "restartPolicy": "OnFailure",
                "template": {"spec": pod_spec(fleet, TOLERATE_ALL, restart_policy="OnFailure")}}

    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(3)}}}


def _jobset(name: str, fleet: fl.Fleet) -> dict[str, Any]:
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name},
            "spec": {"replicatedJobs": [{"name": "workers", "replicas": 4, "template": {"spec": {
                "parallelism": 1, "completions": 1, "backoffLimit": 0, "template": {"spec": pod_spec(fleet)}}}}]}}


def test_pytorchjob_tolerating_all_taints_is_replaced_off_the_suspect_by_its_operator(
    kube_api: client.ApiClient, namespace: str, crds: list[str], make_fleet: Callable[..., fl.Fleet]
) -> None:
    fleet = make_fleet(6)
    custom = client.CustomObjectsApi(kube_api)
    custom.create_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", _pytorchjob("llm", fleet))
    selector = f"{PT}/job-name=llm"
    with played_operator(_reconcile_pytorchjob, kube_api, namespace, "llm"):
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
    custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", _jobset("js", fleet))
    selector = f"{JS}/jobset-name=js"
    with played_operator(_reconcile_jobset, kube_api, namespace, "js"):
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
