"""The node track: what fleetmedic does to nodes. Each node's lifecycle record; isolation passes the
safety gate (the breaker, the budgets) before the lifecycle plan starts, and a refusal escalates
instead; refused isolations are retried while the evidence is fresh; switches, which cannot be
isolated, are escalated for repair; what the executor reports and observes of a node moves its
lifecycle; and every lifecycle event becomes audit records, accounting and incident tracking."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fleetmedic.config import Settings
from fleetmedic.records import Finding, Incident, NodeState, RemediationResult
from fleetmedic.remediation.accounting import Accounting
from fleetmedic.remediation.engine_state import CommandInfo, Decisions, EngineState
from fleetmedic.remediation.incident_tracks import IncidentTracker
from fleetmedic.remediation.issuer import Issuer
from fleetmedic.remediation.lifecycle import (
    ISOLATING,
    OUT_OF_SERVICE,
    Issue,
    Lifecycle,
    LifecycleEvent,
    NodeRecord,
    PlanStep,
)
from fleetmedic.remediation.policy import Decision
from fleetmedic.remediation.safety import SafetyGate
from fleetmedic.remediation.topology import Topology
from fleetmedic.remediation.triage import Assessment, Triage, is_hardware_finding


class NodeTrack:
    def __init__(self, settings: Settings, state: EngineState, topology: Topology, triage: Triage,
                 gate: SafetyGate, lifecycle: Lifecycle, accounting: Accounting, issuer: Issuer,
                 incidents: IncidentTracker) -> None:
        self.settings = settings
        self.state = state
        self.topology = topology  # the engine replaces it as it learns the fleet
        self.triage = triage
        self.gate = gate
        self.lifecycle = lifecycle
        self.accounting = accounting
        self.issuer = issuer
        self.incidents = incidents

    # --- the nodes ----------------------------------------------------------------------------------

    def record(self, node: str) -> NodeRecord:
        """The node's lifecycle record, created (healthy) on first use."""
        rec = self.state.nodes.get(node)
        if rec is None:
            rec = self.state.nodes[node] = NodeRecord(name=node)
        return rec

    def state_of(self, node: str) -> NodeState:
        rec = self.state.nodes.get(node)
        return rec.state if rec else "healthy"

    def busy(self, node: str) -> bool:
        return bool(self.triage.jobs_on(node))

    def out_of_service(self, finding: Finding) -> str:
        """Why ``finding`` is not triaged now ("" when it is): its node is isolated and worked on by
        fleetmedic, or cordoned by someone else (maintenance: its links go down, it reboots); on a
        node cordoned by someone else a hardware fault is still handled (never lifting that cordon)."""
        node = finding.node
        rec = self.state.nodes.get(node)
        if rec is None:
            return ""
        if rec.state in OUT_OF_SERVICE:
            return f"{node} is {rec.state}"
        if rec.foreign_cordon and not is_hardware_finding(finding):
            return f"{node} is cordoned by someone else (maintenance)"
        return ""

    # --- acting on a decision -----------------------------------------------------------------------

    def act(self, node: str, a: Assessment, decision: Decision, now: float, out: Decisions) -> None:
        """Start the decision's node steps on ``node``: isolation through the gate, then the plan."""
        steps = [PlanStep.of(s) for s in decision.node_steps]
        if not steps:
            return
        inc, rec = a.incident, self.record(node)
        issue = self.issuer.node_commands(now, out)
        if rec.opted_out:
            self.issuer.audit(out, now, "skipped", f"{node} opts out ({self.settings.safety.opt_out_label}): no node "
                              f"action, escalated instead of {', '.join(s.action for s in steps)}", incident=inc,
                              node=node, rule=decision.rule, track="node")
            self.apply(self.lifecycle.escalate(rec, now, issue, f"opted_out:{inc.id}", f"{node} opts out; "
                       f"{decision.explanation}"), now, out, incident=inc)
            return
        critical = inc.severity == "critical" or inc.incident_class == "hardware"
        isolating = any(s.action in ISOLATING for s in steps)
        if isolating and critical and self.gate.holds(node):
            self.gate.record_isolation(node, now, critical)  # a preventive hold became a critical one
        if isolating and not self.gate.holds(node) and rec.state not in OUT_OF_SERVICE \
                and not self._isolate(rec, a, decision, steps, critical, issue, now, out):
            return
        before = len(out.commands)
        events = self.lifecycle.begin(rec, inc.id, decision.rule, steps, critical, a.fault_at, now,
                                      self.busy(node), issue, gpu=a.gpu)
        self.apply(events, now, out, incident=inc)
        ids = [c.id for c in out.commands[before:]]
        if ids:
            self.issuer.audit(out, now, "command", f"{node}: {', '.join(c.action for c in out.commands[before:])} "
                              f"({decision.explanation})", incident=inc, node=node, rule=decision.rule, track="node",
                              command_ids=ids)
        self.incidents.track(inc.id, node=node)

    def _isolate(self, rec: NodeRecord, a: Assessment, decision: Decision, steps: list[PlanStep], critical: bool,
                 issue: Issue, now: float, out: Decisions) -> bool:
        """Ask the gate to take ``rec`` out of service (noting the suspicion with the breaker first).
        False when refused: the node waits, blocked, and the refusal is escalated."""
        inc, node, fleet = a.incident, rec.name, len(self.topology)
        breaker = self.gate.breaker
        if breaker.note_suspicion(node, now, fleet):
            self.issuer.audit(out, now, "breaker_tripped", f"circuit breaker open: {breaker.state.opened_reason}; "
                              "isolation stops until it resumes", incident=inc, node=node)
            self.issuer.command(out, now, f"breaker/{breaker.state.trips}/escalate", "escalate", inc.id, "",
                                f"circuit breaker open: {breaker.state.opened_reason}",
                                {"scope": "fleet", "reason": "breaker_open", "escalation": "notify"}, node=node,
                                track="node")
        verdict = self.gate.check_isolation(node, now, fleet, self.topology.rack_of, self.topology.leaves_of, critical)
        if verdict.allowed:
            self.gate.record_isolation(node, now, critical)
            self.accounting.isolation_started(node, inc.incident_class, a.fault_at)
            return True
        repeat = rec.state == "suspect" and rec.blocked_reason == verdict.reason and rec.incident_id == inc.id
        self.apply(self.lifecycle.block(rec, verdict.reason, steps, inc.id, decision.rule, critical, a.fault_at, now),
                   now, out, incident=inc)
        if repeat:  # said already, for this incident and reason
            return False
        self.issuer.audit(out, now, "blocked", f"isolation of {node} refused: {verdict.explanation}; escalated"
                          + (" with the breaker trip" if verdict.reason == "breaker_open" else ""),
                          incident=inc, node=node, rule=decision.rule, track="node")
        if verdict.reason != "breaker_open":  # the trip itself was escalated, once for the fleet
            escalation = self.lifecycle.escalate(rec, now, issue, f"blocked:{verdict.reason}:{inc.id}",
                                                 f"isolation refused: {verdict.explanation}")
            self.apply(escalation, now, out, incident=inc)
        self.incidents.track(inc.id, node=node)
        return False

    def escalate_switches(self, a: Assessment, decision: Decision, now: float, out: Decisions) -> None:
        """A switch cannot be isolated: the node steps of a switch incident escalate its repair."""
        inc = a.incident
        for s in (x for x in inc.suspects if x.kind == "switch"):
            self.issuer.command(out, now, f"{inc.id}/escalate/{s.name}/1", "escalate", inc.id, "",
                                f"{decision.explanation}: {a.explanation}",
                                {"target_kind": "switch", "escalation": "repair"}, node=s.name, track="node")

    # --- what time, results and observations bring ----------------------------------------------------

    def tick(self, now: float, out: Decisions) -> None:
        """Retry blocked isolations; run lifecycle deadlines, backoffs and probation."""
        for name in sorted(self.state.nodes):
            rec = self.state.nodes[name]
            if rec.state == "suspect" and rec.blocked_reason:
                self._retry_blocked(rec, now, out)
            elif rec.state != "healthy" or rec.inflight or rec.plan or rec.returns:
                self.apply(self.lifecycle.tick(rec, now, self.busy(name), self.issuer.node_commands(now, out)),
                           now, out)

    def _retry_blocked(self, rec: NodeRecord, now: float, out: Decisions) -> None:
        if now - rec.blocked_at > self.settings.safety.retry_blocked_s:
            why = (f"isolation refused ({rec.blocked_reason}) for {now - rec.blocked_at:.0f}s: evidence too old to act "
                   "on; it was escalated")
            incident_id = rec.incident_id
            self.apply(self.lifecycle.drop_blocked(rec, now, why), now, out)
            self.incidents.stop_waiting_for(incident_id, rec.name)
            return
        verdict = self.gate.check_isolation(rec.name, now, len(self.topology), self.topology.rack_of,
                                            self.topology.leaves_of, rec.critical)
        if not verdict.allowed:
            return
        self.gate.record_isolation(rec.name, now, rec.critical)
        inc = self.triage.state.incidents.get(rec.incident_id)
        self.accounting.isolation_started(rec.name, inc.incident_class if inc else "unknown", rec.evidence_at)
        plan, rec.blocked_reason = list(rec.plan), ""
        before = len(out.commands)
        events = self.lifecycle.begin(rec, rec.incident_id, rec.rule, plan, rec.critical, rec.evidence_at, now,
                                      self.busy(rec.name), self.issuer.node_commands(now, out), gpu=rec.gpu)
        self.apply(events, now, out)
        self.issuer.audit(out, now, "command", f"{rec.name}: budget available again, isolation proceeds",
                          node=rec.name, incident_id=rec.incident_id, rule=rec.rule, track="node",
                          command_ids=[c.id for c in out.commands[before:]])

    def advance(self, node: str, now: float, out: Decisions) -> None:
        """A job on ``node`` stopped: a plan waiting for the job boundary may go on."""
        rec = self.state.nodes.get(node)
        if rec is not None and rec.plan and rec.state != "suspect":
            self.apply(self.lifecycle.advance(rec, now, self.busy(node), self.issuer.node_commands(now, out)), now, out)

    def on_result(self, info: CommandInfo, result: RemediationResult, now: float, out: Decisions) -> None:
        rec = self.state.nodes[info.node]
        events = self.lifecycle.on_result(rec, result, now, self.busy(info.node), self.issuer.node_commands(now, out))
        self.apply(events, now, out)

    def observed(self, node: str, cordoned: bool, cordoned_by_fleetmedic: bool, labels: Mapping[str, str],
                 now: float, out: Decisions) -> None:
        """What the executor sees on a node: an opt-out label, and its cordon and who made it."""
        rec = self.record(node)
        label = self.settings.safety.opt_out_label
        opted = labels.get(label, "").lower() in ("true", "1", "yes")
        if opted != rec.opted_out:
            rec.opted_out = opted
            self.issuer.audit(out, now, "skipped" if opted else "state_change",
                              f"{node} {'opts out of' if opted else 'no longer opts out of'} remediation "
                              f"(label {label})", node=node)
        if cordoned and not cordoned_by_fleetmedic and not rec.foreign_cordon:
            rec.foreign_cordon, rec.cordon_owned = True, False
            self.issuer.audit(out, now, "skipped", f"{node} is cordoned by someone else: fleetmedic will never "
                              "uncordon it", node=node)
        elif cordoned and cordoned_by_fleetmedic:
            rec.cordon_owned, rec.foreign_cordon = True, False
        elif not cordoned:
            rec.foreign_cordon = False
            cordon_pending = any(f.action == "cordon" for f in rec.inflight)
            if rec.cordon_owned and rec.state in OUT_OF_SERVICE and not cordon_pending:
                why = f"{node} was uncordoned outside fleetmedic while {rec.state}: treated as a manual clear"
                self.apply(self.lifecycle.released_elsewhere(rec, now, why), now, out, actor="kubernetes")
            rec.cordon_owned = False

    # --- operator requests --------------------------------------------------------------------------

    def clear(self, node: str, actor: str, reason: str, now: float, out: Decisions) -> None:
        """An operator vouches for a node: return it to service now (no diagnostics), forget its flaps."""
        rec = self.record(node)
        self.apply(self.lifecycle.clear(rec, now, self.issuer.node_commands(now, out), actor, reason), now, out,
                   actor=actor)

    def repaired(self, node: str, actor: str, reason: str, now: float, out: Decisions) -> None:
        """A human repaired a node awaiting repair: validate it with diagnostics before it returns."""
        rec = self.record(node)
        if rec.state != "repair_needed":
            self.issuer.audit(out, now, "skipped", f"{node} is {rec.state}, not repair_needed: nothing to validate",
                              node=node, actor=actor)
            return
        events = self.lifecycle.repaired(rec, now, self.busy(node), self.issuer.node_commands(now, out), actor, reason)
        self.apply(events, now, out, actor=actor)

    # --- lifecycle events -----------------------------------------------------------------------------

    def apply(self, events: Iterable[LifecycleEvent], now: float, out: Decisions, incident: Incident | None = None,
              actor: str = "fleetmedic") -> None:
        """Lifecycle events become audit records, accounting, budget releases and incident tracking."""
        audit = self.issuer.audit
        for ev in events:
            rec = self.state.nodes.get(ev.node)
            incident_id = incident.id if incident else (rec.incident_id if rec else "")
            if ev.kind == "state_change":
                audit(out, now, "state_change", ev.explanation, node=ev.node, incident_id=incident_id,
                      state_from=ev.state_from, state_to=ev.state_to, command_ids=list(ev.command_ids), actor=actor)
                if ev.state_to == "repair_needed":
                    self.incidents.untrack(incident_id, now, out, node=ev.node)
            elif ev.kind == "escalated":
                audit(out, now, "escalated", ev.explanation, node=ev.node, incident_id=incident_id,
                      command_ids=list(ev.command_ids), track="node")
            elif ev.kind == "verdict":
                self.accounting.verdict(ev.node, bool(ev.passed), ev.first_try, now)
                audit(out, now, "result", f"diagnostics {'passed' if ev.passed else 'failed'}: {ev.explanation}",
                      node=ev.node, incident_id=incident_id)
            elif ev.kind in ("returned", "cleared"):
                self.gate.release(ev.node, now)
                self.accounting.returned(ev.node, now)
                audit(out, now, "cleared" if ev.kind == "cleared" else "command", ev.explanation, node=ev.node,
                      incident_id=incident_id, command_ids=list(ev.command_ids), actor=actor, track="node",
                      state_from=ev.state_from, state_to=ev.state_to)
                self.incidents.untrack(incident_id, now, out, node=ev.node)
            elif ev.kind == "isolated":
                self.accounting.isolated(ev.node, now)
            elif ev.kind == "skipped":
                audit(out, now, "skipped", ev.explanation, node=ev.node, incident_id=incident_id)

    # --- housekeeping -------------------------------------------------------------------------------

    def live_command_ids(self) -> set[str]:
        """Commands whose results a node still waits for (in flight, or its repair)."""
        live = {f.command_id for r in self.state.nodes.values() for f in r.inflight}
        return live | {cid for r in self.state.nodes.values() for cid in r.repair_ids}

    def forget_idle(self, now: float) -> None:
        """Forget released holds past the cooldown and flap window, and healthy nodes nothing marks."""
        s, p = self.settings, self.settings.policy
        self.gate.forget_released_before(now - max(s.safety.node_cooldown_s, p.flap_window_s))
        for name in [n for n, r in self.state.nodes.items() if _forgettable(r)]:
            del self.state.nodes[name]



def _forgettable(rec: NodeRecord) -> bool:
    return (rec.state == "healthy" and not rec.plan and not rec.inflight and not rec.returns
            and not rec.opted_out and not rec.foreign_cordon and not rec.cordon_owned)
