"""The node track: what fleetmedic does to nodes. Each node's lifecycle record; isolation passes the
safety gate (the breaker, the budgets, by the kind of evidence: definitive, preventive, uncertain)
before the lifecycle plan starts, and a refusal escalates instead; preventive candidates settle
first (``safety.settle_s``) so that a storm trips the breaker before they act;
refused isolations are retried until they proceed or an operator clears the node (never dropped by
a timeout: a refused node stays suspect, and its refusal clock runs); switches, which cannot be
isolated, are escalated for repair; what the executor reports and observes of a node moves its
lifecycle; a node deleted from the cluster releases what it held; and every lifecycle event becomes
audit records, accounting and incident tracking."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from fleetmedic.actions import DISRUPTIVE, ISOLATING, command_id
from fleetmedic.config import Settings
from fleetmedic.records import Finding, Incident, NodeState, RemediationResult
from fleetmedic.remediation.accounting import Accounting
from fleetmedic.remediation.engine_state import CommandInfo, Decisions, EngineState
from fleetmedic.remediation.incident_tracks import IncidentTracker
from fleetmedic.remediation.issuer import Issuer
from fleetmedic.remediation.kinds import Isolation, kind_of
from fleetmedic.remediation.lifecycle import (
    OUT_OF_SERVICE,
    Issue,
    Lifecycle,
    LifecycleEvent,
    NodeRecord,
    PlanStep,
    signature_metric,
)
from fleetmedic.remediation.policy import Decision
from fleetmedic.remediation.safety import SafetyGate, Verdict, domain_keys
from fleetmedic.remediation.topology import Topology
from fleetmedic.remediation.triage import Assessment, Triage, finding_isolation, is_hardware_finding
from fleetmedic.remediation.triage.records import finding_class

#: the gate's refusals that depend on the holds, the breaker, the fleet's size and the topology only
STANDING_REFUSALS: Final = frozenset({"max_held", "rack", "switch", "preventive_share", "breaker_open"})


class NodeTrack:
    def __init__(self, settings: Settings, state: EngineState, topology: Topology, triage: Triage,
                 gate: SafetyGate, lifecycle: Lifecycle, accounting: Accounting, issuer: Issuer,
                 incidents: IncidentTracker, fleet_size: Callable[[], int] | None = None) -> None:
        self.settings = settings
        self.state = state
        self.topology = topology  # the engine replaces it as it learns the fleet
        self.triage = triage
        self.gate = gate
        self.lifecycle = lifecycle
        self.accounting = accounting
        self.issuer = issuer
        self.incidents = incidents
        self.fleet_size: Callable[[], int] = fleet_size or (lambda: len(self.topology))
        # What the housekeeping looks at: a record changes only through the node track, which notes
        # its name when it takes the record to change it (:meth:`_changing`), so a record the tick
        # found with nothing to do, or the forgetting found marked, is looked at again only after a
        # change. None: every record (after a restore).
        self._for_tick: set[str] | None = None  # every record the tick may have something to do for
        self._sleeping: list[tuple[float, str]] = []  # (when, node): a record the tick has something for then
        self._for_forget: set[str] | None = None  # every record changed since the last forgetting
        self._for_commands: set[str] | None = None  # ... since :meth:`changed_for_commands`
        self._for_unhealthy: set[str] | None = None  # ... since :meth:`unhealthy`
        self._unhealthy: set[str] = set()
        self.unhealthy_changes = 0  # moves on whenever :meth:`unhealthy` gains or loses a node
        self._probation: dict[str, float] = {}
        self.probation_changes = 0  # moves on whenever :meth:`in_probation` changes
        # (returned_at, node): a record kept only for its definitive return, forgotten once that expires
        self._remembered: list[tuple[float, str]] = []
        self._remembering: set[str] = set()
        #: node -> a waiting isolation's last refusal that stands until what it was decided on changes
        #: (:meth:`_recheck`): what it was decided on, the topology, and the verdict
        self._refusals: dict[str, tuple[tuple[object, ...], Topology, Verdict]] = {}
        #: the waiting isolations whose refusal stands, by what it was decided on (the gate's key and the
        #: topology): the tick leaves them until that changes, their record changes, or their long
        #: refusal is to be escalated (they sleep until then)
        self._standing: dict[tuple[object, ...], tuple[Topology, set[str]]] = {}
        self._new_standing: set[str] = set()  # marked standing during this tick

    def _changing(self, node: str) -> None:
        for names in (self._for_tick, self._for_forget, self._for_commands, self._for_unhealthy):
            if names is not None:
                names.add(node)
        self._new_standing.discard(node)  # (its refusal is read again at the next tick)

    def changed_for_commands(self) -> set[str] | None:
        """The nodes whose records changed since the last call (None: any may have)."""
        changed, self._for_commands = self._for_commands, set()
        return changed

    def unhealthy(self) -> set[str]:
        """The nodes whose records are neither healthy nor in probation (kept up to date as they change)."""
        self._follow_states()
        return self._unhealthy

    def in_probation(self) -> dict[str, float]:
        """The nodes in probation (returned to service) and since when (kept up to date as they change)."""
        self._follow_states()
        return self._probation

    def _follow_states(self) -> None:
        nodes, changed = self.state.nodes, self._for_unhealthy
        self._for_unhealthy = set()
        if changed is None:
            self._unhealthy = {n for n, r in nodes.items() if r.state not in ("healthy", "probation")}
            self._probation = {n: r.since for n, r in nodes.items() if r.state == "probation"}
            self.unhealthy_changes += 1
            self.probation_changes += 1
            return
        unhealthy = self._unhealthy
        for n in changed:
            r = nodes.get(n)
            state = r.state if r is not None else "healthy"
            if (state in ("healthy", "probation")) == (n in unhealthy):  # it joins or leaves
                self.unhealthy_changes += 1
            if state in ("healthy", "probation"):
                unhealthy.discard(n)
            else:
                unhealthy.add(n)
            if r is not None and state == "probation":
                if self._probation.get(n) != r.since:
                    self._probation[n] = r.since
                    self.probation_changes += 1
            elif self._probation.pop(n, None) is not None:
                self.probation_changes += 1

    # --- the nodes ----------------------------------------------------------------------------------

    def record(self, node: str) -> NodeRecord:
        """The node's lifecycle record, created (healthy) on first use, to be changed."""
        rec = self.state.nodes.get(node)
        if rec is None:
            rec = self.state.nodes[node] = NodeRecord(name=node)
        self._changing(node)
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

    def note_muted(self, finding: Finding, now: float) -> None:
        """A finding on a node out of service that repeats what the node was isolated on: that
        evidence is still there (unless a reset or reboot in flight explains it), and a passing
        diagnostic soon after does not return the node (the lifecycle's verdict)."""
        rec = self._held_quiet(finding)
        if rec is not None and rec.signature and supports(finding, rec.signature):
            self._changing(rec.name)
            rec.evidence_seen = now

    def _held_quiet(self, finding: Finding) -> NodeRecord | None:
        """The record of the node fleetmedic holds out of service that ``finding`` is about, when
        the finding may be evidence: not a node condition (those have their own path) and not
        reported while a reset or reboot is in flight (what the node reports then is its echo)."""
        rec = self.state.nodes.get(finding.node)
        if (rec is None or rec.state not in OUT_OF_SERVICE or finding.detector == "node_condition"
                or any(f.action in DISRUPTIVE for f in rec.inflight)):
            return None
        return rec

    def new_evidence(self, finding: Finding) -> bool:
        """Whether ``finding`` on a node fleetmedic holds out of service is hardware evidence of a
        fault the hold does not cover, so it is triaged (its incident published, the hold upgraded,
        the repair ticket amended) instead of muted as an echo of the work on the node. Not while a
        reset or reboot is in flight (what it reports then is the echo), not what the hold rests on
        or its GPU repeats, and not a preventive symptom while diagnostics load the node."""
        rec = self._held_quiet(finding)
        if rec is None or not is_hardware_finding(finding):
            return False
        if rec.signature and supports(finding, rec.signature):
            return False
        if finding.gpu is not None and finding.gpu == rec.gpu:
            return False
        diagnosing = any(f.action == "run_diagnostics" for f in rec.inflight)
        return not (diagnosing and finding_isolation(finding).kind == "preventive")

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
        iso = a.isolation_of(node)
        isolating = any(s.action in ISOLATING for s in steps)
        if isolating and self.gate.holds(node):
            self.gate.record_isolation(node, now, critical, kind=iso.kind)  # a hold's kind may get stronger
        note = ""
        if isolating and not self.gate.holds(node) and rec.state not in OUT_OF_SERVICE:
            acquitted = self.acquitted(rec, iso, now)
            if acquitted:
                self.issuer.audit(out, now, "skipped", f"{node}: {iso.kind} evidence ({iso.signature}) not acted on: "
                                  f"{acquitted}", incident=inc, node=node, rule=decision.rule, track="node")
                self.incidents.track(inc.id, node=node)
                return
            verdict = self._isolate(rec, a, decision, steps, critical, iso, issue, now, out)
            if not verdict.allowed:
                return
            note = f"; {verdict.explanation}" if verdict.reason else ""
        before = len(out.commands)
        events = self.lifecycle.begin(rec, inc.id, decision.rule, steps, critical, a.fault_at, now,
                                      self.busy(node), issue, gpu=a.gpu, iso=iso)
        self.apply(events, now, out, incident=inc)
        ids = [c.id for c in out.commands[before:]]
        if ids:
            self.issuer.audit(out, now, "command", f"{node}: {', '.join(c.action for c in out.commands[before:])} "
                              f"({decision.explanation}){note}", incident=inc, node=node, rule=decision.rule,
                              track="node", command_ids=ids)
        self.incidents.track(inc.id, node=node)

    def _isolate(self, rec: NodeRecord, a: Assessment, decision: Decision, steps: list[PlanStep], critical: bool,
                 iso: Isolation, issue: Issue, now: float, out: Decisions) -> Verdict:
        """Ask the gate to take ``rec`` out of service, noting the suspicion with the breaker first.
        Preventive candidates first wait ``settle_s`` (settling), so a storm of degradation trips the
        breaker before any of them is isolated; the tick asks the gate then. Refused: the node waits,
        suspect, and the refusal is escalated; it is retried until it proceeds or an operator clears it."""
        inc, node = a.incident, rec.name
        self._note_suspicion(node, iso, inc, now, out)
        waiting = rec.state == "suspect" and bool(rec.blocked_reason)
        settle = self.settings.safety.settle_s
        if iso.kind == "preventive" and settle > 0 and (not waiting or rec.blocked_reason == "settling"):
            if not waiting:
                self.issuer.audit(out, now, "skipped", f"{node}: {iso.kind} evidence ({iso.signature}); isolation "
                                  f"waits {settle:g}s (safety.settle_s) for the breaker to see whether the "
                                  "suspicion is correlated", incident=inc, node=node, rule=decision.rule, track="node")
            self.apply(self.lifecycle.block(rec, "settling", steps, inc.id, decision.rule, critical, a.fault_at, now,
                                            iso, why=f"waiting {settle:g}s before isolating ({iso.kind} evidence)"),
                       now, out, incident=inc)
            self.incidents.track(inc.id, node=node)
            return Verdict(allowed=False, reason="settling")
        verdict = self._check(node, iso, critical, now, stopped=rec.blocked_reason == "breaker_open")
        if verdict.allowed:
            self._admitted(node, iso, critical, inc.incident_class, a.fault_at, now)
            return verdict
        self._refused(rec, verdict, steps, inc.id, decision.rule, critical, a.fault_at, iso, issue, now, out, inc)
        return verdict

    def _note_suspicion(self, node: str, iso: Isolation, inc: Incident | None, now: float, out: Decisions) -> None:
        breaker = self.gate.breaker
        if breaker.note_suspicion(node, now, self.fleet_size(), iso.signature, self.topology):
            incident_id = inc.id if inc else ""
            self.issuer.audit(out, now, "breaker_tripped", f"circuit breaker open: {breaker.state.opened_reason}; "
                              f"{breaker.scope_text()} stops until it resumes"
                              + (", except of nodes whose devices are gone" if
                                 self.settings.safety.breaker.pass_lost_devices else ""),
                              incident=inc, incident_id=incident_id, node=node)
            self.issuer.command(out, now, f"breaker/{breaker.state.trips}/escalate", "escalate", incident_id, "",
                                f"circuit breaker open: {breaker.state.opened_reason}",
                                {"scope": "fleet", "reason": "breaker_open", "escalation": "notify"}, node=node,
                                track="node")

    def acquitted(self, rec: NodeRecord | None, iso: Isolation, now: float) -> str:
        """Why preventive evidence does not isolate ``rec``'s node again ("": it does): its
        diagnostics passed within ``policy.acquittal_s`` after an isolation on evidence of the same
        metrics (``policy.acquitted_metrics``, which the diagnostics test under load)."""
        p = self.settings.policy
        if (rec is None or iso.kind != "preventive" or not rec.acquitted_at or now - rec.acquitted_at > p.acquittal_s
                or signature_metric(iso.signature) not in p.acquitted_metrics):
            return ""
        return (f"its diagnostics passed {now - rec.acquitted_at:.0f}s ago after an isolation on "
                f"{', '.join(p.acquitted_metrics)} evidence, which they test under load (policy.acquittal_s)")

    def keeps_jobs(self, a: Assessment, now: float) -> str:
        """Why the running jobs an assessment hits are not moved ("": they are): the open breaker
        stops isolating a node it suspects, or every node it suspects is acquitted of its evidence."""
        if self.breaker_stops(a):
            return "circuit breaker open"
        nodes = a.suspect_nodes
        if nodes and all(self.acquitted(self.state.nodes.get(n), a.isolation_of(n), now) for n in nodes):
            return "its diagnostics acquitted the node of this evidence (policy.acquittal_s)"
        return ""

    def breaker_stops(self, a: Assessment) -> bool:
        """Does the open breaker stop isolating any node this assessment suspects (every assessment
        while it stops all isolation; one without suspect nodes while it is open)?"""
        breaker = self.gate.breaker
        if not breaker.state.open:
            return False
        topo = self.topology
        return not a.suspect_nodes or any(
            breaker.stops(a.isolation_of(n).signature, domain_keys(n, topo.rack_of, topo.leaves_of))
            for n in a.suspect_nodes)

    def _check(self, node: str, iso: Isolation, critical: bool, now: float, stopped: bool = False) -> Verdict:
        """The gate's verdict; ``stopped``: the open breaker already stopped this node, so its further
        evidence (one fault shows several signatures) waits with it."""
        return self.gate.check_isolation(node, now, self.fleet_size(), self.topology.rack_of, self.topology.leaves_of,
                                         critical, kind=iso.kind, device_gone=iso.device_gone,
                                         signature=iso.signature, domains=self.topology, stopped=stopped)

    def _recheck(self, node: str, iso: Isolation, critical: bool, now: float, stopped: bool) -> Verdict:
        """:meth:`_check` for a waiting isolation, retried at every tick: a refusal on the holds (the
        budget, a rack or switch full, the preventive share) or by the open breaker depends on the
        holds, the breaker, the fleet's size and the topology only (the window's isolations, which time
        only lessens, had room for it), so it stands, not asked again, until one of them changes."""
        key = (self._gate_key(), iso, critical, stopped)
        last = self._refusals.get(node)
        if last is not None and last[1] is self.topology and last[0] == key:
            return last[2]
        verdict = self._check(node, iso, critical, now, stopped=stopped)
        if not verdict.allowed and verdict.reason in STANDING_REFUSALS:
            self._refusals[node] = (key, self.topology, verdict)
        else:
            self._refusals.pop(node, None)
        return verdict

    def _gate_key(self) -> tuple[object, ...]:
        """What a standing refusal was decided on, the topology aside: the holds' changes, the breaker
        and the fleet's size."""
        b = self.gate.breaker.state
        return (self.gate.changes, b.open, b.opened_at, tuple(b.tripped_signatures), tuple(b.tripped_domains),
                b.tripped_fleet, self.fleet_size(), self.topology.changes)

    def _stands(self, rec: NodeRecord, verdict: Verdict, escalated: bool) -> None:
        """``rec``'s refusal stands (:meth:`_recheck` kept it): the tick leaves the record until the
        gate's key or the topology changes, the record changes, or (``escalated`` not yet) its refusal
        has lasted ``safety.retry_blocked_s``."""
        last = self._refusals.get(rec.name)
        if last is None or last[2] is not verdict:
            return
        key = (last[0][0], id(last[1]))  # (the group holds the topology: its id is not reused meanwhile)
        group = self._standing.get(key)
        if group is None:
            group = self._standing[key] = (last[1], set())
        group[1].add(rec.name)
        self._new_standing.add(rec.name)
        if not escalated:
            heapq.heappush(self._sleeping, (rec.blocked_at + self.settings.safety.retry_blocked_s, rec.name))

    def _admitted(self, node: str, iso: Isolation, critical: bool, klass: str, evidence_at: float,
                  now: float) -> None:
        self.gate.record_isolation(node, now, critical, kind=iso.kind, signature=iso.signature)
        self.accounting.refusal_ended(node, now)
        self.accounting.isolation_started(node, klass, evidence_at)

    def _refused(self, rec: NodeRecord, verdict: Verdict, steps: list[PlanStep], incident_id: str, rule: str,
                 critical: bool, evidence_at: float, iso: Isolation, issue: Issue, now: float, out: Decisions,
                 inc: Incident | None = None) -> None:
        """The gate refused: the node waits, suspect (its refusal clock runs); the first refusal for an
        incident and reason is audited (``blocked``) and escalated."""
        node = rec.name
        # said already while this wait lasts (a dead node left schedulable keeps failing jobs: each failure is
        # evidence again, not news); a new incident's escalation still goes out below, once per key
        repeat = rec.state == "suspect" and rec.blocked_reason == verdict.reason
        self.apply(self.lifecycle.block(rec, verdict.reason, steps, incident_id, rule, critical, evidence_at, now, iso),
                   now, out, incident=inc)
        kind = kind_of(rec.isolation, rec.critical)
        self.accounting.refused(node, kind, now)
        self.incidents.track(incident_id, node=node)
        if repeat:
            if verdict.reason != "breaker_open":
                self.apply(self.lifecycle.escalate(rec, now, issue, f"blocked:{verdict.reason}:{incident_id}",
                                                   f"isolation refused ({kind} evidence): {verdict.explanation}"),
                           now, out, incident=inc)
            return
        danger = " Its device is gone: it stays schedulable (dangerous) until this is resolved." \
            if rec.device_gone else (" Definitive evidence: it stays schedulable (dangerous) until this is resolved."
                                     if kind == "definitive" else "")
        self.issuer.audit(out, now, "blocked", f"isolation of {node} ({kind} evidence, {rec.signature}) refused: "
                          f"{verdict.explanation}; escalated"
                          + (" with the breaker trip" if verdict.reason == "breaker_open" else "")
                          + f"; it stays suspect and is retried.{danger}",
                          incident=inc, incident_id=incident_id, node=node, rule=rule, track="node")
        if verdict.reason != "breaker_open":  # the trip itself was escalated, once for the fleet
            escalation = self.lifecycle.escalate(rec, now, issue, f"blocked:{verdict.reason}:{incident_id}",
                                                 f"isolation refused ({kind} evidence): {verdict.explanation}")
            self.apply(escalation, now, out, incident=inc)

    def escalate_switches(self, a: Assessment, decision: Decision, now: float, out: Decisions) -> None:
        """A switch cannot be isolated: the node steps of a switch incident escalate its repair."""
        inc = a.incident
        for s in (x for x in inc.suspects if x.kind == "switch"):
            self.issuer.command(out, now, command_id(inc.id, "escalate", s.name, 1), "escalate", inc.id, "",
                                f"{decision.explanation}: {a.explanation}",
                                {"target_kind": "switch", "escalation": "repair"}, node=s.name, track="node")

    # --- what time, results and observations bring ----------------------------------------------------

    def tick(self, now: float, out: Decisions) -> None:
        """Retry blocked isolations; run lifecycle deadlines, backoffs and probation."""
        window = self.settings.policy.flap_window_s
        nodes = self.state.nodes
        # the records the tick has something to do for now: a plan, an isolation waiting, or a
        # deadline, the end of probation or a return to forget that has come; a record waiting for one
        # of those sleeps until then (in ``_sleeping``), one waiting for nothing until it changes
        if self._for_tick is None:
            candidates, self._sleeping, self._standing = set(nodes), [], {}
        else:
            candidates, sleeping = self._for_tick, self._sleeping
            while sleeping and sleeping[0][0] <= now:
                candidates.add(heapq.heappop(sleeping)[1])
        if self._standing:  # the refusals decided on what has changed since are read again
            now_key = (self._gate_key(), id(self.topology))
            for key in [k for k in self._standing if k != now_key]:
                candidates |= self._standing.pop(key)[1]
        names = []
        for n in candidates:
            r = nodes.get(n)
            if r is None:
                continue
            if r.plan or (r.state == "suspect" and r.blocked_reason):
                names.append(n)
                continue
            due = _next_due(r, window)
            if due <= now:
                names.append(n)
            elif due < math.inf:
                heapq.heappush(self._sleeping, (due, n))
        names.sort()
        self._for_tick = set(names)
        if self._for_forget is not None:
            self._for_forget.update(names)
        self._new_standing = set()
        for name in names:
            rec = nodes[name]
            if rec.state == "suspect" and rec.blocked_reason:
                self._retry_blocked(rec, now, out)
            elif rec.state in ("healthy", "probation") and not rec.plan and not rec.inflight and (
                    rec.state == "healthy" or now < rec.probation_until):
                # nothing due but forgetting old returns (what the lifecycle's tick does for it)
                if rec.returns and now - rec.returns[0] >= window:
                    rec.returns = [t for t in rec.returns if now - t < window]
            elif rec.state != "healthy" or rec.inflight or rec.plan or rec.returns:
                self.apply(self.lifecycle.tick(rec, now, self.busy(name), self.issuer.node_commands(now, out)),
                           now, out)
        self._for_tick -= self._new_standing  # left until what their refusal stands on changes

    def _retry_blocked(self, rec: NodeRecord, now: float, out: Decisions) -> None:
        """A waiting isolation: past its settle time, or refused before. Never dropped by a timeout:
        after ``retry_blocked_s`` a refusal is escalated once more (the node stays suspect)."""
        s = self.settings.safety
        settling = rec.blocked_reason == "settling"
        if settling and now - rec.blocked_at < s.settle_s:
            return
        iso = Isolation(kind_of(rec.isolation, rec.critical), rec.signature, rec.device_gone)
        issue = self.issuer.node_commands(now, out)
        verdict = self._recheck(rec.name, iso, rec.critical, now, stopped=rec.blocked_reason == "breaker_open")
        if not verdict.allowed:
            if settling:  # settled, and refused: the first refusal is said and escalated
                self._refused(rec, verdict, list(rec.plan), rec.incident_id, rec.rule, rec.critical, rec.evidence_at,
                              iso, issue, now, out)
                return
            long_key = f"refused_long:{rec.incident_id}"
            if now - rec.blocked_at > s.retry_blocked_s and long_key not in rec.escalations:
                why = (f"isolation of {rec.name} refused ({rec.blocked_reason}) for {now - rec.blocked_at:.0f}s; "
                       f"it stays suspect ({iso.kind} evidence, {iso.signature}) and schedulable until the isolation "
                       "proceeds or an operator clears it")
                self.apply(self.lifecycle.escalate(rec, now, issue, long_key, why), now, out)
            self._stands(rec, verdict, long_key in rec.escalations)
            return
        inc = self.triage.state.incidents.get(rec.incident_id)
        self._admitted(rec.name, iso, rec.critical, inc.incident_class if inc else "unknown", rec.evidence_at, now)
        plan, waited = list(rec.plan), rec.blocked_reason
        before = len(out.commands)
        events = self.lifecycle.begin(rec, rec.incident_id, rec.rule, plan, rec.critical, rec.evidence_at, now,
                                      self.busy(rec.name), issue, gpu=rec.gpu, iso=iso)
        self.apply(events, now, out)
        why = ("settled: no correlated suspicion, isolation proceeds" if waited == "settling" else
               "the circuit breaker closed: isolation proceeds" if waited == "breaker_open" else
               f"budget available again ({waited} no longer refuses it): isolation proceeds")
        self.issuer.audit(out, now, "command", f"{rec.name}: {why}" + (f"; {verdict.explanation}" if verdict.reason
                                                                     else ""),
                          node=rec.name, incident_id=rec.incident_id, rule=rec.rule, track="node",
                          command_ids=[c.id for c in out.commands[before:]])

    def advance(self, node: str, now: float, out: Decisions) -> None:
        """A job on ``node`` stopped: a plan waiting for the job boundary may go on."""
        rec = self.state.nodes.get(node)
        if rec is not None and rec.plan and rec.state != "suspect":
            self._changing(node)
            self.apply(self.lifecycle.advance(rec, now, self.busy(node), self.issuer.node_commands(now, out)), now, out)

    def on_result(self, info: CommandInfo, result: RemediationResult, now: float, out: Decisions) -> None:
        rec = self.state.nodes[info.node]
        self._changing(info.node)
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

    def condition(self, finding: Finding, now: float, out: Decisions) -> None:
        """A node condition a hard rule matched is remembered until the node watch reports it cleared
        (metric ``cleared:<type>``): a node isolated for it returns only after that."""
        metric = finding.evidence[0].metric if finding.evidence else ""
        kind, _, ctype = metric.partition(":")
        if not ctype:
            return
        if kind == "cleared":
            rec = self.state.nodes.get(finding.node)
            if rec is not None and ctype in rec.conditions:
                self._changing(rec.name)
                if rec.state == "repair_needed" and rec.blocked_reason == "condition":
                    self.gate.confirm(rec.name)  # its own health check said so: the hold was right
                self.apply(self.lifecycle.condition_cleared(rec, ctype, now, self.busy(rec.name),
                                                            self.issuer.node_commands(now, out)), now, out)
        elif finding.kind == "hard_fault":
            rec = self.record(finding.node)
            if ctype not in rec.conditions:
                rec.conditions.append(ctype)

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
        self.gate.confirm(node)  # a person repaired it: the hold was right, whatever diagnostics said
        events = self.lifecycle.repaired(rec, now, self.busy(node), self.issuer.node_commands(now, out), actor, reason)
        self.apply(events, now, out, actor=actor)

    # --- lifecycle events -----------------------------------------------------------------------------

    def apply(self, events: Iterable[LifecycleEvent], now: float, out: Decisions, incident: Incident | None = None,
              actor: str = "fleetmedic") -> None:
        """Lifecycle events become audit records, accounting, budget releases and incident tracking."""
        audit = self.issuer.audit
        for ev in events:
            rec = self.state.nodes.get(ev.node)
            if rec is not None:
                self._changing(ev.node)
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
                if ev.reported and not ev.passed:
                    self.gate.confirm(ev.node)  # diagnostics found the fault: the hold leaves the budget
                audit(out, now, "result", f"diagnostics {'passed' if ev.passed else 'failed'}: {ev.explanation}",
                      node=ev.node, incident_id=incident_id)
            elif ev.kind in ("returned", "cleared"):
                self.gate.release(ev.node, now)
                self.accounting.refusal_ended(ev.node, now)
                self.accounting.returned(ev.node, now)
                audit(out, now, "cleared" if ev.kind == "cleared" else "command", ev.explanation, node=ev.node,
                      incident_id=incident_id, command_ids=list(ev.command_ids), actor=actor, track="node",
                      state_from=ev.state_from, state_to=ev.state_to)
                self.incidents.untrack(incident_id, now, out, node=ev.node)
            elif ev.kind == "isolated":
                self.accounting.isolated(ev.node, now)
            elif ev.kind == "skipped":
                audit(out, now, "skipped", ev.explanation, node=ev.node, incident_id=incident_id)

    def removed(self, node: str, now: float) -> str:
        """``node`` was deleted from the cluster: it holds nothing any more (its budget or definitive
        hold, its refusal clock) and its lifecycle record is forgotten. Returns what was released."""
        held = self.gate.kind_held(node)
        self.gate.forget(node)
        self.accounting.refusal_ended(node, now)
        self.accounting.state.clocks.pop(node, None)
        rec = self.state.nodes.pop(node, None)
        self._changing(node)
        self.state.muted.pop(node, None)
        if rec is not None and rec.incident_id:
            self.incidents.stop_waiting_for(rec.incident_id, node)
        bits = [f"its {held} hold"] if held else []
        if rec is not None and rec.state != "healthy":
            bits.append(f"its lifecycle ({rec.state})")
        return " and ".join(bits)

    # --- housekeeping -------------------------------------------------------------------------------

    def waits_for(self, command_id: str, node: str) -> bool:
        """Whether ``node`` still waits for the result of ``command_id`` (in flight, or its repair): a
        node's commands are issued for it, so no other record names them."""
        rec = self.state.nodes.get(node) if node else None
        return rec is not None and (command_id in rec.repair_ids
                                    or any(f.command_id == command_id for f in rec.inflight))

    def forget_idle(self, now: float) -> None:
        """Forget released holds past the cooldown and flap window, and healthy nodes nothing marks."""
        s, p = self.settings, self.settings.policy
        self.gate.forget_released_before(now - max(s.safety.node_cooldown_s, p.flap_window_s))
        nodes = self.state.nodes
        remember = now - p.definitive_recurrence_s  # a definitive return is remembered this long
        names = set(nodes) if self._for_forget is None else self._for_forget
        if self._for_forget is None:
            self._remembered, self._remembering = [], set()
        remembered = self._remembered
        while remembered and remembered[0][0] < remember:  # a remembered return that has expired
            name = heapq.heappop(remembered)[1]
            self._remembering.discard(name)
            names.add(name)
        for name in list(names):  # forgetting notes the name in ``names``
            r = nodes.get(name)
            if r is None or r.state != "healthy" or (r.plan or r.inflight or r.returns or r.opted_out
                                                     or r.foreign_cordon or r.cordon_owned or r.conditions):
                continue  # something marks it: looked at again when it changes
            if not r.returned_signature or r.returned_at < remember:
                del nodes[name]  # nothing marks it: a record is made again when needed
                self._changing(name)
            elif name not in self._remembering:  # looked at again when its return expires
                self._remembering.add(name)
                heapq.heappush(remembered, (r.returned_at, name))
        self._for_forget = set()


def supports(finding: Finding, signature: str) -> bool:
    """Whether ``finding`` repeats the evidence ``signature`` names: the same detector and metric, the
    same metric from another detector (a port down seen by triage and by the port detector), or a
    finding of the class an incident-level signature (``class:network``) names."""
    own = finding_isolation(finding).signature
    if own == signature:
        return True
    head, _, tail = signature.partition(":")
    if head == "class":
        return tail in (finding_class(finding), finding.kind)
    return bool(tail) and own.partition(":")[2] == tail


def _next_due(rec: NodeRecord, window: float) -> float:
    """When the tick next has something to do for ``rec`` (with no plan and no isolation waiting): a
    command's deadline, the end of probation, a return older than the flap ``window``; a second early
    (the tick's own tests decide), infinity when it waits for nothing but a change."""
    due = min((f.deadline for f in rec.inflight), default=math.inf)
    if rec.state == "probation":
        due = min(due, rec.probation_until)
    if rec.returns and rec.state in ("healthy", "probation"):
        due = min(due, min(rec.returns) + window)
    return due - 1.0
