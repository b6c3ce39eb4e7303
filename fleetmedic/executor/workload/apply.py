"""Restart, re-place or requeue a training workload through the API server (the executor's job side).

``restart_workload(api, "ns/name", action=..., exclude_nodes=..., params=..., dry_run=..., actor=...)``
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from kubernetes import client
from kubernetes.client import ApiException

from fleetmedic.executor.kube import api_message
from fleetmedic.executor.workload.api import (
    AdjustChild,
    AdjustPlan,
    VersionChanged,
    patch_workload,
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


def restart_workload(api: client.ApiClient, job: str, *, action: str, exclude_nodes: Sequence[str],
                     params: Mapping[str, str], dry_run: bool, actor: str,
                     adjust_plan: AdjustPlan | None = None, adjust_child: AdjustChild | None = None) -> WorkloadOutcome:
    """Carry out ``action`` on workload ``job`` ("namespace/name"); see the module docstring."""
    try:
        for _ in range(CONFLICT_RETRIES):
            try:
                return _restart(api, job, action, exclude_nodes, params, dry_run, actor, adjust_plan, adjust_child)
            except VersionChanged:  # the workload changed between our read and our first write: plan again
                continue
        return WorkloadOutcome("failed", f"workload {job} kept changing ({CONFLICT_RETRIES} conflicts)")
    except WorkloadError as exc:
        return WorkloadOutcome("failed", str(exc))
    except ApiException as exc:
        return WorkloadOutcome("failed", f"API server: {exc.status} {api_message(exc)}")
    except TimeoutError as exc:
        return WorkloadOutcome("failed", str(exc))


def _restart(api: client.ApiClient, job: str, action: str, exclude_nodes: Sequence[str],
             params: Mapping[str, str], dry_run: bool, actor: str,
             adjust_plan: AdjustPlan | None = None, adjust_child: AdjustChild | None = None) -> WorkloadOutcome:
    namespace, name = parse_job_ref(job)
    found = find_workload(api, namespace, name, params.get("kind", ""))
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
    pods = workload_pods(api, kind, obj)
    nodes = sorted({p.spec.node_name for p in pods if p.spec and p.spec.node_name})
    plan = plan_restart(kind, obj, action=action, exclude_nodes=exclude_nodes, current_nodes=nodes,
                        params=params, now=time.time(), actor=actor)
    if adjust_plan is not None:  # topology-aware placement (workload.placement_apply), before any write
        plan = adjust_plan(kind, obj, pods, plan)
    details = {**plan.details(), "pods": str(len(pods)), "nodes_before": ",".join(nodes)}
    if dry_run:
        return WorkloadOutcome("skipped", f"dry run: would {plan.summary}", {**details, "dry_run": "true"})
    timeout = float(params.get("timeout_s", DEFAULT_TIMEOUT_S))
    if kind is JOB:
        _suspend_resume(api, plan, obj, timeout)
    elif kind is JOBSET and (resuming or plan.template_ops):
        _jobset_with_exclusion(api, plan, obj, params, timeout, actor, details, adjust_child)
    else:
        details["deleted"] = str(_patch_then_delete(api, plan, obj))
    record_event(api, kind, obj, EVENT_REASONS[action], plan.summary, actor)
    log.info("%s", plan.summary)
    return WorkloadOutcome("applied", plan.summary, details)


# --- finding the workload and its pods ------------------------------------------------------------


def find_workload(api: client.ApiClient, namespace: str, name: str,
                  kind_hint: str = "") -> tuple[WorkloadKind, dict[str, Any]] | None:
    """The workload and its kind; a Job that a JobSet controls resolves to the JobSet."""
    kinds = (kind_named(kind_hint),) if kind_hint else KINDS
    custom = client.CustomObjectsApi(api)
    for kind in kinds:
        try:
            obj = cast(dict[str, Any], custom.get_namespaced_custom_object(kind.group, kind.version, namespace,
                                                                           kind.plural, name))
        except ApiException as exc:
            if exc.status == 404:
                continue
            raise
        owner = _controller(obj)
        if kind is JOB and owner and owner.get("kind") == JOBSET.kind and not kind_hint:
            return find_workload(api, namespace, str(owner.get("name")), JOBSET.kind)
        return kind, obj
    return None


def _controller(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


def workload_pods(api: client.ApiClient, kind: WorkloadKind, obj: Mapping[str, Any]) -> list[client.V1Pod]:
    """The workload's live pods (not terminating), by its well-known label and ownership."""
    meta = obj.get("metadata") or {}
    core = client.CoreV1Api(api)
    if kind is JOB:
        selector = f"batch.kubernetes.io/controller-uid={meta.get('uid')}"
    else:
        selector = f"{kind.job_label}={meta.get('name')}"
    pods = core.list_namespaced_pod(str(meta.get("namespace")), label_selector=selector).items
    return [p for p in pods if p.metadata and not p.metadata.deletion_timestamp]


# --- carrying out a plan --------------------------------------------------------------------------


