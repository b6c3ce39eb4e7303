"""Node exclusion for a JobSet whose template the API server will not change.

The JobSet validating webhook keeps ``spec.replicatedJobs`` immutable; only while the JobSet is
(being) suspended may the pod templates' labels, annotations, nodeSelector, tolerations and
scheduling gates change, for Kueue. Node affinity is not among them. So when the webhook refuses
the template patch, :func:`suspend_and_patch_children` takes the route the controller leaves
open: suspend the JobSet (the controller suspends its child Jobs, the Job controller removes their
pods), put the node affinity on each suspended child Job (batch/v1 allows scheduling directives of
a suspended Job to change), resume the JobSet. With the placement step the same child patch also
carries the preferred node affinity toward the surviving ranks' domain and the standby
tolerations. On resume the controller merges only the fields above into the children (labels,
annotations and nodeSelector as maps, tolerations as a union), so their affinity and tolerations
stay and the recreated pods honour them. A later JobSet-level restart (its failure policy
recreates the children from the template) drops the affinity, exclusion and preference alike: the
result says so, and the quarantine taint still applies to pods that do not tolerate it.

Crash-safe like the batch Job path: the JobSet carries ``fleetmedic.io/restart-in-progress``
(``ANNOTATION_RESTART_IN_PROGRESS``) while suspended by fleetmedic, and the next call finishes the job.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from fleetmedic.executor.cluster import WorkloadCluster
from fleetmedic.executor.workload.api import Placement, patch_workload, wait_for
from fleetmedic.executor.workload.plan import (
    JOB,
    JOBSET,
    RestartPlan,
    annotation_patch,
    plan_restart,
)
from fleetmedic.k8s_keys import ANNOTATION_RESTART_IN_PROGRESS


def suspend_and_patch_children(cluster: WorkloadCluster, plan: RestartPlan, obj: Mapping[str, Any],
                               params: Mapping[str, str], timeout: float, actor: str,
                               placement: Placement | None = None) -> int:
    """Suspend, patch the child Jobs' node affinity, resume; returns how many children were patched.
    ``placement`` (the placement step, :mod:`.placement_apply`) turns each child's own exclusion
    ops into the ops that also carry the preference and tolerations: one patch."""
    meta = obj.get("metadata") or {}
    annotations: dict[str, str] = dict(meta.get("annotations") or {})
    if ANNOTATION_RESTART_IN_PROGRESS not in annotations:
        marker = annotation_patch(annotations, {ANNOTATION_RESTART_IN_PROGRESS: plan.summary})
        patch_workload(cluster, JOBSET, plan.namespace, plan.name,
                       [{"op": "add", "path": "/spec/suspend", "value": True}, *marker],
                       if_version=str(meta.get("resourceVersion")))
        annotations[ANNOTATION_RESTART_IN_PROGRESS] = plan.summary
    uid = str(meta.get("uid"))
    wait_for(lambda: all_suspended(_children(cluster, plan, uid)), timeout,
             f"JobSet {plan.namespace}/{plan.name}: its child Jobs were not suspended")
    patched = patch_children(cluster, plan, uid, params, actor, placement)
    resume = [{"op": "add", "path": "/spec/suspend", "value": False},
              *plan.annotation_ops(annotations, remove=[ANNOTATION_RESTART_IN_PROGRESS])]
    patch_workload(cluster, JOBSET, plan.namespace, plan.name, resume)
    return patched


def patch_children(cluster: WorkloadCluster, plan: RestartPlan, uid: str, params: Mapping[str, str], actor: str,
                   placement: Placement | None) -> int:
    """Write each suspended child Job's plan (its exclusion; through ``placement`` also the
    placement) in one patch per child; returns how many children were patched."""
    patched = 0
    for child in _children(cluster, plan, uid):
        child_plan = plan_restart(JOB, child, action=plan.action, exclude_nodes=plan.excluded,
                                  current_nodes=plan.preferred, params=params, now=time.time(), actor=actor)
        ops = placement.child_ops(child, child_plan.template_ops) if placement else child_plan.template_ops
        if ops:
            patch_workload(cluster, JOB, plan.namespace, str(child["metadata"]["name"]), ops)
            patched += 1
    return patched


def _children(cluster: WorkloadCluster, plan: RestartPlan, uid: str) -> list[dict[str, Any]]:
    return child_jobs(cluster, plan.namespace, plan.name, uid)


def child_jobs(cluster: WorkloadCluster, namespace: str, name: str, uid: str) -> list[dict[str, Any]]:
    """The JobSet's live child Jobs (owned by ``uid``, not being deleted), as JSON dicts."""
    listed = cluster.list_objects(JOB, namespace, f"{JOBSET.job_label}={name}")
    return [j for j in listed
            if not j["metadata"].get("deletionTimestamp")
            and any(r.get("uid") == uid for r in j["metadata"].get("ownerReferences") or [])]


def all_suspended(children: list[dict[str, Any]]) -> bool:
    """Every child Job is suspended, has no active pod, and its start time is cleared (so batch/v1
    lets its pod template's scheduling directives change)."""
    return bool(children) and all(
        (j.get("spec") or {}).get("suspend") and not (j.get("status") or {}).get("active")
        and not (j.get("status") or {}).get("startTime") for j in children)
