"""An in-memory :class:`~fleetmedic.executor.cluster.Cluster` for fast tests (pure: no I/O).

It keeps what the API server keeps for the executor and answers as it does:
``tests/executor/test_cluster_contract.py`` runs one set of assertions on this fake and on
:class:`~fleetmedic.executor.kube.KubeCluster` against a real API server, so the two cannot drift.

- Nodes: a JSON merge patch (``None`` deletes a key, lists replace), guarded by
  ``metadata.resourceVersion`` (:class:`~.cluster.Conflict`); conditions merge by type; every
  write moves the resourceVersion on.
- Pods: the Eviction API: a pod gone is ``404``; a pod that a PodDisruptionBudget with no
  disruption left selects is refused with ``429``, naming the budget; otherwise the pod is deleted.
- Jobs: created once (a second create of the name is the first one); a test settles a Job's
  outcome with :meth:`FakeCluster.finish_job`, as the Job controller would.
- Events: the bodies :func:`~.cluster.event_body` builds, in order (:attr:`FakeCluster.events`).
- The ledger: annotations and a resourceVersion per namespace, created empty on first read.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetmedic.executor.cluster import EVENT_NAMESPACE, ApiError, Conflict, Eviction, event_body
from fleetmedic.executor.node.conditions import Condition
from fleetmedic.executor.node.long_plan import JobOutcome, PodView, job_outcome
from fleetmedic.executor.node.plan import NodeView, Note, Taint
from fleetmedic.k8s_keys import CONDITION_QUARANTINE, SOURCE_COMPONENT

PDB_REFUSAL = "Cannot evict pod as it would violate the pod's disruption budget."


@dataclass
class FakeNode:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    taints: list[Taint] = field(default_factory=list)
    conditions: dict[str, Condition] = field(default_factory=dict)
    gpus: int = 8
    resource_version: int = 1


@dataclass
class FakePod:
    view: PodView
    node: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class FakeBudget:
    """A PodDisruptionBudget: ``match_labels`` selects pods; ``allowed`` evictions are left."""

    namespace: str
    name: str
    match_labels: dict[str, str]
    allowed: int = 0


@dataclass
class FakeJob:
    doc: dict[str, Any]
    conditions: list[tuple[str, str, str]] = field(default_factory=list)  # (type, status, message)
    termination_message: str = ""  # of its failed pod, as the kubelet reports it


class FakeCluster:
    """The :class:`~fleetmedic.executor.cluster.Cluster` in memory; see the module docstring."""

    def __init__(self, component: str = SOURCE_COMPONENT, instance: str = "") -> None:
        self.component = component
        self.instance = instance or component
        self.nodes: dict[str, FakeNode] = {}
        self.pods: dict[tuple[str, str], FakePod] = {}
        self.budgets: list[FakeBudget] = []
        self.jobs: dict[tuple[str, str], FakeJob] = {}
        self.events: list[dict[str, Any]] = []
        self.ledgers: dict[str, tuple[dict[str, str], int]] = {}
        self.evictions: list[str] = []  # pod refs evicted, in order
        self._versions = itertools.count(2)

    # --- setting the scene (what a test, a kubelet or a controller does) -----------------------------

    def add_node(self, name: str, *, labels: Mapping[str, str] | None = None, gpus: int = 8,
                 ready: bool = True) -> FakeNode:
        node = FakeNode(name, dict(labels or {}), gpus=gpus)
        node.conditions["Ready"] = Condition("True" if ready else "False", "KubeletReady", "")
        self.nodes[name] = node
        return node

    def add_pod(self, namespace: str, name: str, node: str, *, labels: Mapping[str, str] | None = None,
                phase: str = "Running", owner_kind: str = "", mirror: bool = False, role: str = "") -> PodView:
        view = PodView(namespace=namespace, name=name, phase=phase, owner_kind=owner_kind, mirror=mirror, role=role)
        self.pods[(namespace, name)] = FakePod(view, node, dict(labels or {}))
        return view

    def add_budget(self, namespace: str, name: str, match_labels: Mapping[str, str], allowed: int = 0) -> None:
        self.budgets.append(FakeBudget(namespace, name, dict(match_labels), allowed))

    def finish_job(self, namespace: str, name: str, passed: bool, message: str = "") -> None:
        """The Job controller's verdict: ``Complete``, or ``Failed`` with the pod's termination message."""
        job = self.jobs[(namespace, name)]
        job.conditions = [("Complete", "True", "")] if passed else [("Failed", "True", "BackoffLimitExceeded")]
        job.termination_message = "" if passed else message

    def node_events(self, node: str) -> list[str]:
        """Reasons of the Events about ``node``, oldest first."""
        return [e["reason"] for e in self.events
                if e["involvedObject"].get("kind") == "Node" and e["involvedObject"].get("name") == node]

    # --- nodes ---------------------------------------------------------------------------------------

    def _node(self, name: str, verb: str) -> FakeNode:
        node = self.nodes.get(name)
        if node is None:
            raise ApiError(f"{verb} node {name}: 404 nodes \"{name}\" not found")
        return node

    def read_node(self, name: str) -> NodeView | None:
        node = self.nodes.get(name)
        if node is None:
            return None
        return NodeView(name=name, uid=f"uid-{name}", unschedulable=node.unschedulable, taints=tuple(node.taints),
                        labels=dict(node.labels), annotations=dict(node.annotations),
                        resource_version=str(node.resource_version),
                        conditions={t: c.status for t, c in node.conditions.items()}, gpus=node.gpus)

    def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        node = self._node(name, "patch")
        meta, spec = patch.get("metadata") or {}, patch.get("spec") or {}
        version = meta.get("resourceVersion")
        if version is not None and str(version) != str(node.resource_version):
            raise Conflict(f"node {name} changed while being patched")
        _merge(node.labels, meta.get("labels") or {})
        _merge(node.annotations, meta.get("annotations") or {})
        if "unschedulable" in spec:
            node.unschedulable = bool(spec["unschedulable"])
        if "taints" in spec:
            node.taints = [Taint(t["key"], t.get("value") or "", t["effect"]) for t in spec["taints"] or []]
        node.resource_version = next(self._versions)

    def set_condition(self, name: str, cond: Condition, ctype: str = CONDITION_QUARANTINE) -> None:
        node = self._node(name, "set condition on")
        node.conditions[ctype] = cond
        node.resource_version = next(self._versions)

    def event(self, node: str, note: Note, action: str) -> None:
        self.events.append(event_body({"kind": "Node", "name": node, "uid": node, "apiVersion": "v1"},
                                      note.reason, note.message, namespace=EVENT_NAMESPACE, warning=note.warning,
                                      component=self.component, reporting_component=self.component,
                                      instance=self.instance, action=action))

    # --- pods and evictions --------------------------------------------------------------------------

    def pods_on(self, node: str) -> list[PodView]:
        return [p.view for p in self.pods.values() if p.node == node]

    def evict(self, pod: PodView) -> Eviction:
        found = self.pods.get((pod.namespace, pod.name))
        if found is None:
            return Eviction(True, 404, "already gone")
        selecting = [b for b in self.budgets if b.namespace == pod.namespace
                     and all(found.labels.get(k) == v for k, v in b.match_labels.items())]
        if any(b.allowed <= 0 for b in selecting):
            return Eviction(False, 429, PDB_REFUSAL, tuple(f"{b.namespace}/{b.name}" for b in selecting))
        for b in selecting:
            b.allowed -= 1
        del self.pods[(pod.namespace, pod.name)]
        self.evictions.append(pod.ref)
        return Eviction(True, 201)

    # --- Jobs (diagnostics, hooks) -------------------------------------------------------------------

    def create_job(self, doc: dict[str, Any]) -> None:
        key = (doc["metadata"]["namespace"], doc["metadata"]["name"])
        self.jobs.setdefault(key, FakeJob(copy.deepcopy(doc)))

    def job_outcome(self, namespace: str, name: str) -> JobOutcome | None:
        job = self.jobs.get((namespace, name))
        if job is None:
            return None
        outcome = job_outcome(job.conditions)
        if outcome.passed is False:
            return JobOutcome(False, job.termination_message or outcome.message)
        return outcome

    # --- the job-command ledger ----------------------------------------------------------------------

    def read_ledger(self, namespace: str) -> tuple[dict[str, str], str]:
        annotations, version = self.ledgers.setdefault(namespace, ({}, next(self._versions)))
        return dict(annotations), str(version)

    def patch_ledger(self, namespace: str, annotations: dict[str, str | None], resource_version: str) -> None:
        current, version = self.ledgers.setdefault(namespace, ({}, next(self._versions)))
        if str(version) != resource_version:
            raise Conflict("the ledger changed while being patched")
        merged = dict(current)
        _merge(merged, annotations)
        self.ledgers[namespace] = (merged, next(self._versions))


def _merge(into: dict[str, str], patch: Mapping[str, str | None]) -> None:
    """A JSON merge patch of a string map: ``None`` deletes the key."""
    for key, value in patch.items():
        if value is None:
            into.pop(key, None)
        else:
            into[key] = value
