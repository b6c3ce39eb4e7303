"""Per-node escalation state machine: from suspicion to isolation, diagnosis, repair and back.

::

    healthy ──► suspect ──► quarantined ──► diagnosing ──► probation ──► healthy
       ▲           │  (isolation refused     │   ▲   │ fail        │ new incident
       └───────────┘   by safety: escalate)  │   │   ▼             ▼
                                             │  reset_gpu ─► reboot_node ─► repair_needed
                                             └── (ladder: each rung, then diagnostics again)

- **Plans.** A policy rule gives the node track an ordered plan (``cordon, taint, drain,
  run_diagnostics``). Quick steps (cordon, taint, label, escalate) are issued together; a long step
  (drain, diagnostics, reset, reboot) waits for its result before the next step. A step with
  ``at_job_boundary`` waits until no job runs on the node (preventive isolation without eviction).
- **Timeouts and refusals.** A step without a result by its deadline, or that the executor could
  not carry out (``failed``), is issued again later (a new attempt, a new id; steps that need an
  idle node wait for the job boundary) up to ``action_retries`` times, then escalated while the
  node stays held. Diagnostics that never report count as failed; a diagnostics *verdict* comes in
  ``details.verdict`` (or ``details.diagnostics``): ``pass`` or ``fail``.
- **Validation gate.** A node returns to service only after diagnostics pass (or an operator clears
  it, which is audited). A repair (reported by an operator, or by the executor as the result of the
  repair escalation with ``details.repair: completed``) is validated by diagnostics too. Then the
  node spends ``probation_s`` on probation, where policy is stricter.
- **Flap hysteresis.** A node returned ``flap_max_returns`` times within ``flap_window_s`` goes to
  ``repair_needed`` instead of back to service; a repair starts its count afresh.
- **Ownership.** fleetmedic only lifts what it put there: ``return_to_service`` asks to uncordon only
  when fleetmedic made the cordon; a node someone else cordoned stays cordoned.

Pure and clock-injected: methods take ``now`` and an ``issue`` callback that turns a step into a
command value and returns its id. Budgets are the caller's business (:mod:`.safety`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from fleetmedic.actions import DISRUPTIVE, ISOLATING, NODE_LONG, NODE_QUICK, TRACKED
from fleetmedic.config import ActionStep, PolicySettings
from fleetmedic.records import NodeState, RemediationResult
from fleetmedic.remediation.kinds import Isolation, kind_of

OUT_OF_SERVICE: frozenset[NodeState] = frozenset({"quarantined", "diagnosing", "repair_needed"})


class PlanStep(msgspec.Struct, frozen=True, kw_only=True):
    action: str
    at_job_boundary: bool = False
    params: dict[str, str] = {}
    attempt: int = 1  # > 1: a retry of a step that failed or timed out
    not_before: float = 0.0  # a retry waits until then

    @classmethod
    def of(cls, step: ActionStep) -> PlanStep:
        return cls(action=step.action, at_job_boundary=step.at_job_boundary, params=dict(step.params))


class InFlight(msgspec.Struct, kw_only=True):
    command_id: str
    action: str
    issued_at: float
    deadline: float
    attempt: int
    params: dict[str, str] = {}


class NodeRecord(msgspec.Struct, kw_only=True):
    """Everything fleetmedic remembers about one node (serialised with the engine)."""

    name: str
    state: NodeState = "healthy"
    since: float = 0.0
    episode: int = 0
    incident_id: str = ""
    rule: str = ""
    critical: bool = False
    gpu: int | None = None
    plan: list[PlanStep] = []
    inflight: list[InFlight] = []
    done: list[str] = []  # actions issued in this episode, in order
    attempts: dict[str, int] = {}  # action -> times issued in this episode (command ids)
    cordon_owned: bool = False  # fleetmedic made the cordon
    taint_owned: bool = False
    foreign_cordon: bool = False  # someone else cordoned the node
    opted_out: bool = False
    returns: list[float] = []  # return-to-service times (flap hysteresis)
    probation_until: float = 0.0
    blocked_reason: str = ""  # why its isolation waits: settling, breaker_open, max_held, rate, rack, ...
    blocked_at: float = 0.0
    isolation: str = ""  # this episode's kind of isolation: definitive | preventive | uncertain ("": older state)
    signature: str = ""  # the evidence it rests on (xid:79, hard_rules:ecc_dbe_vol_total, ...)
    device_gone: bool = False  # its GPU (or the whole node) is already gone
    evidence_at: float = 0.0  # first evidence of this episode
    escalations: list[str] = []  # keys of escalations already sent this episode
    repair_ids: list[str] = []  # repair escalations whose completion the executor may report
    conditions: list[str] = []  # node conditions a hard rule matched that have not cleared (types)
    repaired: bool = False  # this episode's isolation went through a repair (validated since)
    evidence_seen: float = 0.0  # the episode's evidence last reported while the node was out of service
    returned_signature: str = ""  # definitive evidence of the last episode that passing diagnostics returned
    returned_at: float = 0.0
    acquitted_at: float = 0.0  # diagnostics passed after an isolation on evidence of policy.acquitted_metrics


@dataclass(frozen=True)
class LifecycleEvent:
    """Something the engine audits and accounts: a state change, an escalation, a verdict."""

    kind: str  # state_change | escalated | verdict | returned | isolated | cleared | skipped
    node: str
    explanation: str
    state_from: NodeState | None = None
    state_to: NodeState | None = None
    command_ids: tuple[str, ...] = ()
    passed: bool | None = None  # for verdicts
    first_try: bool = False  # a verdict on the first diagnostics of the episode, before any repair
    reported: bool = False  # a verdict the diagnostics reported (not a timeout or a run given up)


Issue = Callable[[NodeRecord, str, dict[str, str], str, str], str]
"""``issue(node, action, params, attempt_key, reason) -> command id``."""

Disruptable = Callable[[str, str, float], bool]
"""``may_disrupt(node, action, now)``; ``on_disrupt(node, action, now)`` records it."""


class Lifecycle:
    def __init__(self, policy: PolicySettings, may_disrupt: Disruptable,
                 on_disrupt: Callable[[str, str, float], None]) -> None:
        self.policy = policy
        self.may_disrupt = may_disrupt
        self.on_disrupt = on_disrupt

    # --- starting and merging plans -------------------------------------------------------------

    def begin(
        self, rec: NodeRecord, incident_id: str, rule: str, steps: list[PlanStep], critical: bool,
        evidence_at: float, now: float, busy: bool, issue: Issue, gpu: int | None = None,
        iso: Isolation | None = None,
    ) -> list[LifecycleEvent]:
        """Act on a node-track plan for an incident (merging with a plan already running)."""
        events: list[LifecycleEvent] = []
        if rec.state == "repair_needed":
            # the repair ticket learns every further fault found on the node while it waits
            key = f"evidence:{iso.signature if iso else incident_id}"
            added = self.escalate(rec, now, issue, key, f"{rec.name} awaits repair; incident {incident_id} adds "
                                  f"evidence{f' ({iso.signature})' if iso else ''} to its repair", kind="repair")
            return added or [LifecycleEvent("skipped", rec.name,
                                            f"already awaiting repair; incident {incident_id} noted")]
        if rec.state in ("quarantined", "diagnosing"):
            pending = [s for s in steps if s.action not in rec.done or s.action == "escalate"]
            # new steps first (an upgrade, e.g. drain now), then what was still waiting
            merged = pending + [s for s in rec.plan if s.action not in {p.action for p in pending}]
            rec.plan = _boundary_relaxed(merged) if critical else merged
            rec.critical = rec.critical or critical
            _note_isolation(rec, iso, merge=True)
        else:
            rec.episode += 1
            rec.incident_id, rec.rule, rec.critical, rec.gpu = incident_id, rule, critical, gpu
            rec.plan, rec.inflight, rec.done, rec.attempts, rec.escalations = list(steps), [], [], {}, []
            rec.repaired = False
            rec.evidence_at, rec.evidence_seen = evidence_at, 0.0
            # a blocked isolation that now proceeds keeps what it rested on
            _note_isolation(rec, iso, merge=rec.state == "suspect" and bool(rec.blocked_reason))
            rec.blocked_reason = ""
            target: NodeState = "quarantined" if any(s.action in ISOLATING for s in steps) else "suspect"
            events += self._move(rec, target, now, f"incident {incident_id}, rule {rule}")
        events += self.advance(rec, now, busy, issue)
        return events

    def block(self, rec: NodeRecord, reason: str, steps: list[PlanStep], incident_id: str, rule: str,
              critical: bool, evidence_at: float, now: float, iso: Isolation | None = None,
              why: str = "") -> list[LifecycleEvent]:
        """Isolation waits (settling) or was refused by safety: remember the plan (retried until it
        proceeds or an operator clears the node; never dropped by a timeout), mark the node suspect.
        Within one wait, the evidence only gets stronger."""
        waiting = rec.state == "suspect" and rec.blocked_reason != ""
        rec.plan = list(steps)
        if not waiting:
            rec.escalations = []
            rec.blocked_at, rec.evidence_at = now, evidence_at
            rec.critical, rec.isolation, rec.signature, rec.device_gone = critical, "", "", False
        rec.incident_id, rec.rule, rec.critical = incident_id, rule, rec.critical or critical
        _note_isolation(rec, iso, merge=True)
        rec.blocked_reason = reason
        return self._move(rec, "suspect", now, why or f"isolation refused: {reason}")

    # --- executing plans --------------------------------------------------------------------------

    def advance(self, rec: NodeRecord, now: float, busy: bool, issue: Issue) -> list[LifecycleEvent]:
        """Issue the next steps of the plan, as far as results and job boundaries allow."""
        events: list[LifecycleEvent] = []
        if rec.state == "suspect" and rec.blocked_reason:
            return events
        while rec.plan:
            step = rec.plan[0]
            waiting = any(f.action in NODE_LONG for f in rec.inflight)
            if waiting and not (step.attempt > 1 and step.action in NODE_QUICK):
                break
            if step.at_job_boundary and busy and now - rec.since >= self.policy.boundary_wait_s > 0:
                return events + self._boundary_overdue(rec, step, now, issue)
            if (step.at_job_boundary and busy) or step.not_before > now:
                break
            if step.action in DISRUPTIVE and not self.may_disrupt(rec.name, step.action, now):
                break
            rec.plan.pop(0)
            params = dict(step.params)
            if step.action == "reset_gpu" and "gpu" not in params:
                params["gpu"] = str(rec.gpu) if rec.gpu is not None else "all"
            cid = self._issue(rec, step.action, params, now, issue, f"rule {rec.rule}, incident {rec.incident_id}",
                              step.attempt)
            if step.action in DISRUPTIVE:
                self.on_disrupt(rec.name, step.action, now)
            if step.action == "run_diagnostics":
                events += self._move(rec, "diagnosing", now, "diagnostics started", (cid,))
            elif step.action in ISOLATING or step.action in DISRUPTIVE:
                events += self._move(rec, "quarantined", now, f"{step.action} issued", (cid,))
            if step.action in NODE_LONG:
                break
        return events

    def _boundary_overdue(self, rec: NodeRecord, step: PlanStep, now: float, issue: Issue) -> list[LifecycleEvent]:
        """A step has waited ``policy.boundary_wait_s`` for the node's job to end, and the job still runs
        on it without failing: with the evidence no longer reported, that running job is the better
        evidence and the node returns to service; with the evidence still reported, a human is told
        (the node stays held)."""
        waited = now - rec.since
        if rec.evidence_seen and now - rec.evidence_seen <= self.policy.evidence_quiet_s:
            return self.escalate(rec, now, issue, f"boundary_wait:{rec.incident_id}",
                                 f"{step.action} has waited {waited:.0f}s for the job on the node to end, and "
                                 f"{rec.signature} is still reported: the node stays held")
        what = rec.signature or "the evidence"
        return self.return_to_service(rec, now, issue, f"its job ran {waited:.0f}s on it without failing while "
                                      f"{step.action} waited for the job boundary, and {what} was not reported "
                                      "since (policy.boundary_wait_s)")

    def on_result(self, rec: NodeRecord, result: RemediationResult, now: float, busy: bool,
                  issue: Issue) -> list[LifecycleEvent]:
        if rec.state == "repair_needed" and result.details.get("repair") == "completed" and \
                result.command_id in rec.repair_ids:
            return self.repaired(rec, now, busy, issue, result.executor or "executor", "repair completed")
        flight = next((f for f in rec.inflight if f.command_id == result.command_id), None)
        if flight is None:
            return []
        rec.inflight.remove(flight)
        events: list[LifecycleEvent] = []
        ok = result.outcome in ("applied", "skipped")
        if flight.action == "run_diagnostics":
            verdict = result.details.get("verdict") or result.details.get("diagnostics")
            if verdict is None and (result.outcome == "applied" or result.dry_run):
                verdict = "pass"
            if verdict in ("pass", "fail"):
                tests = result.details.get("failed_tests", "")
                why = result.reason or f"diagnostics {verdict}" + (f" ({tests})" if tests else "")
                return events + self._verdict(rec, verdict == "pass", now, busy, issue, why, reported=True)
            # diagnostics that did not run prove nothing: run them again (the node may still be busy)
            return events + self._retry_or_escalate(rec, flight, now, busy, issue, f"diagnostics did not run: "
                                                    f"{result.reason or result.outcome}")
        if not ok:
            return events + self._retry_or_escalate(rec, flight, now, busy, issue, f"{flight.action} failed: "
                                                    f"{result.reason or 'no reason given'}")
        if flight.action == "cordon":
            already = result.outcome == "skipped" or result.details.get("already_cordoned") == "true"
            rec.cordon_owned = rec.cordon_owned or not already
            rec.foreign_cordon = already and not rec.cordon_owned
            events.append(LifecycleEvent("isolated", rec.name, "cordon confirmed"))
        elif flight.action == "taint":
            rec.taint_owned = True
        return events + self.advance(rec, now, busy, issue)

    def tick(self, rec: NodeRecord, now: float, busy: bool, issue: Issue) -> list[LifecycleEvent]:
        """Deadlines, probation expiry, job boundaries reached."""
        events: list[LifecycleEvent] = []
        for flight in [f for f in rec.inflight if now >= f.deadline]:
            rec.inflight.remove(flight)
            why = f"no result for {flight.action} within {flight.deadline - flight.issued_at:g}s"
            if flight.action == "run_diagnostics":
                events += self._verdict(rec, False, now, busy, issue, why + " (counts as failed)")
            else:
                events += self._retry_or_escalate(rec, flight, now, busy, issue, why, refused=False)
        if rec.state == "probation" and now >= rec.probation_until:
            events += self._move(rec, "healthy", now, "probation passed")
        if rec.state == "healthy" and rec.returns:
            rec.returns = [t for t in rec.returns if now - t < self.policy.flap_window_s]
        events += self.advance(rec, now, busy, issue)
        return events

    # --- verdicts, return to service, operator actions ------------------------------------------------

    def _verdict(self, rec: NodeRecord, passed: bool, now: float, busy: bool, issue: Issue,
                 why: str, reported: bool = False) -> list[LifecycleEvent]:
        first = rec.done.count("run_diagnostics") == 1 and not any(a in DISRUPTIVE for a in rec.done)
        events = [LifecycleEvent("verdict", rec.name, why, passed=passed, first_try=first, reported=reported)]
        if passed and rec.conditions:
            # diagnostics test the GPUs; a read-only filesystem or a kernel deadlock is still there
            events += self._repair(rec, now, issue, f"diagnostics passed ({why}), but node condition "
                                   f"{', '.join(rec.conditions)} is still set: it is validated again once that clears")
            rec.blocked_reason = "condition"
            return events
        if passed and rec.evidence_seen and now - rec.evidence_seen <= self.policy.evidence_quiet_s:
            # the detectors still report what the node was isolated for (a port still down, a link
            # still narrow): the diagnostics do not test it
            return events + self._repair(rec, now, issue, f"diagnostics passed ({why}), but {rec.signature} was "
                                         f"reported again {now - rec.evidence_seen:.0f}s ago: the diagnostics do "
                                         "not test it; repair, then validation, before it returns")
        if passed and rec.isolation == "definitive" and not rec.repaired:
            if self.policy.definitive_return == "repair":
                return events + self._repair(rec, now, issue, f"diagnostics passed ({why}) after definitive evidence "
                                             f"({rec.signature}): repair before it returns (policy.definitive_return)")
            if (rec.returned_signature == rec.signature and self.policy.definitive_recurrence_s > 0
                    and now - rec.returned_at <= self.policy.definitive_recurrence_s):
                return events + self._repair(rec, now, issue, f"diagnostics passed ({why}), but {rec.signature} came "
                                             f"back {now - rec.returned_at:.0f}s after passing diagnostics returned "
                                             "the node: they miss this fault (policy.definitive_recurrence_s)")
        if passed:
            if rec.isolation == "definitive" and not rec.repaired:
                rec.returned_signature, rec.returned_at = rec.signature, now
            if rec.isolation == "preventive" and signature_metric(rec.signature) in self.policy.acquitted_metrics:
                rec.acquitted_at = now
            return events + self.return_to_service(rec, now, issue, f"diagnostics passed: {why}")
        ladder = list(self.policy.remediation_ladder)
        tried = [i for i, a in enumerate(ladder) if a in rec.done]
        nxt = ladder[max(tried) + 1:] if tried else ladder
        if nxt:
            rec.plan = [PlanStep(action=nxt[0]), PlanStep(action="run_diagnostics")]
            events += self._move(rec, "quarantined", now, f"diagnostics failed ({why}); next: {nxt[0]}")
            return events + self.advance(rec, now, busy, issue)
        return events + self._repair(rec, now, issue, f"diagnostics failed after {', '.join(ladder) or 'no'} "
                                     f"remediation ({why})")

    def return_to_service(self, rec: NodeRecord, now: float, issue: Issue, why: str,
                          actor: str = "fleetmedic", count_return: bool = True) -> list[LifecycleEvent]:
        rec.returns = [t for t in rec.returns if now - t < self.policy.flap_window_s]
        if count_return and len(rec.returns) >= self.policy.flap_max_returns:
            return self._repair(rec, now, issue, f"flapping: returned {len(rec.returns)} times within "
                                f"{self.policy.flap_window_s:g}s (flap_max_returns {self.policy.flap_max_returns})")
        cids: tuple[str, ...] = ()
        if rec.cordon_owned or rec.taint_owned:
            params = {"uncordon": "true" if rec.cordon_owned and not rec.foreign_cordon else "false",
                      "untaint": "true", "actor": actor}
            cids = (self._issue(rec, "return_to_service", params, now, issue, why),)
        if count_return:
            rec.returns.append(now)
        rec.plan, rec.inflight, rec.blocked_reason = [], [], ""
        rec.cordon_owned = rec.taint_owned = False
        rec.probation_until = now + self.policy.probation_s
        kept = " (the cordon someone else made stays)" if rec.foreign_cordon else ""
        events = [LifecycleEvent("returned", rec.name, why + kept, command_ids=cids)]
        return events + self._move(rec, "probation", now, why + kept, cids)

    def condition_cleared(self, rec: NodeRecord, ctype: str, now: float, busy: bool,
                          issue: Issue) -> list[LifecycleEvent]:
        """Node condition ``ctype`` cleared: a node that awaits repair because its diagnostics passed
        while the condition was set is validated again (as after a repair) once none is left."""
        rec.conditions = [c for c in rec.conditions if c != ctype]
        if rec.conditions or rec.state != "repair_needed" or rec.blocked_reason != "condition":
            return []
        rec.blocked_reason = ""
        return self.repaired(rec, now, busy, issue, "the node watch", f"node condition {ctype} cleared")

    def clear(self, rec: NodeRecord, now: float, issue: Issue, actor: str, reason: str) -> list[LifecycleEvent]:
        """An operator vouches for the node: return it (without diagnostics) and forget its flaps."""
        before = rec.state
        rec.returns = []
        events = self.return_to_service(rec, now, issue, f"cleared by {actor}: {reason}", actor, count_return=False)
        return [LifecycleEvent("cleared", rec.name, f"cleared by {actor} from {before}: {reason}",
                               state_from=before, state_to=rec.state), *events]

    def repaired(self, rec: NodeRecord, now: float, busy: bool, issue: Issue, actor: str,
                 reason: str) -> list[LifecycleEvent]:
        """A human repaired the node: validate it (diagnostics) before it may return. A repaired node
        starts a new flap history: the returns before it were the fault the repair fixed."""
        rec.plan = [PlanStep(action="run_diagnostics")]
        rec.done = [a for a in rec.done if a in ISOLATING]
        rec.escalations = []
        rec.repaired = True
        rec.returns = []
        events = [LifecycleEvent("cleared", rec.name, f"repair reported by {actor}: {reason}; validating")]
        events += self._move(rec, "quarantined", now, f"repaired by {actor}")
        return events + self.advance(rec, now, busy, issue)

    def released_elsewhere(self, rec: NodeRecord, now: float, why: str) -> list[LifecycleEvent]:
        """Someone else uncordoned a node fleetmedic held: respect it, stop holding it."""
        before = rec.state
        rec.plan, rec.inflight, rec.blocked_reason = [], [], ""
        rec.cordon_owned = False
        rec.probation_until = now + self.policy.probation_s
        return [LifecycleEvent("cleared", rec.name, why, state_from=before, state_to="probation"),
                *self._move(rec, "probation", now, why)]

    # --- helpers ----------------------------------------------------------------------------------------

    def _repair(self, rec: NodeRecord, now: float, issue: Issue, why: str) -> list[LifecycleEvent]:
        rec.plan, rec.inflight = [], []
        events = self.escalate(rec, now, issue, "repair_needed", why, kind="repair")
        return events + self._move(rec, "repair_needed", now, why)

    def escalate(self, rec: NodeRecord, now: float, issue: Issue, key: str, why: str,
                 kind: str = "notify") -> list[LifecycleEvent]:
        """One escalation per key per episode. ``kind``: ``notify`` (a human should look; the node
        stays as it is) or ``repair`` (the node needs hands-on repair or RMA)."""
        if key in rec.escalations:
            return []
        rec.escalations.append(key)
        cid = self._issue(rec, "escalate", {"reason": key.split(":", 1)[0], "escalation": kind}, now, issue, why)
        if kind == "repair":
            rec.repair_ids = [*rec.repair_ids[-4:], cid]
        return [LifecycleEvent("escalated", rec.name, why, command_ids=(cid,))]

    def _retry_or_escalate(self, rec: NodeRecord, flight: InFlight, now: float, busy: bool, issue: Issue,
                           why: str, refused: bool = True) -> list[LifecycleEvent]:
        """A step that could not be carried out (not a verdict): retry it later, then ask a human.
        Steps that need an idle node wait for the job boundary; the node stays held meanwhile."""
        if flight.attempt <= self.policy.action_retries:
            idle = flight.action in ("run_diagnostics", "reset_gpu")
            delay = self.policy.action_retry_delay_s * flight.attempt
            later = now + delay if refused and flight.action in NODE_LONG else 0.0
            rec.plan.insert(0, PlanStep(action=flight.action, params=flight.params, attempt=flight.attempt + 1,
                                        at_job_boundary=idle, not_before=later))
            return self.advance(rec, now, busy, issue)
        gave_up = f"{why}; gave up after {flight.attempt} attempts"
        if flight.action == "run_diagnostics":  # a node that cannot be validated is not healthy
            return self._verdict(rec, False, now, busy, issue, gave_up)
        if flight.action in DISRUPTIVE:  # a rung that cannot run: climb on
            rec.plan = [s for s in rec.plan if s.action != "run_diagnostics"]
            rec.done.append("run_diagnostics")
            return self._verdict(rec, False, now, busy, issue, gave_up)
        note = ": the node may still be schedulable" if flight.action in ("cordon", "taint") else \
            "; the node stays out of service"
        events = self.escalate(rec, now, issue, f"{flight.action}_failed", gave_up + note)
        return events + self.advance(rec, now, busy, issue)

    def _issue(self, rec: NodeRecord, action: str, params: dict[str, str], now: float, issue: Issue,
               reason: str, attempt: int = 1) -> str:
        n = rec.attempts.get(action, 0) + 1
        rec.attempts[action] = n
        cid = issue(rec, action, params, f"e{rec.episode}.{n}", reason)
        if action != "escalate":
            rec.done.append(action)
        if action in TRACKED:
            timeout = self.policy.diagnostics_timeout_s if action == "run_diagnostics" else self.policy.action_timeout_s
            rec.inflight.append(InFlight(command_id=cid, action=action, issued_at=now, deadline=now + timeout,
                                         attempt=attempt, params=params))
        return cid

    def _move(self, rec: NodeRecord, to: NodeState, now: float, why: str,
              cids: tuple[str, ...] = ()) -> list[LifecycleEvent]:
        if rec.state == to:
            return []
        before, rec.state, rec.since = rec.state, to, now
        return [LifecycleEvent("state_change", rec.name, why, before, to, cids)]


def _note_isolation(rec: NodeRecord, iso: Isolation | None, merge: bool) -> None:
    """Remember what the episode's isolation rests on (the stronger evidence when ``merge``)."""
    if iso is None:
        return
    if merge and rec.isolation:
        iso = Isolation(kind_of(rec.isolation), rec.signature, rec.device_gone).stronger(iso)
    rec.isolation, rec.signature, rec.device_gone = iso.kind, iso.signature, iso.device_gone


def _boundary_relaxed(steps: list[PlanStep]) -> list[PlanStep]:
    return [PlanStep(action=s.action, params=s.params) if s.at_job_boundary else s for s in steps]


def signature_metric(signature: str) -> str:
    """The metric an isolation's signature names (``gpu_baseline:gpu_temp`` -> ``gpu_temp``)."""
    return signature.partition(":")[2]
