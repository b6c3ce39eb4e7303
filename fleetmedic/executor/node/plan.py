"""What a remediation command means for a node: the pure half of the executor (decide, then act).

Nothing here talks to a cluster. Functions take what the node (or its pods, or a Job) looks like
now as plain values and return what to change and what to report; :mod:`.apply` applies it.

**Annotations** (the executor's durable state, on the Node; job-track commands use the same keys on
the ledger ConfigMap; the keys live in :mod:`fleetmedic.k8s_keys`):

- ``fleetmedic.io/commands`` (``ANNOTATION_COMMANDS``): ``{command id: expires_at}`` of commands
  applied here. A command seen again (a second replica, a restart re-reading the topic) is
  ``skipped`` as a duplicate. Entries are dropped once expired: an expired command is refused anyway.
- ``fleetmedic.io/inflight`` (``ANNOTATION_INFLIGHT``): the long command (drain, diagnostics, hook) in
  progress, as JSON, so a restarted executor resumes it when the command is delivered again.
- ``fleetmedic.io/cordoned-by`` / ``fleetmedic.io/tainted-by`` (``ANNOTATION_CORDONED_BY`` /
  ``ANNOTATION_TAINTED_BY``): fleetmedic made this cordon / taint. Only these are ever lifted: a
  cordon or a taint someone else made stays.
- ``fleetmedic.io/drain`` (``ANNOTATION_DRAIN``): drain progress (command, start, evicted pods, state).
- ``fleetmedic.io/diagnostics`` (``ANNOTATION_DIAGNOSTICS``): the diagnostics Job and its verdict
  (``running``, ``pass``, ``fail``); ``return_to_service`` by fleetmedic is refused unless it says ``pass``.
- ``fleetmedic.io/reason`` (``ANNOTATION_REASON``): why fleetmedic last changed the node;
  ``fleetmedic.io/escalation`` (``ANNOTATION_ESCALATION``): the last escalation.

The node condition ``FleetmedicQuarantine`` (``CONDITION_QUARANTINE``) and a core/v1 Event explain
every change in ``kubectl describe node``.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fleetmedic.config import ExecutorSettings
from fleetmedic.executor.node.conditions import Condition, isolated, returned
from fleetmedic.k8s_keys import (
    ANNOTATION_COMMANDS,
    ANNOTATION_CORDONED_BY,
    ANNOTATION_DIAGNOSTICS,
    ANNOTATION_DRAIN,
    ANNOTATION_ESCALATION,
    ANNOTATION_INFLIGHT,
    ANNOTATION_REASON,
    ANNOTATION_TAINTED_BY,
    CONDITION_QUARANTINE,
)
from fleetmedic.records import Outcome, RemediationCommand, RemediationResult
from fleetmedic.signing import (
    CommandExpired,
    KeySet,
    SignatureError,
    as_command_keys,
    check_key,
    check_times,
    verify_unheaded,
)

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
ACTOR = "fleetmedic"
TAINT_VALUE = "true"
MAX_REMEMBERED = 200

EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


# --- values ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class NodeView:
    """What the executor needs to know about a Node."""

    name: str
    uid: str = ""
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    resource_version: str = ""
    gpus: int = 0
    conditions: Mapping[str, str] = field(default_factory=dict)  # type -> status


@dataclass(frozen=True)
class Note:
    """A core/v1 Event on the Node."""

    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True)
class NodePlan:
    """The change to make to one Node and what to report. ``None`` / empty: leave it as it is."""

    outcome: Outcome
    reason: str = ""
    details: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool | None = None
    taints: tuple[Taint, ...] | None = None
    labels: Mapping[str, str | None] = field(default_factory=dict)
    annotations: Mapping[str, str | None] = field(default_factory=dict)
    condition: Condition | None = None
    event: Note | None = None
    #: the per-class conditions to write (:mod:`.conditions`): (type, condition)
    class_conditions: tuple[tuple[str, Condition], ...] = ()

    def changes(self) -> list[str]:
        """Human-readable list of the changes (what a dry run reports)."""
        out = []
        if self.unschedulable is not None:
            out.append("cordon" if self.unschedulable else "uncordon")
        if self.taints is not None:
            out.append("set taints to [" + ", ".join(f"{t.key}={t.value}:{t.effect}" for t in self.taints) + "]")
        out += [f"label {k}={v}" if v is not None else f"remove label {k}" for k, v in self.labels.items()]
        out += [f"annotate {k}" if v is not None else f"remove annotation {k}" for k, v in self.annotations.items()
                if k != ANNOTATION_COMMANDS]
        if self.condition is not None:
            out.append(f"condition {CONDITION_QUARANTINE}={self.condition.status} ({self.condition.reason})")
        out += [f"condition {t}={c.status} ({c.reason})" for t, c in self.class_conditions]
        if self.event is not None:
            out.append(f"event {self.event.reason}")
        return out


def merge_patch(plan: NodePlan, node: NodeView) -> dict[str, Any]:
    """The JSON merge patch for ``plan``, guarded by the node's resourceVersion (409 if it moved)."""
    meta: dict[str, Any] = {}
    if node.resource_version:
        meta["resourceVersion"] = node.resource_version
    if plan.labels:
        meta["labels"] = dict(plan.labels)
    if plan.annotations:
        meta["annotations"] = dict(plan.annotations)
    patch: dict[str, Any] = {"metadata": meta}
    spec: dict[str, Any] = {}
    if plan.unschedulable is not None:
        spec["unschedulable"] = plan.unschedulable or None
    if plan.taints is not None:
        spec["taints"] = [{"key": t.key, "value": t.value, "effect": t.effect} for t in plan.taints]
    if spec:
        patch["spec"] = spec
    return patch


