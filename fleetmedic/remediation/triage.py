"""Triage: is it the node, the link, or the job?

Correlates findings, job failures (classified by :mod:`.log_patterns`) and topology into
:class:`~fleetmedic.records.Incident` values, each with a class, ranked suspects, a confidence and
the evidence chain. The rules, in the order they are tried for a failed job attempt:

1. **hardware** — hardware evidence (a hard-fault finding, or a hardware log line) in the same
   window on at most ``max_hardware_suspects`` of the job's nodes: those nodes are the suspects;
2. **network** — the job's nodes sit behind a leaf switch with an open network incident, or have
   network findings or fabric errors in their logs: the switch or the link is the suspect;
3. **preemption** — the job was preempted or evicted: nobody's fault, requeue it;
4. **job_bug** — the same distinctive failure on at least ``job_bug_min_nodes`` nodes, or on at
   least ``job_bug_min_fraction`` of the job's nodes (and two or more), none with hardware evidence;
   or an error in the job's own code (``KeyError``, a shape mismatch): the job is the suspect;
   A distinctive failure that *follows the job* (the same signature on another node in an earlier
   attempt) is a job bug too;
5. **transient_software** — a distinctive software failure (OOM, segfault, illegal address) on a
   few nodes: retry; it counts against the node once per job (failures of ``escalate_after_failures``
   distinct jobs escalate the node — the same job failing again in place proves nothing);
6. **history** — nothing distinctive (only timeouts): a node that appears in
   ``suspect_after_failed_jobs`` such failed jobs within ``suspect_window_s`` becomes the suspect;
   otherwise a lone timeout with no other evidence is transient.

Findings on their own: a hard fault that isolates (XID/hint ``reset_gpu``/``reboot_node``/
``isolate``) opens a hardware incident at once; ``investigate`` hints, degradations and stragglers
open degradation incidents; network findings are gathered per leaf switch for
``network_settle_s`` and become **one** switch incident when at least ``leaf_min_nodes`` and
``leaf_min_fraction`` of the nodes behind the leaf are affected, else one link incident per node.
Failure reports of one job attempt are gathered for ``failure_settle_s`` before deciding, so that
all ranks' logs and late findings are seen together.

Pure: state is a serialisable struct, time comes in as ``now``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final, Literal, TypeVar

import msgspec

from fleetmedic.config import PolicySettings, TriageSettings
from fleetmedic.records import Evidence, Finding, Incident, IncidentClass, JobEvent, Severity, Suspect
from fleetmedic.remediation.log_patterns import LineMatch, PatternLibrary
from fleetmedic.remediation.topology import Topology

ISOLATING_HINTS: Final = frozenset({"reset_gpu", "reboot_node", "isolate"})
QUIET_HINTS: Final = frozenset({"ignore", "restart_app"})
SEVERITY_RANK: Final = {"info": 0, "warning": 1, "critical": 2}
MAX_EVIDENCE: Final = 40
MAX_IDS: Final = 200
LOG_EVIDENCE_PER_NODE: Final = 3

JobStatus = Literal["placed", "running", "failed", "completed"]


class JobRecord(msgspec.Struct, kw_only=True):
    job: str
    attempt: int = 0
    nodes: list[str] = []
    ranks: dict[int, str] = {}
    status: JobStatus = "placed"
    retries_in_place: int = 0
    last_event: float = 0.0


class FailureReport(msgspec.Struct, frozen=True, kw_only=True):
    ts: float
    node: str = ""
    rank: int | None = None
    exit_code: int | None = None
    reason: str = ""
    lines: list[str] = []


class PendingGroup(msgspec.Struct, kw_only=True):
    """Reports (or findings) gathered until ``deadline`` before triage decides."""

    key: str
    first_ts: float
    deadline: float
    job: str = ""
    attempt: int = 0
    reports: list[FailureReport] = []
    findings: list[Finding] = []


class TriageState(msgspec.Struct, kw_only=True):
    jobs: dict[str, JobRecord] = {}
    findings: dict[str, list[Finding]] = {}  # node (or switch) -> recent findings
    failures: dict[str, PendingGroup] = {}  # "job#attempt" -> reports being gathered
    decided: dict[str, float] = {}  # "job#attempt" -> when it was decided (late reports are evidence only)
    expected: dict[str, float] = {}  # "job#attempt" -> until: its failure is fleetmedic's own doing
    network: dict[str, PendingGroup] = {}  # "leaf:<leaf>" or "node:<node>" -> findings being gathered
    incidents: dict[str, Incident] = {}
    open_by_subject: dict[str, str] = {}  # "class|subject" -> incident id
    node_failures: dict[str, list[tuple[float, str]]] = {}  # node -> (ts, job) software failures attributed to it
    job_signatures: dict[str, list[tuple[float, str, str]]] = {}  # job -> (ts, pattern, node) distinctive failures
    node_failed_jobs: dict[str, list[tuple[float, str]]] = {}  # unattributed failed jobs a node was part of


@dataclass(frozen=True)
class Assessment:
    """An incident plus what policy needs to decide: signals, history, the jobs and nodes involved."""

    incident: Incident
    new: bool
    signals: frozenset[str]
    explanation: str
    fault_at: float  # earliest evidence (MTTR "detect" starts here)
    job: str = ""  # the failed job, for job-failure incidents
    attempt: int = 0
    retries_in_place: int = 0
    affected_jobs: tuple[str, ...] = ()  # running jobs hit by a node/switch incident
    exclude_nodes: tuple[str, ...] = ()
    node_failures: dict[str, int] = field(default_factory=dict)  # suspect node -> distinct jobs it failed
    gpu: int | None = None
    confirmed: bool = True  # False: a warning seen too few times yet; the incident is kept, nothing is done

    @property
    def suspect_nodes(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.incident.suspects if s.kind == "node")

    @property
    def jobs(self) -> tuple[str, ...]:
        return (self.job, *[j for j in self.affected_jobs if j != self.job]) if self.job else self.affected_jobs


class Triage:
    def __init__(self, settings: TriageSettings, policy: PolicySettings, library: PatternLibrary,
                 topology: Topology | None = None, state: TriageState | None = None) -> None:
        self.settings = settings
        self.policy = policy
        self.library = library
        self.topology = topology or Topology()
        self.state = state if state is not None else TriageState()
        self._node_jobs: dict[str, set[str]] | None = None

    # --- jobs ---------------------------------------------------------------------------------------

    def jobs_on(self, node: str) -> tuple[str, ...]:
        if self._node_jobs is None:
            index: dict[str, set[str]] = {}
            for rec in self.state.jobs.values():
                if rec.status in ("placed", "running"):
                    for n in rec.nodes:
                        index.setdefault(n, set()).add(rec.job)
            self._node_jobs = index
        return tuple(sorted(self._node_jobs.get(node, ())))

    def job(self, job: str) -> JobRecord | None:
        return self.state.jobs.get(job)

    def expect_failure(self, job: str, attempt: int, until: float) -> None:
        """A failure of this attempt is fleetmedic's own doing (it restarted or drained it)."""
        self.state.expected[f"{job}#{attempt}"] = until

    def add_job_event(self, e: JobEvent, now: float) -> list[str]:
        """Track the job; gather failure reports. Returns notes for the audit (ignored reports)."""
        rec = self.state.jobs.get(e.job)
        if rec is None:
            rec = self.state.jobs[e.job] = JobRecord(job=e.job, attempt=e.attempt)
        notes: list[str] = []
        if e.attempt < rec.attempt and e.event != "failure":
            return [f"{e.job}: {e.event} of attempt {e.attempt} ignored, attempt {rec.attempt} is current"]
        self._node_jobs = None
        rec.last_event = max(rec.last_event, e.ts)
        if e.placement:
            rec.attempt = e.attempt
            rec.ranks = {p.rank: p.node for p in e.placement}
            rec.nodes = sorted(set(rec.ranks.values()))
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
            notes += self._add_failure(rec, e, now)
        return notes

    def _add_failure(self, rec: JobRecord, e: JobEvent, now: float) -> list[str]:
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
            group = self.state.failures[key] = PendingGroup(
                key=key, first_ts=now, deadline=now + self.settings.failure_settle_s, job=e.job, attempt=e.attempt)
        group.reports.append(report)
        return []

    # --- findings -----------------------------------------------------------------------------------

    def add_finding(self, f: Finding, now: float) -> list[Assessment]:
        self.state.findings.setdefault(f.node, []).append(f)
        if f.severity == "info" or f.kind == "telemetry":
            return []
        if f.kind == "network":
            self._gather_network(f, now)
            return []
        klass = _finding_class(f)
        if klass is None:
            return []
        if f.detector == "xid_repeat" and self._xids_across_job(f, now):
            return []  # an application's XIDs on many nodes of its job: the job's failure decides (job bug)
        signals = {f"detector:{f.detector}", f"kind:{f.kind}"}
        if f.action_hint:
            signals.add(f"hint:{f.action_hint}")
        if f.kind == "job":
            signals.add("straggler")
        suspects = [Suspect(kind="node", name=f.node)]
        if f.gpu is not None:
            suspects.append(Suspect(kind="gpu", name=f"{f.node}/gpu{f.gpu}"))
        confidence = 0.9 if klass == "hardware" else (0.8 if f.severity == "critical" else 0.6)
        jobs = self.jobs_on(f.node)
        why = f"{f.detector} on {f.node}: {f.summary}"
        inc, new = self._open(klass, f"node:{f.node}", suspects, confidence, list(f.evidence)[:5], f.severity,
                              why, list(jobs), [f.id], f.ts, now)
        seen = self._warnings(f.node, lambda g: _finding_class(g) == klass, now)
        return [Assessment(inc, new, frozenset(signals), why, f.ts, affected_jobs=jobs, exclude_nodes=(f.node,),
                           gpu=f.gpu, confirmed=klass == "hardware" or self._confirmed(inc.severity, seen, klass))]

    def _xids_across_job(self, f: Finding, now: float) -> str:
        """The job (if any) ``f.node`` ran in whose nodes reported non-isolating XIDs within the evidence
        window as a job bug's failures spread: on ``job_bug_min_nodes`` nodes, or on at least two and
        ``job_bug_min_fraction`` of them. A GPU's repeated application XIDs are then the job's doing."""
        s = self.settings
        lo = now - s.evidence_window_s
        for rec in self.state.jobs.values():
            if f.node not in rec.nodes:
                continue
            count = sum(1 for n in rec.nodes if any(
                g.detector == "xid_rules" and g.severity != "critical" and g.ts >= lo
                for g in self.state.findings.get(n, ())))
            if count >= s.job_bug_min_nodes or (count >= 2 and count >= s.job_bug_min_fraction * len(rec.nodes)):
                return rec.job
        return ""

    def _warnings(self, node: str, same: Callable[[Finding], bool], now: float) -> list[float]:
        """When a node reported findings like this one within the confirmation window."""
        lo = now - self.settings.warning_confirm_window_s
        return sorted({f.ts for f in self.state.findings.get(node, ()) if f.severity != "info" and f.ts >= lo
                       and same(f)})

    def _confirmed(self, severity: Severity, seen: list[float], klass: IncidentClass = "network") -> bool:
        """Hardware faults and critical network evidence act at once; warnings, and degradation of
        any severity (statistical evidence), only once the detector has reasserted them over time."""
        if severity == "critical" and klass != "degradation":
            return True
        s = self.settings
        return len(seen) >= s.warning_confirmations and seen[-1] - seen[0] >= s.warning_confirm_min_span_s

    def _gather_network(self, f: Finding, now: float) -> None:
        if self._is_device(f.node):
            # a spine's port facing a leaf is about that leaf's uplink: file it with the leaf
            peer = next((e.port.partition("/")[0] for e in f.evidence if e.detector == "link_peer"), "")
            on_leaf = self.topology.is_switch(f.node) or not self.topology.is_switch(peer)
            key = f"leaf:{f.node if on_leaf else peer}"
        else:
            leaf = self.topology.leaf_for_port(f.node, f.port)
            key = f"leaf:{leaf}" if leaf else f"node:{f.node}"
        group = self.state.network.get(key)
        if group is None:
            group = self.state.network[key] = PendingGroup(key=key, first_ts=now,
                                                           deadline=now + self.settings.network_settle_s)
        group.findings.append(f)

    def _is_device(self, name: str) -> bool:
        """A switch (or other fabric device) rather than a node of the fleet."""
        return self.topology.is_switch(name) or (len(self.topology) > 0 and name not in self.topology)

    # --- deciding -----------------------------------------------------------------------------------

    def due(self, now: float) -> list[Assessment]:
        """Decide the gathered groups whose settle time has passed (oldest first)."""
        out: list[Assessment] = []
        for key, group in sorted(self.state.network.items(), key=lambda kv: (kv[1].deadline, kv[0])):
            if group.deadline <= now:
                del self.state.network[key]
                out += self._decide_network(group, now)
        for key, group in sorted(self.state.failures.items(), key=lambda kv: (kv[1].deadline, kv[0])):
            if group.deadline <= now:
                del self.state.failures[key]
                self.state.decided[key] = now
                out += self._decide_failure(group, now)
        return out

    def next_deadline(self) -> float | None:
        deadlines = [g.deadline for g in (*self.state.failures.values(), *self.state.network.values())]
        return min(deadlines) if deadlines else None

    def _decide_network(self, group: PendingGroup, now: float) -> list[Assessment]:
        topo, s = self.topology, self.settings
        window = [f for f in group.findings if f.severity != "info"]
        if not window:
            return []
        leaf = group.key[5:] if group.key.startswith("leaf:") else ""
        behind = topo.behind_leaf(leaf)
        on_switch = [f for f in window if self._is_device(f.node)]
        hosts = {f.node for f in window if not self._is_device(f.node)}
        # hosts behind the same leaf that reported trouble on it recently (before this group) count too
        lo = group.first_ts - s.network_window_s
        for n in behind - hosts:
            if any(f.kind == "network" and f.severity != "info" and lo <= f.ts and topo.leaf_for_port(n, f.port) == leaf
                   for f in self.state.findings.get(n, ())):
                hosts.add(n)
        severity = _max_severity(f.severity for f in window)
        first = min(f.ts for f in window)
        ids = [f.id for f in window]
        if leaf and (on_switch or (len(hosts) >= s.leaf_min_nodes and len(hosts) >= s.leaf_min_fraction * len(behind))):
            ports = sorted({_link(f) for f in window if f.port})[:10]
            suspects = [Suspect(kind="switch", name=leaf), *[Suspect(kind="link", name=p) for p in ports]]
            why = (f"network errors on {len(hosts)} of {len(behind)} nodes behind leaf {leaf}"
                   + (f" and on the switch itself ({len(on_switch)} findings)" if on_switch else "")
                   + ": one switch/link incident, not node incidents")
            jobs = sorted({j for n in hosts for j in self.jobs_on(n)})
            evidence = [Evidence(detector="triage", note=why, ts=now), *_evidence_of(window)]
            conf = 0.9 if on_switch else min(0.9, 0.6 + 0.3 * len(hosts) / max(1, len(behind)))
            inc, new = self._open("network", f"switch:{leaf}", suspects, conf, evidence, severity, why, jobs, ids,
                                  first, now)
            return [Assessment(inc, new, frozenset({"leaf_correlated", "kind:network"}), why, first,
                               affected_jobs=tuple(jobs), exclude_nodes=tuple(sorted(hosts)))]
        out = []
        for host in sorted({f.node for f in window if not self._is_device(f.node)}):
            mine = [f for f in window if f.node == host]
            ports = sorted({_link(f) for f in mine if f.port})
            suspects = [Suspect(kind="node", name=host), *[Suspect(kind="link", name=p) for p in ports[:4]]]
            why = f"network errors on {host} ({', '.join(ports) or 'its NIC'}), not shared by its leaf's other nodes"
            on_host = self.jobs_on(host)
            inc, new = self._open("network", f"link:{host}", suspects, 0.75, _evidence_of(mine),
                                  _max_severity(f.severity for f in mine), why, list(on_host), [f.id for f in mine],
                                  min(f.ts for f in mine), now)
            seen = self._warnings(host, lambda g: g.kind == "network", now)
            out.append(Assessment(inc, new, frozenset({"link", "kind:network"}), why, inc.first_seen,
                                  affected_jobs=on_host, exclude_nodes=(host,),
                                  confirmed=self._confirmed(inc.severity, seen)))
        return out

    def _decide_failure(self, group: PendingGroup, now: float) -> list[Assessment]:
        s, lib = self.settings, self.library
        rec = self.state.jobs.get(group.job) or JobRecord(job=group.job, attempt=group.attempt)
        job_nodes = set(rec.nodes)
        by_node: dict[str, list[LineMatch]] = {}
        loose: list[LineMatch] = []
        for rep in group.reports:
            if rep.node:
                job_nodes.add(rep.node)
            for m in lib.classify_all([*rep.lines, *([rep.reason] if rep.reason else [])]):
                if m.pattern is None:
                    continue
                node = self._node_of(m, rec) or rep.node
                (by_node.setdefault(node, []) if node else loose).append(m)
        sig = {n: b for n, ms in by_node.items() if (b := lib.strongest(ms)) is not None}
        distinct = {n: m for n, m in sig.items() if m.distinctive}
        loose_best = lib.strongest(loose)
        all_matches = [m for ms in by_node.values() for m in ms] + loose
        signals = {m.signal for m in all_matches}
        first = min([r.ts for r in group.reports] or [group.first_ts])
        lo = first - s.evidence_window_s
        log_ev = _log_evidence(by_node, loose)
        ctx = _FailureContext(group, rec, sorted(job_nodes), first, signals, log_ev)

        # 1. hardware
        hw_findings = {n: fs for n in job_nodes if (fs := [f for f in self.state.findings.get(n, ())
                                                            if _is_hardware(f) and lo <= f.ts <= now])}
        hw_logs = {n: m for n, m in distinct.items() if m.incident_class == "hardware"}
        hw_nodes = set(hw_findings) | set(hw_logs)
        if hw_nodes and len(hw_nodes) <= s.max_hardware_suspects:
            ranked = sorted(hw_nodes, key=lambda n: (-(n in hw_findings) - (n in hw_logs), n))
            suspects = [Suspect(kind="node", name=n) for n in ranked]
            gpus = [f.gpu for n in ranked for f in hw_findings.get(n, ()) if f.gpu is not None]
            suspects += [Suspect(kind="gpu", name=f"{ranked[0]}/gpu{gpus[0]}")] if gpus else []
            both = [n for n in ranked if n in hw_findings and n in hw_logs]
            conf = 0.97 if both else (0.9 if hw_findings else 0.85)
            hints = {f"hint:{f.action_hint}" for fs in hw_findings.values() for f in fs if f.action_hint}
            hints |= {f"hint:{m.hint}" for m in hw_logs.values() if m.hint}
            why = (f"job {group.job} attempt {group.attempt} failed; hardware evidence on "
                   f"{', '.join(ranked)} in the same window"
                   + (" (findings and log lines agree)" if both else ""))
            ev = [*_evidence_of([f for n in ranked for f in hw_findings.get(n, ())]), *log_ev]
            ids = [f.id for n in ranked for f in hw_findings.get(n, ())]
            return [self._failure("hardware", f"node:{ranked[0]}", suspects, conf, ev, why, ctx, now,
                                  signals | hints | {"hardware_evidence"}, ids, gpu=gpus[0] if gpus else None)]
        if len(hw_nodes) > s.max_hardware_suspects:
            signals.add("widespread_hardware_evidence")

        # 2. network, unless the log names a software cause of its own (an OOM on a node behind a
        # broken leaf is still an OOM) and no network error
        net_logs = {n for n, m in distinct.items() if m.incident_class == "network"}
        own_cause = any(m.incident_class in ("transient_software", "job_bug") and m.signal != "preemption"
                        for m in distinct.values())
        for leaf in sorted({leaf for n in ctx.nodes for leaf in self.topology.leaves_of(n)}
                           if net_logs or not own_cause else ()):
            inc_id = self.state.open_by_subject.get(f"network|switch:{leaf}")
            if inc_id and self.state.incidents[inc_id].status in ("open", "mitigating"):
                behind = self.topology.behind_leaf(leaf)
                why = f"job {group.job} failed with nodes behind leaf {leaf}, which has an open network incident"
                return [self._failure("network", f"switch:{leaf}", [Suspect(kind="switch", name=leaf)], 0.85,
                                      log_ev, why, ctx, now, signals | {"leaf_correlated"}, [],
                                      exclude=sorted(behind & set(ctx.nodes)))]
        net_findings = {n for n in job_nodes if any(f.kind == "network" and f.severity != "info" and lo <= f.ts <= now
                                                    for f in self.state.findings.get(n, ()))}
        net_nodes = (net_findings if net_logs or not own_cause else set()) | net_logs
        if net_nodes and len(net_nodes) <= s.max_hardware_suspects:
            ranked = sorted(net_nodes, key=lambda n: (-(n in net_findings) - (n in net_logs), n))
            why = f"job {group.job} failed; network errors on {', '.join(ranked)}"
            conf = 0.85 if net_findings & net_logs else 0.75
            return [self._failure("network", f"link:{ranked[0]}", [Suspect(kind="node", name=n) for n in ranked],
                                  conf, log_ev, why, ctx, now, signals | {"link"}, [])]
        if net_nodes:
            leaves = Counter(leaf for n in net_nodes for leaf in self.topology.leaves_of(n))
            leaf, count = leaves.most_common(1)[0]
            if leaf and count >= s.leaf_min_nodes:
                behind = self.topology.behind_leaf(leaf)
                why = f"job {group.job} failed with fabric errors on {count} nodes behind leaf {leaf}"
                return [self._failure("network", f"switch:{leaf}", [Suspect(kind="switch", name=leaf)], 0.7,
                                      log_ev, why, ctx, now, signals | {"leaf_correlated"}, [],
                                      exclude=sorted(behind & set(ctx.nodes)))]

        # 3. preemption
        if "preemption" in {m.signal for m in (*distinct.values(), *([loose_best] if loose_best else []))}:
            why = f"job {group.job} attempt {group.attempt} was preempted or evicted"
            return [self._failure("transient_software", f"job:{group.job}", [Suspect(kind="job", name=group.job)],
                                  0.9, log_ev, why, ctx, now, signals | {"preemption"}, [])]

        # 4. job bug
        soft = {n: m for n, m in distinct.items() if m.incident_class not in ("hardware", "network")
                and m.signal != "preemption"}
        spread = Counter(m.pattern for m in soft.values())
        if spread:
            pattern, count = spread.most_common(1)[0]
            many = count >= s.job_bug_min_nodes or (count >= 2 and count >= s.job_bug_min_fraction * len(ctx.nodes))
            if many and not hw_nodes:
                why = (f"the same failure ({pattern}) on {count} of {len(ctx.nodes)} nodes of job {group.job}, "
                       "none with hardware evidence: a job bug, no node is isolated")
                return [self._failure("job_bug", f"job:{group.job}", [Suspect(kind="job", name=group.job)], 0.9,
                                      log_ev, why, ctx, now, signals | {"spread"}, [])]
        followed = self._follows_the_job(group.job, soft, first, now)
        if followed and not hw_nodes:
            pattern, nodes = followed
            why = (f"job {group.job} failed with {pattern} on {', '.join(nodes)} across attempts: the failure "
                   "follows the job, not a node — a job bug, no node is isolated")
            return [self._failure("job_bug", f"job:{group.job}", [Suspect(kind="job", name=group.job)], 0.85,
                                  log_ev, why, ctx, now, signals | {"follows_job"}, [])]
        user = [m for m in (*soft.values(), *([loose_best] if loose_best and loose_best.distinctive else []))
                if m.incident_class == "job_bug"]
        if user:
            why = f"job {group.job} failed in its own code ({user[0].pattern}): a job bug, no node is isolated"
            return [self._failure("job_bug", f"job:{group.job}", [Suspect(kind="job", name=group.job)], 0.8,
                                  log_ev, why, ctx, now, signals, [])]

        # 5. a software failure concentrated on a few nodes
        if soft and len(soft) <= s.max_hardware_suspects:
            ranked = sorted(soft, key=lambda n: (-soft[n].priority, n))
            klass = soft[ranked[0]].incident_class
            for n in ranked:
                self.state.node_failures.setdefault(n, []).append((first, group.job))
            why = (f"job {group.job} failed with {soft[ranked[0]].pattern} on {', '.join(ranked)}: "
                   "a software failure, retried; repeated failures on the same node escalate it")
            # a software failure: the job first (what to retry), then where it happened
            suspects = [Suspect(kind="job", name=group.job)] + [Suspect(kind="node", name=n) for n in ranked]
            return [self._failure(klass, f"job:{group.job}", suspects, 0.6, log_ev, why, ctx, now, signals, [],
                                  exclude=[])]

        # 6. nothing distinctive: history, else a lone timeout
        for n in ctx.nodes:
            self.state.node_failed_jobs.setdefault(n, []).append((first, group.job))
        horizon = now - self.policy.suspect_window_s
        repeated = []
        for n in ctx.nodes:
            jobs = {j for ts, j in self.state.node_failed_jobs.get(n, ()) if ts >= horizon}
            if len(jobs) >= self.policy.suspect_after_failed_jobs:
                repeated.append((len(jobs), n))
        if repeated and len(repeated) <= s.max_hardware_suspects:
            ranked = [n for _, n in sorted(repeated, key=lambda t: (-t[0], t[1]))]
            k = max(c for c, _ in repeated)
            why = (f"job {group.job} failed without a distinctive error; {', '.join(ranked)} appeared in {k} failed "
                   f"jobs within {self.policy.suspect_window_s:g}s: suspect")
            return [self._failure("unknown", f"node:{ranked[0]}", [Suspect(kind="node", name=n) for n in ranked],
                                  0.6, log_ev, why, ctx, now, signals | {"repeated_job_failures"}, [])]
        if any(m.symptom for m in all_matches):
            why = f"job {group.job} failed with only a timeout/symptom and no other evidence: transient"
            return [self._failure("transient_software", f"job:{group.job}", [Suspect(kind="job", name=group.job)],
                                  0.5, log_ev, why, ctx, now, signals | {"lone_timeout"}, [])]
        why = f"job {group.job} failed (exit {_exit_codes(group)}) with no recognised error and no other evidence"
        return [self._failure("unknown", f"job:{group.job}", [Suspect(kind="job", name=group.job)], 0.3,
                              log_ev, why, ctx, now, signals, [])]

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

    def _failure(self, klass: IncidentClass, subject: str, suspects: list[Suspect], confidence: float,
                 evidence: list[Evidence], why: str, ctx: _FailureContext, now: float, signals: set[str],
                 finding_ids: list[str], exclude: list[str] | None = None, gpu: int | None = None) -> Assessment:
        nodes = [x.name for x in suspects if x.kind == "node"]
        excluded = tuple(sorted(set(nodes if exclude is None else exclude)))
        ev = [Evidence(detector="triage", note=why, ts=now), *evidence]
        inc, new = self._open(klass, subject, suspects, confidence, ev, "critical", why, [ctx.group.job],
                              finding_ids, ctx.first, now)
        horizon = now - self.policy.escalate_window_s
        counts = {n: len({j for t, j in self.state.node_failures.get(n, ()) if t >= horizon}) for n in nodes}
        return Assessment(inc, new, frozenset(signals | {f"class:{klass}", "job_failed"}), why, ctx.first,
                          job=ctx.group.job,
                          attempt=ctx.group.attempt, retries_in_place=ctx.rec.retries_in_place,
                          exclude_nodes=excluded, node_failures=counts, gpu=gpu)

    def _node_of(self, m: LineMatch, rec: JobRecord) -> str:
        if m.rank is not None and m.rank in rec.ranks:
            return rec.ranks[m.rank]
        if m.host and (m.host in rec.nodes or m.host in self.topology):
            return m.host
        return ""

    # --- incidents ----------------------------------------------------------------------------------

    def _open(self, klass: IncidentClass, subject: str, suspects: list[Suspect], confidence: float,
              evidence: list[Evidence], severity: Severity, summary: str, jobs: list[str],
              finding_ids: list[str], first_seen: float, now: float) -> tuple[Incident, bool]:
        """Open an incident, or merge into the open one with the same class and subject."""
        key = f"{klass}|{subject}"
        old_id = self.state.open_by_subject.get(key)
        old = self.state.incidents.get(old_id) if old_id else None
        if old is not None and old.status in ("open", "mitigating") and \
                now - (old.last_seen or old.first_seen) <= self.settings.incident_merge_s:
            merged = msgspec.structs.replace(
                old,
                suspects=_union(old.suspects, suspects),
                confidence=max(old.confidence, confidence),
                evidence=(old.evidence + evidence)[-MAX_EVIDENCE:],
                last_seen=max(now, old.last_seen or 0.0),
                severity=_max_severity((old.severity, severity)),
                jobs=_union(old.jobs, jobs),
                finding_ids=_union(old.finding_ids, finding_ids)[-MAX_IDS:],
            )
            self.state.incidents[merged.id] = merged
            return merged, False
        base = f"{klass}:{subject}:{int(first_seen * 1000)}"
        inc_id, n = base, 1
        while inc_id in self.state.incidents:
            n += 1
            inc_id = f"{base}.{n}"
        inc = Incident(id=inc_id, incident_class=klass, suspects=_union([], suspects), confidence=round(confidence, 3),
                       evidence=evidence[-MAX_EVIDENCE:], first_seen=first_seen, last_seen=now, status="open",
                       severity=severity, summary=summary[:4096], jobs=_union([], jobs),
                       finding_ids=_union([], finding_ids)[-MAX_IDS:])
        self.state.incidents[inc_id] = inc
        self.state.open_by_subject[key] = inc_id
        return inc, True

    def set_status(self, incident_id: str, status: Literal["open", "mitigating", "resolved", "dismissed"],
                   now: float) -> Incident | None:
        """Change an incident's status; returns the updated incident, or None if nothing changed."""
        inc = self.state.incidents.get(incident_id)
        if inc is None or inc.status == status:
            return None
        inc = msgspec.structs.replace(inc, status=status, last_seen=max(now, inc.last_seen or 0.0))
        self.state.incidents[incident_id] = inc
        if status in ("resolved", "dismissed"):
            for key in [k for k, v in self.state.open_by_subject.items() if v == incident_id]:
                del self.state.open_by_subject[key]
        return inc

    # --- housekeeping -------------------------------------------------------------------------------

    def prune(self, now: float) -> None:
        """Forget what no window can reach any more (keeps the serialised state small)."""
        s, p = self.settings, self.policy
        keep = max(s.evidence_window_s, s.network_window_s, s.warning_confirm_window_s)
        for node in list(self.state.findings):
            fs = [f for f in self.state.findings[node] if f.ts >= now - keep]
            if fs:
                self.state.findings[node] = fs
            else:
                del self.state.findings[node]
        self.state.node_failures = {n: kept for n, v in self.state.node_failures.items()
                                    if (kept := [(t, j) for t, j in v if t >= now - p.escalate_window_s])}
        self.state.job_signatures = {j: sigs for j, v in self.state.job_signatures.items()
                                     if (sigs := [x for x in v if x[0] >= now - p.escalate_window_s])}
        self.state.node_failed_jobs = {n: kept for n, v in self.state.node_failed_jobs.items()
                                       if (kept := [(t, j) for t, j in v if t >= now - p.suspect_window_s])}
        self.state.expected = {k: t for k, t in self.state.expected.items() if t >= now}
        self.state.decided = {k: t for k, t in self.state.decided.items() if t >= now - s.incident_merge_s}
        retention = max(s.incident_merge_s, p.suspect_window_s)
        for inc_id, inc in list(self.state.incidents.items()):
            if inc.status in ("resolved", "dismissed") and (inc.last_seen or inc.first_seen) < now - s.incident_merge_s:
                del self.state.incidents[inc_id]
        for job, rec in list(self.state.jobs.items()):
            if rec.status in ("completed", "failed") and rec.last_event < now - retention:
                del self.state.jobs[job]
                self._node_jobs = None


