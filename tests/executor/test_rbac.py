"""deploy/rbac/executor.yaml on the real API server (RBAC authorizer): the executor's ServiceAccount
may do what the executor does (SubjectAccessReviews, then the executor itself running under an
impersonating client: cordon, taint, drain, diagnostics, Lease, ledger, return to service) and
may not read Secrets, delete or create Nodes, delete any Pod (it evicts), or create Jobs and Leases
outside its namespace; the job track (restart_job of a batch Job) runs under it too."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, utils

from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.chain import gpu_job, running_ranks
from fleetmedic.devenv.kclient import connect
from fleetmedic.devenv.waiting import wait
from fleetmedic.executor.dispatch import kube_executor
from fleetmedic.executor.kube import KubeCluster
from fleetmedic.executor.leader import LeaseElector
from fleetmedic.k8s_keys import ANNOTATION_KWOK_COMPLETE, CONDITION_GPU_HARDWARE
from tests.executor.helpers_executor import KEY, command, pinned_pod, running, settings

MANIFEST = Path(__file__).parents[2] / "deploy" / "rbac" / "executor.yaml"


def _docs(namespace: str, suffix: str) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    for d in docs:
        if d["metadata"].get("namespace"):
            d["metadata"]["namespace"] = namespace
        if d["kind"].startswith("Cluster"):
            d["metadata"]["name"] += suffix
        if "roleRef" in d and d["roleRef"]["kind"] == "ClusterRole":
            d["roleRef"]["name"] += suffix
        for subject in d.get("subjects", []):
            subject["namespace"] = namespace
    return docs


@pytest.fixture
def executor_rbac(kube_api: client.ApiClient, namespace: str) -> Iterator[str]:
    """The manifests applied for ``namespace``; yields the ServiceAccount's user name."""
    docs = _docs(namespace, f"-{namespace}")
    for d in docs:
        utils.create_from_dict(kube_api, d)
    yield f"system:serviceaccount:{namespace}:fleetmedic-executor"
    rbac = client.RbacAuthorizationV1Api(kube_api)
    for d in docs:
        if d["kind"] == "ClusterRole":
            rbac.delete_cluster_role(d["metadata"]["name"])
        elif d["kind"] == "ClusterRoleBinding":
            rbac.delete_cluster_role_binding(d["metadata"]["name"])


def _allowed(api: client.ApiClient, user: str, verb: str, resource: str, namespace: str = "", group: str = "",
             subresource: str = "") -> bool:
    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=user, groups=["system:serviceaccounts", "system:authenticated"],
        resource_attributes=client.V1ResourceAttributes(verb=verb, resource=resource, namespace=namespace or None,
                                                        group=group, subresource=subresource or None)))
    out = client.AuthorizationV1Api(api).create_subject_access_review(review)
    return bool(out.status and out.status.allowed)


def test_the_service_account_can_do_what_the_executor_does_and_nothing_it_must_not(
    kube_api: client.ApiClient, namespace: str, executor_rbac: str
) -> None:
    user = executor_rbac
    may = [("patch", "nodes", "", ""), ("list", "pods", "", ""), ("create", "pods", "", "eviction"),
           ("patch", "nodes", "", "status"), ("create", "events", "default", ""),
           ("list", "poddisruptionbudgets", "", ""), ("create", "leases", namespace, ""),
           ("update", "leases", namespace, ""), ("patch", "configmaps", namespace, ""),
           ("create", "jobs", namespace, ""), ("get", "jobs", namespace, ""), ("patch", "jobs", "team-a", ""),
           ("delete", "jobs", "team-a", ""), ("patch", "pytorchjobs", "team-a", ""),
           ("patch", "jobsets", "team-a", ""), ("patch", "workloads", "team-a", "")]
    groups = {"leases": "coordination.k8s.io", "jobs": "batch", "poddisruptionbudgets": "policy",
              "pytorchjobs": "kubeflow.org", "jobsets": "jobset.x-k8s.io", "workloads": "kueue.x-k8s.io"}
    wait("RBAC to take effect", lambda: _allowed(kube_api, user, "patch", "nodes"), timeout=30)
    for verb, res, ns, sub in may:
        assert _allowed(kube_api, user, verb, res, ns, groups.get(res, ""), sub), (verb, res, ns, sub)
    must_not = [("get", "secrets", ""), ("list", "secrets", ""), ("get", "secrets", namespace),
                ("list", "secrets", namespace), ("delete", "nodes", ""), ("create", "nodes", ""),
                ("update", "nodes", ""), ("create", "jobs", "default"), ("create", "leases", "default"),
                ("delete", "leases", namespace), ("patch", "configmaps", "default"), ("create", "pods", namespace),
                ("delete", "pods", ""), ("delete", "pods", namespace), ("delete", "pods", "team-a"),
                ("deletecollection", "pods", ""), ("update", "pods", "team-a"), ("patch", "pods", "team-a")]
    for verb, res, ns in must_not:
        assert not _allowed(kube_api, user, verb, res, ns, groups.get(res, "")), (verb, res, ns)


