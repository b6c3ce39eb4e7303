"""Honest metrics: what failed, against which denominator, and where recovery time went.

- **Job failures** are counted per failed job attempt, by incident class, against job attempts
  and job-hours (time jobs ran). **Node failures** are counted per incident that suspects a node,
  against node-days (fleet size integrated over time). The two never share a denominator.
- **Node-time**: *dangerous but schedulable* is the time from the first evidence on a node that
  turned out bad (diagnostics failed) until its cordon was confirmed; *refused* is the time nodes
  spent schedulable while safety refused their isolation, by kind (``definitive``: a node whose
  device is gone, left schedulable: the clock to alert on); *healthy but unschedulable*
  is the time a node that turned out healthy (diagnostics passed on the first try, no repair) was
  held out of service, plus, for any node, the time from passing diagnostics to its return.
- **MTTR** of each job recovery is split into *detect* (first evidence -> incident), *isolate*
  (incident -> suspect node cordoned), *wait for capacity* (restart issued -> new placement),
  *restore* (placement -> job running) and *first good step* (running -> first progress).
- **Repeats**: failures attributed to a node fleetmedic holds out of service, and placements of a
  job onto such a node (the state-propagation problem).

Pure: fed by :class:`~fleetmedic.remediation.engine.DecisionEngine`, time comes in as ``now``.
"""

from __future__ import annotations

import statistics
from typing import Any, Final

import msgspec

PHASES: Final = ("detect", "isolate", "wait_for_capacity", "restore", "first_good_step")
MAX_SAMPLES: Final = 2000


class Timeline(msgspec.Struct, kw_only=True):
    incident_id: str
    job: str
    failed_attempt: int
    fault_at: float
    detected_at: float
    restart_at: float
    suspects: list[str] = []
    isolated_at: float | None = None
    placed_at: float | None = None
    started_at: float | None = None


class NodeClock(msgspec.Struct, kw_only=True):
    evidence_at: float = 0.0
    isolated_at: float | None = None
    passed_at: float | None = None
    healthy_first_try: bool = False
    confirmed_bad: bool = False


class AccountingState(msgspec.Struct, kw_only=True):
    job_attempts: int = 0
    job_seconds: float = 0.0
    running_since: dict[str, float] = {}
    job_failures: dict[str, int] = {}
    node_failures: dict[str, int] = {}
    node_seconds: float = 0.0
    fleet_size: int = 0
    fleet_since: float | None = None
    dangerous_schedulable_s: float = 0.0
    healthy_unschedulable_s: float = 0.0
    clocks: dict[str, NodeClock] = {}
    isolations: int = 0
    isolations_confirmed_bad: int = 0
    isolations_healthy: int = 0
    isolations_for_software: int = 0
    refused_s: dict[str, float] = {}  # kind -> node-seconds schedulable while isolation was refused (ended)
    refused_since: dict[str, tuple[str, float]] = {}  # node -> (kind, since) of a refusal going on
    repeat_failures: int = 0
    repeat_placements: int = 0
    timelines: dict[str, Timeline] = {}  # job -> recovery in progress
    phases: dict[str, list[float]] = {}  # phase -> recent durations
    phase_totals: dict[str, int] = {}  # phase -> durations ever sampled (the metrics' histograms follow it)


