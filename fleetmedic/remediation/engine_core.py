"""The decision engine's bookkeeping: its parts (triage, policy, lifecycle, safety gate,
accounting) over one :class:`~.engine_state.EngineState`, lifecycle events turned into audit records
and accounting, incident tracks and publication, command issuing and audit records, pruning.
:class:`~.engine.DecisionEngine` builds on it; nothing here is public."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from fleetmedic.config import Settings
from fleetmedic.records import (
    AuditDecision,
    AuditRecord,
    Finding,
    Incident,
    IncidentStatus,
    JobEvent,
    NodeState,
    RemediationCommand,
    Track,
)
from fleetmedic.remediation.accounting import Accounting
from fleetmedic.remediation.engine_state import CommandInfo, Decisions, EngineState, IncidentTracks
from fleetmedic.remediation.lifecycle import OUT_OF_SERVICE, Issue, Lifecycle, LifecycleEvent, NodeRecord
from fleetmedic.remediation.log_patterns import PatternLibrary, default_library
from fleetmedic.remediation.policy import Policy
from fleetmedic.remediation.safety import SafetyGate
from fleetmedic.remediation.topology import Topology
from fleetmedic.remediation.triage import Triage, is_hardware_finding


class EngineCore:
    def __init__(self, settings: Settings | None = None, topology: Topology | None = None,
                 library: PatternLibrary | None = None, state: EngineState | None = None) -> None:
        self.settings = settings or Settings()
        self.state = state if state is not None else EngineState()
        if topology is not None:
            self.state.topology = dict(topology.nodes)
        self.topology = Topology(self.state.topology)
        self.triage = Triage(self.settings.triage, self.settings.policy, library or default_library(),
                             self.topology, self.state.triage)
        self.policy = Policy(self.settings.policy)
        self.gate = SafetyGate(self.settings.safety, self.state.safety)
        self.lifecycle = Lifecycle(self.settings.policy, self._may_disrupt, self.gate.record_disruptive)
        self.accounting = Accounting(self.state.accounting)

    # --- lifecycle events, incidents, accounting ------------------------------------------------------

    def _events(self, events: Iterable[LifecycleEvent], now: float, out: Decisions, incident: Incident | None = None,
                actor: str = "fleetmedic") -> None:
        for ev in events:
            rec = self.state.nodes.get(ev.node)
            incident_id = incident.id if incident else (rec.incident_id if rec else "")
            if ev.kind == "state_change":
                self._audit(out, now, "state_change", ev.explanation, node=ev.node, incident_id=incident_id,
                            state_from=ev.state_from, state_to=ev.state_to, command_ids=list(ev.command_ids),
                            actor=actor)
                if ev.state_to == "repair_needed":
                    self._untrack(incident_id, now, out, node=ev.node)
            elif ev.kind == "escalated":
                self._audit(out, now, "escalated", ev.explanation, node=ev.node, incident_id=incident_id,
                            command_ids=list(ev.command_ids), track="node")
            elif ev.kind == "verdict":
                self.accounting.verdict(ev.node, bool(ev.passed), ev.first_try, now)
                self._audit(out, now, "result", f"diagnostics {'passed' if ev.passed else 'failed'}: {ev.explanation}",
                            node=ev.node, incident_id=incident_id)
            elif ev.kind in ("returned", "cleared"):
                self.gate.release(ev.node, now)
                self.accounting.returned(ev.node, now)
                self._audit(out, now, "cleared" if ev.kind == "cleared" else "command", ev.explanation, node=ev.node,
                            incident_id=incident_id, command_ids=list(ev.command_ids), actor=actor, track="node",
                            state_from=ev.state_from, state_to=ev.state_to)
                self._untrack(incident_id, now, out, node=ev.node)
            elif ev.kind == "isolated":
                self.accounting.isolated(ev.node, now)
            elif ev.kind == "skipped":
                self._audit(out, now, "skipped", ev.explanation, node=ev.node, incident_id=incident_id)

    def _account_job(self, e: JobEvent, now: float, out: Decisions) -> None:
        acc = self.accounting
        if e.event == "placement":
            bad = [p.node for p in e.placement if self.gate.holds(p.node) or self.node_state(p.node) in OUT_OF_SERVICE]
            for node in sorted(set(bad)):
                acc.repeat_placement()
                self._audit(out, now, "repeat_placement", f"job {e.job} attempt {e.attempt} was placed on {node}, "
                            f"which fleetmedic holds out of service ({self.node_state(node)})", node=node, job=e.job)
        if e.event == "start":
            acc.job_attempt()
            acc.job_running(e.job, now)
        elif e.event == "progress":
            acc.job_running(e.job, now)
        elif e.event in ("failure", "completion"):
            acc.job_stopped(e.job, now)
        resolved = acc.job_progress(e.job, e.event, e.attempt, now)
        if resolved:
            self._untrack(resolved, now, out, job=e.job)
        if e.event == "completion":
            for inc_id, tracks in list(self.state.tracks.items()):
                if e.job in tracks.jobs:
                    self._untrack(inc_id, now, out, job=e.job)

    def _track(self, incident_id: str, node: str = "", job: str = "", wait: bool = True) -> None:
        t = self.state.tracks.setdefault(incident_id, IncidentTracks())
        if node and node not in t.nodes:
            t.nodes.append(node)
        if job and wait and job not in t.jobs:
            t.jobs.append(job)
        if job and job not in t.handled:
            t.handled.append(job)

    def _untrack(self, incident_id: str, now: float, out: Decisions, node: str = "", job: str = "") -> None:
        t = self.state.tracks.get(incident_id)
        if t is None:
            return
        t.nodes = [n for n in t.nodes if n != node]
        t.jobs = [j for j in t.jobs if j != job]
        if not t.nodes and not t.jobs:
            self._set_status(incident_id, "resolved", now, out)

    def _set_status(self, incident_id: str, status: IncidentStatus, now: float, out: Decisions) -> None:
        inc = self.triage.set_status(incident_id, status, now)
        if inc is not None:
            self._publish(inc, out)
            self._audit(out, now, "incident", f"incident {status}", incident=inc)

    def _publish(self, inc: Incident, out: Decisions) -> bool:
        """Emit an incident when it is new or changed materially (not for every piece of evidence)."""
        sources = sorted({e.detector for e in inc.evidence})  # a new kind of evidence is news; more of it is not
        key = msgspec.json.encode([inc.status, inc.incident_class, inc.suspects, inc.severity, inc.confidence,
                                   inc.jobs, sources]).decode()
        if self.state.published.get(inc.id) == key:
            return False
        self.state.published[inc.id] = key
        out.incidents.append(inc)
        return True

    # --- calls, closing, pruning --------------------------------------------------------------------

    def _begin(self, now: float) -> tuple[float, Decisions]:
        now = max(float(now), self.state.clock)
        self.state.clock = now
        return now, Decisions()

    def _finish(self, now: float, out: Decisions) -> Decisions:
        """Every command is explained: audit any command no audit record of this call names yet."""
        named = {cid for a in out.audit for cid in a.command_ids}
        for c in out.commands:
            if c.id not in named:
                self._audit(out, now, "command", f"{c.action} {c.node or c.job}: {c.reason}", node=c.node, job=c.job,
                            incident_id=c.incident_id, track=c.track, command_ids=[c.id])
        return out

    def _close_stale(self, now: float, out: Decisions) -> None:
        """Incidents nothing waits for and no evidence renewed within ``incident_merge_s`` close:
        ``resolved`` if fleetmedic acted on them, else ``dismissed``."""
        horizon = now - self.settings.triage.incident_merge_s
        for inc in list(self.triage.state.incidents.values()):
            if inc.status not in ("open", "mitigating") or (inc.last_seen or inc.first_seen) > horizon:
                continue
            t = self.state.tracks.get(inc.id)
            if t is not None and (t.nodes or t.jobs):
                continue
            if inc.id not in self.state.published:  # watched, never confirmed: forget it quietly
                self.triage.set_status(inc.id, "dismissed", now)
                continue
            self._set_status(inc.id, "resolved" if inc.status == "mitigating" else "dismissed", now, out)

    def _prune(self, now: float) -> None:
        self.triage.prune(now)
        s, p = self.settings, self.settings.policy
        horizon = now - max(s.signing.command_ttl_s, p.action_timeout_s, p.diagnostics_timeout_s) * 2
        live = {f.command_id for r in self.state.nodes.values() for f in r.inflight}
        live |= {cid for r in self.state.nodes.values() for cid in r.repair_ids}
        self.state.commands = {k: v for k, v in self.state.commands.items() if v.issued_at >= horizon or k in live}
        self.gate.forget_released_before(now - max(s.safety.node_cooldown_s, p.flap_window_s))
        for name in [n for n, r in self.state.nodes.items() if _forgettable(r)]:
            del self.state.nodes[name]
        for inc_id in [i for i in self.state.tracks if i not in self.triage.state.incidents]:
            del self.state.tracks[inc_id]
        for inc_id in [i for i in self.state.published if i not in self.triage.state.incidents]:
            del self.state.published[inc_id]

    # --- helpers ------------------------------------------------------------------------------------

    def node_state(self, node: str) -> NodeState:
        rec = self.state.nodes.get(node)
        return rec.state if rec else "healthy"

    def _node(self, node: str) -> NodeRecord:
        rec = self.state.nodes.get(node)
        if rec is None:
            rec = self.state.nodes[node] = NodeRecord(name=node)
        return rec

    def _out_of_service(self, finding: Finding) -> str:
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

    def _busy(self, node: str) -> bool:
        return bool(self.triage.jobs_on(node))

    def _fleet_size(self) -> int:
        return len(self.topology)

    def _may_disrupt(self, node: str, action: str, now: float) -> bool:
        return self.gate.check_disruptive(node, action, now).allowed

    def _issuer(self, now: float, out: Decisions) -> Issue:
        def issue(rec: NodeRecord, action: str, params: dict[str, str], attempt: str, reason: str) -> str:
            cid = f"{rec.incident_id or 'node'}/{action}/{rec.name}/{attempt}"
            self._job_command(out, now, cid, action, rec.incident_id, "", reason, params, node=rec.name, track="node")
            return cid
        return issue

    def _job_command(self, out: Decisions, now: float, cid: str, action: str, incident_id: str, job: str, reason: str,
                     params: dict[str, str], exclude: list[str] | None = None, node: str = "",
                     track: Track = "job") -> None:
        """Build and emit one command (both tracks); an id already issued is never emitted twice."""
        if cid in self.state.commands:
            return
        cmd = RemediationCommand(
            id=cid, action=action, incident_id=incident_id, reason=reason[:4096], issued_at=now,  # type: ignore[arg-type]
            expires_at=now + self.settings.signing.command_ttl_s, node=node, job=job, track=track,
            dry_run=self.settings.safety.dry_run, exclude_nodes=exclude or [], params=params,
        )
        self.state.commands[cid] = CommandInfo(action=action, track=track, incident_id=incident_id, issued_at=now,
                                               node=node, job=job)
        out.commands.append(cmd)

    def _audit(self, out: Decisions, now: float, decision: AuditDecision, explanation: str, *,
               incident: Incident | None = None, incident_id: str = "", node: str = "", job: str = "",
               rule: str = "", track: Track | None = None, command_ids: list[str] | None = None,
               state_from: NodeState | None = None, state_to: NodeState | None = None,
               actor: str = "fleetmedic") -> None:
        self.state.seq += 1
        budget = self.gate.snapshot(now, self._fleet_size()) if decision in ("blocked", "command", "breaker_tripped",
                                                                             "breaker_resumed", "cleared") else None
        out.audit.append(AuditRecord(
            id=f"audit-{self.state.seq:012d}", ts=now, decision=decision, explanation=explanation[:4096],
            node=node, job=job, incident_id=incident.id if incident else incident_id,
            incident_class=incident.incident_class if incident else None, command_ids=command_ids or [],
            rule=rule, track=track, state_from=state_from, state_to=state_to, actor=actor, budget=budget,
            dry_run=self.settings.safety.dry_run,
        ))


def _forgettable(rec: NodeRecord) -> bool:
    return (rec.state == "healthy" and not rec.plan and not rec.inflight and not rec.returns
            and not rec.opted_out and not rec.foreign_cordon and not rec.cordon_owned)
