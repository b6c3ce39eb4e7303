"""Restarting a Kueue-managed batch Job or JobSet through its Kueue ``Workload`` (docs/placement.md).

Kueue owns a queued workload's ``spec.suspend``: it suspends it until the Workload is admitted
against a ClusterQueue's quota, and suspends it again if anyone else resumes it. Restarting such a
workload around Kueue (suspend/resume it ourselves) fights Kueue; this module goes through it:

1. ``spec.active: false`` on the Workload (with the ``fleetmedic.io/restart-in-progress`` marker,
   ``ANNOTATION_RESTART_IN_PROGRESS``):
   Kueue evicts it (condition ``Evicted``, reason ``InactiveWorkload``) and suspends the Job or
   JobSet; for a JobSet the JobSet controller suspends its child Jobs; the Job controller removes
   the pods and clears the Jobs' start time;
2. once everything is suspended and the pods are gone, the placement (node exclusion, topology
   preference, standby tolerations) is written where Kueue's readmission keeps it:

   - a Job: its pod template (batch/v1 lets a suspended Job's scheduling directives change);
   - a JobSet: its suspended **child Jobs**, not the JobSet. The JobSet webhook refuses affinity
     changes on ``replicatedJobs``, and Kueue derives the Workload's pod sets from them. On
     readmission Kueue merges the flavor's nodeSelector/tolerations into the JobSet's templates
     and un-suspends it; the JobSet controller then merges only labels, annotations, nodeSelector
     and tolerations from the templates into the children before resuming them, so the children's
     affinity (and our tolerations, a union) stay;

3. ``spec.active: true`` (marker removed): Kueue requeues the same Workload in its LocalQueue with
   its own priority and admits it when quota allows, then un-suspends the workload.

If Kueue does not evict the Workload within ``params["timeout_s"]`` (its controller is not running),
the Workload is set active again and the restart fails with that reason: nothing is left inactive.
An executor that died between 1 and 3 finds the marker on the inactive Workload and finishes.

A workload is Kueue-managed when it carries ``kueue.x-k8s.io/queue-name`` (label or annotation), the
``workloads.kueue.x-k8s.io`` API is served, and a Workload names it as its controller owner.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

from kubernetes import client
from kubernetes.client import ApiException

from fleetmedic.executor.kube import api_message
from fleetmedic.executor.workload import apply as wl
from fleetmedic.executor.workload.api import JSON_PATCH, AdjustChild, AdjustPlan, record_event, wait_for
from fleetmedic.executor.workload.jobset import all_suspended, child_jobs, patch_children
from fleetmedic.executor.workload.plan import (
    JOB,
    JOBSET,
    RestartPlan,
    WorkloadError,
    WorkloadKind,
    finished,
    parse_job_ref,
    plan_restart,
)
from fleetmedic.k8s_keys import ANNOTATION_RESTART_IN_PROGRESS, LABEL_OPT_OUT

log = logging.getLogger(__name__)
GROUP = "kueue.x-k8s.io"
PLURAL = "workloads"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_STOPPING = "kueue.x-k8s.io/stopping"  # on a Job while Kueue stops it (pkg/controller/jobs/job)
MERGE_PATCH = "application/merge-patch+json"


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
    """The Workload whose controller owner is the Job or JobSet with ``job_uid``."""
    items = cast(dict[str, Any], client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, version, namespace, PLURAL))
    for w in items.get("items") or []:
        for ref in (w.get("metadata") or {}).get("ownerReferences") or []:
            if ref.get("uid") == job_uid and ref.get("controller"):
                return cast(dict[str, Any], w)
    return None


def requeue_if_managed(api: client.ApiClient, job: str, *, action: str, exclude_nodes: Sequence[str],
                       params: Mapping[str, str], dry_run: bool, actor: str, adjust: AdjustPlan | None = None,
                       adjust_child: AdjustChild | None = None) -> wl.WorkloadOutcome | None:
    """The outcome of restarting ``job`` (a Job, or a JobSet or one of its child Jobs) through its
    Kueue Workload, or None when Kueue does not manage it (the caller restarts it the ordinary way).
    ``adjust`` turns the plan into the placed plan; ``adjust_child`` a JobSet child Job's ops."""
    namespace, name = parse_job_ref(job)
    try:
        found = wl.find_workload(api, namespace, name, params.get("kind", ""))
    except WorkloadError:
        return None
    if found is None or found[0] not in (JOB, JOBSET):
        return None
    kind, obj = found
    meta = obj.get("metadata") or {}
    if not ((meta.get("labels") or {}).get(QUEUE_LABEL) or (meta.get("annotations") or {}).get(QUEUE_LABEL)):
        return None
    version = served_version(api)
    if not version:
        return None
    workload = owning_workload(api, version, namespace, str(meta.get("uid")))
    if workload is None:
        return None
    ref = f"{namespace}/{meta.get('name')}"
    wname = str(workload["metadata"]["name"])
    details = {"kind": kind.kind, "mechanism": "kueue_workload", "kueue_workload": f"{namespace}/{wname}",
               "kueue_version": version}
    opt_out = params.get("opt_out_label", LABEL_OPT_OUT)
    if str((meta.get("labels") or {}).get(opt_out, "")).lower() == "true":
        return wl.WorkloadOutcome("skipped", f"{kind.kind} {ref} is labelled {opt_out}=true", details)
    over = finished(kind, obj)
    if over:
        return wl.WorkloadOutcome("skipped", over, details)
    resuming = ANNOTATION_RESTART_IN_PROGRESS in ((workload.get("metadata") or {}).get("annotations") or {})
    if (workload.get("spec") or {}).get("active") is False and not resuming:
        return wl.WorkloadOutcome("skipped", f"Kueue Workload {namespace}/{wname} was deactivated by someone else "
                                             "(not by fleetmedic)", details)
    where = "its suspended child Jobs" if kind is JOBSET else "the pod template"
    if dry_run:
        return wl.WorkloadOutcome("skipped", f"dry run: would requeue {kind.kind} {ref} through Kueue Workload "
                                             f"{wname} (spec.active false, the placement on {where}, "
                                             "spec.active true)", {**details, "dry_run": "true"})
    timeout = float(params.get("timeout_s", wl.DEFAULT_TIMEOUT_S))
    pods = wl.workload_pods(api, kind, obj)  # where the ranks ran: the placement's domain
    if not resuming:
        _set_active(api, version, namespace, wname, False, marker=f"requeue {kind.kind} {ref}")
    try:
        wait_for(lambda: _evicted(api, kind, obj), timeout,
                    f"Kueue did not evict Workload {namespace}/{wname} and suspend {kind.kind} {ref} "
                    "(is the Kueue controller running?)")
    except TimeoutError as exc:
        _set_active(api, version, namespace, wname, True)  # never leave it inactive
        return wl.WorkloadOutcome("failed", f"{exc}; Workload set active again, {kind.kind} {ref} not restarted",
                                  details)
    try:
        plan, placed = _write_placement(api, kind, obj, pods, action=action, exclude_nodes=exclude_nodes,
                                        params=params, actor=actor, adjust=adjust, adjust_child=adjust_child)
    except (ApiException, WorkloadError) as exc:
        _set_active(api, version, namespace, wname, True)
        why = f"{exc.status} {api_message(exc)}" if isinstance(exc, ApiException) else str(exc)
        return wl.WorkloadOutcome("failed", f"{kind.kind} {ref}: the placement was not written ({why[:300]}); "
                                            f"Workload {wname} set active again", details)
    _set_active(api, version, namespace, wname, True)  # readmission goes through Kueue's queue
    summary = f"requeued {kind.kind} {ref} through Kueue Workload {wname} (attempt {plan.attempt})"
    record_event(api, kind, obj, wl.EVENT_REASONS.get(action, "FleetmedicRequeueJob"), summary, actor)
    log.info("%s", summary)
    return wl.WorkloadOutcome("applied", summary, {**plan.details(), **details, **placed})


