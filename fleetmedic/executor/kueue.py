"""Restarting a Kueue-managed batch Job through its Kueue ``Workload`` (docs/placement.md).

Kueue owns a queued Job's ``spec.suspend``: it suspends the Job until the Workload is admitted
against a ClusterQueue's quota, and suspends it again if anyone else resumes it. Restarting such a
Job around Kueue (suspend/resume it ourselves) fights Kueue; this module goes through it instead:

1. ``spec.active: false`` on the Job's Workload: Kueue evicts it (condition ``Evicted``, reason
   ``InactiveWorkload``), suspends the Job, the Job controller removes the pods;
2. once the Job is suspended and its pods are gone, the pod template gets the placement (node
   exclusion, topology preference) while suspended, as batch/v1 allows;
3. ``spec.active: true``: Kueue requeues the Workload in its LocalQueue with the Workload's own
   priority and admits it when quota allows, then un-suspends the Job.

If Kueue does not evict the Workload within ``params["timeout_s"]`` (its controller is not running),
the Workload is set active again and the restart fails with that reason: nothing is left inactive.

A Job is Kueue-managed when it carries ``kueue.x-k8s.io/queue-name`` (label or annotation), the
``workloads.kueue.x-k8s.io`` API is served, and a Workload names the Job as its controller owner.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from kubernetes import client
from kubernetes.client import ApiException

from fleetmedic.executor import workloads as wl
from fleetmedic.executor.workloads_plan import JOB, RestartPlan, WorkloadKind, parse_job_ref, plan_restart

log = logging.getLogger(__name__)
GROUP = "kueue.x-k8s.io"
PLURAL = "workloads"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MERGE_PATCH = "application/merge-patch+json"
Adjust = Callable[[WorkloadKind, dict[str, Any], list[client.V1Pod], RestartPlan], RestartPlan]


def served_version(api: client.ApiClient) -> str:
    """The served version of Kueue's API group that has ``workloads`` (``""``: Kueue is not installed)."""
    groups = client.ApisApi(api).get_api_versions().groups or []
    group = next((g for g in groups if g.name == GROUP), None)
    if group is None:
        return ""
    preferred = group.preferred_version.version if group.preferred_version else ""
    for version in [preferred, *(v.version for v in group.versions or [])]:
        if version and any(r.get("name") == PLURAL for r in _get_json(api, f"/apis/{GROUP}/{version}").get(
                "resources") or []):
            return str(version)
    return ""


def _get_json(api: client.ApiClient, path: str) -> dict[str, Any]:
    method, url, headers, body, post = api.param_serialize("GET", path, auth_settings=["BearerToken"])
    resp = api.call_api(method, url, headers, body, post, _request_timeout=10.0)
    resp.read()  # type: ignore[no-untyped-call]
    if resp.status >= 400:
        raise ApiException(status=resp.status, reason=(resp.data or b"")[:200].decode(errors="replace"))
    return cast(dict[str, Any], json.loads(resp.data or b"{}"))


def owning_workload(api: client.ApiClient, version: str, namespace: str, job_uid: str) -> dict[str, Any] | None:
    """The Workload whose controller owner is the Job with ``job_uid``."""
    items = cast(dict[str, Any], client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, version, namespace, PLURAL))
    for w in items.get("items") or []:
        for ref in (w.get("metadata") or {}).get("ownerReferences") or []:
            if ref.get("uid") == job_uid and ref.get("controller"):
                return cast(dict[str, Any], w)
    return None


def requeue_if_managed(api: client.ApiClient, job: str, *, action: str, exclude_nodes: Sequence[str],
                       params: Mapping[str, str], dry_run: bool, actor: str,
                       adjust: Adjust | None = None) -> wl.WorkloadOutcome | None:
    """The outcome of restarting ``job`` through its Kueue Workload, or None when Kueue does not
    manage it (the caller restarts it the ordinary way)."""
    namespace, name = parse_job_ref(job)
    try:
        obj = cast(dict[str, Any], client.CustomObjectsApi(api).get_namespaced_custom_object(
            "batch", "v1", namespace, "jobs", name))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    meta = obj.get("metadata") or {}
    if not ((meta.get("labels") or {}).get(QUEUE_LABEL) or (meta.get("annotations") or {}).get(QUEUE_LABEL)):
        return None
    version = served_version(api)
    if not version:
        return None
    workload = owning_workload(api, version, namespace, str(meta.get("uid")))
    if workload is None:
        return None
    wname = str(workload["metadata"]["name"])
    details = {"kind": "Job", "mechanism": "kueue_workload", "kueue_workload": f"{namespace}/{wname}",
               "kueue_version": version}
    if dry_run:
        return wl.WorkloadOutcome("skipped", f"dry run: would requeue Job {job} through Kueue Workload {wname} "
                                             "(spec.active false, set the placement, spec.active true)",
                                  {**details, "dry_run": "true"})
    timeout = float(params.get("timeout_s", wl.DEFAULT_TIMEOUT_S))
    pods = wl.workload_pods(api, JOB, obj)  # where the ranks ran: the placement's domain
    _set_active(api, version, namespace, wname, False)
    try:
        wl.wait_for(lambda: _evicted(api, namespace, name), timeout,
                    f"Kueue did not evict Workload {namespace}/{wname} (is the Kueue controller running?)")
    except TimeoutError as exc:
        _set_active(api, version, namespace, wname, True)  # never leave it inactive
        return wl.WorkloadOutcome("failed", f"{exc}; Workload set active again, Job {job} not restarted", details)
    current = cast(dict[str, Any], client.CustomObjectsApi(api).get_namespaced_custom_object(
        "batch", "v1", namespace, "jobs", name))
    plan = plan_restart(JOB, current, action=action, exclude_nodes=exclude_nodes,
                        current_nodes=sorted({p.spec.node_name for p in pods if p.spec and p.spec.node_name}),
                        params=params, now=time.time(), actor=actor)
    if adjust is not None:
        plan = adjust(JOB, current, pods, plan)
    ops = [*plan.template_ops, *plan.annotation_ops((current.get("metadata") or {}).get("annotations") or {})]
    if ops:
        client.CustomObjectsApi(api).patch_namespaced_custom_object(
            "batch", "v1", namespace, "jobs", name, ops, _content_type=wl.JSON_PATCH)
    _set_active(api, version, namespace, wname, True)
    summary = f"requeued Job {job} through Kueue Workload {wname} (attempt {plan.attempt})"
    log.info("%s", summary)
    return wl.WorkloadOutcome("applied", summary, {**plan.details(), **details})


def _set_active(api: client.ApiClient, version: str, namespace: str, name: str, active: bool) -> None:
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, version, namespace, PLURAL, name, {"spec": {"active": active}}, _content_type=MERGE_PATCH)


def _evicted(api: client.ApiClient, namespace: str, name: str) -> bool:
    """Kueue has suspended the Job and the Job controller has removed its pods."""
    job = cast(dict[str, Any], client.CustomObjectsApi(api).get_namespaced_custom_object(
        "batch", "v1", namespace, "jobs", name))
    return bool((job.get("spec") or {}).get("suspend")) and not (job.get("status") or {}).get("active")
