"""Kubernetes node conditions -> findings, by the rules of the config's ``conditions`` section (pure:
Node objects as dicts in, :class:`~fleetmedic.records.Finding` records out).

Teams that already run node-problem-detector or NVSentinel keep them: the conditions those tools
write on a Node (``KernelDeadlock``, ``ReadonlyFilesystem``; ``SysLogsXIDError``, ``GpuMemWatch``,
...) and the kubelet's own (``Ready`` ``False``/``Unknown``, the pressure conditions) reach the
decision stage as findings, and fleetmedic's triage, safety and recovery act on them.

:class:`ConditionTracker` is fed the Node watch's events and keeps, per node, each condition's
``(status, reason)``. Only a change makes a finding: a condition seen for the first time (the
initial list, or a new condition) or one whose status or reason changed, when the new state matches
a rule (first match wins). The kubelet's heartbeats, a message that changes alone, and every other
watch event make nothing. A condition that goes back to a state no rule names makes a ``telemetry``
finding (metric ``cleared:<type>``) when a ``definitive`` or ``uncertain`` rule had named it, and
nothing otherwise: a node fleetmedic isolated for such a condition returns only once its diagnostics
passed and the condition cleared (diagnostics test GPUs, not filesystems).

The finding (detector ``node_condition``): ``kind`` ``hard_fault`` for ``definitive`` and
``uncertain`` rules, ``degradation`` for ``preventive`` ones, ``telemetry`` for severity ``info``
(recorded, no incident); ``action_hint`` ``isolate`` for a critical hard fault, else
``investigate``; the evidence's ``metric`` is ``<kind>:<condition type>`` (what triage reads as the
isolation's kind and signature, :func:`~fleetmedic.remediation.triage.records.finding_isolation`),
its ``port`` the rule's component, its ``note`` ``type=status (reason): message``. The finding's time
is when the watch saw the change; its id carries the condition's ``lastTransitionTime``: a
restarted watcher that lists the same condition again makes the same finding id, which the
decision stage has seen.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from fleetmedic.config import ConditionRule, Settings
from fleetmedic.records import Evidence, Finding, FindingKind

DETECTOR: Final = "node_condition"
MAX_TEXT: Final = 1024
#: The fields of a Node the tracker reads (a ``fleetmedic.kube_watch.Fields`` tree)
CONDITION_FIELDS: Final[dict[str, Any]] = {
    "metadata": {"name": True},
    "status": {"conditions": [{"type": True, "status": True, "reason": True, "message": True,
                               "lastTransitionTime": True}]},
}


@dataclass(frozen=True)
class _Rule:
    rule: ConditionRule
    reason: re.Pattern[str] | None

    def matches(self, ctype: str, status: str, reason: str) -> bool:
        return (self.rule.type == ctype and self.rule.status == status
                and (self.reason is None or self.reason.search(reason) is not None))


class ConditionTracker:
    """Node watch events in; a finding per condition that changed into a state a rule names."""

    def __init__(self, rules: Sequence[ConditionRule]) -> None:
        self.rules = [_Rule(r, re.compile(r.reason_regex) if r.reason_regex else None) for r in rules]
        self.types = frozenset(r.type for r in rules)
        self.nodes: dict[str, dict[str, tuple[str, str]]] = {}  # node -> type -> (status, reason)
        self.hard: dict[str, set[str]] = {}  # node -> condition types last in a state a hard rule names

    @classmethod
    def of(cls, settings: Settings) -> ConditionTracker:
        return cls(settings.conditions.rules if settings.conditions.enabled else [])

    def observe(self, etype: str, obj: Any, now: float) -> list[Finding]:
        """One watch event (``ADDED``, ``MODIFIED``, ``DELETED``) of a Node; a malformed object
        makes nothing (the node tracker counts it)."""
        if not self.rules or not isinstance(obj, Mapping):
            return []
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not isinstance(name, str) or not name:
            return []
        if etype == "DELETED":
            self.forget(name)
            return []
        status = obj.get("status")
        conditions = status.get("conditions") if isinstance(status, Mapping) else None
        if not isinstance(conditions, list):
            return []
        known = self.nodes.setdefault(name, {})
        out: list[Finding] = []
        for cond in conditions:
            if not isinstance(cond, Mapping):
                continue
            ctype, cstatus = cond.get("type"), cond.get("status")
            if not isinstance(ctype, str) or ctype not in self.types or not isinstance(cstatus, str):
                continue
            reason = str(cond.get("reason") or "")[:MAX_TEXT]
            state = (cstatus, reason)
            if known.get(ctype) == state:
                continue
            known[ctype] = state
            rule = next((r.rule for r in self.rules if r.matches(ctype, cstatus, reason)), None)
            held = self.hard.setdefault(name, set())
            if rule is not None:
                out.append(_finding(name, rule, cond, reason, now))
                if rule.kind != "preventive" and rule.severity != "info":
                    held.add(ctype)
            elif ctype in held:
                held.discard(ctype)
                out.append(_cleared(name, ctype, cond, reason, now))
        return out

    def forget(self, node: str) -> None:
        self.nodes.pop(node, None)
        self.hard.pop(node, None)


def _cleared(node: str, ctype: str, cond: Mapping[str, Any], reason: str, now: float) -> Finding:
    """A condition a hard rule named went back to a state no rule names: recorded (``telemetry``),
    no incident; a node isolated for it may return."""
    state = f"{ctype}={cond.get('status')}" + (f" ({reason})" if reason else "")
    since = str(cond.get("lastTransitionTime") or "")
    evidence = Evidence(detector=DETECTOR, metric=f"cleared:{ctype}", ts=now, note=state[:4000])
    return Finding(id=f"{node}:{DETECTOR}:{ctype}:cleared:{since or f'{now:.3f}'}"[:512], ts=now, node=node,
                   detector=DETECTOR, kind="telemetry", severity="info",
                   summary=f"node condition {state}: cleared"[:4096], evidence=[evidence])


def _finding(node: str, rule: ConditionRule, cond: Mapping[str, Any], reason: str, now: float) -> Finding:
    message = " ".join(str(cond.get("message") or "").split())[:MAX_TEXT]
    since = str(cond.get("lastTransitionTime") or "")
    ts = now  # when the watch saw it (a condition listed at start may have changed long ago)
    kind: FindingKind = ("telemetry" if rule.severity == "info"
                         else "degradation" if rule.kind == "preventive" else "hard_fault")
    hint = "isolate" if kind == "hard_fault" and rule.severity == "critical" else "investigate"
    state = f"{rule.type}={cond.get('status')}" + (f" ({reason})" if reason else "")
    note = f"{state}: {message}" if message else state
    evidence = Evidence(detector=DETECTOR, metric=f"{rule.kind}:{rule.type}", port=rule.component, ts=ts,
                        note=note[:4000])
    return Finding(id=f"{node}:{DETECTOR}:{rule.type}:{cond.get('status')}:{since or f'{now:.3f}'}"[:512], ts=ts,
                   node=node, detector=DETECTOR, kind=kind, severity=rule.severity,
                   summary=f"node condition {state} ({rule.component})"[:4096], evidence=[evidence],
                   action_hint=hint)

