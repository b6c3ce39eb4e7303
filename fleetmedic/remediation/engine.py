"""The decision engine: findings, job events, executor results and node observations in; incidents,
remediation commands and audit records out. Decide, then act: nothing here performs I/O.

One :class:`DecisionEngine` holds triage, policy, the per-node lifecycle, safety and accounting.
Every input method takes ``now`` (epoch seconds; the engine never reads a clock and never lets its
own time run backwards) and returns a :class:`Decisions` value::

    engine = DecisionEngine(settings, topology)
    out = engine.on_finding(finding, now)          # also on_job_event, on_result, node_observed, tick
    producer.send_all(out.incidents, out.commands, out.audit)   # the stage signs commands first
    table["engine"] = engine.to_bytes()            # reassign: the state lives in a table changelog

The engine reads no files: a stage loads the failure-log library named by
``triage.patterns_file`` with :func:`~fleetmedic.remediation.log_patterns.load_library` and passes
it in (default: the shipped library), and restores the engine with :meth:`DecisionEngine.from_bytes`.
Node observations (:meth:`DecisionEngine.node_observed`: cordon, who made it, labels) teach it the
topology, opt-outs and cordon ownership. Operator requests (:meth:`DecisionEngine.clear_node`,
:meth:`DecisionEngine.node_repaired`, :meth:`DecisionEngine.resume_breaker`) are audited.

Call :meth:`DecisionEngine.tick` every few seconds as well: failure reports are gathered for
``triage.failure_settle_s`` before deciding, retries wait for their backoff, and lifecycle
deadlines, probation and the breaker's resume rule run on it.

Commands carry deterministic ids (``<incident>/<action>/<target>/<attempt>``): replaying the same
inputs yields the same ids, and executors apply an id at most once. Job-track commands are never
blocked by node budgets; node-track isolation passes the :class:`~.safety.SafetyGate` first, and
when it is refused the engine escalates instead and says why in the audit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

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
    RemediationResult,
    Track,
)
from fleetmedic.remediation.accounting import Accounting, AccountingState
from fleetmedic.remediation.lifecycle import (
    ISOLATING,
    OUT_OF_SERVICE,
    Issue,
    Lifecycle,
    LifecycleEvent,
    NodeRecord,
    PlanStep,
)
from fleetmedic.remediation.log_patterns import PatternLibrary, default_library
from fleetmedic.remediation.policy import Decision, Policy
from fleetmedic.remediation.safety import SafetyGate, SafetyState
from fleetmedic.remediation.topology import Placement, Topology
from fleetmedic.remediation.triage import Assessment, Triage, TriageState

STATE_VERSION: Final = 1
NODE_CLASSES: Final = frozenset({"hardware", "degradation", "network", "unknown"})


@dataclass
class Decisions:
    """What one call decided. Publish incidents, (signed) commands and audit records in this order."""

    incidents: list[Incident] = field(default_factory=list)
    commands: list[RemediationCommand] = field(default_factory=list)
    audit: list[AuditRecord] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.incidents or self.commands or self.audit)

    def extend(self, other: Decisions) -> None:
        self.incidents += other.incidents
        self.commands += other.commands
        self.audit += other.audit


class CommandInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Where an issued command's result should go."""

    action: str
    track: Track
    incident_id: str
    issued_at: float
    node: str = ""
    job: str = ""


class HeldCommand(msgspec.Struct, frozen=True, kw_only=True):
    """A job-track command waiting for its backoff."""

    due: float
    id: str
    action: str
    incident_id: str
    job: str
    reason: str
    params: dict[str, str] = {}
    attempt: int = 0  # the failed attempt it retries: moot once the job moved on


class IncidentTracks(msgspec.Struct, kw_only=True):
    """What an incident still waits for before it is resolved, and the jobs it already moved."""

    jobs: list[str] = []
    nodes: list[str] = []
    handled: list[str] = []


class EngineState(msgspec.Struct, kw_only=True):
    version: int = STATE_VERSION
    clock: float = 0.0
    seq: int = 0
    topology: dict[str, Placement] = {}
    nodes: dict[str, NodeRecord] = {}
    triage: TriageState = msgspec.field(default_factory=TriageState)
    safety: SafetyState = msgspec.field(default_factory=SafetyState)
    accounting: AccountingState = msgspec.field(default_factory=AccountingState)
    commands: dict[str, CommandInfo] = {}
    held: list[HeldCommand] = []
    tracks: dict[str, IncidentTracks] = {}
    published: dict[str, str] = {}  # incident id -> what was last published of it
    muted: dict[str, float] = {}  # out-of-service node -> since when its findings are not triaged