# --- screening and idempotency -------------------------------------------------------------------


def reject_reason(cmd: RemediationCommand, keys: KeySet | bytes, now: float, *, max_future_skew_s: float,
                  allow_demo: bool = False, verified_by_header: bool = False) -> str | None:
    """Why the command must not be acted on (bad signature, an unusable key, expired or issued
    more than ``max_future_skew_s``, the configured ``streams.max_future_skew_s``, ahead of ``now``),
    or ``None``. ``keys`` are the command keys by id (one bare key: the id
    :data:`~fleetmedic.signing.DEFAULT_COMMAND_KEY_ID`): a command signed with an operator key never
    passes. ``verified_by_header``: the record's signature header was verified over the bytes
    received with the key its id names (:func:`~fleetmedic.signing.verify_bytes`); then the in-body
    signature is not consulted (the migration in :mod:`fleetmedic.signing`), the times still are.
    Otherwise the in-body signature is verified with the key of the default id
    (:func:`~fleetmedic.signing.verify_unheaded`)."""
    ring = as_command_keys(keys)
    try:
        if verified_by_header:
            for kid, key in ring.keys.items():
                check_key(key, allow_demo=allow_demo, what=f"command key {kid!r}")
            check_times(cmd, now, max_future_skew_s)
        else:
            verify_unheaded(cmd, ring, now, max_future_skew_s=max_future_skew_s, allow_demo=allow_demo)
    except SignatureError as exc:
        return f"signature rejected: {exc}"
    except CommandExpired as exc:
        return f"expired before it could be applied: {exc}"
    return None


def applied_ids(annotations: Mapping[str, str]) -> dict[str, float]:
    raw = annotations.get(ANNOTATION_COMMANDS, "")
    try:
        doc = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return {str(k): float(v) for k, v in doc.items()} if isinstance(doc, dict) else {}


def remember(annotations: Mapping[str, str], cmd: RemediationCommand, now: float) -> str:
    """The ``fleetmedic.io/commands`` (``ANNOTATION_COMMANDS``) value with ``cmd`` added and expired ids dropped."""
    ids = {k: v for k, v in applied_ids(annotations).items() if v >= now}
    ids[cmd.id] = cmd.expires_at
    newest = sorted(ids.items(), key=lambda kv: kv[1])[-MAX_REMEMBERED:]
    return json.dumps(dict(newest), separators=(",", ":"), sort_keys=True)


def inflight(annotations: Mapping[str, str]) -> dict[str, Any]:
    return annotation_json(annotations.get(ANNOTATION_INFLIGHT, ""))


Screen = Literal["act", "resume", "duplicate"]


def screen(cmd: RemediationCommand, annotations: Mapping[str, str]) -> Screen:
    """Duplicate (applied before, by any executor), resume (a long action of this id in progress) or act."""
    if cmd.id in applied_ids(annotations):
        return "duplicate"
    if inflight(annotations).get("id") == cmd.id:
        return "resume"
    return "act"


def result_of(cmd: RemediationCommand, outcome: Outcome, now: float, executor: str, reason: str = "",
              details: Mapping[str, str] | None = None, dry_run: bool = False) -> RemediationResult:
    return RemediationResult(command_id=cmd.id, action=cmd.action, outcome=outcome, ts=now, reason=reason[:4096],
                             node=cmd.node, job=cmd.job, executor=executor, dry_run=dry_run or cmd.dry_run,
                             details=dict(details or {}))


def opted_out(node: NodeView, opt_out_label: str) -> bool:
    return node.labels.get(opt_out_label, "").lower() in ("true", "1", "yes")


# --- quick node actions ---------------------------------------------------------------------------


