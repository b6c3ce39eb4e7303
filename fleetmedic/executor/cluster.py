"""What the executor needs of a cluster (pure): the :class:`Cluster` protocol, its errors, and the
one builder of the core/v1 Events the executor records.

Two implementations stand behind the protocol: :class:`fleetmedic.executor.kube.KubeCluster` on the
API server (the one executor module that calls the ``kubernetes`` client for it) and
:class:`fleetmedic.executor.fake_cluster.FakeCluster` in memory, for fast tests.
``tests/executor/test_cluster_contract.py`` runs the same assertions on both, so the fake keeps
the real server's behaviour.

Errors carry what to do: :class:`Conflict` (the object changed since it was read: read it again
and decide again), :class:`ApiError` (the server refused or failed: report the command failed,
with the message).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from fleetmedic.executor.node.conditions import Condition
from fleetmedic.executor.node.long_plan import JobOutcome, PodView
from fleetmedic.executor.node.plan import NodeView, Note
from fleetmedic.k8s_keys import CONDITION_QUARANTINE

EVENT_NAMESPACE = "default"  # where kubelet puts Node events too; `kubectl describe node` finds them


class Conflict(Exception):
    """The object changed since it was read (HTTP 409): read it again and decide again."""


class ApiError(Exception):
    """The API server refused or failed a request; the message says what and why. ``status`` is
    the HTTP status (0: no answer), ``detail`` the server's own message."""

    def __init__(self, message: str, status: int = 0, detail: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail or message


class Resource(Protocol):
    """A namespaced API resource by group, version and plural (``""`` is the core group), e.g. a
    :class:`~fleetmedic.executor.workload.plan.WorkloadKind` or Kueue's ``workloads``."""

    @property
    def group(self) -> str: ...

    @property
    def version(self) -> str: ...

    @property
    def plural(self) -> str: ...


@dataclass(frozen=True)
class ApiResource:
    group: str
    version: str
    plural: str


@dataclass(frozen=True)
class Eviction:
    evicted: bool
    status: int
    message: str = ""
    blockers: tuple[str, ...] = ()  # PodDisruptionBudgets that select the pod (on 429)


class Cluster(Protocol):
    """The node track's reads and writes, the job-command ledger, and the job track's workloads and
    pods as the JSON the API server serves (``metadata``, ``spec``, ``status`` in its own casing)."""

    # --- nodes ---------------------------------------------------------------------------------------

    def read_node(self, name: str) -> NodeView | None:
        """The node as the plans see it; ``None`` if there is no such node."""

    def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        """A JSON merge patch of the Node; :class:`Conflict` when the patch names a
        ``metadata.resourceVersion`` the node has moved past."""

    def set_condition(self, name: str, cond: Condition, ctype: str = CONDITION_QUARANTINE) -> None:
        """Set the node condition ``ctype`` (the node's other conditions stay)."""

    def event(self, node: str, note: Note, action: str) -> None:
        """A core/v1 Event about the Node (best effort: a lost Event does not fail the action)."""

    # --- pods and evictions --------------------------------------------------------------------------

    def pods_on(self, node: str) -> list[PodView]:
        """Every pod bound to ``node``, in any namespace."""

    def evict(self, pod: PodView) -> Eviction:
        """Evict through the Eviction API: evicted (or already gone), or refused (429) with the
        PodDisruptionBudgets that select the pod."""

    # --- Jobs (diagnostics, hooks) -------------------------------------------------------------------

    def create_job(self, doc: dict[str, Any]) -> None:
        """Create the batch/v1 Job; one of that name already there is the one to watch."""

    def job_outcome(self, namespace: str, name: str) -> JobOutcome | None:
        """The Job's outcome (``passed`` None while it runs), or ``None`` if there is no such Job."""

    # --- the job-command ledger ----------------------------------------------------------------------

    def read_ledger(self, namespace: str) -> tuple[dict[str, str], str]:
        """The ledger's annotations and version (created empty when missing)."""

    def patch_ledger(self, namespace: str, annotations: dict[str, str | None], resource_version: str) -> None:
        """Merge ``annotations`` into the ledger (``None`` removes a key), only if it is still at
        ``resource_version``; :class:`Conflict` otherwise."""


class WorkloadCluster(Cluster, Protocol):
    """The :class:`Cluster` with what the job track does to workloads (Jobs, JobSets, PyTorchJobs,
    Kueue Workloads), their pods and the nodes placement reads. A failed request raises
    :class:`ApiError` with the status; the caller decides what a 404, 409 or 422 means."""

    def get_object(self, res: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        """The object; ``None`` if there is none (404)."""

    def list_objects(self, res: Resource, namespace: str, label_selector: str = "") -> list[dict[str, Any]]:
        """The objects in ``namespace`` that match ``label_selector``."""

    def patch_object(self, res: Resource, namespace: str, name: str,
                     patch: list[dict[str, Any]] | dict[str, Any]) -> dict[str, Any]:
        """A JSON patch (a list of operations) or a JSON merge patch (a dict); the object as written."""

    def delete_job(self, namespace: str, name: str) -> bool:
        """Delete the batch/v1 Job with its pods (foreground); False if it was gone already."""

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """The pods in ``namespace`` that match ``label_selector`` (terminating ones too)."""

    def live_pods(self) -> list[dict[str, Any]]:
        """Every pod in the cluster whose phase is neither Succeeded nor Failed."""

    def list_nodes(self) -> list[dict[str, Any]]:
        """Every Node."""

    def get_node(self, name: str) -> dict[str, Any] | None:
        """The Node; ``None`` if there is none."""

    def served_version(self, group: str, plural: str) -> str:
        """The version of API ``group`` that serves ``plural``, the preferred one first; ``""``
        when none does (the API is not installed)."""

    def record_event(self, body: dict[str, Any]) -> None:
        """Record an Event built by :func:`event_body` (best effort: a lost Event is logged)."""


def event_body(involved: Mapping[str, Any], reason: str, message: str, *, namespace: str, warning: bool,
               component: str, reporting_component: str, instance: str, action: str = "",
               now: datetime | None = None) -> dict[str, Any]:
    """A core/v1 Event about ``involved`` (an ObjectReference: apiVersion, kind, name, namespace,
    uid), named by the server after the object. ``action`` (what was done) goes with an
    ``eventTime``, as events.k8s.io readers expect of an Event that names one."""
    at = now or datetime.now(UTC)
    stamp = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    body: dict[str, Any] = {
        "metadata": {"generateName": f"{involved.get('name')}.fleetmedic.", "namespace": namespace},
        "involvedObject": {k: v for k, v in involved.items() if v is not None},
        "reason": reason, "message": message[:1024], "type": "Warning" if warning else "Normal", "count": 1,
        "firstTimestamp": stamp, "lastTimestamp": stamp,
        "source": {"component": component},
        "reportingComponent": reporting_component, "reportingInstance": instance[:128] or "fleetmedic",
    }
    if action:
        body["action"] = action
        body["eventTime"] = at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return body