def test_the_executor_runs_under_the_service_account(
    kube_api: client.ApiClient, kube_config: Path, namespace: str, executor_rbac: str,
    make_fleet: Callable[..., fl.Fleet]
) -> None:
    core = client.CoreV1Api(kube_api)
    name = make_fleet(1).nodes[0]
    core.create_namespaced_pod(namespace, pinned_pod("victim", name))
    wait("Running", lambda: running(core, namespace, "victim"))
    s = settings(namespace, extra=f"  namespace_policies: {{{namespace}: evict_now}}\n"
                                  f"  diagnostics_pod_annotations: {{{ANNOTATION_KWOK_COMPLETE}: 'true'}}\n")
    wait("RBAC to take effect", lambda: _allowed(kube_api, executor_rbac, "patch", "nodes"), timeout=30)
    with connect(kube_config) as sa_api:
        sa_api.set_default_header("Impersonate-User", executor_rbac)
        with pytest.raises(client.ApiException) as denied:
            client.CoreV1Api(sa_api).list_namespaced_secret(namespace)
        assert denied.value.status == 403
        with pytest.raises(client.ApiException) as refused:
            client.CoreV1Api(sa_api).delete_node(name)
        assert refused.value.status == 403
        assert LeaseElector(sa_api, namespace, "fleetmedic-executor", "sa", 5.0).try_acquire_or_renew()
        ex = kube_executor(KubeCluster(sa_api), s, KEY, identity="sa")
        hardware = {"params": {"incident_class": "hardware"}}  # the cordon writes fleetmedic.io/GPUHardware too
        outcomes = [ex.handle(command(a, name, **(hardware if a == "cordon" else {})))
                    for a in ("cordon", "taint", "drain", "run_diagnostics")]
        assert [o.outcome for o in outcomes] == ["applied"] * 4, outcomes
        assert outcomes[3].details["verdict"] == "pass"
        back = ex.handle(command("return_to_service", name, params={"uncordon": "true", "untaint": "true"}))
        assert back.outcome == "applied", back
        assert ex.handle(command("escalate", job=f"{namespace}/some-job")).outcome == "skipped"  # via the ledger
    assert not core.read_node(name).spec.unschedulable
    gpu = next(c for c in core.read_node_status(name).status.conditions if c.type == CONDITION_GPU_HARDWARE)
    assert (gpu.status, gpu.reason) == ("False", "ReturnedToService")  # set True, then cleared, as the SA


def test_the_job_track_runs_under_the_service_account(
    kube_api: client.ApiClient, kube_config: Path, namespace: str, executor_rbac: str,
    make_fleet: Callable[..., fl.Fleet]
) -> None:
    core = client.CoreV1Api(kube_api)
    fleet = make_fleet(5)
    client.BatchV1Api(kube_api).create_namespaced_job(namespace, gpu_job("train", fleet))
    ranks = wait("4 ranks", lambda: (x := running_ranks(core, namespace, "train")) and len(x) == 4 and x)
    wait("RBAC to take effect", lambda: _allowed(kube_api, executor_rbac, "patch", "nodes"), timeout=30)
    with connect(kube_config) as sa_api:
        sa_api.set_default_header("Impersonate-User", executor_rbac)
        ex = kube_executor(KubeCluster(sa_api), settings(namespace), KEY, identity="sa")
        sick = ranks[1].node
        for action in ("cordon", "taint"):
            assert ex.handle(command(action, sick)).outcome == "applied"
        out = ex.handle(command("restart_job", job=f"{namespace}/train", exclude_nodes=[sick]))
        assert out.outcome == "applied", out
    moved = wait("4 new ranks", lambda: (x := running_ranks(core, namespace, "train")) and len(x) == 4
                 and not ({y.uid for y in x} & {y.uid for y in ranks}) and x)
    assert sick not in {x.node for x in moved}
