"""Restart, re-place or requeue a training workload through the API server (the executor's job side).

``restart_workload(cluster, "ns/name", action=..., exclude_nodes=..., params=..., dry_run=..., actor=...)``
finds the workload (``params["kind"]`` or a look-up among Job, PyTorchJob, JobSet), plans the
restart with :mod:`fleetmedic.executor.workload.plan` (pure) and carries it out:

- batch Job: suspend (with the ``fleetmedic.io/restart-in-progress`` marker,
  ``ANNOTATION_RESTART_IN_PROGRESS``), wait until the Job
  controller has removed the pods, patch the pod template's node affinity if the plan says so,
  resume. An executor that died in between finds the marker and resumes the Job on the next call.
- PyTorchJob: patch the replica templates, evict the job's pods (the Eviction API: the executor
  has no ``delete`` on pods); the training operator recreates each replica from its (patched)
  template. An eviction a PodDisruptionBudget refuses fails the restart with the budget's message.
- JobSet: patch the replicated-job templates, delete the child Jobs (foreground; only Jobs the
  JobSet owns, by uid); the JobSet controller recreates them. Where the JobSet webhook refuses the
  template change, the exclusion goes onto the suspended child Jobs instead (:mod:`.jobset`).

Every applied restart records annotations on the workload and a core/v1 Event on it. It returns
once the API server accepted the change, not when the pods run again. ``dry_run`` plans, reports
(outcome ``skipped``, ``details["dry_run"] = "true"``) and changes nothing. Errors never escape:
a missing workload, a bad command or an API error is a ``failed`` outcome with the reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from fleetmedic.executor.cluster import ApiError, WorkloadCluster
from fleetmedic.executor.node.long_plan import PodView
from fleetmedic.executor.workload.api import (
    Placement,
    VersionChanged,
    patch_workload,
    pod_node,
    record_event,
    wait_for,
)
from fleetmedic.executor.workload.jobset import suspend_and_patch_children
from fleetmedic.executor.workload.plan import (
    JOB,
    JOBSET,
    KINDS,
    PYTORCHJOB,
    RestartPlan,
    WorkloadError,
    WorkloadKind,
    annotation_patch,
    finished,
    kind_named,
    parse_job_ref,
    plan_restart,
)
from fleetmedic.k8s_keys import ANNOTATION_RESTART_IN_PROGRESS, LABEL_OPT_OUT

log = logging.getLogger(__name__)
DEFAULT_TIMEOUT_S = 60.0
EVENT_REASONS = {"restart_job": "FleetmedicReplaceJob", "requeue_job": "FleetmedicRequeueJob",
                 "retry_in_place": "FleetmedicRetryInPlace"}


CONFLICT_RETRIES = 5


@dataclass(frozen=True)
class WorkloadOutcome:
    outcome: Literal["applied", "skipped", "failed"]
    reason: str
    details: dict[str, str] = field(default_factory=dict)


def restart_workload(cluster: WorkloadCluster, job: str, *, action: str, exclude_nodes: Sequence[str],
                     params: Mapping[str, str], dry_run: bool, actor: str,
                     placement: Placement | None = None) -> WorkloadOutcome:
    """Carry out ``action`` on workload ``job`` ("namespace/name"); see the module docstring."""
    try:
        for _ in range(CONFLICT_RETRIES):
            try:
                return _restart(cluster, job, action, exclude_nodes, params, dry_run, actor, placement)
            except VersionChanged:  # the workload changed between our read and our first write: plan again
                continue
        return WorkloadOutcome("failed", f"workload {job} kept changing ({CONFLICT_RETRIES} conflicts)")
    except WorkloadError as exc:
        return WorkloadOutcome("failed", str(exc))
    except ApiError as exc:
        return WorkloadOutcome("failed", f"API server: {exc.status} {exc.detail}")
    except TimeoutError as exc:
        return WorkloadOutcome("failed", str(exc))


def _restart(cluster: WorkloadCluster, job: str, action: str, exclude_nodes: Sequence[str],
             params: Mapping[str, str], dry_run: bool, actor: str,
             placement: Placement | None = None) -> WorkloadOutcome:
    namespace, name = parse_job_ref(job)
    found = find_workload(cluster, namespace, name, params.get("kind", ""))
    if found is None:
        kinds = params.get("kind") or "/".join(k.kind for k in KINDS)
        return WorkloadOutcome("failed", f"workload {job} not found (looked for {kinds})")
    kind, obj = found
    meta = obj.get("metadata") or {}
    opt_out = params.get("opt_out_label", LABEL_OPT_OUT)
    if str((meta.get("labels") or {}).get(opt_out, "")).lower() == "true":
        return WorkloadOutcome("skipped", f"{kind.kind} {job} is labelled {opt_out}=true", {"kind": kind.kind})
    over = finished(kind, obj)
    if over:
        return WorkloadOutcome("skipped", over, {"kind": kind.kind})
    resuming = ANNOTATION_RESTART_IN_PROGRESS in (meta.get("annotations") or {})
    spec = obj.get("spec") or {}
    if (spec.get("suspend") or (spec.get("runPolicy") or {}).get("suspend")) and not resuming:
        return WorkloadOutcome("skipped", f"{kind.kind} {job} is suspended by someone else (not by fleetmedic)",
                               {"kind": kind.kind})
    pods = workload_pods(cluster, kind, obj)
    nodes = sorted({pod_node(p) for p in pods if pod_node(p)})
    plan = plan_restart(kind, obj, action=action, exclude_nodes=exclude_nodes, current_nodes=nodes,
                        params=params, now=time.time(), actor=actor)
    if placement is not None:  # topology-aware placement (workload.placement_apply), before any write
        plan = placement.place(kind, obj, pods, plan)
    details = {**plan.details(), "pods": str(len(pods)), "nodes_before": ",".join(nodes)}
    if dry_run:
        return WorkloadOutcome("skipped", f"dry run: would {plan.summary}", {**details, "dry_run": "true"})
    timeout = float(params.get("timeout_s", DEFAULT_TIMEOUT_S))
    if kind is JOB:
        _suspend_resume(cluster, plan, obj, timeout)
    elif kind is JOBSET and (resuming or plan.template_ops):
        _jobset_with_exclusion(cluster, plan, obj, params, timeout, actor, details, placement)
    else:
        details["deleted"] = str(_patch_then_delete(cluster, plan, obj))
    record_event(cluster, kind, obj, EVENT_REASONS[action], plan.summary, actor)
    log.info("%s", plan.summary)
    return WorkloadOutcome("applied", plan.summary, details)


# --- finding the workload and its pods ------------------------------------------------------------


def find_workload(cluster: WorkloadCluster, namespace: str, name: str,
                  kind_hint: str = "") -> tuple[WorkloadKind, dict[str, Any]] | None:
    """The workload and its kind; a Job that a JobSet controls resolves to the JobSet."""
    kinds = (kind_named(kind_hint),) if kind_hint else KINDS
    for kind in kinds:
        obj = cluster.get_object(kind, namespace, name)
        if obj is None:
            continue
        owner = _controller(obj)
        if kind is JOB and owner and owner.get("kind") == JOBSET.kind and not kind_hint:
            return find_workload(cluster, namespace, str(owner.get("name")), JOBSET.kind)
        return kind, obj
    return None


def _controller(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


def workload_pods(cluster: WorkloadCluster, kind: WorkloadKind, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The workload's live pods (not terminating), by its well-known label and ownership (JSON)."""
    meta = obj.get("metadata") or {}
    if kind is JOB:
        selector = f"batch.kubernetes.io/controller-uid={meta.get('uid')}"
    else:
        selector = f"{kind.job_label}={meta.get('name')}"
    pods = cluster.list_pods(str(meta.get("namespace")), selector)
    return [p for p in pods if p.get("metadata") and not p["metadata"].get("deletionTimestamp")]