@dataclass(frozen=True)
class _FailureContext:
    group: PendingGroup
    rec: JobRecord
    nodes: list[str]
    first: float
    signals: set[str]
    log_evidence: list[Evidence]


def _finding_class(f: Finding) -> IncidentClass | None:
    hint = f.action_hint
    if hint in QUIET_HINTS:
        return None
    if f.kind == "hard_fault":
        if hint in ISOLATING_HINTS or (not hint and f.severity == "critical"):
            return "hardware"
        return "degradation"
    if f.kind in ("degradation", "job"):
        return "degradation"
    return None


def is_hardware_finding(f: Finding) -> bool:
    """Evidence of a hardware fault (isolate at once), as opposed to degradation or network symptoms."""
    return _is_hardware(f)


def _is_hardware(f: Finding) -> bool:
    return _finding_class(f) == "hardware" or (f.kind == "hard_fault" and f.severity == "critical"
                                               and f.action_hint not in QUIET_HINTS)


def _max_severity(values: Iterable[Severity]) -> Severity:
    best: Severity = "info"
    for v in values:
        if SEVERITY_RANK[v] > SEVERITY_RANK[best]:
            best = v
    return best


T = TypeVar("T")


def _union(a: Iterable[T], b: Iterable[T]) -> list[T]:
    """``a`` then ``b``, without repeats, in order."""
    out: list[T] = []
    for x in [*a, *b]:
        if x not in out:
            out.append(x)
    return out