_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final = msgspec.msgpack.Decoder(EngineState)


class DecisionEngine:
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

    # --- serialisation ------------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The whole state (msgpack). Restore with :meth:`from_bytes` and the same settings."""
        self.state.topology = self.topology.nodes
        return _ENCODER.encode(self.state)

    @classmethod
    def from_bytes(cls, data: bytes, settings: Settings | None = None,
                   library: PatternLibrary | None = None) -> DecisionEngine:
        state = _DECODER.decode(data)
        if state.version != STATE_VERSION:
            raise ValueError(f"engine state version {state.version} is not {STATE_VERSION}")
        return cls(settings, None, library, state)

    # --- inputs -------------------------------------------------------------------------------------

    def handle(self, record: Finding | JobEvent | RemediationResult, now: float) -> Decisions:
        """Dispatch one decoded record from ``findings``, ``jobs.events`` or ``remediation.results``."""
        if isinstance(record, Finding):
            return self.on_finding(record, now)
        if isinstance(record, JobEvent):
            return self.on_job_event(record, now)
        return self.on_result(record, now)

    def on_finding(self, finding: Finding, now: float) -> Decisions:
        now, out = self._begin(now)
        state = self.node_state(finding.node)
        if state in OUT_OF_SERVICE:
            # the node is isolated and being worked on: what it reports now is mostly the echo of our
            # own actions (links down during a reboot, counters reset, diagnostics load) and its
            # verdict comes from diagnostics; it must not open new incidents or implicate its leaf
            if finding.node not in self.state.muted:
                self.state.muted[finding.node] = now
                self._audit(out, now, "skipped", f"{finding.node} is {state}: its findings are not triaged "
                            f"until it is back in service (first: {finding.summary})", node=finding.node)
            self._advance(now, out)
            return self._finish(now, out)
        self.state.muted.pop(finding.node, None)
        for a in self.triage.add_finding(finding, now):
            self._act(a, now, out)
        self._advance(now, out)
        return self._finish(now, out)

    def on_job_event(self, event: JobEvent, now: float) -> Decisions:
        now, out = self._begin(now)
        rec_before = self.triage.job(event.job)
        old_nodes = list(rec_before.nodes) if rec_before else []
        if event.event in ("start", "placement", "restart"):
            self.triage.state.decided.pop(f"{event.job}#{event.attempt}", None)  # a new run of that attempt
        for note in self.triage.add_job_event(event, now):
            self._audit(out, now, "skipped", note, job=event.job)
        self._account_job(event, now, out)
        if event.event in ("failure", "completion"):
            for node in old_nodes:  # a job boundary may have been reached
                self._advance_node(node, now, out)
        self._advance(now, out)
        return self._finish(now, out)

    def on_result(self, result: RemediationResult, now: float) -> Decisions:
        now, out = self._begin(now)
        info = self.state.commands.get(result.command_id)
        if info is None:
            self._advance(now, out)
            return self._finish(now, out)
        if info.track == "node" and info.node in self.state.nodes:
            rec = self.state.nodes[info.node]
            events = self.lifecycle.on_result(rec, result, now, self._busy(info.node), self._issuer(now, out))
            self._events(events, now, out)
        elif info.track == "job" and result.outcome == "failed":
            self._audit(out, now, "escalated", f"{info.action} of {info.job} failed: {result.reason}", job=info.job,
                        incident_id=info.incident_id, track="job")
            self._job_command(out, now, f"{info.incident_id}/escalate/{info.job}/{info.action}-failed", "escalate",
                              info.incident_id, info.job, f"{info.action} failed: {result.reason}",
                              {"escalation": "notify"})
        self._advance(now, out)
        return self._finish(now, out)

    def node_observed(self, node: str, *, cordoned: bool, cordoned_by_fleetmedic: bool,
                      labels: Mapping[str, str] | None = None, now: float) -> Decisions:
        """What the executor sees on a node: its cordon (and who made it) and its labels."""
        now, out = self._begin(now)
        labels = labels or {}
        t = self.settings.triage
        before = self.topology
        self.topology = self.topology.with_labels(node, labels, t.rack_label, t.leaf_label, t.pool_label)
        if self.topology is not before:
            self.triage.topology = self.topology
        rec = self._node(node)
        opted = labels.get(self.settings.safety.opt_out_label, "").lower() in ("true", "1", "yes")
        if opted != rec.opted_out:
            rec.opted_out = opted
            self._audit(out, now, "skipped" if opted else "state_change",
                        f"{node} {'opts out of' if opted else 'no longer opts out of'} remediation "
                        f"(label {self.settings.safety.opt_out_label})", node=node)
        if cordoned and not cordoned_by_fleetmedic and not rec.foreign_cordon:
            rec.foreign_cordon, rec.cordon_owned = True, False
            self._audit(out, now, "skipped", f"{node} is cordoned by someone else: fleetmedic will never uncordon it",
                        node=node)
        elif cordoned and cordoned_by_fleetmedic:
            rec.cordon_owned, rec.foreign_cordon = True, False
        elif not cordoned:
            rec.foreign_cordon = False
            cordon_pending = any(f.action == "cordon" for f in rec.inflight)
            if rec.cordon_owned and rec.state in OUT_OF_SERVICE and not cordon_pending:
                why = f"{node} was uncordoned outside fleetmedic while {rec.state}: treated as a manual clear"
                self._events(self.lifecycle.released_elsewhere(rec, now, why), now, out, actor="kubernetes")
            rec.cordon_owned = False
        self._advance(now, out)
        return self._finish(now, out)

    def tick(self, now: float) -> Decisions:
        """Deadlines, backoffs, settle windows, probation, blocked isolations, breaker resume, pruning."""
        now, out = self._begin(now)
        self._advance(now, out)
        fleet = self._fleet_size()
        for name in sorted(self.state.nodes):
            rec = self.state.nodes[name]
            if rec.state == "suspect" and rec.blocked_reason:
                self._retry_blocked(rec, now, out)
            elif rec.state != "healthy" or rec.inflight or rec.plan or rec.returns:
                self._events(self.lifecycle.tick(rec, now, self._busy(name), self._issuer(now, out)), now, out)
        if self.gate.breaker.poll(now, fleet):
            self._audit(out, now, "breaker_resumed", f"circuit breaker closed by rule (resume: auto) after "
                        f"{self.settings.safety.breaker.auto_resume_after_s:g}s with suspicion below the trip level")
        self._close_stale(now, out)
        self._prune(now)
        self.accounting.fleet(fleet, now)
        return self._finish(now, out)

    # --- operator commands (audited) ------------------------------------------------------------------

    def clear_node(self, node: str, *, actor: str, reason: str, now: float) -> Decisions:
        """An operator vouches for a node: return it to service now (no diagnostics), forget its flaps."""
        now, out = self._begin(now)
        rec = self._node(node)
        self._events(self.lifecycle.clear(rec, now, self._issuer(now, out), actor, reason), now, out, actor=actor)
        return self._finish(now, out)

    def node_repaired(self, node: str, *, actor: str, reason: str, now: float) -> Decisions:
        """A human repaired a node awaiting repair: validate it with diagnostics before it returns."""
        now, out = self._begin(now)
        rec = self._node(node)
        if rec.state != "repair_needed":
            self._audit(out, now, "skipped", f"{node} is {rec.state}, not repair_needed: nothing to validate",
                        node=node, actor=actor)
            return self._finish(now, out)
        events = self.lifecycle.repaired(rec, now, self._busy(node), self._issuer(now, out), actor, reason)
        self._events(events, now, out, actor=actor)
        return self._finish(now, out)

    def resume_breaker(self, *, actor: str, reason: str, now: float) -> Decisions:
        now, out = self._begin(now)
        if self.gate.breaker.state.open:
            self.gate.breaker.close()
            self._audit(out, now, "breaker_resumed", f"circuit breaker closed by {actor}: {reason}", actor=actor)
        return self._finish(now, out)

    # --- queries ------------------------------------------------------------------------------------

    def node_state(self, node: str) -> NodeState:
        rec = self.state.nodes.get(node)
        return rec.state if rec else "healthy"

    def nodes_in(self, *states: NodeState) -> list[str]:
        return sorted(n for n, r in self.state.nodes.items() if r.state in states)

    @property
    def breaker_open(self) -> bool:
        return self.gate.breaker.state.open

    def report(self, now: float) -> dict[str, Any]:
        states: dict[str, int] = {}
        for r in self.state.nodes.values():
            states[r.state] = states.get(r.state, 0) + 1
        return {
            **self.accounting.report(now),
            "nodes": dict(sorted(states.items())),
            "budget": msgspec.to_builtins(self.gate.snapshot(now, self._fleet_size())),
            "breaker_trips": self.gate.breaker.state.trips,
        }

    # --- deciding -----------------------------------------------------------------------------------

    def _act(self, a: Assessment, now: float, out: Decisions) -> None:
        inc = a.incident
        probation = {n for n in a.suspect_nodes if self.node_state(n) == "probation"}
        if not a.confirmed and not probation:  # watched, not yet published
            if a.new:
                c = self.settings.triage
                self._audit(out, now, "skipped", f"{a.explanation}: {inc.severity} evidence not yet seen "
                            f"{c.warning_confirmations} times over {c.warning_confirm_min_span_s:g}s: watching, "
                            "no incident published, no action yet", incident=inc)
            return
        if self._publish(inc, out) or a.job:
            self._audit(out, now, "incident", ("new: " if a.new else "updated: ") + a.explanation,
                        incident=inc, job=a.job, node=(a.suspect_nodes or ("",))[0])
        if a.job:
            self.accounting.job_failed(inc.incident_class)
            for n in a.suspect_nodes:
                if self.gate.holds(n) and self.state.nodes[n].cordon_owned:
                    self.accounting.repeat_failure()
                    self._audit(out, now, "repeat_placement", f"job {a.job} failed on {n}, which fleetmedic holds "
                                "out of service: the job was placed there before the cordon took effect",
                                incident=inc, node=n, job=a.job)
        if inc.id not in self.state.tracks:  # the first decision on this incident
            self.state.tracks[inc.id] = IncidentTracks()
            if inc.incident_class in NODE_CLASSES and a.suspect_nodes:
                self.accounting.node_failed(inc.incident_class, len(a.suspect_nodes))
        decision = self.policy.decide(a, probation)
        issued_before = len(out.commands)
        jobs = list(a.jobs)
        if any(s.action == "drain" for s in decision.node_steps):
            jobs += [j for n in a.suspect_nodes for j in self.triage.jobs_on(n) if j not in jobs]
        done = self.state.tracks.get(inc.id, IncidentTracks()).handled
        if self.gate.breaker.state.open and decision.job_steps and any(j != a.job for j in jobs):
            self._audit(out, now, "skipped", "circuit breaker open: running jobs are not moved on this evidence "
                        "(a failed job still is)", incident=inc, rule=decision.rule, track="job")
            jobs = [j for j in jobs if j == a.job]
        for job in jobs:
            if job != a.job and job in done:
                continue  # a running job is moved once per incident; its own failures decide again
            for step in decision.job_steps:
                self._job_step(step.action, dict(step.params), job, a, decision, now, out)
        for node in a.suspect_nodes:
            self._node_track(node, a, decision, now, out)
        if decision.node_steps and not a.suspect_nodes:
            for s in (x for x in inc.suspects if x.kind == "switch"):
                self._job_command(out, now, f"{inc.id}/escalate/{s.name}/1", "escalate", inc.id, "",
                                  f"{decision.explanation}: {a.explanation}",
                                  {"target_kind": "switch", "escalation": "repair"},
                                  node=s.name, track="node")
        if not decision.rule:
            self._audit(out, now, "skipped", decision.explanation, incident=inc)
            if a.new:
                self._set_status(inc.id, "dismissed", now, out)
        elif len(out.commands) > issued_before:
            self._set_status(inc.id, "mitigating", now, out)

    def _job_step(self, action: str, params: dict[str, str], job: str, a: Assessment, decision: Decision,
                  now: float, out: Decisions) -> None:
        rec = self.triage.job(job)
        attempt = rec.attempt if rec else a.attempt
        inc = a.incident
        # one escalation per incident and job; other actions once per incident, job and attempt
        cid = f"{inc.id}/{action}/{job}" + ("" if action == "escalate" else f"/{attempt}")
        if cid in self.state.commands or any(h.id == cid for h in self.state.held):
            return
        reason = f"{decision.explanation}: {a.explanation}"
        if action == "retry_in_place":
            retries = (rec.retries_in_place if rec else 0) + 1
            if rec:
                rec.retries_in_place = retries
            backoff = self.settings.policy.transient_retry_backoff_s * 2 ** (retries - 1)
            params |= {"retry": str(retries), "backoff_s": f"{backoff:g}"}
            self.state.held.append(HeldCommand(due=now + backoff, id=cid, action=action, incident_id=inc.id,
                                               job=job, reason=reason, params=params, attempt=attempt))
            self._audit(out, now, "command", f"retry {retries} of {job} in place after {backoff:g}s backoff; "
                        "no node is isolated", incident=inc, job=job, rule=decision.rule, track="job",
                        command_ids=[cid])
            self._track(inc.id, job=job)
            return
        if action in ("restart_job", "requeue_job"):
            self.state.held = [h for h in self.state.held if h.job != job]  # a restart supersedes a pending retry
            self.triage.expect_failure(job, attempt, now + self.settings.signing.command_ttl_s
                                       + self.settings.triage.failure_settle_s)
            if job != a.job:  # a running job interrupted by fleetmedic counts as a failed attempt of that class
                self.accounting.job_failed(inc.incident_class)
                self.accounting.job_stopped(job, now)
            exclude = sorted(set(a.exclude_nodes) | set(a.suspect_nodes) | set(self.gate.state.held))
            self._job_command(out, now, cid, action, inc.id, job, reason, params, exclude=exclude)
            self.accounting.recovery_started(job, inc.id, attempt, a.fault_at, now, list(a.suspect_nodes), now)
            self._track(inc.id, job=job)
        else:
            if action == "escalate":
                params.setdefault("escalation", "notify")
            self._job_command(out, now, cid, action, inc.id, job, reason, params)
            self._track(inc.id, job=job, wait=False)
        self._audit(out, now, "command", f"{action} {job}" + (f" excluding {len(a.exclude_nodes)} suspect node(s)"
                    if action == "restart_job" and a.exclude_nodes else "") + f": {decision.explanation}",
                    incident=inc, job=job, rule=decision.rule, track="job", command_ids=[cid])

    def _node_track(self, node: str, a: Assessment, decision: Decision, now: float, out: Decisions) -> None:
        steps = [PlanStep.of(s) for s in decision.node_steps]
        if not steps:
            return
        inc, rec = a.incident, self._node(node)
        issue = self._issuer(now, out)
        if rec.opted_out:
            self._audit(out, now, "skipped", f"{node} opts out ({self.settings.safety.opt_out_label}): no node "
                        f"action, escalated instead of {', '.join(s.action for s in steps)}", incident=inc, node=node,
                        rule=decision.rule, track="node")
            self._events(self.lifecycle.escalate(rec, now, issue, f"opted_out:{inc.id}", f"{node} opts out; "
                         f"{decision.explanation}"), now, out, incident=inc)
            return
        critical = inc.severity == "critical" or inc.incident_class == "hardware"
        isolating = any(s.action in ISOLATING for s in steps)
        if isolating and critical and self.gate.holds(node):
            self.gate.record_isolation(node, now, critical)  # a preventive hold became a critical one
        if isolating and not self.gate.holds(node) and rec.state not in OUT_OF_SERVICE:
            fleet = self._fleet_size()
            if self.gate.breaker.note_suspicion(node, now, fleet):
                opened = self.gate.breaker.state.opened_reason
                self._audit(out, now, "breaker_tripped", f"circuit breaker open: {opened}; isolation stops until "
                            "it resumes", incident=inc, node=node)
                trips = self.gate.breaker.state.trips
                self._job_command(out, now, f"breaker/{trips}/escalate", "escalate", inc.id, "",
                                  f"circuit breaker open: {self.gate.breaker.state.opened_reason}",
                                  {"scope": "fleet", "reason": "breaker_open", "escalation": "notify"}, node=node,
                                  track="node")
            verdict = self.gate.check_isolation(node, now, fleet, self.topology.rack_of, self.topology.leaves_of,
                                                critical)
            if not verdict.allowed:
                repeat = rec.state == "suspect" and rec.blocked_reason == verdict.reason and rec.incident_id == inc.id
                self._events(self.lifecycle.block(rec, verdict.reason, steps, inc.id, decision.rule, critical,
                                                  a.fault_at, now), now, out, incident=inc)
                if repeat:  # said already, for this incident and reason
                    return
                self._audit(out, now, "blocked", f"isolation of {node} refused: {verdict.explanation}; escalated"
                            + (" with the breaker trip" if verdict.reason == "breaker_open" else ""),
                            incident=inc, node=node, rule=decision.rule, track="node")
                if verdict.reason != "breaker_open":  # the trip itself was escalated, once for the fleet
                    escalation = self.lifecycle.escalate(rec, now, issue, f"blocked:{verdict.reason}:{inc.id}",
                                                         f"isolation refused: {verdict.explanation}")
                    self._events(escalation, now, out, incident=inc)
                self._track(inc.id, node=node)
                return
            self.gate.record_isolation(node, now, critical)
            self.accounting.isolation_started(node, inc.incident_class, a.fault_at)
        before = len(out.commands)
        events = self.lifecycle.begin(rec, inc.id, decision.rule, steps, critical, a.fault_at, now,
                                      self._busy(node), issue, gpu=a.gpu)
        self._events(events, now, out, incident=inc)
        ids = [c.id for c in out.commands[before:]]
        if ids:
            self._audit(out, now, "command", f"{node}: {', '.join(c.action for c in out.commands[before:])} "
                        f"({decision.explanation})", incident=inc, node=node, rule=decision.rule, track="node",
                        command_ids=ids)
        self._track(inc.id, node=node)

    def _retry_blocked(self, rec: NodeRecord, now: float, out: Decisions) -> None:
        fleet = self._fleet_size()
        if now - rec.blocked_at > self.settings.safety.retry_blocked_s:
            why = (f"isolation refused ({rec.blocked_reason}) for {now - rec.blocked_at:.0f}s: evidence too old to act "
                   "on; it was escalated")
            incident_id = rec.incident_id
            self._events(self.lifecycle.drop_blocked(rec, now, why), now, out)
            t = self.state.tracks.get(incident_id)
            if t is not None:
                t.nodes = [n for n in t.nodes if n != rec.name]
            return
        verdict = self.gate.check_isolation(rec.name, now, fleet, self.topology.rack_of, self.topology.leaves_of,
                                            rec.critical)
        if not verdict.allowed:
            return
        self.gate.record_isolation(rec.name, now, rec.critical)
        inc = self.triage.state.incidents.get(rec.incident_id)
        self.accounting.isolation_started(rec.name, inc.incident_class if inc else "unknown", rec.evidence_at)
        plan, rec.blocked_reason = list(rec.plan), ""
        before = len(out.commands)
        events = self.lifecycle.begin(rec, rec.incident_id, rec.rule, plan, rec.critical, rec.evidence_at, now,
                                      self._busy(rec.name), self._issuer(now, out), gpu=rec.gpu)
        self._events(events, now, out)
        self._audit(out, now, "command", f"{rec.name}: budget available again, isolation proceeds", node=rec.name,
                    incident_id=rec.incident_id, rule=rec.rule, track="node",
                    command_ids=[c.id for c in out.commands[before:]])

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

    # --- advancing time -----------------------------------------------------------------------------

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

    def _advance(self, now: float, out: Decisions) -> None:
        deadline = self.triage.next_deadline()
        if deadline is not None and deadline <= now:
            for a in self.triage.due(now):
                self._act(a, now, out)
        if self.state.held and min(h.due for h in self.state.held) <= now:
            due = [h for h in self.state.held if h.due <= now]
            self.state.held = [h for h in self.state.held if h.due > now]
            for h in due:
                rec = self.triage.job(h.job)
                if rec is None or rec.attempt != h.attempt or rec.status != "failed":
                    state = f"attempt {rec.attempt} is {rec.status}" if rec else "it is gone"
                    self._audit(out, now, "skipped", f"{h.action} of {h.job} dropped: the job moved on ({state}) "
                                "during the backoff", job=h.job, incident_id=h.incident_id, track="job")
                    self._untrack(h.incident_id, now, out, job=h.job)
                    continue
                self.triage.expect_failure(h.job, h.attempt, now + self.settings.signing.command_ttl_s
                                           + self.settings.triage.failure_settle_s)
                self._job_command(out, now, h.id, h.action, h.incident_id, h.job, h.reason, h.params)

    def _advance_node(self, node: str, now: float, out: Decisions) -> None:
        rec = self.state.nodes.get(node)
        if rec is not None and rec.plan and rec.state != "suspect":
            self._events(self.lifecycle.advance(rec, now, self._busy(node), self._issuer(now, out)), now, out)

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

    def _node(self, node: str) -> NodeRecord:
        rec = self.state.nodes.get(node)
        if rec is None:
            rec = self.state.nodes[node] = NodeRecord(name=node)
        return rec

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
