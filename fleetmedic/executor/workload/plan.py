"""What restarting a training workload means, decided from the workload's own manifest (pure).

No ``kubernetes`` import: values in (the workload as a JSON dict, the command's action and its
excluded nodes), a :class:`RestartPlan` out. :mod:`fleetmedic.executor.workload.apply` carries it out.

Kinds and how each is restarted (docs/workloads.md):

- ``Job`` (batch/v1, Indexed or not): suspend, wait for the Job controller to remove the pods,
  change the pod template's scheduling directives (allowed on a suspended Job), resume. The Job
  controller recreates every index at once; suspension does not count against ``backoffLimit``.
- ``PyTorchJob`` (kubeflow.org/v1) and ``JobSet`` (jobset.x-k8s.io/v1alpha2): patch the replica
  templates, then evict the pods (PyTorchJob) or delete the child Jobs (JobSet); the operator recreates
  them from the patched templates, as it does after a failure.

Node exclusion: a required node affinity term ``kubernetes.io/hostname NotIn [...]`` ANDed into
every ``nodeSelectorTerm`` of every pod template, added only where the pods would otherwise be
allowed onto a quarantined node (they tolerate the quarantine taint), unless the command's params
say ``anti_affinity: always`` or ``never``. ``retry_in_place`` adds a preferred affinity for the
nodes the pods ran on (and replaces fleetmedic's earlier preference), less the nodes the command
excludes: a retry is in place except on nodes fleetmedic suspects when it is due.

What fleetmedic did is recorded in annotations on the workload (the ``ANNOTATION_*`` keys of
:mod:`fleetmedic.k8s_keys`: last restart, attempts, last command, excluded and in-place nodes, restart
in progress), so a later command (or a person) can tell fleetmedic's changes from the owner's.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from fleetmedic.actions import JOB_ACTIONS
from fleetmedic.k8s_keys import (
    ANNOTATION_EXCLUDED_NODES,
    ANNOTATION_IN_PLACE_NODES,
    ANNOTATION_LAST_COMMAND,
    ANNOTATION_LAST_RESTART,
    ANNOTATION_RESTART_ATTEMPTS,
    TAINT_QUARANTINE,
)

HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
UNSCHEDULABLE_TAINT_KEY: Final = "node.kubernetes.io/unschedulable"
PREFERRED_WEIGHT: Final = 100

Mechanism = Literal["suspend_resume", "evict_pods", "delete_child_jobs"]


class WorkloadError(ValueError):
    """A command or workload that cannot be planned; the message names the field and the reason."""


@dataclass(frozen=True)
class WorkloadKind:
    kind: str
    group: str
    version: str
    plural: str
    mechanism: Mechanism
    job_label: str  # the label the pods carry with the workload's name

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


JOB = WorkloadKind("Job", "batch", "v1", "jobs", "suspend_resume", "batch.kubernetes.io/job-name")
PYTORCHJOB = WorkloadKind("PyTorchJob", "kubeflow.org", "v1", "pytorchjobs", "evict_pods",
                          "training.kubeflow.org/job-name")
JOBSET = WorkloadKind("JobSet", "jobset.x-k8s.io", "v1alpha2", "jobsets", "delete_child_jobs",
                      "jobset.sigs.k8s.io/jobset-name")
KINDS: Final[tuple[WorkloadKind, ...]] = (JOB, PYTORCHJOB, JOBSET)


def kind_named(name: str) -> WorkloadKind:
    """The kind for ``params["kind"]`` (``Job``, ``PyTorchJob``, ``JobSet``; case-insensitive)."""
    for k in KINDS:
        if name.lower() in (k.kind.lower(), k.plural, f"{k.plural}.{k.group}"):
            return k
    raise WorkloadError(f"params.kind: unknown workload kind {name!r} (known: {', '.join(k.kind for k in KINDS)})")


def parse_job_ref(job: str) -> tuple[str, str]:
    """``"namespace/name"`` -> ``(namespace, name)``."""
    namespace, sep, name = job.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise WorkloadError(f"job: expected 'namespace/name', got {job!r}")
    return namespace, name


# --- pod templates --------------------------------------------------------------------------------


def _pointer(*parts: str | int) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def pod_spec_paths(kind: WorkloadKind, obj: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(JSON pointer, pod spec) of every pod template in the workload."""
    spec = obj.get("spec") or {}
    out: list[tuple[str, dict[str, Any]]] = []
    if kind is JOB:
        out.append((_pointer("spec", "template", "spec"), (spec.get("template") or {}).get("spec") or {}))
    elif kind is PYTORCHJOB:
        for rtype, rspec in sorted((spec.get("pytorchReplicaSpecs") or {}).items()):
            pod = ((rspec or {}).get("template") or {}).get("spec") or {}
            out.append((_pointer("spec", "pytorchReplicaSpecs", rtype, "template", "spec"), pod))
    else:
        for i, rjob in enumerate(spec.get("replicatedJobs") or []):
            pod = (((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
            out.append((_pointer("spec", "replicatedJobs", i, "template", "spec", "template", "spec"), pod))
    if not out:
        raise WorkloadError(f"{kind.kind}: spec has no pod template")
    return out


def tolerates(tolerations: Sequence[Mapping[str, Any]], key: str, effect: str = "NoSchedule") -> bool:
    """Whether a pod with ``tolerations`` may be scheduled onto a node tainted ``key:effect``."""
    for t in tolerations:
        t_effect = t.get("effect") or ""
        if t_effect and t_effect != effect:
            continue
        t_key, op = t.get("key") or "", t.get("operator") or "Equal"
        if (not t_key and op == "Exists") or t_key == key:
            return True
    return False


def needs_node_exclusion(pod_spec: Mapping[str, Any], taint_key: str) -> bool:
    """The quarantine taint and the cordon do not keep these pods off a suspect node."""
    tol = pod_spec.get("tolerations") or []
    return tolerates(tol, taint_key) or tolerates(tol, UNSCHEDULABLE_TAINT_KEY)


def excluded_nodes(affinity: Mapping[str, Any] | None) -> set[str]:
    """Nodes every required node-affinity term keeps the pods off (``hostname NotIn``)."""
    terms = _required_terms(affinity)
    if not terms:
        return set()
    per_term = []
    for term in terms:
        nodes: set[str] = set()
        for e in term.get("matchExpressions") or []:
            if e.get("key") == HOSTNAME_LABEL and e.get("operator") == "NotIn":
                nodes |= set(e.get("values") or [])
        per_term.append(nodes)
    return set.intersection(*per_term)


def _required_terms(affinity: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    node_aff = (affinity or {}).get("nodeAffinity") or {}
    required = node_aff.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return list(required.get("nodeSelectorTerms") or [])


def with_node_exclusion(affinity: Mapping[str, Any] | None, nodes: Sequence[str]) -> dict[str, Any]:
    """``affinity`` with ``hostname NotIn nodes`` ANDed into every required term (terms are ORed,
    so each needs it); merges into fleetmedic's earlier NotIn expression instead of adding another."""
    out: dict[str, Any] = copy.deepcopy(dict(affinity or {}))
    node_aff = out.setdefault("nodeAffinity", {})
    required = node_aff.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    new_terms = []
    for term in terms:
        exprs = list(term.get("matchExpressions") or [])
        for i, e in enumerate(exprs):
            if e.get("key") == HOSTNAME_LABEL and e.get("operator") == "NotIn":
                values = sorted(set(e.get("values") or []) | set(nodes))
                exprs[i] = {**e, "values": values}
                break
        else:
            exprs.append({"key": HOSTNAME_LABEL, "operator": "NotIn", "values": sorted(set(nodes))})
        new_terms.append({**term, "matchExpressions": exprs})
    required["nodeSelectorTerms"] = new_terms
    return out


def without_node_exclusion(affinity: Mapping[str, Any] | None, nodes: Collection[str]) -> dict[str, Any]:
    """``affinity`` with ``nodes`` taken out of every required ``hostname NotIn`` (fleetmedic's own
    exclusions of nodes that are back in service); an expression, term or block left empty goes."""
    out: dict[str, Any] = copy.deepcopy(dict(affinity or {}))
    drop = set(nodes)
    node_aff = out.get("nodeAffinity") or {}
    required = node_aff.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    if not drop or not required.get("nodeSelectorTerms"):
        return out
    terms = []
    for term in required["nodeSelectorTerms"]:
        exprs = []
        for e in term.get("matchExpressions") or []:
            if e.get("key") == HOSTNAME_LABEL and e.get("operator") == "NotIn":
                values = [v for v in e.get("values") or [] if v not in drop]
                if not values:
                    continue
                e = {**e, "values": values}
            exprs.append(e)
        kept = {**term, "matchExpressions": exprs} if exprs else {k: v for k, v in term.items()
                                                                 if k != "matchExpressions"}
        if kept:
            terms.append(kept)
    if terms:
        required["nodeSelectorTerms"] = terms
    else:
        node_aff.pop("requiredDuringSchedulingIgnoredDuringExecution")
        if not node_aff:
            out.pop("nodeAffinity")
    return out


def with_preferred_nodes(affinity: Mapping[str, Any] | None, nodes: Sequence[str],
                         previous: Sequence[str] = ()) -> dict[str, Any]:
    """``affinity`` preferring ``nodes`` (weight 100), without fleetmedic's earlier preference for
    ``previous`` (recognised by its exact values); the owner's own preferences stay."""
    out: dict[str, Any] = copy.deepcopy(dict(affinity or {}))
    node_aff = out.setdefault("nodeAffinity", {})
    prefs = [p for p in node_aff.get("preferredDuringSchedulingIgnoredDuringExecution") or []
             if not (previous and _is_preference_for(p, previous))]
    if nodes:
        prefs.append({"weight": PREFERRED_WEIGHT, "preference": {"matchExpressions": [
            {"key": HOSTNAME_LABEL, "operator": "In", "values": sorted(set(nodes))}]}})
    if prefs:
        node_aff["preferredDuringSchedulingIgnoredDuringExecution"] = prefs
    else:
        node_aff.pop("preferredDuringSchedulingIgnoredDuringExecution", None)
    if not node_aff:
        out.pop("nodeAffinity")
    return out


def _is_preference_for(pref: Mapping[str, Any], nodes: Sequence[str]) -> bool:
    exprs = (pref.get("preference") or {}).get("matchExpressions") or []
    return (len(exprs) == 1 and exprs[0].get("key") == HOSTNAME_LABEL and exprs[0].get("operator") == "In"
            and sorted(exprs[0].get("values") or []) == sorted(set(nodes)))


# --- the plan -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RestartPlan:
    """What to do to one workload: ``template_ops`` (JSON-patch ops on the pod templates) and the
    annotations that record the restart."""

    kind: WorkloadKind
    namespace: str
    name: str
    action: str
    mechanism: Mechanism
    template_ops: list[dict[str, Any]] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    remove_annotations: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    preferred: tuple[str, ...] = ()
    attempt: int = 1
    summary: str = ""

    def annotation_ops(self, current: Mapping[str, str], remove: Sequence[str] = ()) -> list[dict[str, Any]]:
        """JSON-patch ops recording this restart on a workload whose annotations are ``current``."""
        return annotation_patch(current, self.annotations, remove=(*self.remove_annotations, *remove))

    def details(self) -> dict[str, str]:
        return {"kind": self.kind.kind, "mechanism": self.mechanism, "attempt": str(self.attempt),
                "excluded_nodes": ",".join(self.excluded), "preferred_nodes": ",".join(self.preferred),
                "template_changed": str(bool(self.template_ops)).lower()}


def _split(text: str | None) -> list[str]:
    return [n for n in (text or "").split(",") if n]


def finished(kind: WorkloadKind, obj: Mapping[str, Any]) -> str:
    """The reason the workload is already over (``""`` while it runs)."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    done = {"Complete", "Failed", "Succeeded", "Completed"}
    for c in conditions:
        if c.get("type") in done and c.get("status") == "True":
            return f"{kind.kind} has finished ({c.get('type')})"
    return ""


def plan_restart(kind: WorkloadKind, obj: Mapping[str, Any], *, action: str, exclude_nodes: Sequence[str],
                 current_nodes: Sequence[str], params: Mapping[str, str], now: float, actor: str) -> RestartPlan:
    """The restart of ``obj`` that ``action`` asks for. ``current_nodes``: where its pods run now."""
    if action not in JOB_ACTIONS:
        raise WorkloadError(f"action: {action!r} is not a workload action ({', '.join(sorted(JOB_ACTIONS))})")
    meta = obj.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    mode = params.get("anti_affinity", "auto")
    if mode not in ("auto", "always", "never"):
        raise WorkloadError(f"params.anti_affinity: {mode!r} is not one of auto, always, never")
    taint_key = params.get("taint_key", TAINT_QUARANTINE)
    exclude = sorted({n for n in exclude_nodes if n})
    previous_pref = _split(annotations.get(ANNOTATION_IN_PLACE_NODES))
    preferred = sorted(set(current_nodes) - set(exclude)) if action == "retry_in_place" else []

    template_ops: list[dict[str, Any]] = []
    all_excluded: set[str] = set(_split(annotations.get(ANNOTATION_EXCLUDED_NODES)))
    for pointer, pod_spec in pod_spec_paths(kind, obj):
        before = pod_spec.get("affinity")
        after: dict[str, Any] = copy.deepcopy(before) if before else {}
        wants_exclusion = mode == "always" or (mode == "auto" and needs_node_exclusion(pod_spec, taint_key))
        if exclude and wants_exclusion:
            after = with_node_exclusion(after, exclude)
            all_excluded |= set(exclude)
        if preferred or previous_pref:
            after = with_preferred_nodes(after, preferred, previous_pref)
        if after != (before or {}):
            template_ops.append({"op": "add", "path": pointer + "/affinity", "value": after})

    attempt = _int(annotations.get(ANNOTATION_RESTART_ATTEMPTS)) + 1
    stamp = dt.datetime.fromtimestamp(now, tz=dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    record = {"at": stamp, "action": action, "by": actor, "command": params.get("command_id", ""),
              "exclude": exclude, "attempt": attempt}
    new_annotations = {ANNOTATION_LAST_RESTART: json.dumps(record, separators=(",", ":"), sort_keys=True),
                       ANNOTATION_RESTART_ATTEMPTS: str(attempt)}
    if params.get("command_id"):  # the executor passes the command's id here
        new_annotations[ANNOTATION_LAST_COMMAND] = params["command_id"]
    if all_excluded:
        new_annotations[ANNOTATION_EXCLUDED_NODES] = ",".join(sorted(all_excluded))
    if preferred:
        new_annotations[ANNOTATION_IN_PLACE_NODES] = ",".join(preferred)
    remove = () if preferred else (ANNOTATION_IN_PLACE_NODES,)
    changed = bool(template_ops)
    verb = {"restart_job": "re-place", "requeue_job": "requeue", "retry_in_place": "restart in place"}[action]
    how = {"suspend_resume": "suspend, {t}resume", "evict_pods": "{t}evict its pods for the operator to recreate",
           "delete_child_jobs": "{t}delete its child Jobs for the JobSet controller to recreate"}[kind.mechanism]
    what = ("set node affinity (" + _affinity_words(exclude if changed else [], preferred) + "), ") if changed else ""
    summary = f"{verb} {kind.kind} {namespace}/{name} (attempt {attempt}): " + how.format(t=what)
    return RestartPlan(kind, namespace, name, action, kind.mechanism, template_ops, new_annotations, remove,
                       tuple(sorted(all_excluded)), tuple(preferred), attempt, summary)


def _affinity_words(exclude: Sequence[str], preferred: Sequence[str]) -> str:
    parts = []
    if exclude:
        parts.append("not on " + ", ".join(exclude))
    if preferred:
        parts.append("prefer " + ", ".join(preferred))
    return "; ".join(parts) or "drop fleetmedic's earlier preference"


def annotation_patch(current: Mapping[str, str], new: Mapping[str, str],
                     remove: Sequence[str] = ()) -> list[dict[str, Any]]:
    """JSON-patch ops setting ``new`` and removing ``remove`` among ``metadata.annotations``."""
    if not current:
        values = {k: v for k, v in new.items() if k not in remove}
        return [{"op": "add", "path": "/metadata/annotations", "value": values}] if values else []
    ops: list[dict[str, Any]] = [
        {"op": "add", "path": _pointer("metadata", "annotations", k), "value": v} for k, v in new.items()]
    ops += [{"op": "remove", "path": _pointer("metadata", "annotations", k)} for k in remove if k in current]
    return ops


def _int(text: str | None) -> int:
    try:
        return max(0, int(text or 0))
    except ValueError:
        return 0
