"""The job track: what fleetmedic does to jobs. The policy's job steps for the failed job and the
running jobs an incident hits (restart elsewhere, retry in place after a backoff, requeue, escalate),
never blocked by node budgets; retries held until their backoff passes (dropped if the job moved on);
and the accounting of job events (attempts, running time, jobs placed on held nodes)."""

from __future__ import annotations

from collections.abc import Callable

from fleetmedic.actions import MOVING, command_id
from fleetmedic.config import Settings
from fleetmedic.records import JobEvent, NodeState, RemediationResult
from fleetmedic.remediation.accounting import Accounting
from fleetmedic.remediation.engine_state import CommandInfo, Decisions, EngineState, HeldCommand, MovingJob
from fleetmedic.remediation.incident_tracks import IncidentTracker
from fleetmedic.remediation.issuer import Issuer
from fleetmedic.remediation.lifecycle import OUT_OF_SERVICE
from fleetmedic.remediation.placements import among
from fleetmedic.remediation.policy import Decision
from fleetmedic.remediation.safety import SafetyGate
from fleetmedic.remediation.triage import Assessment, Triage


class JobTrack:
    def __init__(self, settings: Settings, state: EngineState, triage: Triage, gate: SafetyGate,
                 accounting: Accounting, issuer: Issuer, incidents: IncidentTracker,
                 node_state: Callable[[str], NodeState], suspected: Callable[[], set[str]] | None = None,
                 unhealthy: Callable[[], set[str]] | None = None,
                 keeps_jobs: Callable[[Assessment, float], str] | None = None,
                 hard_changes: Callable[[], object] | None = None) -> None:
        self.settings = settings
        self.state = state
        self.triage = triage
        self.gate = gate
        self.accounting = accounting
        self.issuer = issuer
        self.incidents = incidents
        self.node_state = node_state
        #: every node fleetmedic suspects now (the engine's :meth:`~.engine.DecisionEngine.suspected_nodes`)
        self.suspected: Callable[[], set[str]] = suspected or (lambda: set(self.gate.state.held))
        #: the nodes whose state is neither healthy nor probation (the node track's
        #: :meth:`~.node_track.NodeTrack.unhealthy`), else each node's state is asked
        self.unhealthy = unhealthy
        #: why the running jobs an assessment hits stay where they are ("": they are moved)
        self.keeps_jobs: Callable[[Assessment, float], str] = keeps_jobs or (
            lambda a, now: "circuit breaker open" if self.gate.breaker.state.open else "")
        #: what moves on whenever the held or unhealthy nodes change (None: not known, they are compared)
        self.hard_changes = hard_changes
        #: job -> a waiting restart's exclusions (``MovingJob.exclude``, replaced when it grows), their set,
        #: and ``hard_changes()`` when they were last found to hold every held and unhealthy node
        self._excluded: dict[str, tuple[list[str], set[str], object]] = {}
        self._last_exclude: tuple[set[str], list[str]] | None = None  # the last move's exclusions, and sorted

    # --- acting on a decision -----------------------------------------------------------------------

    def act(self, a: Assessment, decision: Decision, now: float, out: Decisions) -> None:
        """Run the decision's job steps on the failed job and on the running jobs the incident hits
        (those on nodes to be drained too); a running job is moved once per incident."""
        inc = a.incident
        jobs = list(a.jobs)
        if any(s.action == "drain" for s in decision.node_steps):
            jobs += [j for n in a.suspect_nodes for j in self.triage.jobs_on(n) if j not in jobs]
        done = self.incidents.handled_jobs(inc.id)
        kept = self.keeps_jobs(a, now) if decision.job_steps and any(j != a.job for j in jobs) else ""
        if kept:
            self.issuer.audit(out, now, "skipped", f"{kept}: running jobs are not moved on this evidence (a failed "
                              "job still is)", incident=inc, rule=decision.rule, track="job")
            jobs = [j for j in jobs if j == a.job]
        for job in jobs:
            if job != a.job and job in done:
                continue  # a running job is moved once per incident; its own failures decide again
            for step in decision.job_steps:
                self._step(step.action, dict(step.params), job, a, decision, now, out)

    def _step(self, action: str, params: dict[str, str], job: str, a: Assessment, decision: Decision,
              now: float, out: Decisions) -> None:
        rec = self.triage.job(job)
        attempt = rec.attempt if rec else a.attempt
        inc = a.incident
        # one escalation per incident and job; other actions once per incident, job and attempt
        cid = command_id(inc.id, action, job, None if action == "escalate" else attempt)
        if cid in self.state.commands or any(h.id == cid for h in self.state.held):
            return
        reason = f"{decision.explanation}: {a.explanation}"
        if action == "retry_in_place":
            self._hold_retry(cid, params, job, attempt, reason, a, decision, now, out)
            return
        if action in MOVING:
            self._move(cid, action, params, job, attempt, reason, a, now, out)
        else:
            if action == "escalate":
                params.setdefault("escalation", "notify")
            self.issuer.command(out, now, cid, action, inc.id, job, reason, params)
            self.incidents.track(inc.id, job=job, wait=False)
        self.issuer.audit(out, now, "command", f"{action} {job}" + (f" excluding {len(a.exclude_nodes)} suspect "
                          "node(s)" if action == "restart_job" and a.exclude_nodes else "")
                          + f": {decision.explanation}", incident=inc, job=job, rule=decision.rule, track="job",
                          command_ids=[cid])

    def _hold_retry(self, cid: str, params: dict[str, str], job: str, attempt: int, reason: str, a: Assessment,
                    decision: Decision, now: float, out: Decisions) -> None:
        """Retry the job in place after an exponential backoff (held until due; no node is isolated)."""
        rec, inc = self.triage.job(job), a.incident
        retries = (rec.retries_in_place if rec else 0) + 1
        if rec:
            rec.retries_in_place = retries
        backoff = self.settings.policy.transient_retry_backoff_s * 2 ** (retries - 1)
        params |= {"retry": str(retries), "backoff_s": f"{backoff:g}"}
        self.state.held.append(HeldCommand(due=now + backoff, id=cid, action="retry_in_place", incident_id=inc.id,
                                           job=job, reason=reason, params=params, attempt=attempt))
        self.issuer.audit(out, now, "command", f"retry {retries} of {job} in place after {backoff:g}s backoff; "
                          "no node is isolated", incident=inc, job=job, rule=decision.rule, track="job",
                          command_ids=[cid])
        self.incidents.track(inc.id, job=job)

    def _move(self, cid: str, action: str, params: dict[str, str], job: str, attempt: int, reason: str,
              a: Assessment, now: float, out: Decisions) -> None:
        """Restart or requeue the job away from the incident's suspects and every node fleetmedic
        suspects; its coming failure is fleetmedic's own doing, and its recovery is timed."""
        inc = a.incident
        self.state.held = [h for h in self.state.held if h.job != job]  # a restart supersedes a pending retry
        self.triage.expect_failure(job, attempt, now + self.settings.signing.command_ttl_s
                                   + self.settings.triage.failure_settle_s)
        if job != a.job:  # a running job interrupted by fleetmedic counts as a failed attempt of that class
            self.accounting.job_failed(inc.incident_class)
            self.accounting.job_stopped(job, now)
        # away from every node fleetmedic suspects, isolated or not: a restart that lands on one that is
        # settling, refused, not yet cordoned or still being confirmed fails again
        own = set(a.exclude_nodes) | set(a.suspect_nodes)
        chosen = own | self._affordable(job, self.suspected() - own)
        last = self._last_exclude  # the moves of the jobs one input stops exclude the same nodes
        if last is None or last[0] != chosen:
            last = self._last_exclude = (chosen, sorted(chosen))
        exclude = last[1]  # (read-only: shared by the commands and moving jobs that exclude them)
        self.issuer.command(out, now, cid, action, inc.id, job, reason, params, exclude=exclude)
        if self.settings.policy.follow_suspects_s > 0:
            self.state.moving[job] = MovingJob(command_id=cid, action=action, incident_id=inc.id, attempt=attempt,
                                               since=now, exclude=exclude, reason=reason)
        self.accounting.recovery_started(job, inc.id, attempt, a.fault_at, now, list(a.suspect_nodes), now)
        self.incidents.track(inc.id, job=job)

    def _affordable(self, job: str, suspects: set[str], already: int = 0) -> set[str]:
        """Of ``suspects``, those a restart of ``job`` excludes: every node fleetmedic holds or works on
        (it is unschedulable anyway), and at most ``policy.max_soft_exclusions`` (less ``already``
        excluded) of the nodes it only suspects: those suspected of what fails a job first (hardware,
        unknown, then network, degradation), and within each the job's own nodes (where its pods go back)."""
        held = self.gate.state.held
        if self.unhealthy is not None:
            unhealthy = self.unhealthy()
            hard = suspects.intersection(held)
            hard.update(suspects.intersection(unhealthy))
        else:
            hard = {n for n in suspects if n in held or self.node_state(n) not in ("healthy", "probation")}
        room = max(0, self.settings.policy.max_soft_exclusions - max(0, already - len(hard)))
        if not room or not suspects - hard:  # no room for soft exclusions, or none to rank
            return hard
        rec = self.triage.job(job)
        candidates = suspects - hard
        # the job's own nodes among them (its sorted node list looked up, not made a set)
        own = {n for n in candidates if among(rec.nodes, n)} if rec else set()
        rank = {"hardware": 0, "unknown": 1, "network": 2, "degradation": 3}
        why = self.triage.suspicion_classes() if len(candidates) > self.settings.policy.max_soft_exclusions else {}
        soft = sorted(candidates, key=lambda n: (rank.get(why.get(n, ""), 9), n not in own, n))
        return hard | set(soft[:room])

    # --- what time, results and job events bring -----------------------------------------------------

    def follow_suspects(self, now: float, out: Decisions) -> None:
        """A restart still waiting for capacity excludes the nodes fleetmedic started suspecting since
        it was issued: the same command again with the longer list, marked ``only_if_waiting`` (the
        executor adds the exclusions to pods that wait, and never restarts a job that was placed)."""
        moving = self.state.moving
        if not moving:
            return
        horizon = now - self.settings.policy.follow_suspects_s
        full = self.settings.policy.max_soft_exclusions
        held, unhealthy = self.gate.state.held, self.unhealthy() if self.unhealthy is not None else None
        hard = self.hard_changes() if self.hard_changes is not None else None
        suspected: set[str] | None = None  # asked for when a restart may have something to add
        for job, m in list(moving.items()):
            if m.since < horizon:  # a job waiting longer than follow_suspects_s, or deleted, is not followed
                del moving[job]
                continue
            excluded = self._excluded.get(job)
            if excluded is None or excluded[0] is not m.exclude:
                excluded = self._excluded[job] = (m.exclude, set(m.exclude), None)
            ex = excluded[1]
            if unhealthy is not None and len(m.exclude) >= full and (
                    (hard is not None and excluded[2] == hard) or (ex.issuperset(held) and ex.issuperset(unhealthy))):
                # no room for soft exclusions, and every node held or worked on is excluded already (or
                # was, and none has been held or worked on since): :meth:`_affordable` would add none of
                # the suspects it does not exclude
                if hard is not None:
                    self._excluded[job] = (m.exclude, ex, hard)
                continue
            if suspected is None:
                suspected = self.suspected()
            fresh = suspected.difference(ex)
            if not fresh:  # none it does not exclude already
                continue
            new = self._affordable(job, fresh, len(m.exclude))
            if not new:
                continue
            m.exclude = sorted(ex | new)
            m.updates += 1
            cid = f"{m.command_id}/follow-{m.updates}"
            self.issuer.command(out, now, cid, m.action, m.incident_id, job, m.reason, {"only_if_waiting": "true"},
                                exclude=m.exclude)
            self.issuer.audit(out, now, "command", f"{m.action} {job}, waiting for capacity: also excluding "
                              f"{', '.join(sorted(new))} (suspected since)", incident_id=m.incident_id, job=job,
                              track="job", command_ids=[cid])
        if len(self._excluded) > len(moving):  # some restart was placed or given up: its set goes
            self._excluded = {job: excluded for job, excluded in self._excluded.items() if job in moving}

    def release_due(self, now: float, out: Decisions) -> None:
        """Issue held retries whose backoff passed, unless the job moved on meanwhile."""
        if not self.state.held or min(h.due for h in self.state.held) > now:
            return
        due = [h for h in self.state.held if h.due <= now]
        self.state.held = [h for h in self.state.held if h.due > now]
        for h in due:
            rec = self.triage.job(h.job)
            if rec is None or rec.attempt != h.attempt or rec.status != "failed":
                state = f"attempt {rec.attempt} is {rec.status}" if rec else "it is gone"
                self.issuer.audit(out, now, "skipped", f"{h.action} of {h.job} dropped: the job moved on ({state}) "
                                  "during the backoff", job=h.job, incident_id=h.incident_id, track="job")
                self.incidents.untrack(h.incident_id, now, out, job=h.job)
                continue
            self.triage.expect_failure(h.job, h.attempt, now + self.settings.signing.command_ttl_s
                                       + self.settings.triage.failure_settle_s)
            # in place, except on the nodes fleetmedic suspects now (the job's own nodes first); while
            # its pods wait, they learn the nodes suspected since (as a re-placement's do)
            exclude = sorted(self._affordable(h.job, self.suspected()))
            self.issuer.command(out, now, h.id, h.action, h.incident_id, h.job, h.reason, h.params, exclude=exclude)
            if self.settings.policy.follow_suspects_s > 0:
                self.state.moving[h.job] = MovingJob(command_id=h.id, action="restart_job", incident_id=h.incident_id,
                                                     attempt=h.attempt, since=now, exclude=exclude, reason=h.reason)

    def on_failed_result(self, info: CommandInfo, result: RemediationResult, now: float, out: Decisions) -> None:
        """The executor could not carry out a job command: a human is told."""
        self.issuer.audit(out, now, "escalated", f"{info.action} of {info.job} failed: {result.reason}", job=info.job,
                          incident_id=info.incident_id, track="job")
        cid = command_id(info.incident_id, "escalate", info.job, f"{info.action}-failed")
        self.issuer.command(out, now, cid, "escalate", info.incident_id, info.job,
                            f"{info.action} failed: {result.reason}", {"escalation": "notify"})

    def on_event(self, e: JobEvent, now: float, out: Decisions) -> None:
        """Account a job event: attempts, running time, placements on held nodes, recoveries done."""
        acc = self.accounting
        moving = self.state.moving.get(e.job)
        if moving is not None and (e.event == "completion" or (e.event in ("placement", "start")
                                                               and e.attempt > moving.attempt)):
            del self.state.moving[e.job]  # placed (or done): its exclusions are what the scheduler used
        if e.event == "placement":
            bad = [p.node for p in e.placement if self.gate.holds(p.node) or self.node_state(p.node) in OUT_OF_SERVICE]
            for node in sorted(set(bad)):
                acc.repeat_placement()
                self.issuer.audit(out, now, "repeat_placement", f"job {e.job} attempt {e.attempt} was placed on "
                                  f"{node}, which fleetmedic holds out of service ({self.node_state(node)})",
                                  node=node, job=e.job)
        if e.event == "start":
            acc.job_attempt()
            acc.job_running(e.job, now)
        elif e.event == "progress":
            acc.job_running(e.job, now)
        elif e.event in ("failure", "completion"):
            acc.job_stopped(e.job, now)
        if acc.job_progress(e.job, e.event, e.attempt, now) or e.event == "completion":
            self._job_done(e.job, now, out)

    def recoveries(self, now: float, out: Decisions) -> None:
        """Restarted jobs that ran ``policy.recovered_after_s`` without failing are recovered (0: only a
        progress report recovers a job)."""
        after = self.settings.policy.recovered_after_s
        if after > 0 and self.accounting.state.timelines:
            for job, _ in self.accounting.recoveries_due(now, after):
                self._job_done(job, now, out)

    def _job_done(self, job: str, now: float, out: Decisions) -> None:
        """The job recovered (or completed): no incident waits for it any more, whichever of them
        moved it last (a job that failed again before it recovered is tracked by several)."""
        for inc_id, tracks in list(self.state.tracks.items()):
            if job in tracks.jobs:
                self.incidents.untrack(inc_id, now, out, job=job)