def plan_node_action(cmd: RemediationCommand, node: NodeView, cfg: ExecutorSettings, now: float) -> NodePlan:
    """cordon, uncordon, taint, untaint, label, return_to_service, escalate (without a hook)."""
    planner = _PLANNERS.get(cmd.action)
    if planner is None:
        return NodePlan("failed", f"{cmd.action} is not a quick node action")
    plan = planner(cmd, node, cfg)
    if plan.outcome == "failed" or not (plan.unschedulable is not None or plan.taints is not None or plan.labels
                                        or plan.annotations or plan.condition):
        return plan
    if cmd.action in ("cordon", "taint"):  # why the node is isolated, per class (conditions.py)
        cls = isolated(cmd)
        plan = _with(plan, class_conditions=(cls,) if cls else ())
    elif cmd.action == "return_to_service" and plan.outcome == "applied":
        plan = _with(plan, class_conditions=returned(node.conditions, plan.condition.message
                                                     if plan.condition else cmd.reason))
    ann = dict(plan.annotations)
    ann[ANNOTATION_REASON] = f"{cmd.action}: {cmd.reason}"[:1024]
    return _with(plan, annotations=ann)


def _with(plan: NodePlan, **changes: Any) -> NodePlan:
    from dataclasses import replace

    return replace(plan, **changes)


def _quarantine_condition(cmd: RemediationCommand, why: str) -> Condition:
    return Condition("True", why, f"fleetmedic {cmd.action} (incident {cmd.incident_id or '-'}): {cmd.reason}"[:1024])


def _cordon(cmd: RemediationCommand, node: NodeView, cfg: ExecutorSettings) -> NodePlan:
    labels = {cfg.lifecycle_label: "quarantined"}
    cond = _quarantine_condition(cmd, "Cordoned")
    if node.unschedulable:
        if ANNOTATION_CORDONED_BY in node.annotations:
            return NodePlan("applied", "already cordoned by fleetmedic", labels=labels, condition=cond)
        return NodePlan("applied", "already cordoned by someone else: fleetmedic will not uncordon it",
                        {"already_cordoned": "true"}, labels=labels, condition=cond,
                        event=Note("FleetmedicCordonExisting", f"node already cordoned (not by fleetmedic); "
                                   f"{cmd.action} for: {cmd.reason}", warning=True))
    return NodePlan("applied", details={"already_cordoned": "false"}, unschedulable=True, labels=labels,
                    annotations={ANNOTATION_CORDONED_BY: ACTOR}, condition=cond,
                    event=Note("FleetmedicCordoned", f"cordoned by fleetmedic (incident {cmd.incident_id}): "
                               f"{cmd.reason}", warning=True))


def _uncordon(cmd: RemediationCommand, node: NodeView, cfg: ExecutorSettings) -> NodePlan:
    if ANNOTATION_CORDONED_BY not in node.annotations:
        why = "cordon not made by fleetmedic: left in place" if node.unschedulable else "node is not cordoned"
        return NodePlan("skipped", why)
    return NodePlan("applied", unschedulable=False, annotations={ANNOTATION_CORDONED_BY: None},
                    event=Note("FleetmedicUncordoned", f"uncordoned by fleetmedic: {cmd.reason}"))


def _taint(cmd: RemediationCommand, node: NodeView, cfg: ExecutorSettings) -> NodePlan:
    effect = cmd.params.get("effect", cfg.taint_effect)
    if effect not in EFFECTS:
        return NodePlan("failed", f"params.effect: must be one of {', '.join(EFFECTS)}, got {effect!r}")
    labels = {cfg.lifecycle_label: "quarantined"}
    cond = _quarantine_condition(cmd, "Tainted")
    ours = [t for t in node.taints if t.key == cfg.taint_key]
    if ours and ANNOTATION_TAINTED_BY not in node.annotations:
        return NodePlan("applied", f"taint {cfg.taint_key} already present (not fleetmedic's): left as it is",
                        {"already_tainted": "true"}, labels=labels, condition=cond)
    if any(t.effect == effect for t in ours):
        return NodePlan("applied", f"already tainted {cfg.taint_key}:{effect} by fleetmedic", labels=labels,
                        condition=cond)
    others = tuple(t for t in node.taints if t.key != cfg.taint_key)
    return NodePlan("applied", details={"taint": f"{cfg.taint_key}={TAINT_VALUE}:{effect}"},
                    taints=(*others, Taint(cfg.taint_key, TAINT_VALUE, effect)), labels=labels,
                    annotations={ANNOTATION_TAINTED_BY: effect}, condition=cond,
                    event=Note("FleetmedicTainted", f"tainted {cfg.taint_key}:{effect} by fleetmedic "
                               f"(incident {cmd.incident_id}): {cmd.reason}", warning=True))


