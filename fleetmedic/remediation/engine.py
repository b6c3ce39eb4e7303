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
topology, opt-outs and cordon ownership; :meth:`DecisionEngine.node_removed` drops a deleted node.
Operator requests (:meth:`DecisionEngine.clear_node`, :meth:`DecisionEngine.node_repaired`,
:meth:`DecisionEngine.resume_breaker`) are audited.

Call :meth:`DecisionEngine.tick` every few seconds as well: failure reports are gathered for
``triage.failure_settle_s`` before deciding, retries wait for their backoff, and lifecycle
deadlines, probation and the breaker's resume rule run on it.

Commands carry deterministic ids (``<incident>/<action>/<target>/<attempt>``): replaying the same
inputs yields the same ids, and executors apply an id at most once. Job-track commands are never
blocked by node budgets; node-track isolation passes the :class:`~.safety.SafetyGate` first, and
when it is refused the engine escalates instead and says why in the audit.

The implementation is split for reading: :mod:`.engine_state` (the values and the state),
:mod:`.engine_core` (bookkeeping, audit, commands), :mod:`.engine_acting` (acting on assessments);
this module holds the public API.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from fleetmedic.config import Settings
from fleetmedic.records import Finding, JobEvent, NodeState, RemediationResult
from fleetmedic.remediation.engine_acting import EngineActing
from fleetmedic.remediation.engine_state import (
    STATE_VERSION,
    CommandInfo,
    Decisions,
    EngineState,
    HeldCommand,
    IncidentTracks,
    decode_state,
    encode_state,
)
from fleetmedic.remediation.lifecycle import OUT_OF_SERVICE
from fleetmedic.remediation.log_patterns import PatternLibrary
from fleetmedic.remediation.topology import Topology

__all__ = ["STATE_VERSION", "CommandInfo", "DecisionEngine", "Decisions", "EngineState", "HeldCommand",
           "IncidentTracks"]


class DecisionEngine(EngineActing):
    """Findings, job events, executor results and node observations in; incidents, commands and audit
    records out (see the module's docstring)."""

    # --- serialisation ------------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The whole state (msgpack). Restore with :meth:`from_bytes` and the same settings."""
        self.state.topology = self.topology.nodes
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
        why = self._out_of_service(finding)
        if why:
            # the node is isolated and being worked on (by fleetmedic, or by a person who cordoned it
            # for maintenance): what it reports now is mostly the echo of that work (links down during
            # a reboot, counters reset, diagnostics load); it must not open incidents or implicate its leaf
            if finding.node not in self.state.muted:
                self.state.muted[finding.node] = now
                self._audit(out, now, "skipped", f"{why}: its findings are not triaged "
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

    def node_removed(self, node: str, now: float) -> Decisions:
        """The node was deleted from the cluster: it leaves the topology (so the fleet size); what the
        engine holds about it (lifecycle, budget, history) is kept. A later observation adds it back."""
        now, out = self._begin(now)
        if node in self.topology:
            self.topology = Topology({n: p for n, p in self.topology.nodes.items() if n != node})
            self.triage.topology = self.topology
            self._audit(out, now, "state_change", f"{node} was deleted from the cluster: no longer counted in "
                        f"the fleet ({len(self.topology)} nodes)", node=node)
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
