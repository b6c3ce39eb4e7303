"""The workload side's low-level calls to the API server, shared by :mod:`.apply`, :mod:`.jobset`
and :mod:`.kueue` (imports run one way: they import this, this imports only :mod:`.plan`).

- :func:`patch_workload`: a JSON patch of a workload, optionally bound to a resourceVersion
  (:class:`VersionChanged` when the object moved on: nothing was written, plan again);
- :func:`wait_for`: poll a condition until a deadline (``TimeoutError`` naming what did not happen);
- :func:`record_event`: a core/v1 Event on the workload, best effort;
- :data:`AdjustPlan` / :data:`AdjustChild`: the placement step's hooks into a restart
  (:mod:`.placement_apply`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from kubernetes import client
from kubernetes.client import ApiException

from fleetmedic.executor.cluster import event_body
from fleetmedic.executor.kube import create_event
from fleetmedic.executor.workload.plan import RestartPlan, WorkloadKind
from fleetmedic.k8s_keys import REPORTING_COMPONENT, SOURCE_COMPONENT

JSON_PATCH = "application/json-patch+json"
# (kind, workload, its live pods, plan) -> the plan to carry out; see fleetmedic.executor.workload.placement_apply
AdjustPlan = Callable[[WorkloadKind, dict[str, Any], list[client.V1Pod], RestartPlan], RestartPlan]
# (a JobSet's suspended child Job, the JSON-patch ops its own plan made) -> the ops to write to it
AdjustChild = Callable[[dict[str, Any], list[dict[str, Any]]], list[dict[str, Any]]]


class VersionChanged(Exception):
    """The first write's resourceVersion precondition failed (409): nothing was changed yet."""


def patch_workload(api: client.ApiClient, kind: WorkloadKind, namespace: str, name: str,
                   ops: list[dict[str, Any]], if_version: str = "") -> dict[str, Any]:
    """A JSON patch; with ``if_version``, only if the object is still at that resourceVersion."""
    custom = client.CustomObjectsApi(api)
    if if_version:
        ops = [{"op": "replace", "path": "/metadata/resourceVersion", "value": if_version}, *ops]
    try:
        result = custom.patch_namespaced_custom_object(
            kind.group, kind.version, namespace, kind.plural, name, ops, _content_type=JSON_PATCH)
    except ApiException as exc:
        if if_version and exc.status == 409:
            raise VersionChanged() from None
        raise
    return cast(dict[str, Any], result)


def wait_for(ready: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout:.0f}s")
        time.sleep(interval)


def record_event(api: client.ApiClient, kind: WorkloadKind, obj: Mapping[str, Any], reason: str,
                 message: str, actor: str, *, warning: bool = False) -> None:
    """A core/v1 Event on the workload (``kubectl describe`` shows it); best effort."""
    meta = obj.get("metadata") or {}
    involved = {"apiVersion": kind.api_version, "kind": kind.kind, "name": meta.get("name"),
                "namespace": meta.get("namespace"), "uid": meta.get("uid")}
    create_event(api, event_body(involved, reason, message, namespace=str(meta.get("namespace")), warning=warning,
                                 component=SOURCE_COMPONENT, reporting_component=REPORTING_COMPONENT, instance=actor))
