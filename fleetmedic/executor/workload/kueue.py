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

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from fleetmedic.executor.cluster import ApiError, ApiResource, WorkloadCluster
from fleetmedic.executor.workload import apply as wl
from fleetmedic.executor.workload.api import Placement, pod_node, record_event, wait_for
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


def served_version(cluster: WorkloadCluster) -> str:
    """The served version of Kueue's API group that has ``workloads`` (``""``: Kueue is not installed)."""
    return cluster.served_version(GROUP, PLURAL)


def owning_workload(cluster: WorkloadCluster, version: str, namespace: str, job_uid: str) -> dict[str, Any] | None:
    """The Workload whose controller owner is the Job or JobSet with ``job_uid``."""
    for w in cluster.list_objects(ApiResource(GROUP, version, PLURAL), namespace):
        for ref in (w.get("metadata") or {}).get("ownerReferences") or []:
            if ref.get("uid") == job_uid and ref.get("controller"):
                return w
    return None


def requeue_if_managed(cluster: WorkloadCluster, job: str, *, action: str, exclude_nodes: Sequence[str],
                       params: Mapping[str, str], dry_run: bool, actor: str,
                       placement: Placement | None = None) -> wl.WorkloadOutcome | None:
    """The outcome of restarting ``job`` (a Job, or a JobSet or one of its child Jobs) through its
    Kueue Workload, or None when Kueue does not manage it (the caller restarts it the ordinary way).
    ``placement`` turns the plan into the placed plan, and a JobSet child Job's ops."""
    namespace, name = parse_job_ref(job)
    try:
        found = wl.find_workload(cluster, namespace, name, params.get("kind", ""))
    except WorkloadError:
        return None
    if found is None or found[0] not in (JOB, JOBSET):
        return None
    kind, obj = found
    meta = obj.get("metadata") or {}
    if not ((meta.get("labels") or {}).get(QUEUE_LABEL) or (meta.get("annotations") or {}).get(QUEUE_LABEL)):
        return None
    version = served_version(cluster)
    if not version:
        return None
    workload = owning_workload(cluster, version, namespace, str(meta.get("uid")))
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
    pods = wl.workload_pods(cluster, kind, obj)  # where the ranks ran: the placement's domain
    if not resuming:
        _set_active(cluster, version, namespace, wname, False, marker=f"requeue {kind.kind} {ref}")
    try:
        wait_for(lambda: _evicted(cluster, kind, obj), timeout,
                    f"Kueue did not evict Workload {namespace}/{wname} and suspend {kind.kind} {ref} "
                    "(is the Kueue controller running?)")
    except TimeoutError as exc:
        _set_active(cluster, version, namespace, wname, True)  # never leave it inactive
        return wl.WorkloadOutcome("failed", f"{exc}; Workload set active again, {kind.kind} {ref} not restarted",
                                  details)
    try:
        plan, placed = _write_placement(cluster, kind, obj, pods, action=action, exclude_nodes=exclude_nodes,
                                        params=params, actor=actor, placement=placement)
    except (ApiError, WorkloadError) as exc:
        _set_active(cluster, version, namespace, wname, True)
        why = f"{exc.status} {exc.detail}" if isinstance(exc, ApiError) else str(exc)
        return wl.WorkloadOutcome("failed", f"{kind.kind} {ref}: the placement was not written ({why[:300]}); "
                                            f"Workload {wname} set active again", details)
    _set_active(cluster, version, namespace, wname, True)  # readmission goes through Kueue's queue
    summary = f"requeued {kind.kind} {ref} through Kueue Workload {wname} (attempt {plan.attempt})"
    record_event(cluster, kind, obj, wl.EVENT_REASONS.get(action, "FleetmedicRequeueJob"), summary, actor)
    log.info("%s", summary)
    return wl.WorkloadOutcome("applied", summary, {**plan.details(), **details, **placed})


def _write_placement(cluster: WorkloadCluster, kind: WorkloadKind, obj: Mapping[str, Any], pods: list[dict[str, Any]],
                     *, action: str, exclude_nodes: Sequence[str], params: Mapping[str, str], actor: str,
                     placement: Placement | None) -> tuple[RestartPlan, dict[str, str]]:
    """While Kueue keeps the workload suspended: write the plan (a JobSet: onto its child Jobs)."""
    meta = obj.get("metadata") or {}
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    current = _read(cluster, kind, namespace, name)
    plan = plan_restart(kind, current, action=action, exclude_nodes=exclude_nodes,
                        current_nodes=sorted({pod_node(p) for p in pods if pod_node(p)}),
                        params=params, now=time.time(), actor=actor)
    if placement is not None:
        plan = placement.place(kind, current, pods, plan)
    record = plan.annotation_ops((current.get("metadata") or {}).get("annotations") or {})
    placed: dict[str, str] = {}
    if kind is JOBSET:
        patched = patch_children(cluster, plan, str(meta.get("uid")), params, actor, placement)
        placed = {"children_patched": str(patched),
                  "note": "placement on the child Jobs, which keep it through Kueue's readmission; a JobSet-level "
                          "restart recreates them from the template without it"}
        ops = record  # the JobSet's own templates stay as Kueue admitted them (its pod sets)
    else:
        ops = [*plan.template_ops, *record]
    if ops:
        cluster.patch_object(kind, namespace, name, ops)
    return plan, placed


def _set_active(cluster: WorkloadCluster, version: str, namespace: str, name: str, active: bool,
                marker: str = "") -> None:
    """Set the Workload's ``spec.active``; deactivating marks it as fleetmedic's, activating unmarks."""
    patch = {"metadata": {"annotations": {ANNOTATION_RESTART_IN_PROGRESS: marker or None}}, "spec": {"active": active}}
    cluster.patch_object(ApiResource(GROUP, version, PLURAL), namespace, name, patch)


def _evicted(cluster: WorkloadCluster, kind: WorkloadKind, obj: Mapping[str, Any]) -> bool:
    """Kueue has stopped the workload and its pods are gone (a JobSet: every child Job suspended,
    without active pods or start time, as the JobSet and Job controllers leave them; Kueue
    suspends a JobSet and restores its templates in one write)."""
    meta = obj.get("metadata") or {}
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    now = _read(cluster, kind, namespace, name)
    if not (now.get("spec") or {}).get("suspend"):
        return False
    if kind is JOBSET:
        return all_suspended(child_jobs(cluster, namespace, name, str(meta.get("uid")))) and \
            not wl.workload_pods(cluster, kind, now)
    status = now.get("status") or {}
    stopping = KUEUE_STOPPING in ((now.get("metadata") or {}).get("annotations") or {})
    # batch/v1 lets the template change again once the start time is cleared; Kueue suspends a Job,
    # then restores its template (nodeSelector, tolerations) and only then drops its annotation:
    # a placement written before that could be undone (tolerations) or fail (a stale JSON patch)
    return not status.get("active") and not status.get("startTime") and not stopping


def _read(cluster: WorkloadCluster, kind: WorkloadKind, namespace: str, name: str) -> dict[str, Any]:
    """The workload now; gone meanwhile is the API server's 404."""
    obj = cluster.get_object(kind, namespace, name)
    if obj is None:
        raise ApiError(f"read {kind.plural} {namespace}/{name}: 404", 404, f'{kind.plural} "{name}" not found')
    return obj
