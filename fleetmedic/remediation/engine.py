"""The decision engine: findings, job events, executor results and node observations in; incidents,
remediation commands and audit records out. Decide, then act: nothing here performs I/O.

Every input method takes ``now`` (epoch seconds; the engine never reads a clock and never lets its
own time run backwards) and returns a :class:`Decisions` value::

    engine = DecisionEngine(settings, topology)
    out = engine.on_finding(finding, now)          # also on_job_event, on_result, node_observed, tick
    producer.send_all(out.incidents, out.commands, out.audit)   # the stage signs commands first
    snapshot = engine.to_bytes()                   # the stage keeps it in a compacted Kafka topic

The engine reads no files: a stage loads the failure-log library named by
``triage.patterns_file`` with :func:`~fleetmedic.remediation.log_patterns.load_library` and passes
it in (default: the shipped library), and restores the engine with :meth:`DecisionEngine.from_bytes`
(see :mod:`fleetmedic.streams.state`). Node observations (:meth:`DecisionEngine.node_observed`:
cordon, who made it, labels) teach it the topology, opt-outs and cordon ownership;
:meth:`DecisionEngine.node_removed` drops a deleted node. Operator requests
(:meth:`DecisionEngine.clear_node`, :meth:`DecisionEngine.node_repaired`,
:meth:`DecisionEngine.resume_breaker`) are audited.

Call :meth:`DecisionEngine.tick` every few seconds as well: failure reports are gathered for
``triage.failure_settle_s`` before deciding, retries wait for their backoff, and lifecycle
deadlines, probation and the breaker's resume rule run on it.

Commands carry deterministic ids (``<incident>/<action>/<target>/<attempt>``): replaying the same
inputs yields the same ids, and executors apply an id at most once. Job-track commands are never
blocked by node budgets; node-track isolation passes the :class:`~.safety.SafetyGate` first, and
when it is refused the engine escalates instead and says why in the audit.

How it is put together: one :class:`~.engine_state.EngineState` (serialised whole) and the parts
that work on it, each held by the engine, which routes every input through them here —
finding -> :class:`~.triage.Triage` (incident) -> :class:`~.policy.Policy` (decision) ->
:class:`~.job_track.JobTrack` and :class:`~.node_track.NodeTrack` (commands, the node track through
the :class:`~.safety.SafetyGate` and the :class:`~.lifecycle.Lifecycle`), with
:class:`~.incident_tracks.IncidentTracker` (what an incident still waits for, its status and
publication), :class:`~.issuer.Issuer` (audit records and commands) and
:class:`~.accounting.Accounting` alongside.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from fleetmedic.config import Settings
from fleetmedic.records import Finding, JobEvent, NodeState, RankPlacement, RemediationCommand, RemediationResult
from fleetmedic.remediation.accounting import Accounting
from fleetmedic.remediation.engine_state import (
    NODE_CLASSES,
    STATE_VERSION,
    CommandInfo,
    Decisions,
    EngineState,
    HeldCommand,
    IncidentTracks,
    decode_state,
    encode_state,
)
from fleetmedic.remediation.incident_tracks import IncidentTracker
from fleetmedic.remediation.issuer import Issuer
from fleetmedic.remediation.job_track import JobTrack
from fleetmedic.remediation.lifecycle import OUT_OF_SERVICE, Lifecycle
from fleetmedic.remediation.log_patterns import PatternLibrary, default_library
from fleetmedic.remediation.node_track import NodeTrack
from fleetmedic.remediation.placements import among, changed_at
from fleetmedic.remediation.policy import Policy
from fleetmedic.remediation.safety import SafetyGate
from fleetmedic.remediation.sightings import Sightings
from fleetmedic.remediation.topology import Topology
from fleetmedic.remediation.triage import Assessment, Triage

__all__ = ["STATE_VERSION", "CommandInfo", "DecisionEngine", "Decisions", "EngineState", "HeldCommand",
           "IncidentTracks"]


class DecisionEngine:
    """Findings, job events, executor results and node observations in; incidents, commands and audit
    records out (see the module's docstring)."""

    def __init__(self, settings: Settings | None = None, topology: Topology | None = None,
                 library: PatternLibrary | None = None, state: EngineState | None = None) -> None:
        self.settings = s = settings or Settings()
        self.state = state if state is not None else EngineState()
        #: ``state.seen`` and the order its nodes were seen in (the forgetting looks only at the oldest)
        self.sightings = Sightings(self.state.seen)
        #: job -> the placement last read and its nodes: a job placed again on the same ranks (a
        #: lock-step job restarted where it ran) has its nodes read once
        self._placed_nodes: dict[str, tuple[list[RankPlacement], list[str]]] = {}
        #: what :meth:`suspected_nodes` last read, and the versions of what it was read from
        self._suspected: tuple[tuple[int, int, int, int] | None, frozenset[str]] = (None, frozenset())
        if topology is not None:
            self.state.topology = dict(topology.nodes)
        fleet = self._topology = Topology(self.state.topology)
        self.triage = Triage(s.triage, s.policy, library or default_library(), fleet, self.state.triage,
                             lambda: self.fleet_size)
        self.policy = Policy(s.policy)
        self.gate = SafetyGate(s.safety, self.state.safety)
        self.lifecycle = Lifecycle(s.policy, self._may_disrupt, self.gate.record_disruptive)
        self.accounting = Accounting(self.state.accounting)
        self.issuer = Issuer(s, self.state, self.gate, lambda: self.fleet_size)
        self.incidents = IncidentTracker(s, self.state, self.triage, self.issuer)
        self.nodes = NodeTrack(s, self.state, fleet, self.triage, self.gate, self.lifecycle, self.accounting,
                               self.issuer, self.incidents, lambda: self.fleet_size)
        self.jobs = JobTrack(s, self.state, self.triage, self.gate, self.accounting, self.issuer, self.incidents,
                             self.nodes.state_of, self.suspected_nodes, self.nodes.unhealthy,
                             self.nodes.keeps_jobs,
                             lambda: (self.gate.changes, self.nodes.unhealthy_changes))

    @property
    def topology(self) -> Topology:
        """Where the nodes sit, as learned so far; triage and the node track always see the same one."""
        return self._topology

    @topology.setter
    def topology(self, topology: Topology) -> None:
        self._topology = self.triage.topology = self.nodes.topology = topology

    @property
    def fleet_size(self) -> int:
        """The nodes of the fleet, from the first source that names any (:attr:`fleet_source`): the
        cluster's node list (the node watch, :meth:`node_observed`), else the topology given, else the
        nodes telemetry, findings and placements showed within ``safety.fleet_forget_after_s``.
        Telemetry never adds to a node list or a topology: names only telemetry carries cannot grow
        the budgets and breaker levels that scale with it."""
        if self.state.cluster:
            return len(self.state.cluster)
        if self._topology.nodes:
            return len(self._topology)
        return len(self.state.seen)

    @property
    def fleet_source(self) -> str:
        """Where :attr:`fleet_size` comes from: ``cluster``, ``topology`` or ``telemetry``."""
        return "cluster" if self.state.cluster else "topology" if self._topology.nodes else "telemetry"

    def nodes_seen(self, nodes: Iterable[str], now: float) -> None:
        """Telemetry (stage 1's node summaries, GPU records) showed ``nodes``: they are the fleet
        when neither the node watch nor a topology names it. O(1) a node: cheap enough to call for
        every batch."""
        self.sightings.nodes(nodes if isinstance(nodes, list) else list(nodes), now)

    # --- serialisation ------------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The whole state (msgpack). Restore with :meth:`from_bytes` and the same settings."""
        self.state.topology = self.topology.nodes
        self.sightings.write()
        self.triage.write_state()
        return encode_state(self.state)

    @classmethod
    def from_bytes(cls, data: bytes, settings: Settings | None = None,
                   library: PatternLibrary | None = None) -> DecisionEngine:
        state = decode_state(data)
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
        if finding.kind != "network" and not self.topology.is_switch(finding.node):
            self.nodes_seen((finding.node,), now)
        if finding.detector == "node_condition":
            self.nodes.condition(finding, now, out)
        why = self.nodes.out_of_service(finding)
        if why and not self.nodes.new_evidence(finding):
            # the node is isolated and being worked on (by fleetmedic, or by a person who cordoned it
            # for maintenance): what it reports now is mostly the echo of that work (links down during
            # a reboot, counters reset, diagnostics load); it must not open incidents or implicate its leaf
            self.nodes.note_muted(finding, now)
            if finding.node not in self.state.muted:
                self.state.muted[finding.node] = now
                self.issuer.audit(out, now, "skipped", f"{why}: its findings are not triaged "
                                  f"until it is back in service (first: {finding.summary})", node=finding.node)
        else:
            if not why:
                self.state.muted.pop(finding.node, None)
            for a in self.triage.add_finding(finding, now):
                self._act(a, now, out)
        self._advance(now, out)
        return self._finish(now, out)

    def on_job_event(self, event: JobEvent, now: float) -> Decisions:
        now, out = self._begin(now)
        rec_before = self.triage.job(event.job)
        old_nodes = rec_before.nodes if rec_before else []  # (read-only: a placement replaces the list)
        if event.event in ("start", "placement", "restart"):
            self.triage.forget_decision(event.job, event.attempt)  # a new run of that attempt
        if event.placement:
            last = self._placed_nodes.get(event.job)
            if last is not None and last[0] == event.placement:  # the same records: compared by identity
                placed = last[1]
            else:
                placed = _placed_nodes(event.placement, last)
                self._placed_nodes[event.job] = (list(event.placement), placed)
            self.sightings.placement(event.job, placed, now)
        for note in self.triage.add_job_event(event, now):
            self.issuer.audit(out, now, "skipped", note, job=event.job)
        self.jobs.on_event(event, now, out)
        if event.event in ("failure", "completion"):
            # a job boundary may have been reached: the plans of its nodes may go on
            # (the job's nodes are sorted and distinct: so are those of them that wait; a job on few
            # nodes looks them up, the advance takes only those that wait)
            if len(old_nodes) > 64:
                waiting = {n for n, r in self.state.nodes.items() if r.plan and r.state != "suspect"}
                if len(old_nodes) > len(waiting):
                    old_nodes = [n for n in sorted(waiting) if among(old_nodes, n)]
            for node in old_nodes:
                self.nodes.advance(node, now, out)
        self._advance(now, out)
        return self._finish(now, out)

    def on_result(self, result: RemediationResult, now: float) -> Decisions:
        now, out = self._begin(now)
        info = self.state.commands.get(result.command_id)
        if info is not None and info.track == "node" and info.node in self.state.nodes:
            self.nodes.on_result(info, result, now, out)
        elif info is not None and info.track == "job" and result.outcome == "failed":
            self.jobs.on_failed_result(info, result, now, out)
        self._advance(now, out)
        return self._finish(now, out)

    def node_observed(self, node: str, *, cordoned: bool, cordoned_by_fleetmedic: bool,
                      labels: Mapping[str, str] | None = None, now: float, listed: bool = True) -> Decisions:
        """What the node watch sees on a node: its cordon (and who made it) and its labels.
        ``listed``: the observation comes from the cluster's node list, so the node counts in the
        fleet; False for a cordon seen without the list (the simulator's executor), which changes
        neither the fleet nor the topology of a node not placed yet."""
        now, out = self._begin(now)
        labels = labels or {}
        t = self.settings.triage
        if listed:
            self.state.cluster.setdefault(node, now)
        if listed or node in self.topology:
            self.topology.place_labels(node, labels, t.rack_label, t.leaf_label, t.pool_label)
        self.nodes.observed(node, cordoned, cordoned_by_fleetmedic, labels, now, out)
        self._advance(now, out)
        return self._finish(now, out)

    def node_removed(self, node: str, now: float) -> Decisions:
        """The node was deleted from the cluster: it leaves the topology and the nodes seen (so the
        fleet size), and releases what it held (its budget or definitive hold, its lifecycle record,
        its refusal clock). A later observation adds it back, as a new node."""
        now, out = self._begin(now)
        known = node in self.topology or node in self.state.seen or node in self.state.nodes
        self.topology.remove(node)
        self.sightings.remove(node)
        self.state.cluster.pop(node, None)
        released = self.nodes.removed(node, now)
        if known:
            self.issuer.audit(out, now, "state_change", f"{node} was deleted from the cluster: no longer counted "
                              f"in the fleet ({self.fleet_size} nodes)"
                              + (f"; released {released}" if released else ""), node=node)
        return self._finish(now, out)

    def tick(self, now: float) -> Decisions:
        """Deadlines, backoffs, settle windows, probation, blocked isolations, breaker resume, pruning."""
        now, out = self._begin(now)
        self._advance(now, out)
        self._forget_unseen(now)
        fleet = self.fleet_size
        self.nodes.tick(now, out)
        self.jobs.follow_suspects(now, out)
        self.jobs.recoveries(now, out)
        if self.gate.breaker.poll(now, fleet, self.topology):
            self.issuer.audit(out, now, "breaker_resumed", f"circuit breaker closed by rule (resume: auto) after "
                              f"{self.settings.safety.breaker.auto_resume_after_s:g}s with suspicion below the trip "
                              "level")
        self.incidents.close_stale(now, out)
        self._prune(now)
        self.accounting.fleet(fleet, now)
        return self._finish(now, out)

    # --- the route: an assessment -> its incident -> a decision -> commands ----------------------------

    def _act(self, a: Assessment, now: float, out: Decisions) -> None:
        inc = a.incident
        probation = {n for n in a.suspect_nodes if self.nodes.state_of(n) == "probation"}
        if not a.confirmed and not probation:  # watched, not yet published
            if a.new:
                c = self.settings.triage
                self.issuer.audit(out, now, "skipped", f"{a.explanation}: {inc.severity} evidence not yet seen "
                                  f"{c.warning_confirmations} times over {c.warning_confirm_min_span_s:g}s: "
                                  "watching, no incident published, no action yet", incident=inc)
            return
        if self.incidents.publish(inc, out) or a.job:
            self.issuer.audit(out, now, "incident", ("new: " if a.new else "updated: ") + a.explanation,
                              incident=inc, job=a.job, node=(a.suspect_nodes or ("",))[0])
        self._count_failure(a, now, out)
        decision = self.policy.decide(a, probation)
        issued_before = len(out.commands)
        self.jobs.act(a, decision, now, out)
        for node in a.suspect_nodes:
            self.nodes.act(node, a, decision, now, out)
        if decision.node_steps and not a.suspect_nodes:
            self.nodes.escalate_switches(a, decision, now, out)
        if not decision.rule:
            self.issuer.audit(out, now, "skipped", decision.explanation, incident=inc)
            if a.new:
                self.incidents.set_status(inc.id, "dismissed", now, out)
        elif len(out.commands) > issued_before:
            self.incidents.set_status(inc.id, "mitigating", now, out)

    def _count_failure(self, a: Assessment, now: float, out: Decisions) -> None:
        """Account the failed job (and one that failed on a node already held), and the node failure
        the first time the incident is decided on."""
        inc = a.incident
        if a.job:
            self.accounting.job_failed(inc.incident_class)
            for n in a.suspect_nodes:
                if self.gate.holds(n) and self.state.nodes[n].cordon_owned:
                    self.accounting.repeat_failure()
                    self.issuer.audit(out, now, "repeat_placement", f"job {a.job} failed on {n}, which fleetmedic "
                                      "holds out of service: the job was placed there before the cordon took effect",
                                      incident=inc, node=n, job=a.job)
        if self.incidents.first_decision(inc.id) and inc.incident_class in NODE_CLASSES and a.suspect_nodes:
            self.accounting.node_failed(inc.incident_class, len(a.suspect_nodes))

    def _advance(self, now: float, out: Decisions) -> None:
        """Act on what became due: triage groups that settled, then job retries whose backoff passed."""
        deadline = self.triage.next_deadline()
        if deadline is not None and deadline <= now:
            for a in self.triage.due(now):
                self._act(a, now, out)
        self.jobs.release_due(now, out)

    # --- a call's frame, housekeeping -----------------------------------------------------------------

    def _begin(self, now: float) -> tuple[float, Decisions]:
        now = max(float(now), self.state.clock)
        self.state.clock = now
        return now, Decisions()

    def _finish(self, now: float, out: Decisions) -> Decisions:
        if self.state.moving and (out.commands or out.incidents):
            # what this input decided may add suspects: restarts that wait for capacity learn them now,
            # not at the next tick, so the scheduler does not place them there meanwhile
            self.jobs.follow_suspects(now, out)
        if len(out.commands) > 1:
            # isolate, then move: cordons and the exclusions of waiting restarts go out before the
            # restarts and drains that free a node, so the scheduler never refills a suspect node
            # with a waiting job in between
            out.commands.sort(key=_command_order)
        self.issuer.explain_commands(out, now)
        return out

    def _prune(self, now: float) -> None:
        self.triage.prune(now)
        jobs = self.triage.state.jobs
        if len(self._placed_nodes) > len(jobs):  # some job triage forgot: so is its placement
            self._placed_nodes = {j: v for j, v in self._placed_nodes.items() if j in jobs}
        s, p = self.settings, self.settings.policy
        self.issuer.forget_commands(now - max(s.signing.command_ttl_s, p.action_timeout_s, p.diagnostics_timeout_s) * 2,
                                    self.nodes.waits_for, self.nodes.changed_for_commands())
        self.nodes.forget_idle(now)
        self.incidents.forget_gone()

    def _forget_unseen(self, now: float) -> None:
        """Nodes telemetry showed, silent for ``fleet_forget_after_s`` and not worked on, leave the
        telemetry's fleet (a node that is down but held or waiting stays counted)."""
        self.sightings.forget(now, self.settings.safety.fleet_forget_after_s,
                              lambda n: self.nodes.state_of(n) == "healthy" and not self.gate.holds(n))

    def _may_disrupt(self, node: str, action: str, now: float) -> bool:
        return self.gate.check_disruptive(node, action, now).allowed

    # --- operator commands (audited) ------------------------------------------------------------------

    def clear_node(self, node: str, *, actor: str, reason: str, now: float) -> Decisions:
        """An operator vouches for a node: return it to service now (no diagnostics), forget its flaps."""
        now, out = self._begin(now)
        self.nodes.clear(node, actor, reason, now, out)
        return self._finish(now, out)

    def node_repaired(self, node: str, *, actor: str, reason: str, now: float) -> Decisions:
        """A human repaired a node awaiting repair: validate it with diagnostics before it returns."""
        now, out = self._begin(now)
        self.nodes.repaired(node, actor, reason, now, out)
        return self._finish(now, out)

    def resume_breaker(self, *, actor: str, reason: str, now: float) -> Decisions:
        now, out = self._begin(now)
        if self.gate.breaker.state.open:
            self.gate.breaker.close()
            self.issuer.audit(out, now, "breaker_resumed", f"circuit breaker closed by {actor}: {reason}", actor=actor)
        return self._finish(now, out)

    # --- queries ------------------------------------------------------------------------------------

    def node_state(self, node: str) -> NodeState:
        return self.nodes.state_of(node)

    def nodes_in(self, *states: NodeState) -> list[str]:
        return sorted(n for n, r in self.state.nodes.items() if r.state in states)

    def suspected_nodes(self) -> set[str]:
        """Every node fleetmedic suspects now, whatever the budget, breaker or confirmation decides
        about isolating it: held, waiting (settling, refused), worked on (not yet cordoned, diagnosing,
        awaiting repair), or named by an open node incident whose evidence is still being confirmed
        (unless the node passed diagnostics and returned to service since the incident's last evidence).
        A restart or requeue excludes them all."""
        returned, unhealthy = self.nodes.in_probation(), self.nodes.unhealthy()
        # read again only when the incidents, the nodes in probation or unhealthy, or the holds changed
        key = (self.triage.book.version, self.nodes.probation_changes, self.nodes.unhealthy_changes,
               self.gate.changes)
        if self._suspected[0] != key:
            named = self.triage.suspected_nodes(NODE_CLASSES, returned, gathering=False)
            named.update(unhealthy)
            named.update(self.gate.state.held)
            self._suspected = (key, frozenset(named))
        out = set(self._suspected[1])  # (the callers' to change)
        out.update(self.triage.gathering())
        return out

    def cordons_in_flight(self) -> dict[str, str]:
        """The nodes fleetmedic decided to take out of service whose cordon it has issued and not yet
        seen applied, each with why: what a bind-time check refuses (``admission``), closing the
        window between the decision and the cordon in which the scheduler may still place a pod
        there. Once the cordon is applied, the scheduler's own check takes over (with its
        tolerations: DaemonSets, diagnostics)."""
        nodes = self.state.nodes
        out: dict[str, str] = {}
        for n in self.nodes.unhealthy():
            rec = nodes.get(n)
            if rec is not None and rec.state in OUT_OF_SERVICE and any(f.action == "cordon" for f in rec.inflight):
                out[n] = f"{rec.state} ({rec.isolation or 'isolation'} evidence, {rec.signature or rec.rule})"
        return out

    @property
    def breaker_open(self) -> bool:
        return self.gate.breaker.state.open

    def breaker_calm(self, now: float) -> bool:
        """Every breaker count is below its level now (what ``resume: auto`` waits for)."""
        return self.gate.breaker.calm(now, self.fleet_size, self.topology)

    def report(self, now: float) -> dict[str, Any]:
        states: dict[str, int] = {}
        for r in self.state.nodes.values():
            states[r.state] = states.get(r.state, 0) + 1
        fleet = self.fleet_size
        return {
            **self.accounting.report(now),
            "nodes": dict(sorted(states.items())),
            "budget": {**msgspec.to_builtins(self.gate.snapshot(now, fleet)),
                       "definitive_held": self.gate.definitive_held(),
                       "confirmed_held": self.gate.confirmed_held(),
                       "definitive_isolations": self.gate.state.definitive_isolations,
                       "fleet_source": self.fleet_source},
            "breaker_trips": self.gate.breaker.state.trips,
        }


def _placed_nodes(placement: list[RankPlacement], last: tuple[list[RankPlacement], list[str]] | None) -> list[str]:
    """The named nodes of ``placement``'s ranks, in rank order. ``last`` (the job's last placement and
    its nodes, every rank named): a placement of the same size with few ranks changed takes its
    nodes and names the changed ranks' (:mod:`.placements`)."""
    if last is not None and len(last[0]) == len(last[1]):
        at = changed_at(last[0], placement)
        if at is not None and all(placement[i].node for i in at):
            nodes = last[1].copy()
            for i in at:
                nodes[i] = placement[i].node
            return nodes
    return [p.node for p in placement if p.node]


def _command_order(c: RemediationCommand) -> int:
    if c.action in ("cordon", "taint"):
        return 0
    if c.params.get("only_if_waiting") == "true":
        return 1
    return 2