def _link(f: Finding) -> str:
    """A link as the scorer and operators name it: ``device/port`` as findings give it, else ``node:port``."""
    return f.port if "/" in f.port else f"{f.node}:{f.port}"


def _evidence_of(findings: list[Finding]) -> list[Evidence]:
    out: list[Evidence] = []
    for f in findings[:10]:
        out += f.evidence[:2] or [Evidence(detector=f.detector, ts=f.ts, note=f.summary)]
    return out


def _log_evidence(by_node: dict[str, list[LineMatch]], loose: list[LineMatch]) -> list[Evidence]:
    out: list[Evidence] = []
    for node in sorted(by_node):
        ranked = sorted(by_node[node], key=lambda m: (not m.distinctive, -m.priority))[:LOG_EVIDENCE_PER_NODE]
        out += [Evidence(detector="log_patterns", metric=m.pattern or "", note=f"[{node}] {m.line}"[:1000])
                for m in ranked]
    for m in sorted(loose, key=lambda m: (not m.distinctive, -m.priority))[:LOG_EVIDENCE_PER_NODE]:
        out.append(Evidence(detector="log_patterns", metric=m.pattern or "", note=m.line[:1000]))
    return out[:20]


def _exit_codes(group: PendingGroup) -> str:
    codes = sorted({r.exit_code for r in group.reports if r.exit_code is not None})
    return ", ".join(str(c) for c in codes) or "unknown"


