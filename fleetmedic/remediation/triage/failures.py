"""Triage of a failed job attempt. The failure reports of one attempt, gathered for
``failure_settle_s``, are classified by the pattern library and weighed against the findings
remembered per node; the rules are tried in order and the first that applies decides:

1. **hardware** — hardware evidence (a hard-fault finding, or a hardware log line) in the same
   window on at most ``max_hardware_suspects`` of the job's nodes: those nodes are the suspects;
2. **network** — the job's nodes sit behind a leaf switch with an open network incident, or have
   network findings or fabric errors in their logs: the switch or the link is the suspect (unless
   the log names a cause of its own and no network error);
3. **preemption** — the job was preempted or evicted: nobody's fault, requeue it;
4. **job bug** — the same distinctive failure on at least ``job_bug_min_nodes`` nodes, or on at
   least ``job_bug_min_fraction`` of the job's nodes (and two or more), none with hardware evidence;
   a distinctive failure that *follows the job* (the same signature on another node in an earlier
   attempt); an application's XIDs (13, 31, 43) spread the same way over the job's nodes; or an
   error in the job's own code (``KeyError``, a shape mismatch): the job is the suspect,
   and its earlier failures stop counting against the nodes they happened on (rule 5);
5. **software failure on a few nodes** — a distinctive software failure (OOM, segfault, illegal
   address) on a few nodes: retry; it counts against the node once per job (failures of
   ``escalate_after_failures`` distinct jobs escalate the node; signals in
   ``policy.node_neutral_signals``, by default memory exhaustion, never count against a node);
6. **history** — nothing distinctive (only timeouts): a node that appears in
   ``suspect_after_failed_jobs`` such failed jobs within ``suspect_window_s`` becomes the suspect,
   unless chance explains it (more than ``suspect_max_chance_nodes`` nodes of the fleet expected in
   all those jobs if they were placed independently: large jobs share nodes by chance, and a node
   that moved from one failed job to the next is scheduling, not evidence; or more than that many
   nodes expected in as many failed jobs if failures struck jobs whatever their size: a node that
   hosts one short job after another collects failures); otherwise a lone timeout with no other
   evidence is transient.

Pure: time comes in as ``now``."""

from __future__ import annotations

import functools
from bisect import insort
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from fleetmedic.config import PolicySettings, TriageSettings
from fleetmedic.records import Evidence, Finding, IncidentClass, Suspect
from fleetmedic.remediation.kinds import Isolation
from fleetmedic.remediation.log_patterns import LineMatch, PatternLibrary
from fleetmedic.remediation.topology import Topology
from fleetmedic.remediation.triage.book import IncidentBook
from fleetmedic.remediation.triage.history import FailedJobs, chance_by_jobs
from fleetmedic.remediation.triage.jobs import JobBoard
from fleetmedic.remediation.triage.records import (
    Assessment,
    JobRecord,
    PendingGroup,
    TriageState,
    app_xids_spread,
    evidence_of,
    finding_isolation,
    is_congestion,
    is_hardware_finding,
    log_isolation,
    most_common,
)

LOG_EVIDENCE_PER_NODE: Final = 3


@dataclass(frozen=True)
class _Failure:
    """What one failed attempt's reports say, with the hardware evidence around it."""

    group: PendingGroup
    rec: JobRecord
    job_nodes: frozenset[str]  # the job's nodes and every node a report came from
    nodes: list[str]  # the same, sorted
    distinct: dict[str, LineMatch]  # node -> its strongest distinctive log match
    soft: dict[str, LineMatch]  # of those, the software failures (neither hardware, network nor preemption)
    loose_best: LineMatch | None  # the strongest match no node could be named for
    matches: list[LineMatch]
    signals: set[str]  # grows as the rules go (widespread hardware evidence)
    first: float  # the earliest report
    since: float  # the evidence window opens
    log_evidence: list[Evidence]
    hw_findings: dict[str, list[Finding]]  # node -> hardware findings in the window
    hw_logs: dict[str, LineMatch]  # node -> hardware log line

    @property
    def job(self) -> str:
        return self.group.job

    @property
    def hw_nodes(self) -> set[str]:
        return set(self.hw_findings) | set(self.hw_logs)

    def own_cause(self) -> list[LineMatch]:
        """The distinctive matches (per node, then the loose one) that name a cause."""
        return [*self.distinct.values(), *([self.loose_best] if self.loose_best and self.loose_best.distinctive
                                           else [])]