# --- carrying out a plan --------------------------------------------------------------------------


def _suspend_resume(cluster: WorkloadCluster, plan: RestartPlan, obj: Mapping[str, Any], timeout: float) -> None:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    rv = str((obj.get("metadata") or {}).get("resourceVersion"))
    if ANNOTATION_RESTART_IN_PROGRESS not in annotations:
        marker = annotation_patch(annotations, {ANNOTATION_RESTART_IN_PROGRESS: plan.summary})
        patch_workload(cluster, JOB, plan.namespace, plan.name,
                       [{"op": "add", "path": "/spec/suspend", "value": True}, *marker], if_version=rv)
        annotations = {**annotations, ANNOTATION_RESTART_IN_PROGRESS: plan.summary}
    done = annotation_patch(annotations, {}, remove=[ANNOTATION_RESTART_IN_PROGRESS])
    resume = [{"op": "add", "path": "/spec/suspend", "value": False}]
    record = plan.annotation_ops(annotations, remove=[ANNOTATION_RESTART_IN_PROGRESS])
    deadline = time.monotonic() + timeout
    seen: dict[str, Any] = {}
    while True:
        # The API server lets a suspended Job's node affinity change only while it has no active pods and
        # is marked Suspended (or never started): the write is bound to the version we saw in that state.
        wait_for(lambda: _suspended_and_empty(cluster, plan.namespace, plan.name, seen), deadline - time.monotonic(),
                 f"Job {plan.namespace}/{plan.name}: the Job controller did not remove its pods")
        version = str(seen["metadata"].get("resourceVersion"))
        try:
            patch_workload(cluster, JOB, plan.namespace, plan.name, [*plan.template_ops, *record, *resume],
                           if_version=version)
            return
        except VersionChanged:  # the Job controller wrote its status after we looked: look again
            if time.monotonic() > deadline:
                raise TimeoutError(f"Job {plan.namespace}/{plan.name}: kept changing while suspended "
                                   f"within {timeout:.0f}s") from None
        except ApiError as exc:
            if exc.status != 422 or not plan.template_ops:
                raise
            # never leave the job suspended because the node affinity was refused
            patch_workload(cluster, JOB, plan.namespace, plan.name, [*done, *resume])
            raise WorkloadError(f"Job {plan.namespace}/{plan.name}: resumed without the node affinity, which the "
                                f"API server refused ({exc.detail[:300]}); the Job we wrote to: "
                                f"{_suspension_state(seen)}") from None


