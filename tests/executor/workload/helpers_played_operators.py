"""Played operators for the workload tests on a control plane without the real ones (no tests here):
each plays the operator's part, faithfully and only that part, in a background thread:

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
from fleetmedic.devenv.workloads import TOLERATE_ALL, pod_spec
from fleetmedic.executor.workload.plan import JOBSET, PYTORCHJOB

PT = "training.kubeflow.org"
JS = "jobset.sigs.k8s.io"


def _owner(kind: str, api_version: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}


def reconcile_pytorchjob(api: client.ApiClient, namespace: str, name: str) -> None:
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


def reconcile_jobset(api: client.ApiClient, namespace: str, name: str) -> None:
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


def pytorchjob_manifest(name: str, fleet: fl.Fleet) -> dict[str, Any]:
    def replica(n: int) -> dict[str, Any]:
        return {"replicas": n, "restartPolicy": "OnFailure",
                "template": {"spec": pod_spec(fleet, TOLERATE_ALL, restart_policy="OnFailure")}}

    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(3)}}}


def jobset_manifest(name: str, fleet: fl.Fleet) -> dict[str, Any]:
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name},
            "spec": {"replicatedJobs": [{"name": "workers", "replicas": 4, "template": {"spec": {
                "parallelism": 1, "completions": 1, "backoffLimit": 0, "template": {"spec": pod_spec(fleet)}}}}]}}