Rule = Callable[[_Failure, float], Assessment | None]


class JobFailureTriage:
    def __init__(self, settings: TriageSettings, policy: PolicySettings, library: PatternLibrary,
                 state: TriageState, book: IncidentBook, topology: Topology,
                 fleet_size: Callable[[], int] | None = None, failed_jobs: FailedJobs | None = None,
                 jobs: JobBoard | None = None) -> None:
        self.settings = settings
        self.policy = policy
        self.library = library
        self.state = state
        self.book = book
        self.topology = topology
        self.fleet_size: Callable[[], int] = fleet_size or (lambda: len(self.topology))
        #: rule 6's failed jobs (their serialised form is the state's ``node_failed_jobs``)
        self.failed_jobs = failed_jobs if failed_jobs is not None else FailedJobs(state)
        self.jobs = jobs if jobs is not None else JobBoard(settings, state)

    def decide(self, group: PendingGroup, now: float) -> list[Assessment]:
        """The first of the rules (see the module's docstring) that applies to this failed attempt."""
        failure = self._read(group, now)
        rules: tuple[Rule, ...] = (self._hardware, self._network, self._preemption, self._job_bug,
                                   self._software_on_few_nodes)
        for rule in rules:
            found = rule(failure, now)
            if found is not None:
                return [found]
        return [self._history(failure, now)]

    # --- reading the reports ------------------------------------------------------------------------

    def _read(self, group: PendingGroup, now: float) -> _Failure:
        s, lib = self.settings, self.library
        rec = self.state.jobs.get(group.job) or JobRecord(job=group.job, attempt=group.attempt)
        placed = self.jobs.node_set(rec)
        extra = sorted({rep.node for rep in group.reports if rep.node and rep.node not in placed})
        job_nodes = placed.union(extra) if extra else placed
        by_node: dict[str, list[LineMatch]] = {}
        loose: list[LineMatch] = []
        for rep in group.reports:
            for m in lib.classify_all([*rep.lines, *([rep.reason] if rep.reason else [])]):
                if m.pattern is None:
                    continue
                node = self._node_of(m, rec) or rep.node
                (by_node.setdefault(node, []) if node else loose).append(m)
        sig = {n: b for n, ms in by_node.items() if (b := lib.strongest(ms)) is not None}
        distinct = {n: m for n, m in sig.items() if m.distinctive}
        matches = [m for ms in by_node.values() for m in ms] + loose
        first = min([r.ts for r in group.reports] or [group.first_ts])
        since = first - s.evidence_window_s
        findings = self.state.findings
        return _Failure(
            group=group, rec=rec, job_nodes=job_nodes, distinct=distinct,
            # the record's nodes are sorted and distinct: the same list (read-only: a placement replaces
            # it) unless a report named another
            nodes=_with(rec.nodes, extra) if extra else rec.nodes,
            soft={n: m for n, m in distinct.items() if m.incident_class not in ("hardware", "network")
                  and m.signal != "preemption"},
            loose_best=lib.strongest(loose), matches=matches, signals={m.signal for m in matches}, first=first,
            since=since, log_evidence=_log_evidence(by_node, loose),
            hw_findings={n: fs for n in job_nodes.intersection(findings) if (fs := [
                f for f in findings[n] if is_hardware_finding(f) and since <= f.ts <= now])},
            hw_logs={n: m for n, m in distinct.items() if m.incident_class == "hardware"},
        )

    def _node_of(self, m: LineMatch, rec: JobRecord) -> str:
        if m.rank is not None and m.rank in rec.ranks:
            return rec.ranks[m.rank]
        if m.host and (m.host in self.jobs.node_set(rec) or m.host in self.topology):
            return m.host
        return ""

    # --- 1. hardware --------------------------------------------------------------------------------

    def _hardware(self, x: _Failure, now: float) -> Assessment | None:
        hw_nodes, found, logs = x.hw_nodes, x.hw_findings, x.hw_logs
        if len(hw_nodes) > self.settings.max_hardware_suspects:
            x.signals.add("widespread_hardware_evidence")
            return None
        if not hw_nodes:
            return None
        ranked = sorted(hw_nodes, key=lambda n: (-(n in found) - (n in logs), n))
        suspects = [Suspect(kind="node", name=n) for n in ranked]
        gpus = [f.gpu for n in ranked for f in found.get(n, ()) if f.gpu is not None]
        suspects += [Suspect(kind="gpu", name=f"{ranked[0]}/gpu{gpus[0]}")] if gpus else []
        both = [n for n in ranked if n in found and n in logs]
        conf = 0.97 if both else (0.9 if found else 0.85)
        hints = {f"hint:{f.action_hint}" for fs in found.values() for f in fs if f.action_hint}
        hints |= {f"hint:{m.hint}" for m in logs.values() if m.hint}
        why = (f"job {x.job} attempt {x.group.attempt} failed; hardware evidence on "
               f"{', '.join(ranked)} in the same window"
               + (" (findings and log lines agree)" if both else ""))
        ev = [*evidence_of([f for n in ranked for f in found.get(n, ())]), *x.log_evidence]
        ids = [f.id for n in ranked for f in found.get(n, ())]
        isolation: dict[str, Isolation] = {}
        for n in ranked:
            basis = [finding_isolation(f) for f in found.get(n, ())]
            if n in logs:
                m = logs[n]
                basis.append(log_isolation(m.signal, m.pattern, m.xid, m.hint))
            isolation[n] = functools.reduce(Isolation.stronger, basis) if basis else Isolation("uncertain",
                                                                                               "class:hardware")
        return self._failure("hardware", f"node:{ranked[0]}", suspects, conf, ev, why, x, now,
                             x.signals | hints | {"hardware_evidence"}, ids, gpu=gpus[0] if gpus else None,
                             isolation=isolation)

    # --- 2. network ---------------------------------------------------------------------------------

    def _network(self, x: _Failure, now: float) -> Assessment | None:
        # unless the log names a cause of its own and no network error: an OOM on a node behind a broken
        # leaf is still an OOM, and a job its owner or the scheduler terminated (SIGTERM, preempted,
        # evicted; reported per rank or for the whole job) was not killed by the fabric
        net_logs = {n for n, m in x.distinct.items() if m.incident_class == "network"}
        own_cause = any(m.incident_class in ("transient_software", "job_bug") for m in x.own_cause())
        fabric_suspected = bool(net_logs) or not own_cause
        if fabric_suspected and (behind_open := self._behind_an_open_switch_incident(x, now)):
            return behind_open
        since, congestion = x.since, self.settings.congestion_metrics
        findings = self.state.findings
        net_findings = {n for n in x.job_nodes.intersection(findings) if any(
            f.kind == "network" and f.severity != "info" and since <= f.ts <= now and not is_congestion(f, congestion)
            for f in findings[n])}
        net_nodes = (net_findings if fabric_suspected else set()) | net_logs
        if not net_nodes:
            return None
        if len(net_nodes) <= self.settings.max_hardware_suspects:
            ranked = sorted(net_nodes, key=lambda n: (-(n in net_findings) - (n in net_logs), n))
            why = f"job {x.job} failed; network errors on {', '.join(ranked)}"
            conf = 0.85 if net_findings & net_logs else 0.75
            return self._failure("network", f"link:{ranked[0]}", [Suspect(kind="node", name=n) for n in ranked],
                                 conf, x.log_evidence, why, x, now, x.signals | {"link"}, [])
        return self._shared_leaf(x, net_nodes, now)

    def _behind_an_open_switch_incident(self, x: _Failure, now: float) -> Assessment | None:
        prefix = "network|switch:"
        if not any(key.startswith(prefix) for key in self.state.open_by_subject):
            return None  # no switch incident on the book: the job's leaves need not be looked at
        for leaf in sorted({leaf for n in x.nodes for leaf in self.topology.leaves_of(n)}):
            if self.book.is_open("network", f"switch:{leaf}"):
                behind = self.topology.behind_leaf(leaf)
                why = f"job {x.job} failed with nodes behind leaf {leaf}, which has an open network incident"
                return self._failure("network", f"switch:{leaf}", [Suspect(kind="switch", name=leaf)], 0.85,
                                     x.log_evidence, why, x, now, x.signals | {"leaf_correlated"}, [],
                                     exclude=sorted(behind & set(x.nodes)))
        return None

    def _shared_leaf(self, x: _Failure, net_nodes: set[str], now: float) -> Assessment | None:
        """Fabric errors on too many nodes to suspect each: their common leaf, if enough share one.
        Nodes whose topology names no leaf share none."""
        top = most_common(Counter(leaf for n in net_nodes for leaf in self.topology.leaves_of(n)))
        if top is None:
            return None
        leaf, count = top
        if not leaf or count < self.settings.leaf_min_nodes:
            return None
        behind = self.topology.behind_leaf(leaf)
        why = f"job {x.job} failed with fabric errors on {count} nodes behind leaf {leaf}"
        return self._failure("network", f"switch:{leaf}", [Suspect(kind="switch", name=leaf)], 0.7,
                             x.log_evidence, why, x, now, x.signals | {"leaf_correlated"}, [],
                             exclude=sorted(behind & set(x.nodes)))

    # --- 3. preemption ------------------------------------------------------------------------------

    def _preemption(self, x: _Failure, now: float) -> Assessment | None:
        if "preemption" not in {m.signal for m in (*x.distinct.values(), *([x.loose_best] if x.loose_best else []))}:
            return None
        why = f"job {x.job} attempt {x.group.attempt} was preempted or evicted"
        return self._failure("transient_software", f"job:{x.job}", [Suspect(kind="job", name=x.job)],
                             0.9, x.log_evidence, why, x, now, x.signals | {"preemption"}, [])

    # --- 4. job bug ---------------------------------------------------------------------------------

    def _job_bug(self, x: _Failure, now: float) -> Assessment | None:
        found = self._job_bug_of(x, now)
        if found is not None:
            self._acquit_nodes(x.job)
        return found

    def _acquit_nodes(self, job: str) -> None:
        """``job``'s own bug explains its failures: those noted against nodes no longer count there (a
        node where it failed first is not escalated when another job fails on it later)."""
        for node, entries in list(self.state.node_failures.items()):
            kept = [e for e in entries if e[1] != job]
            if len(kept) < len(entries):
                if kept:
                    self.state.node_failures[node] = kept
                else:
                    del self.state.node_failures[node]

    def _job_bug_of(self, x: _Failure, now: float) -> Assessment | None:
        s, job = self.settings, x.job
        top = most_common(Counter(m.pattern for m in x.soft.values()))
        if top is not None:
            pattern, count = top
            many = count >= s.job_bug_min_nodes or (count >= 2 and count >= s.job_bug_min_fraction * len(x.nodes))
            if many and not x.hw_nodes:
                why = (f"the same failure ({pattern}) on {count} of {len(x.nodes)} nodes of job {job}, "
                       "none with hardware evidence: a job bug, no node is isolated")
                return self._failure("job_bug", f"job:{job}", [Suspect(kind="job", name=job)], 0.9,
                                     x.log_evidence, why, x, now, x.signals | {"spread"}, [])
        if not x.hw_nodes and app_xids_spread(self.state, s, x.job_nodes, x.since):
            why = (f"job {job} failed and its nodes reported application XIDs (graphics exceptions, page "
                   "faults) as a job bug's spread, none with hardware evidence: a job bug, no node is isolated")
            return self._failure("job_bug", f"job:{job}", [Suspect(kind="job", name=job)], 0.85,
                                 x.log_evidence, why, x, now, x.signals | {"spread", "app_xids"}, [])
        followed = self._follows_the_job(job, x.soft, x.first, now)
        if followed and not x.hw_nodes:
            signature, nodes = followed
            why = (f"job {job} failed with {signature} on {', '.join(nodes)} across attempts: the failure "
                   "follows the job, not a node — a job bug, no node is isolated")
            return self._failure("job_bug", f"job:{job}", [Suspect(kind="job", name=job)], 0.85,
                                 x.log_evidence, why, x, now, x.signals | {"follows_job"}, [])
        user = [m for m in (*x.soft.values(), *([x.loose_best] if x.loose_best and x.loose_best.distinctive else []))
                if m.incident_class == "job_bug"]
        if user:
            why = f"job {job} failed in its own code ({user[0].pattern}): a job bug, no node is isolated"
            return self._failure("job_bug", f"job:{job}", [Suspect(kind="job", name=job)], 0.8,
                                 x.log_evidence, why, x, now, x.signals, [])
        return None

    def _follows_the_job(self, job: str, soft: dict[str, LineMatch], first: float, now: float
                         ) -> tuple[str, list[str]] | None:
        """Remember this failure's signatures; if one was also seen on another node in an earlier
        attempt of the same job, the failure follows the job: (pattern, nodes)."""
        history = self.state.job_signatures.setdefault(job, [])
        horizon = now - self.policy.escalate_window_s
        found: tuple[str, list[str]] | None = None
        for node, m in sorted(soft.items()):
            pattern = m.pattern or ""
            elsewhere = sorted({n for t, p, n in history if p == pattern and n != node and t >= horizon})
            if elsewhere and found is None:
                found = (pattern, [*elsewhere, node])
        history += [(first, m.pattern or "", node) for node, m in sorted(soft.items())]
        return found

    # --- 5. a software failure concentrated on a few nodes ------------------------------------------

    def _software_on_few_nodes(self, x: _Failure, now: float) -> Assessment | None:
        soft, job = x.soft, x.job
        if not soft or len(soft) > self.settings.max_hardware_suspects:
            return None
        ranked = sorted(soft, key=lambda n: (-soft[n].priority, n))
        klass = soft[ranked[0]].incident_class
        for n in ranked:
            if soft[n].signal not in self.policy.node_neutral_signals:
                _note(self.state.node_failures, n, x.first, job)
        why = (f"job {job} failed with {soft[ranked[0]].pattern} on {', '.join(ranked)}: "
               "a software failure, retried; repeated failures on the same node escalate it")
        # a software failure: the job first (what to retry), then where it happened; a job that ran on
        # one node alone cannot tell its own bug from the node's fault (policy: no probation shortcut)
        suspects = [Suspect(kind="job", name=job)] + [Suspect(kind="node", name=n) for n in ranked]
        alone = {"single_node_job"} if len(x.nodes) == 1 else set()
        return self._failure(klass, f"job:{job}", suspects, 0.6, x.log_evidence, why, x, now, x.signals | alone,
                             [], exclude=[])

    # --- 6. nothing distinctive: history, else a lone timeout ---------------------------------------

    def _history(self, x: _Failure, now: float) -> Assessment:
        job, p = x.job, self.policy
        self.failed_jobs.note(job, x.nodes, x.first)
        sizes = self.state.failed_job_sizes
        sizes[job] = len(x.nodes)
        horizon = now - p.suspect_window_s
        fleet = max(self.fleet_size(), len(x.nodes), 1)
        repeated = []
        rate: tuple[float, Counter[int], dict[str, int]] | None = None  # the fleet's, read once a failure
        for n, jobs in self.failed_jobs.jobs_of(x.nodes, x.job_nodes, horizon, p.suspect_after_failed_jobs):
            if _chance_nodes(fleet, [sizes.get(j, 1) for j in jobs]) > p.suspect_max_chance_nodes:
                continue
            if rate is None:
                active, counts = self.jobs.hosted_since(horizon)
                # no job known to have run well (only failures are sent): no rate (1.0 skips the test)
                share = self.failed_jobs.failed_since(horizon) / active if active else 1.0
                rate = (share, Counter(counts.values()), counts)
            share, by_hosted, counts = rate
            if share < 1.0:
                h = counts.get(n, 0)
                own = max(h, len(jobs))  # the node hosted every job that failed on it
                hosted = by_hosted + Counter({own: 1}) - Counter({h: 1}) if own != h else by_hosted
                if chance_by_jobs(hosted, share, len(jobs)) > p.suspect_max_chance_nodes:
                    continue
            repeated.append((len(jobs), n))
        if repeated and len(repeated) <= self.settings.max_hardware_suspects:
            ranked = [n for _, n in sorted(repeated, key=lambda t: (-t[0], t[1]))]
            k = max(c for c, _ in repeated)
            why = (f"job {job} failed without a distinctive error; {', '.join(ranked)} appeared in {k} failed "
                   f"jobs within {p.suspect_window_s:g}s: suspect")
            return self._failure("unknown", f"node:{ranked[0]}", [Suspect(kind="node", name=n) for n in ranked],
                                 0.6, x.log_evidence, why, x, now, x.signals | {"repeated_job_failures"}, [])
        if any(m.symptom for m in x.matches):
            why = f"job {job} failed with only a timeout/symptom and no other evidence: transient"
            return self._failure("transient_software", f"job:{job}", [Suspect(kind="job", name=job)],
                                 0.5, x.log_evidence, why, x, now, x.signals | {"lone_timeout"}, [])
        why = f"job {job} failed (exit {_exit_codes(x.group)}) with no recognised error and no other evidence"
        return self._failure("unknown", f"job:{job}", [Suspect(kind="job", name=job)], 0.3,
                             x.log_evidence, why, x, now, x.signals, [])

    # --- the incident -------------------------------------------------------------------------------

    def _failure(self, klass: IncidentClass, subject: str, suspects: list[Suspect], confidence: float,
                 evidence: list[Evidence], why: str, x: _Failure, now: float, signals: set[str],
                 finding_ids: list[str], exclude: list[str] | None = None, gpu: int | None = None,
                 isolation: dict[str, Isolation] | None = None) -> Assessment:
        nodes = [s.name for s in suspects if s.kind == "node"]
        excluded = tuple(sorted(set(nodes if exclude is None else exclude)))
        ev = [Evidence(detector="triage", note=why, ts=now), *evidence]
        inc, new = self.book.open(klass, subject, suspects, confidence, ev, "critical", why, [x.job],
                                  finding_ids, x.first, now)
        horizon = now - self.policy.escalate_window_s
        counts = {n: len({j for t, j in self.state.node_failures.get(n, ()) if t >= horizon}) for n in nodes}
        return Assessment(inc, new, frozenset(signals | {f"class:{klass}", "job_failed"}), why, x.first,
                          job=x.job, attempt=x.group.attempt, retries_in_place=x.rec.retries_in_place,
                          exclude_nodes=excluded, node_failures=counts, gpu=gpu, isolation=isolation or {})


