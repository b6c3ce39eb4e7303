"""deploy/rbac/jobwatch.yaml on the real API server (RBAC authorizer): the job watcher's
ServiceAccount may list and watch pods, Jobs, PyTorchJobs, JobSets and Nodes everywhere and do
nothing else (no Secrets, no writes); the watcher itself runs under an impersonating client and
lists every kind without an error."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, utils
from prometheus_client import CollectorRegistry

from fleetmedic.config import JobWatchSettings, Settings
from fleetmedic.connectors.kube.jobs import JobWatcher
from fleetmedic.devenv.kclient import connect

MANIFEST = Path(__file__).parents[3] / "deploy" / "rbac" / "jobwatch.yaml"
GROUPS = {"pods": "", "jobs": "batch", "pytorchjobs": "kubeflow.org", "jobsets": "jobset.x-k8s.io", "nodes": ""}
KINDS = ("Pod", "Job", "PyTorchJob", "JobSet", "Node")


@pytest.fixture
def jobwatch_user(kube_api: client.ApiClient, namespace: str) -> Iterator[str]:
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    for d in docs:
        if d["metadata"].get("namespace"):
            d["metadata"]["namespace"] = namespace
        if d["kind"].startswith("Cluster"):
            d["metadata"]["name"] += f"-{namespace}"
        if "roleRef" in d:
            d["roleRef"]["name"] += f"-{namespace}"
        for subject in d.get("subjects", []):
            subject["namespace"] = namespace
        utils.create_from_dict(kube_api, d)
    yield f"system:serviceaccount:{namespace}:fleetmedic-jobwatch"
    rbac = client.RbacAuthorizationV1Api(kube_api)
    rbac.delete_cluster_role(f"fleetmedic-jobwatch-{namespace}")
    rbac.delete_cluster_role_binding(f"fleetmedic-jobwatch-{namespace}")


def _allowed(api: client.ApiClient, user: str, verb: str, resource: str, namespace: str = "") -> bool:
    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=user, groups=["system:serviceaccounts", "system:authenticated"],
        resource_attributes=client.V1ResourceAttributes(verb=verb, resource=resource, namespace=namespace or None,
                                                        group=GROUPS.get(resource, ""))))
    out = client.AuthorizationV1Api(api).create_subject_access_review(review)
    return bool(out.status and out.status.allowed)


def test_the_watcher_may_read_training_workloads_and_nothing_else(
    kube_api: client.ApiClient, kube_config: Path, namespace: str, crds: list[str], jobwatch_user: str
) -> None:
    deadline = time.monotonic() + 30
    while not _allowed(kube_api, jobwatch_user, "watch", "pods"):
        assert time.monotonic() < deadline, "RBAC did not take effect"
        time.sleep(0.2)
    for resource in GROUPS:
        for verb in ("get", "list", "watch"):
            assert _allowed(kube_api, jobwatch_user, verb, resource, "any-namespace"), (verb, resource)
        for verb in ("create", "patch", "delete"):
            assert not _allowed(kube_api, jobwatch_user, verb, resource, namespace), (verb, resource)
    for verb, resource in (("get", "secrets"), ("list", "secrets"), ("list", "configmaps"), ("create", "events")):
        assert not _allowed(kube_api, jobwatch_user, verb, resource, namespace), (verb, resource)

    registry = CollectorRegistry()
    settings = Settings(jobwatch=JobWatchSettings(watch_timeout_s=2))
    with connect(kube_config) as sa_api:
        sa_api.set_default_header("Impersonate-User", jobwatch_user)
        watcher = JobWatcher(sa_api, settings, registry)
        watcher.start_watches()
        try:
            listed: dict[str, Any] = {}
            deadline = time.monotonic() + 30
            while len(listed) < len(KINDS):
                assert time.monotonic() < deadline, listed
                for kind in KINDS:
                    v = registry.get_sample_value("fleetmedic_jobwatch_relists_total", {"kind": kind, "cause": "start"})
                    if v:
                        listed[kind] = v
                time.sleep(0.2)
            for kind in listed:
                assert registry.get_sample_value("fleetmedic_jobwatch_watch_errors_total", {"kind": kind}) is None
        finally:
            watcher.stop.set()
            for t in watcher.threads:  # their watches time out after 2 s
                t.join(timeout=5)
