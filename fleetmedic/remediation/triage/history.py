"""The failed jobs rule 6 of :mod:`.failures` weighs: jobs that failed without a distinctive error,
and on which nodes. A failure is recorded once, with its nodes as one sorted list (the job record's
own, shared and read-only), not once a node: a lock-step job of thousands of nodes failing again
and again costs one entry a failure. Which failed jobs a node was part of within a window is
derived when a failure is weighed, for that failure's nodes only.

The serialised form is the state's ``node_failed_jobs`` (node -> ``(time, job)``: each job's latest
failure on the node): :class:`FailedJobs` reads it when built and writes it back in :meth:`~FailedJobs.write`,
which the engine calls before the state is serialised. Pure: time comes in as ``now``."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterator, Mapping

from fleetmedic.remediation.triage.records import TriageState

#: a job's failures, oldest first: (time, its nodes sorted)
Failures = list[tuple[float, list[str]]]


class FailedJobs:
    """Job -> its unattributed failures (see the module's docstring). A node's time for a job is the
    latest of the job's failures that had the node."""

    def __init__(self, state: TriageState) -> None:
        self.state = state
        self.failures: dict[str, Failures] = {}
        self.read()

    def read(self) -> None:
        """Take the state's ``node_failed_jobs``: the nodes that share a job's failure time are one failure."""
        groups: dict[tuple[str, float], list[str]] = {}
        for node, entries in self.state.node_failed_jobs.items():
            for t, job in entries:
                groups.setdefault((job, t), []).append(node)
        self.failures = {}
        for (job, t), nodes in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            self.failures.setdefault(job, []).append((t, sorted(nodes)))

    def write(self) -> None:
        """Put the failures into the state's ``node_failed_jobs`` (its serialised form): each node's
        jobs, one entry a job (its latest failure there), oldest first (then by name)."""
        latest: dict[str, dict[str, float]] = {}
        for job, failures in self.failures.items():
            for t, nodes in failures:
                for n in nodes:
                    jobs = latest.setdefault(n, {})
                    if t >= jobs.get(job, t):
                        jobs[job] = t
        self.state.node_failed_jobs = {n: sorted((t, j) for j, t in jobs.items()) for n, jobs in sorted(latest.items())}

    def note(self, job: str, nodes: list[str], t: float) -> None:
        """``job`` failed at ``t`` on ``nodes`` (sorted, distinct; kept as given, never changed). The
        same nodes as the job's latest failure (the same list, or an equal one) move that entry's time."""
        failures = self.failures.setdefault(job, [])
        if failures and (failures[-1][1] is nodes or failures[-1][1] == nodes):
            failures[-1] = (max(t, failures[-1][0]), failures[-1][1])
            return
        failures.append((t, nodes))
        if len(failures) > 1 and failures[-2][0] > t:  # noted out of time order: keep them oldest first
            failures.sort(key=lambda e: e[0])

    def jobs_of(self, nodes: list[str], node_set: set[str] | frozenset[str], horizon: float, enough: int
                ) -> Iterator[tuple[str, set[str]]]:
        """Of ``nodes`` (sorted; ``node_set`` the same as a set), each that was part of at least
        ``enough`` failed jobs at or after ``horizon``, with those jobs, in the order of ``nodes``.
        A job whose latest failure in the window had exactly ``nodes`` (the failure being weighed)
        counts for each of them at no cost a node; any other job costs the smaller of its failures'
        nodes or a binary search of each of its failures for each of ``nodes``."""
        every: list[tuple[float, str]] = []  # (time, job): the jobs every one of ``nodes`` was part of
        hits: dict[str, list[tuple[float, str]]] = {}  # node -> (its latest time in the job, job)
        for job, failures in self.failures.items():
            if not failures or failures[-1][0] < horizon:
                continue
            recent = [(t, ns) for t, ns in reversed(failures) if t >= horizon]  # newest first
            if recent[0][1] is nodes or recent[0][1] == nodes:
                every.append((recent[0][0], job))
            elif len(nodes) * len(recent) <= sum(len(ns) for _, ns in recent):
                for n in nodes:
                    for t, ns in recent:
                        i = bisect_left(ns, n)
                        if i < len(ns) and ns[i] == n:
                            hits.setdefault(n, []).append((t, job))
                            break
            else:
                found: set[str] = set()
                for t, ns in recent:
                    for n in node_set.intersection(ns).difference(found):
                        hits.setdefault(n, []).append((t, job))
                        found.add(n)
        need = enough - len(every)
        for n in nodes if need <= 0 else sorted(hits):  # (the nodes hit are some of ``nodes``: sorted)
            got = hits.get(n, [])
            if len(got) >= need:
                # in the order a node's entries are kept: its latest failure last
                yield n, {j for _, j in sorted(every + got, key=lambda e: e[0])}

    def failed_since(self, horizon: float) -> int:
        """How many jobs failed (unattributed) at or after ``horizon``."""
        return sum(1 for fs in self.failures.values() if fs and fs[-1][0] >= horizon)

    def trim(self, horizon: float) -> None:
        """Forget the failures older than ``horizon`` (and the sizes of jobs left with none)."""
        for job in [j for j, fs in self.failures.items() if not fs or fs[0][0] < horizon]:
            kept = [e for e in self.failures[job] if e[0] >= horizon]
            if kept:
                self.failures[job] = kept
            else:
                del self.failures[job]
        sizes = self.state.failed_job_sizes
        self.state.failed_job_sizes = {j: k for j, k in sizes.items() if j in self.failures}


def chance_by_jobs(hosted: Mapping[int, int], rate: float, k: int) -> float:
    """How many nodes would be in ``k`` or more failed jobs by chance if failures struck jobs, not
    nodes: each job failing with probability ``rate`` whatever its size, a node that hosted ``h`` jobs
    (``hosted``: h -> how many nodes hosted that many) is in ``k`` of them with the binomial tail.
    Small jobs fail as often as large ones, so the nodes that host one short job after another
    collect failures."""
    rate = min(1.0, max(0.0, rate))
    total = 0.0
    for h, nodes in hosted.items():
        if h >= k:
            below = sum(math.comb(h, i) * rate**i * (1.0 - rate) ** (h - i) for i in range(k))
            total += nodes * max(0.0, 1.0 - below)
    return total
