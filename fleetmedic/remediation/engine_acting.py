"""How the decision engine acts on an assessment: publish the incident, run the policy's job track
(restart, retry with backoff, escalate) and node track (isolation through the safety gate, then the
lifecycle plan), retry isolations the budget refused, and decide what became due."""

from __future__ import annotations

from fleetmedic.remediation.engine_core import EngineCore
from fleetmedic.remediation.engine_state import NODE_CLASSES, Decisions, HeldCommand, IncidentTracks
from fleetmedic.remediation.lifecycle import ISOLATING, OUT_OF_SERVICE, NodeRecord, PlanStep
from fleetmedic.remediation.policy import Decision
from fleetmedic.remediation.triage import Assessment


class EngineActing(EngineCore):
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

    # --- what became due ----------------------------------------------------------------------------

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