class Accounting:
    def __init__(self, state: AccountingState | None = None) -> None:
        self.state = state if state is not None else AccountingState()

    # --- denominators -----------------------------------------------------------------------------

    def fleet(self, size: int, now: float) -> None:
        st = self.state
        if st.fleet_since is not None and now > st.fleet_since:
            st.node_seconds += st.fleet_size * (now - st.fleet_since)
        st.fleet_since = now if st.fleet_since is None else max(now, st.fleet_since)
        st.fleet_size = size

    def job_running(self, job: str, now: float) -> None:
        self.state.running_since.setdefault(job, now)

    def job_stopped(self, job: str, now: float) -> None:
        since = self.state.running_since.pop(job, None)
        if since is not None:
            self.state.job_seconds += max(0.0, now - since)

    def job_attempt(self) -> None:
        self.state.job_attempts += 1

    # --- failures ---------------------------------------------------------------------------------

    def job_failed(self, klass: str) -> None:
        self.state.job_failures[klass] = self.state.job_failures.get(klass, 0) + 1

    def node_failed(self, klass: str, nodes: int = 1) -> None:
        self.state.node_failures[klass] = self.state.node_failures.get(klass, 0) + nodes

    def repeat_failure(self) -> None:
        self.state.repeat_failures += 1

    def repeat_placement(self) -> None:
        self.state.repeat_placements += 1

    # --- node-time --------------------------------------------------------------------------------

    def isolation_started(self, node: str, klass: str, evidence_at: float) -> None:
        self.state.isolations += 1
        if klass in ("transient_software", "job_bug"):
            self.state.isolations_for_software += 1
        self.state.clocks[node] = NodeClock(evidence_at=evidence_at)

    def refused(self, node: str, kind: str, now: float) -> None:
        """Safety refused to isolate ``node`` (on ``kind`` evidence): its refusal clock runs."""
        was = self.state.refused_since.get(node)
        if was is None:
            self.state.refused_since[node] = (kind, now)
        elif was[0] != kind:  # the evidence changed kind: account what ran so far under the old one
            self.refusal_ended(node, now)
            self.state.refused_since[node] = (kind, now)

    def refusal_ended(self, node: str, now: float) -> None:
        """``node`` is isolated after all, cleared, or gone: its refusal clock stops."""
        was = self.state.refused_since.pop(node, None)
        if was is not None:
            self.state.refused_s[was[0]] = self.state.refused_s.get(was[0], 0.0) + max(0.0, now - was[1])

    def refused_now(self) -> dict[str, int]:
        """Nodes whose isolation is refused right now, by kind."""
        out = {"definitive": 0, "preventive": 0, "uncertain": 0}
        for kind, _ in self.state.refused_since.values():
            out[kind] = out.get(kind, 0) + 1
        return out

    def isolated(self, node: str, now: float) -> None:
        clock = self.state.clocks.get(node)
        if clock is not None and clock.isolated_at is None:
            clock.isolated_at = now
            for t in self.state.timelines.values():
                if node in t.suspects and t.isolated_at is None:
                    t.isolated_at = now

    def verdict(self, node: str, passed: bool, first_try: bool, now: float) -> None:
        clock = self.state.clocks.get(node)
        if clock is None:
            return
        if passed:
            clock.passed_at = now
            if first_try and not clock.confirmed_bad:
                clock.healthy_first_try = True
                self.state.isolations_healthy += 1
        elif not clock.confirmed_bad:
            clock.confirmed_bad = True
            self.state.isolations_confirmed_bad += 1
            if clock.isolated_at is not None:
                self.state.dangerous_schedulable_s += max(0.0, clock.isolated_at - clock.evidence_at)

    def returned(self, node: str, now: float) -> None:
        clock = self.state.clocks.pop(node, None)
        if clock is None:
            return
        if clock.healthy_first_try and clock.isolated_at is not None:
            self.state.healthy_unschedulable_s += max(0.0, now - clock.isolated_at)
        elif clock.passed_at is not None:
            self.state.healthy_unschedulable_s += max(0.0, now - clock.passed_at)

    # --- MTTR -------------------------------------------------------------------------------------

    def recovery_started(self, job: str, incident_id: str, failed_attempt: int, fault_at: float,
                         detected_at: float, suspects: list[str], now: float) -> None:
        if job in self.state.timelines:
            return
        isolated = [c.isolated_at for n in suspects if (c := self.state.clocks.get(n)) and c.isolated_at is not None]
        self.state.timelines[job] = Timeline(incident_id=incident_id, job=job, failed_attempt=failed_attempt,
                                             fault_at=min(fault_at, detected_at), detected_at=detected_at,
                                             restart_at=now, suspects=suspects,
                                             isolated_at=min(isolated) if isolated else None)

    def job_progress(self, job: str, event: str, attempt: int, now: float) -> str | None:
        """Advance a recovery; returns the incident id when the job made its first good step (its first
        progress report). A failure of the restarted attempt sets the recovery back to waiting for a start."""
        t = self.state.timelines.get(job)
        if t is None:
            return None
        if event in ("placement", "restart") and t.placed_at is None and (attempt > t.failed_attempt or
                                                                          now >= t.restart_at):
            t.placed_at = now
        elif event == "start" and t.started_at is None:
            t.placed_at = t.placed_at if t.placed_at is not None else now
            t.started_at = now
        elif event == "failure" and attempt > t.failed_attempt:
            t.started_at = None
        elif event == "progress":
            return self._recovered(t, now)
        return None

    def recoveries_due(self, now: float, after_s: float) -> list[tuple[str, str]]:
        """(job, incident id) of the recoveries whose restarted attempt has run ``after_s`` without
        failing: recovered, for job watchers that see pods run but no training steps."""
        due = [t for t in self.state.timelines.values() if t.started_at is not None and now - t.started_at >= after_s]
        return [(t.job, self._recovered(t, now)) for t in due]

    def _recovered(self, t: Timeline, now: float) -> str:
        placed = t.placed_at if t.placed_at is not None else now
        started = t.started_at if t.started_at is not None else placed
        self._sample("detect", t.detected_at - t.fault_at)
        if t.isolated_at is not None:
            self._sample("isolate", t.isolated_at - t.detected_at)
        self._sample("wait_for_capacity", placed - t.restart_at)
        self._sample("restore", started - placed)
        self._sample("first_good_step", now - started)
        del self.state.timelines[t.job]
        return t.incident_id

    def _sample(self, phase: str, value: float) -> None:
        self.state.phase_totals[phase] = self.recovered(phase) + 1
        samples = self.state.phases.setdefault(phase, [])
        samples.append(max(0.0, value))
        if len(samples) > MAX_SAMPLES:
            del samples[: len(samples) - MAX_SAMPLES]

    def recovered(self, phase: str) -> int:
        """Durations of ``phase`` sampled ever (at least the recent ones kept: a state saved before
        the count existed)."""
        return max(self.state.phase_totals.get(phase, 0), len(self.state.phases.get(phase, ())))

    def recoveries(self) -> dict[str, tuple[int, list[float]]]:
        """Per phase: (durations sampled ever, the most recent ones, oldest first). A reader that
        remembers the count sees which durations are new since it last looked."""
        return {phase: (self.recovered(phase), self.state.phases.get(phase, [])) for phase in PHASES}

    # --- report -----------------------------------------------------------------------------------

    def report(self, now: float) -> dict[str, Any]:
        st = self.state
        node_seconds = st.node_seconds + (st.fleet_size * (now - st.fleet_since) if st.fleet_since is not None
                                          and now > st.fleet_since else 0.0)
        job_seconds = st.job_seconds + sum(max(0.0, now - t) for t in st.running_since.values())
        job_total, node_total = sum(st.job_failures.values()), sum(st.node_failures.values())
        refused = {"definitive": 0.0, "preventive": 0.0, "uncertain": 0.0} | dict(st.refused_s)
        for kind, since in st.refused_since.values():
            refused[kind] = refused.get(kind, 0.0) + max(0.0, now - since)
        return {
            "job_failures": {
                "total": job_total, "by_class": dict(sorted(st.job_failures.items())),
                "attempts": st.job_attempts, "job_hours": job_seconds / 3600,
                "per_attempt": job_total / st.job_attempts if st.job_attempts else None,
                "per_job_hour": job_total / (job_seconds / 3600) if job_seconds else None,
            },
            "node_failures": {
                "total": node_total, "by_class": dict(sorted(st.node_failures.items())),
                "node_days": node_seconds / 86400,
                "per_node_day": node_total / (node_seconds / 86400) if node_seconds else None,
            },
            "node_time": {
                "dangerous_but_schedulable_s": st.dangerous_schedulable_s,
                "healthy_but_unschedulable_s": st.healthy_unschedulable_s,
                **{f"refused_{kind}_s": refused[kind] for kind in ("definitive", "preventive", "uncertain")},
            },
            "refused_now": self.refused_now(),
            "isolations": {
                "total": st.isolations, "confirmed_bad": st.isolations_confirmed_bad,
                "healthy_first_try": st.isolations_healthy, "for_software_or_job_bugs": st.isolations_for_software,
            },
            "repeats": {"failures_on_isolated_nodes": st.repeat_failures,
                        "placements_on_isolated_nodes": st.repeat_placements},
            "mttr_s": {phase: _summary(st.phases.get(phase, [])) for phase in PHASES},
        }


def _summary(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"count": 0, "mean": None, "p50": None, "p95": None, "max": None}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"count": len(values), "mean": statistics.fmean(values), "p50": statistics.median(ordered),
            "p95": p95, "max": ordered[-1]}
