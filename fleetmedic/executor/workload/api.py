"""The workload side's low-level calls to the API server, shared by :mod:`.apply`, :mod:`.jobset`
and :mod:`.kueue` (imports run one way: they import this, this imports only :mod:`.plan`), all through the
:class:`~fleetmedic.executor.cluster.WorkloadCluster`.

- :func:`patch_workload`: a JSON patch of a workload, optionally bound to a resourceVersion
  (:class:`VersionChanged` when the object moved on: nothing was written, plan again);
- :func:`wait_for`: poll a condition until a deadline (``TimeoutError`` naming what did not happen);
- :func:`record_event`: a core/v1 Event on the workload, best effort;
- :func:`pod_node`: the node a pod is bound to;
- :class:`Placement`: what the placement step (:mod:`.placement_apply`) does within a restart.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from fleetmedic.executor.cluster import ApiError, WorkloadCluster, event_body
from fleetmedic.executor.workload.plan import RestartPlan, WorkloadKind
from fleetmedic.k8s_keys import REPORTING_COMPONENT, SOURCE_COMPONENT


class Placement(Protocol):
    """The placement step of one restart (:mod:`.placement_apply`), handed to the restart
    (:func:`.apply.restart_workload`, :func:`.kueue.requeue_if_managed`) before anything is written."""

    def place(self, kind: WorkloadKind, obj: dict[str, Any], pods: list[dict[str, Any]],
              plan: RestartPlan) -> RestartPlan:
        """The plan to carry out, from the workload, its live pods and its own restart plan."""
        ...

    def child_ops(self, child: dict[str, Any], ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The JSON-patch ops to write to a JobSet's suspended child Job, from the ops its own plan made."""
        ...


class VersionChanged(Exception):
    """The first write's resourceVersion precondition failed (409): nothing was changed yet."""


def patch_workload(cluster: WorkloadCluster, kind: WorkloadKind, namespace: str, name: str,
                   ops: list[dict[str, Any]], if_version: str = "") -> dict[str, Any]:
    """A JSON patch; with ``if_version``, only if the object is still at that resourceVersion."""
    if if_version:
        ops = [{"op": "replace", "path": "/metadata/resourceVersion", "value": if_version}, *ops]
    try:
        return cluster.patch_object(kind, namespace, name, ops)
    except ApiError as exc:
        if if_version and exc.status == 409:
            raise VersionChanged() from None
        raise


def wait_for(ready: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout:.0f}s")
        time.sleep(interval)


def record_event(cluster: WorkloadCluster, kind: WorkloadKind, obj: Mapping[str, Any], reason: str,
                 message: str, actor: str, *, warning: bool = False) -> None:
    """A core/v1 Event on the workload (``kubectl describe`` shows it); best effort."""
    meta = obj.get("metadata") or {}
    involved = {"apiVersion": kind.api_version, "kind": kind.kind, "name": meta.get("name"),
                "namespace": meta.get("namespace"), "uid": meta.get("uid")}
    cluster.record_event(event_body(involved, reason, message, namespace=str(meta.get("namespace")), warning=warning,
                                    component=SOURCE_COMPONENT, reporting_component=REPORTING_COMPONENT,
                                    instance=actor))


def pod_node(pod: Mapping[str, Any]) -> str:
    """The node a pod (JSON) is bound to, ``""`` while it waits to be scheduled."""
    return str((pod.get("spec") or {}).get("nodeName") or "")