def _suspend_resume(api: client.ApiClient, plan: RestartPlan, obj: Mapping[str, Any], timeout: float) -> None:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    rv = str((obj.get("metadata") or {}).get("resourceVersion"))
    if ANNOTATION_RESTART_IN_PROGRESS not in annotations:
        marker = annotation_patch(annotations, {ANNOTATION_RESTART_IN_PROGRESS: plan.summary})
        patch_workload(api, JOB, plan.namespace, plan.name,
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
        wait_for(lambda: _suspended_and_empty(api, plan.namespace, plan.name, seen), deadline - time.monotonic(),
                 f"Job {plan.namespace}/{plan.name}: the Job controller did not remove its pods")
        version = str(seen["metadata"].get("resourceVersion"))
        try:
            patch_workload(api, JOB, plan.namespace, plan.name, [*plan.template_ops, *record, *resume],
                           if_version=version)
            return
        except VersionChanged:  # the Job controller wrote its status after we looked: look again
            if time.monotonic() > deadline:
                raise TimeoutError(f"Job {plan.namespace}/{plan.name}: kept changing while suspended "
                                   f"within {timeout:.0f}s") from None
        except ApiException as exc:
            if exc.status != 422 or not plan.template_ops:
                raise
            # never leave the job suspended because the node affinity was refused
            patch_workload(api, JOB, plan.namespace, plan.name, [*done, *resume])
            raise WorkloadError(f"Job {plan.namespace}/{plan.name}: resumed without the node affinity, which the "
                                f"API server refused ({api_message(exc)[:300]}); the Job we wrote to: "
                                f"{_suspension_state(seen)}") from None


def _suspended_and_empty(api: client.ApiClient, namespace: str, name: str, seen: dict[str, Any]) -> bool:
    """Whether the Job is suspended with no active pods (its template may change); ``seen`` gets it."""
    job = cast(dict[str, Any], client.CustomObjectsApi(api).get_namespaced_custom_object(
        "batch", "v1", namespace, "jobs", name))
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


def _jobset_with_exclusion(api: client.ApiClient, plan: RestartPlan, obj: Mapping[str, Any],
                           params: Mapping[str, str], timeout: float, actor: str, details: dict[str, str],
                           adjust_child: AdjustChild | None = None) -> None:
    """Patch the JobSet's template and recreate its children; where the JobSet webhook refuses the
    template change (or a suspension of ours is to be finished), go through the child Jobs."""
    if ANNOTATION_RESTART_IN_PROGRESS not in ((obj.get("metadata") or {}).get("annotations") or {}):
        try:
            details["deleted"] = str(_patch_then_delete(api, plan, obj))
            return
        except ApiException as exc:
            if exc.status not in (400, 403, 422):
                raise
            details["template_refused"] = api_message(exc)[:300]
    details["mechanism"] = "suspend_patch_children"
    details["children_patched"] = str(suspend_and_patch_children(api, plan, obj, params, timeout, actor,
                                                                 adjust_child))
    what = "exclusion and placement preference are" if adjust_child else "exclusion is"
    details["note"] = f"{what} on the child Jobs: a JobSet-level restart recreates them from the template without it"


def _patch_then_delete(api: client.ApiClient, plan: RestartPlan, obj: Mapping[str, Any]) -> int:
    meta = obj.get("metadata") or {}
    rv, uid = str(meta.get("resourceVersion")), str(meta.get("uid"))
    ops = [*plan.template_ops, *plan.annotation_ops(meta.get("annotations") or {})]
    patch_workload(api, plan.kind, plan.namespace, plan.name, ops, if_version=rv)
    selector = f"{plan.kind.job_label}={plan.name}"
    deleted = 0
    if plan.kind is PYTORCHJOB:
        core = client.CoreV1Api(api)
        for pod in core.list_namespaced_pod(plan.namespace, label_selector=selector).items:
            name = _owned_live_name(pod, uid)
            if name:
                deleted += _evicted(core, name, plan.namespace)
    else:
        batch = client.BatchV1Api(api)
        body = client.V1DeleteOptions(propagation_policy="Foreground")
        for job in batch.list_namespaced_job(plan.namespace, label_selector=selector).items:
            name = _owned_live_name(job, uid)
            if name:
                deleted += _gone(batch.delete_namespaced_job, name, plan.namespace, body=body)
    return deleted


def _owned_live_name(obj: Any, uid: str) -> str:
    """The object's name if ``uid`` owns it and it is not being deleted already, else ``""``."""
    meta = obj.metadata
    if meta is None or meta.deletion_timestamp or not any(r.uid == uid for r in meta.owner_references or []):
        return ""
    return str(meta.name)


def _evicted(core: client.CoreV1Api, name: str, namespace: str) -> int:
    """Evict the pod (the API server deletes it, honouring PodDisruptionBudgets): 1 if this call
    evicted it, 0 if it was already gone; a refusal (429) fails the restart with the reason."""
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
    try:
        core.create_namespaced_pod_eviction(name, namespace, body)
        return 1
    except ApiException as exc:
        if exc.status == 404:
            return 0
        if exc.status == 429:
            raise WorkloadError(f"pod {namespace}/{name}: eviction refused ({api_message(exc)[:300]}); the "
                                f"restart stopped there (the replicas evicted before it are recreated)") from None
        raise


def _gone(delete: Callable[..., object], *args: Any, **kwargs: Any) -> int:
    """1 if this call deleted the object, 0 if it was already gone."""
    try:
        delete(*args, **kwargs)
        return 1
    except ApiException as exc:
        if exc.status == 404:
            return 0
        raise