def _suspended_and_empty(cluster: WorkloadCluster, namespace: str, name: str, seen: dict[str, Any]) -> bool:
    """Whether the Job is suspended with no active pods (its template may change); ``seen`` gets it."""
    job = cluster.get_object(JOB, namespace, name)
    if job is None:
        raise ApiError(f"read jobs {namespace}/{name}: 404", 404, f'jobs.batch "{name}" not found')
    seen.clear()
    seen.update(job)
    status = job.get("status") or {}
    suspended = any(c.get("type") == "Suspended" and c.get("status") == "True" for c in status.get("conditions") or [])
    return suspended and not status.get("active") and not status.get("startTime")


def _suspension_state(job: Mapping[str, Any]) -> str:
    status = job.get("status") or {}
    conditions = ",".join(f"{c.get('type')}={c.get('status')}" for c in status.get("conditions") or [])
    return (f"resourceVersion={(job.get('metadata') or {}).get('resourceVersion')} "
            f"suspend={(job.get('spec') or {}).get('suspend')} active={status.get('active', 0)} "
            f"startTime={status.get('startTime')} conditions=[{conditions}]")


def _jobset_with_exclusion(cluster: WorkloadCluster, plan: RestartPlan, obj: Mapping[str, Any],
                           params: Mapping[str, str], timeout: float, actor: str, details: dict[str, str],
                           placement: Placement | None = None) -> None:
    """Patch the JobSet's template and recreate its children; where the JobSet webhook refuses the
    template change (or a suspension of ours is to be finished), go through the child Jobs."""
    if ANNOTATION_RESTART_IN_PROGRESS not in ((obj.get("metadata") or {}).get("annotations") or {}):
        try:
            details["deleted"] = str(_patch_then_delete(cluster, plan, obj))
            return
        except ApiError as exc:
            if exc.status not in (400, 403, 422):
                raise
            details["template_refused"] = exc.detail[:300]
    details["mechanism"] = "suspend_patch_children"
    details["children_patched"] = str(suspend_and_patch_children(cluster, plan, obj, params, timeout, actor,
                                                                 placement))
    what = "exclusion and placement preference are" if placement else "exclusion is"
    details["note"] = f"{what} on the child Jobs: a JobSet-level restart recreates them from the template without it"


def _patch_then_delete(cluster: WorkloadCluster, plan: RestartPlan, obj: Mapping[str, Any]) -> int:
    meta = obj.get("metadata") or {}
    rv, uid = str(meta.get("resourceVersion")), str(meta.get("uid"))
    ops = [*plan.template_ops, *plan.annotation_ops(meta.get("annotations") or {})]
    patch_workload(cluster, plan.kind, plan.namespace, plan.name, ops, if_version=rv)
    selector = f"{plan.kind.job_label}={plan.name}"
    deleted = 0
    if plan.kind is PYTORCHJOB:
        for pod in cluster.list_pods(plan.namespace, selector):
            name = _owned_live_name(pod, uid)
            if name:
                deleted += _evicted(cluster, name, plan.namespace)
    else:
        for job in cluster.list_objects(JOB, plan.namespace, selector):
            name = _owned_live_name(job, uid)
            if name:
                deleted += int(cluster.delete_job(plan.namespace, name))
    return deleted


def _owned_live_name(obj: Mapping[str, Any], uid: str) -> str:
    """The object's name if ``uid`` owns it and it is not being deleted already, else ``""``."""
    meta = obj.get("metadata") or {}
    if not meta or meta.get("deletionTimestamp") or not any(
            r.get("uid") == uid for r in meta.get("ownerReferences") or []):
        return ""
    return str(meta.get("name"))


def _evicted(cluster: WorkloadCluster, name: str, namespace: str) -> int:
    """Evict the pod (the API server deletes it, honouring PodDisruptionBudgets): 1 if this call
    evicted it, 0 if it was already gone; a refusal (429) fails the restart with the reason."""
    ev = cluster.evict(PodView(namespace, name))
    if ev.evicted:
        return 0 if ev.status == 404 else 1
    raise WorkloadError(f"pod {namespace}/{name}: eviction refused ({ev.message[:300]}); the "
                        f"restart stopped there (the replicas evicted before it are recreated)")