def _untaint(cmd: RemediationCommand, node: NodeView, cfg: ExecutorSettings) -> NodePlan:
    if ANNOTATION_TAINTED_BY not in node.annotations:
        present = any(t.key == cfg.taint_key for t in node.taints)
        return NodePlan("skipped", "taint not made by fleetmedic: left in place" if present else "node not tainted")
    return NodePlan("applied", taints=tuple(t for t in node.taints if t.key != cfg.taint_key),
                    annotations={ANNOTATION_TAINTED_BY: None},
                    event=Note("FleetmedicUntainted", f"taint {cfg.taint_key} removed by fleetmedic: {cmd.reason}"))


def _label(cmd: RemediationCommand, node: NodeView, cfg: ExecutorSettings) -> NodePlan:
    value = cmd.params.get("state") or cmd.params.get("value") or "suspect"
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        return NodePlan("failed", f"params.state: not a valid label value: {value!r}")
    return NodePlan("applied", labels={cfg.lifecycle_label: value},
                    event=Note("FleetmedicLabelled", f"{cfg.lifecycle_label}={value}: {cmd.reason}"))


def _return_to_service(cmd: RemediationCommand, node: NodeView, cfg: ExecutorSettings) -> NodePlan:
    actor = cmd.params.get("actor", ACTOR)
    diag = annotation_json(node.annotations.get(ANNOTATION_DIAGNOSTICS, ""))
    if actor == ACTOR and diag.get("verdict") != "pass":
        seen = f"diagnostics {diag.get('verdict')}" if diag else "no diagnostics recorded on the node"
        return NodePlan("failed", f"refused: return to service needs passing diagnostics ({seen}); "
                                  "an operator clear (params.actor) overrides")
    if inflight(node.annotations):
        return NodePlan("failed", f"node busy: {inflight(node.annotations).get('action')} in progress")
    unschedulable: bool | None = None
    taints: tuple[Taint, ...] | None = None
    ann: dict[str, str | None] = {ANNOTATION_DRAIN: None, ANNOTATION_DIAGNOSTICS: None, ANNOTATION_ESCALATION: None}
    kept = []
    if cmd.params.get("untaint", "true") != "false" and ANNOTATION_TAINTED_BY in node.annotations:
        taints = tuple(t for t in node.taints if t.key != cfg.taint_key)
        ann[ANNOTATION_TAINTED_BY] = None
    elif any(t.key == cfg.taint_key for t in node.taints):
        kept.append("taint (not fleetmedic's)")
    if cmd.params.get("uncordon", "true") != "false" and ANNOTATION_CORDONED_BY in node.annotations:
        unschedulable = False
        ann[ANNOTATION_CORDONED_BY] = None
    elif node.unschedulable:
        kept.append("cordon (not fleetmedic's)")
    note = f"returned to service by fleetmedic ({actor}): {cmd.reason}" + (f"; kept {', '.join(kept)}" if kept else "")
    return NodePlan("applied", "; ".join(f"kept {k}" for k in kept), {"kept": ",".join(kept)} if kept else {},
                    unschedulable=unschedulable, taints=taints, labels={cfg.lifecycle_label: None}, annotations=ann,
                    condition=Condition("False", "ReturnedToService", note[:1024]),
                    event=Note("FleetmedicReturnedToService", note))


def _escalate(cmd: RemediationCommand, node: NodeView, cfg: ExecutorSettings) -> NodePlan:
    what = cmd.params.get("escalation", "notify")
    return NodePlan("skipped", f"no escalate hook configured (executor.action_hooks): escalation '{what}' "
                               "recorded on the node (annotation and Event) for a human",
                    annotations={ANNOTATION_ESCALATION: json.dumps({"command": cmd.id, "escalation": what,
                                                            "reason": cmd.reason[:512]})},
                    event=Note("FleetmedicEscalated", f"escalated ({what}): {cmd.reason}", warning=True))


_PLANNERS = {"cordon": _cordon, "uncordon": _uncordon, "taint": _taint, "untaint": _untaint, "label": _label,
             "return_to_service": _return_to_service, "escalate": _escalate}


def no_hook_plan(cmd: RemediationCommand) -> NodePlan:
    """reset_gpu / reboot_node without a hook: nothing can do it here; say so on the node."""
    return NodePlan("skipped", f"no {cmd.action} hook configured (executor.action_hooks): nothing was done to the "
                               "node; recorded as an Event for a human",
                    event=Note(f"Fleetmedic{camel(cmd.action)}Requested",
                               f"{cmd.action} requested ({cmd.reason}) but no hook is configured", warning=True))


def camel(action: str) -> str:
    return "".join(p.capitalize() for p in action.split("_"))


def annotation_json(raw: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