def _write_placement(api: client.ApiClient, kind: WorkloadKind, obj: Mapping[str, Any], pods: list[client.V1Pod],
                     *, action: str, exclude_nodes: Sequence[str], params: Mapping[str, str], actor: str,
                     adjust: AdjustPlan | None, adjust_child: AdjustChild | None) -> tuple[RestartPlan, dict[str, str]]:
    """While Kueue keeps the workload suspended: write the plan (a JobSet: onto its child Jobs)."""
    custom = client.CustomObjectsApi(api)
    meta = obj.get("metadata") or {}
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    current = cast(dict[str, Any], custom.get_namespaced_custom_object(
        kind.group, kind.version, namespace, kind.plural, name))
    plan = plan_restart(kind, current, action=action, exclude_nodes=exclude_nodes,
                        current_nodes=sorted({p.spec.node_name for p in pods if p.spec and p.spec.node_name}),
                        params=params, now=time.time(), actor=actor)
    if adjust is not None:
        plan = adjust(kind, current, pods, plan)
    record = plan.annotation_ops((current.get("metadata") or {}).get("annotations") or {})
    placed: dict[str, str] = {}
    if kind is JOBSET:
        patched = patch_children(api, plan, str(meta.get("uid")), params, actor, adjust_child)
        placed = {"children_patched": str(patched),
                  "note": "placement on the child Jobs, which keep it through Kueue's readmission; a JobSet-level "
                          "restart recreates them from the template without it"}
        ops = record  # the JobSet's own templates stay as Kueue admitted them (its pod sets)
    else:
        ops = [*plan.template_ops, *record]
    if ops:
        custom.patch_namespaced_custom_object(kind.group, kind.version, namespace, kind.plural, name, ops,
                                              _content_type=JSON_PATCH)
    return plan, placed


def _set_active(api: client.ApiClient, version: str, namespace: str, name: str, active: bool,
                marker: str = "") -> None:
    """Set the Workload's ``spec.active``; deactivating marks it as fleetmedic's, activating unmarks."""
    patch = {"metadata": {"annotations": {ANNOTATION_RESTART_IN_PROGRESS: marker or None}}, "spec": {"active": active}}
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, version, namespace, PLURAL, name, patch, _content_type=MERGE_PATCH)


def _evicted(api: client.ApiClient, kind: WorkloadKind, obj: Mapping[str, Any]) -> bool:
    """Kueue has stopped the workload and its pods are gone (a JobSet: every child Job suspended,
    without active pods or start time, as the JobSet and Job controllers leave them; Kueue
    suspends a JobSet and restores its templates in one write)."""
    meta = obj.get("metadata") or {}
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    now = cast(dict[str, Any], client.CustomObjectsApi(api).get_namespaced_custom_object(
        kind.group, kind.version, namespace, kind.plural, name))
    if not (now.get("spec") or {}).get("suspend"):
        return False
    if kind is JOBSET:
        return all_suspended(child_jobs(api, namespace, name, str(meta.get("uid")))) and \
            not wl.workload_pods(api, kind, now)
    status = now.get("status") or {}
    stopping = KUEUE_STOPPING in ((now.get("metadata") or {}).get("annotations") or {})
    # batch/v1 lets the template change again once the start time is cleared; Kueue suspends a Job,
    # then restores its template (nodeSelector, tolerations) and only then drops its annotation:
    # a placement written before that could be undone (tolerations) or fail (a stale JSON patch)
    return not status.get("active") and not status.get("startTime") and not stopping
