"""The Cluster contract: one set of assertions run on the in-memory FakeCluster and on KubeCluster
against the real API server (kube-apiserver, kube-controller-manager, kwok nodes), so the fake the
fast tests use answers as the server does: nodes (merge patch, resourceVersion guard, conditions),
Events, pods and the Eviction API (404 once gone, 429 naming the PodDisruptionBudget), Jobs, and
the job-command ledger."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.waiting import wait
from fleetmedic.executor.cluster import ApiError, Cluster, Conflict
from fleetmedic.executor.fake_cluster import FakeCluster
from fleetmedic.executor.kube import KubeCluster
from fleetmedic.executor.node.conditions import Condition
from fleetmedic.executor.node.long_plan import PodView
from fleetmedic.executor.node.plan import Note, Taint
from fleetmedic.k8s_keys import ANNOTATION_KWOK_COMPLETE, CONDITION_NETWORK, CONDITION_QUARANTINE
from tests.executor.helpers_executor import node_events, pinned_pod, running


@dataclass
class Scene:
    """A cluster with one node, and what a test does to it around the executor (kubectl, the
    kubelet, controllers)."""

    cluster: Cluster
    namespace: str
    node: str
    add_pod: Callable[[str, dict[str, str]], None]
    add_budget: Callable[[str, dict[str, str]], None]  # minAvailable 1: no disruption allowed
    events: Callable[[], list[str]]


def _fake() -> Scene:
    fake = FakeCluster()
    fake.add_node("node-0", labels={"fleet": "f"})

    def add_pod(name: str, labels: dict[str, str]) -> None:
        fake.add_pod("ns", name, "node-0", labels=labels)

    def add_budget(name: str, labels: dict[str, str]) -> None:
        fake.add_budget("ns", name, labels, allowed=0)

    return Scene(fake, "ns", "node-0", add_pod, add_budget, lambda: fake.node_events("node-0"))


def _kube(request: pytest.FixtureRequest) -> Scene:
    api: client.ApiClient = request.getfixturevalue("kube_api")
    namespace: str = request.getfixturevalue("namespace")
    fleet: fl.Fleet = request.getfixturevalue("make_fleet")(1)
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    node = fleet.nodes[0]

    def add_pod(name: str, labels: dict[str, str]) -> None:
        core.create_namespaced_pod(namespace, pinned_pod(name, node, labels))
        wait(f"pod {name} Running", lambda: running(core, namespace, name))

    def add_budget(name: str, labels: dict[str, str]) -> None:
        policy.create_namespaced_pod_disruption_budget(namespace, client.V1PodDisruptionBudget.from_dict(
            {"metadata": {"name": name}, "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}}}))

    return Scene(KubeCluster(api), namespace, node, add_pod, add_budget, lambda: node_events(core, node))


@pytest.fixture(params=["fake", pytest.param("kube", marks=pytest.mark.kube)])
def scene(request: pytest.FixtureRequest) -> Iterator[Scene]:
    yield _fake() if request.param == "fake" else _kube(request)


def test_a_node_reads_back_as_patched_and_a_stale_resource_version_is_a_conflict(scene: Scene) -> None:
    c, name = scene.cluster, scene.node
    assert c.read_node("no-such-node-x") is None
    before = c.read_node(name)
    assert before is not None and before.name == name and not before.unschedulable
    assert before.conditions.get("Ready") == "True" and before.resource_version
    c.patch_node(name, {"metadata": {"resourceVersion": before.resource_version,
                                     "labels": {"fleetmedic.io/x": "1"}, "annotations": {"fleetmedic.io/a": "b"}},
                        "spec": {"unschedulable": True,
                                 "taints": [{"key": "fleetmedic.io/t", "value": "v", "effect": "NoSchedule"}]}})
    after = c.read_node(name)
    assert after is not None and after.unschedulable and after.resource_version != before.resource_version
    assert after.labels["fleetmedic.io/x"] == "1" and after.annotations["fleetmedic.io/a"] == "b"
    assert Taint("fleetmedic.io/t", "v", "NoSchedule") in after.taints
    assert after.labels.items() >= before.labels.items()  # a merge patch: the other labels stay
    with pytest.raises(Conflict):
        c.patch_node(name, {"metadata": {"resourceVersion": before.resource_version,
                                         "labels": {"fleetmedic.io/x": "2"}}})
    c.patch_node(name, {"metadata": {"labels": {"fleetmedic.io/x": None}}, "spec": {"unschedulable": None}})
    cleared = c.read_node(name)
    assert cleared is not None and "fleetmedic.io/x" not in cleared.labels and not cleared.unschedulable
    with pytest.raises(ApiError, match="no-such-node-x"):
        c.patch_node("no-such-node-x", {"metadata": {"labels": {"a": "b"}}})


def test_conditions_merge_by_type_and_events_are_about_the_node(scene: Scene) -> None:
    c, name = scene.cluster, scene.node
    c.set_condition(name, Condition("True", "Cordoned", "fleetmedic cordon"))
    c.set_condition(name, Condition("True", "NetworkLink", "a network incident"), CONDITION_NETWORK)
    c.set_condition(name, Condition("False", "ReturnedToService", "back"), CONDITION_NETWORK)
    view = c.read_node(name)
    assert view is not None
    assert {k: view.conditions.get(k) for k in ("Ready", CONDITION_QUARANTINE, CONDITION_NETWORK)} == {
        "Ready": "True", CONDITION_QUARANTINE: "True", CONDITION_NETWORK: "False"}
    with pytest.raises(ApiError):
        c.set_condition("no-such-node-x", Condition("True", "Cordoned", "x"))
    c.event(name, Note("FleetmedicContract", "a contract event", warning=True), "cordon")
    assert "FleetmedicContract" in scene.events()


def test_evictions_delete_a_pod_answer_404_once_it_is_gone_and_429_naming_the_budget(scene: Scene) -> None:
    c, name, ns = scene.cluster, scene.node, scene.namespace
    scene.add_pod("free", {"app": "free"})
    scene.add_pod("held", {"app": "held"})
    scene.add_budget("keep-held", {"app": "held"})
    on = {(p.namespace, p.name): p for p in c.pods_on(name)}
    assert on[(ns, "free")] == PodView(ns, "free", "Running") and (ns, "held") in on
    refused = c.evict(on[(ns, "held")])
    assert (refused.evicted, refused.status, refused.blockers) == (False, 429, (f"{ns}/keep-held",))
    done = c.evict(on[(ns, "free")])
    assert (done.evicted, done.status) == (True, 201)
    wait("the evicted pod gone", lambda: (ns, "free") not in {(p.namespace, p.name) for p in c.pods_on(name)})
    again = c.evict(on[(ns, "free")])
    assert (again.evicted, again.status) == (True, 404)


def test_a_job_is_created_once_and_reports_its_outcome(scene: Scene) -> None:
    c, ns = scene.cluster, scene.namespace
    assert c.job_outcome(ns, "contract-job") is None
    doc: dict[str, Any] = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "contract-job", "namespace": ns},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"annotations": {ANNOTATION_KWOK_COMPLETE: "true"}},
            "spec": {"nodeName": scene.node, "restartPolicy": "Never", "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "c", "image": "example.invalid/c:1"}]}}}}
    c.create_job(doc)
    c.create_job(doc)  # a resumed command creates it again: the first one stands
    if isinstance(c, FakeCluster):  # the Job controller's part: kwok completes the pod on a real cluster
        running_now = c.job_outcome(ns, "contract-job")
        assert running_now is not None and running_now.passed is None
        c.finish_job(ns, "contract-job", passed=True)
    outcome = wait("the Job's verdict", lambda: (o := c.job_outcome(ns, "contract-job")) and o.passed is not None
                   and o, 60)
    assert outcome.passed is True


def test_the_ledger_starts_empty_and_refuses_a_stale_write(scene: Scene) -> None:
    c, ns = scene.cluster, scene.namespace
    ann, version = c.read_ledger(ns)
    assert not {k for k in ann if k.startswith("fleetmedic.io/")} and version
    c.patch_ledger(ns, {"fleetmedic.io/commands": '{"c1":1}'}, version)
    ann2, version2 = c.read_ledger(ns)
    assert ann2["fleetmedic.io/commands"] == '{"c1":1}' and version2 != version
    with pytest.raises(Conflict):
        c.patch_ledger(ns, {"fleetmedic.io/commands": '{"c2":1}'}, version)
    c.patch_ledger(ns, {"fleetmedic.io/commands": None}, version2)
    assert "fleetmedic.io/commands" not in c.read_ledger(ns)[0]