def _log_evidence(by_node: dict[str, list[LineMatch]], loose: list[LineMatch]) -> list[Evidence]:
    out: list[Evidence] = []
    for node in sorted(by_node):
        ranked = sorted(by_node[node], key=lambda m: (not m.distinctive, -m.priority))[:LOG_EVIDENCE_PER_NODE]
        out += [Evidence(detector="log_patterns", metric=m.pattern or "", note=f"[{node}] {m.line}"[:1000])
                for m in ranked]
    for m in sorted(loose, key=lambda m: (not m.distinctive, -m.priority))[:LOG_EVIDENCE_PER_NODE]:
        out.append(Evidence(detector="log_patterns", metric=m.pattern or "", note=m.line[:1000]))
    return out[:20]


def _with(nodes: list[str], extra: list[str]) -> list[str]:
    """``nodes`` (sorted, distinct) with ``extra`` (sorted, none of them in ``nodes``), sorted."""
    out = list(nodes)
    for n in extra:
        insort(out, n)
    return out


def _exit_codes(group: PendingGroup) -> str:
    codes = sorted({r.exit_code for r in group.reports if r.exit_code is not None})
    return ", ".join(str(c) for c in codes) or "unknown"


def _chance_nodes(fleet: int, sizes: list[int]) -> float:
    """How many nodes of a fleet of ``fleet`` would be in every one of jobs of ``sizes`` nodes placed
    independently: a node in all of them is evidence only when this is small."""
    out = float(fleet)
    for k in sizes:
        out *= min(1.0, k / fleet)
    return out


def _note(table: dict[str, list[tuple[float, str]]], node: str, t: float, job: str) -> None:
    """Record that ``job`` failed on ``node`` at ``t``: one entry a job, its latest failure (readers
    count the distinct jobs within a window, and a lock-step job failing again and again on its
    hundreds of nodes must not grow each node's list with every failure)."""
    entries = table.setdefault(node, [])
    if entries and entries[-1][1] == job:
        entries[-1] = (max(t, entries[-1][0]), job)
        return
    entries[:] = [e for e in entries if e[1] != job]
    entries.append((t, job))
