"""What triage knows about jobs: where each runs (and so which jobs a node's fault hits), its current
attempt and status, and the failure reports of an attempt gathered for ``failure_settle_s`` before
the failure is decided (:mod:`.failures`)."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter

from fleetmedic.config import TriageSettings
from fleetmedic.records import JobEvent, RankPlacement
from fleetmedic.remediation.placements import among, changed_at
from fleetmedic.remediation.triage.records import FailureReport, JobRecord, PendingGroup, TriageState, file_group


class JobBoard:
    def __init__(self, settings: TriageSettings, state: TriageState) -> None:
        self.settings = settings
        self.state = state
        #: node -> the jobs whose current placement has a rank there, whatever their status: built from
        #: the state once (after a restore), then updated as placements change (per event, not per fleet)
        self._by_node: dict[str, set[str]] | None = None
        #: no completed or failed job's last event is older than this (unknown after a restore)
        self._done_since = float("-inf")
        #: job -> its record and the placement its ranks and nodes were last read from: a job placed
        #: again on the same ranks (a lock-step job restarted where it ran) is not read again
        self._read_from: dict[str, tuple[JobRecord, list[RankPlacement]]] = {}
        #: job -> its record's nodes and how many of its ranks each hosts (made when a placement is
        #: first read as a change of the last one)
        self._counts: dict[str, tuple[list[str], Counter[str]]] = {}
        self._sets: dict[str, tuple[list[str], frozenset[str]]] = {}  # job -> its record's nodes, as a set

    def _index(self) -> dict[str, set[str]]:
        if self._by_node is None:
            index: dict[str, set[str]] = {}
            for rec in self.state.jobs.values():
                for n in rec.nodes:
                    index.setdefault(n, set()).add(rec.job)
            self._by_node = index
        return self._by_node

    def _moved(self, job: str, before: list[str], after: list[str]) -> None:
        """``job``'s nodes went from ``before`` to ``after``."""
        if self._by_node is not None and before != after:
            old, new = set(before), set(after)
            self._changed_nodes(job, old - new, new - old)

    def _changed_nodes(self, job: str, left: set[str], gained: set[str]) -> None:
        """``job`` left the nodes ``left`` and gained ``gained`` (the index, once built, follows)."""
        index = self._by_node
        if index is None:
            return
        for n in left:
            jobs = index.get(n)
            if jobs is not None:
                jobs.discard(job)
                if not jobs:
                    del index[n]
        for n in gained:
            index.setdefault(n, set()).add(job)

    def jobs_on(self, node: str) -> tuple[str, ...]:
        """The placed or running jobs with a rank on ``node``."""
        jobs = self.state.jobs
        return tuple(sorted(j for j in self._index().get(node, ()) if jobs[j].status in ("placed", "running")))

    def jobs_placed_on(self, node: str) -> tuple[str, ...]:
        """Every known job whose current placement has a rank on ``node`` (finished ones too, until forgotten)."""
        return tuple(sorted(self._index().get(node, ())))

    def hosted_since(self, horizon: float) -> tuple[int, dict[str, int]]:
        """The jobs active at or after ``horizon`` (placed, running, or with an event since), and for
        each node the number of them whose current placement has a rank there."""
        active = {j for j, rec in self.state.jobs.items()
                  if rec.status in ("placed", "running") or rec.last_event >= horizon}
        hosted = {n: k for n, jobs in self._index().items() if (k := len(jobs & active))}
        return len(active), hosted

    def job(self, job: str) -> JobRecord | None:
        return self.state.jobs.get(job)

    def expect_failure(self, job: str, attempt: int, until: float) -> None:
        """A failure of this attempt is fleetmedic's own doing (it restarted or drained it)."""
        self.state.expected[f"{job}#{attempt}"] = until

    def forget_decision(self, job: str, attempt: int) -> None:
        """A new run of that attempt (started, placed or restarted again): its failure is decided anew."""
        self.state.decided.pop(f"{job}#{attempt}", None)

    def add_event(self, e: JobEvent, now: float) -> list[str]:
        """Track the job; gather failure reports. Returns notes for the audit (ignored reports)."""
        rec = self.state.jobs.get(e.job)
        if rec is None:
            rec = self.state.jobs[e.job] = JobRecord(job=e.job, attempt=e.attempt)
        notes: list[str] = []
        if e.attempt < rec.attempt and e.event != "failure":
            return [f"{e.job}: {e.event} of attempt {e.attempt} ignored, attempt {rec.attempt} is current"]
        rec.last_event = max(rec.last_event, e.ts)
        if e.placement:
            rec.attempt = e.attempt
            last = self._read_from.get(e.job)
            if last is None or last[0] is not rec or last[1] != e.placement:
                if last is None or last[0] is not rec or not self._read_change(rec, last[1], e.placement):
                    rec.ranks = {p.rank: p.node for p in e.placement}
                    before, rec.nodes = rec.nodes, sorted(set(rec.ranks.values()))
                    self._moved(rec.job, before, rec.nodes)
                self._read_from[e.job] = (rec, list(e.placement))
        if e.event == "placement":
            rec.attempt, rec.status = e.attempt, "placed"
        elif e.event in ("start", "progress"):
            rec.attempt = max(rec.attempt, e.attempt)
            rec.status = "running"
            if e.event == "progress":
                rec.retries_in_place = 0
        elif e.event == "completion":
            rec.status, rec.retries_in_place = "completed", 0
        elif e.event == "restart":
            rec.attempt, rec.status = max(rec.attempt, e.attempt), "placed"
        elif e.event == "failure":
            notes += self._gather_failure(rec, e, now)
        if rec.status in ("completed", "failed"):
            self._done_since = min(self._done_since, rec.last_event)
        return notes

    def _read_change(self, rec: JobRecord, last: list[RankPlacement], placement: list[RankPlacement]) -> bool:
        """Read ``placement`` as a change of ``last`` (the job's last placement read into ``rec``), if
        few of its ranks changed node and none changed number, and ``last`` named each rank once:
        the changed ranks, the nodes left and gained and the node-to-jobs index are updated, O(the
        ranks changed) but for copying the sorted node list. False: to be read whole."""
        at = changed_at(last, placement)
        if at is None or len(rec.ranks) != len(last) or any(last[i].rank != placement[i].rank for i in at):
            return False
        counts = self._counts.get(rec.job)
        if counts is None or counts[0] is not rec.nodes:
            counts = (rec.nodes, Counter(rec.ranks.values()))
        per_node = counts[1]
        touched: set[str] = set()
        for i in at:
            before, after = last[i], placement[i]
            rec.ranks[after.rank] = after.node
            per_node[before.node] -= 1
            per_node[after.node] += 1
            touched.update((before.node, after.node))
        nodes = rec.nodes.copy()
        left = {n for n in touched if not per_node[n]}
        gained = {n for n in touched if per_node[n] and not among(nodes, n)}
        for n in left:
            del per_node[n]
            if among(nodes, n):
                del nodes[bisect_left(nodes, n)]
        for n in gained:
            insort(nodes, n)
        made = self._sets.get(rec.job)
        if made is not None and made[0] is rec.nodes and (left or gained):  # the set, changed the same way
            self._sets[rec.job] = (nodes, made[1].difference(left).union(gained))
        elif made is not None and made[0] is rec.nodes:
            self._sets[rec.job] = (nodes, made[1])
        rec.nodes = nodes
        self._counts[rec.job] = (nodes, per_node)
        self._changed_nodes(rec.job, left, gained)
        return True

    def node_set(self, rec: JobRecord) -> frozenset[str]:
        """``rec.nodes`` as a set, made once for each placement (a lock-step job fails again and again
        on the same nodes)."""
        if self.state.jobs.get(rec.job) is not rec:  # a job not tracked (yet): kept for none
            return frozenset(rec.nodes)
        made = self._sets.get(rec.job)
        if made is None or made[0] is not rec.nodes:
            made = self._sets[rec.job] = (rec.nodes, frozenset(rec.nodes))
        return made[1]

    def _gather_failure(self, rec: JobRecord, e: JobEvent, now: float) -> list[str]:
        key = f"{e.job}#{e.attempt}"
        if e.attempt == rec.attempt:
            rec.status = "failed"
        if self.state.expected.get(key, -1.0) >= now:
            return [f"{key}: failure expected (fleetmedic restarted or drained it); no new decision"]
        if key in self.state.decided:
            return [f"{key}: late failure report after the attempt was triaged; kept as evidence only"]
        node = e.node or (rec.ranks.get(e.rank, "") if e.rank is not None else "")
        report = FailureReport(ts=e.ts, node=node, rank=e.rank, exit_code=e.exit_code, reason=e.reason,
                               lines=list(e.log_excerpt))
        group = self.state.failures.get(key)
        if group is None:
            group = file_group(self.state.failures, PendingGroup(
                key=key, first_ts=now, deadline=now + self.settings.failure_settle_s, job=e.job, attempt=e.attempt))
        group.reports.append(report)
        return []

    def forget_finished(self, before: float) -> None:
        """Drop completed and failed jobs whose last event is older than ``before``."""
        if before <= self._done_since:
            return  # none is old enough: the jobs need not be looked at
        since = float("inf")
        for job, rec in list(self.state.jobs.items()):
            if rec.status in ("completed", "failed"):
                if rec.last_event < before:
                    del self.state.jobs[job]
                    self._read_from.pop(job, None)
                    self._counts.pop(job, None)
                    self._sets.pop(job, None)
                    self._moved(job, rec.nodes, [])
                else:
                    since = min(since, rec.last_event)
        self._done_since = since

