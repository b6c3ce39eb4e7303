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
   distinct jobs escalate the node — the same job failing again in place proves nothing; signals in
   ``policy.node_neutral_signals``, by default memory exhaustion, never count against a node);
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

Pure: state is a serialisable struct, time comes in as ``now``. The state, the assessment and the
incident book live in :mod:`.triage_records`; the failed-job rules (1-6) in :mod:`.triage_failures`;
this module tracks jobs and findings, gathers network evidence per leaf and decides when groups settle.
"""

from __future__ import annotations

from collections.abc import Callable

from fleetmedic.config import PolicySettings, TriageSettings
from fleetmedic.records import Evidence, Finding, IncidentClass, JobEvent, Severity, Suspect
from fleetmedic.remediation.log_patterns import PatternLibrary
from fleetmedic.remediation.topology import Topology
from fleetmedic.remediation.triage_failures import JobFailureTriage
from fleetmedic.remediation.triage_records import (
    ISOLATING_HINTS,
    QUIET_HINTS,
    SEVERITY_RANK,
    Assessment,
    FailureReport,
    JobRecord,
    JobStatus,
    PendingGroup,
    TriageState,
    evidence_of,
    finding_class,
    is_congestion,
    is_hardware_finding,
    max_severity,
)

__all__ = ["ISOLATING_HINTS", "QUIET_HINTS", "SEVERITY_RANK", "Assessment", "FailureReport", "JobRecord",
           "JobStatus", "PendingGroup", "Triage", "TriageState", "is_hardware_finding"]


class Triage(JobFailureTriage):
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
        klass = finding_class(f)
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
        seen = self._warnings(f.node, lambda g: finding_class(g) == klass, now)
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
        severity = max_severity(f.severity for f in window)
        first = min(f.ts for f in window)
        ids = [f.id for f in window]
        # a node whose every link went down at once is down itself (power, kernel): its own incident,
        # never evidence against a leaf
        dark = {h for h in hosts if self._went_dark(h, first - s.network_settle_s)}
        hosts -= dark
        dark_now = [self._node_down(h, [f for f in window if f.node == h], now) for h in sorted(dark)
                    if any(f.node == h for f in window)]
        if leaf and (on_switch or (len(hosts) >= s.leaf_min_nodes and len(hosts) >= s.leaf_min_fraction * len(behind))):
            ports = sorted({_link(f) for f in window if f.port})[:10]
            suspects = [Suspect(kind="switch", name=leaf), *[Suspect(kind="link", name=p) for p in ports]]
            why = (f"network errors on {len(hosts)} of {len(behind)} nodes behind leaf {leaf}"
                   + (f" and on the switch itself ({len(on_switch)} findings)" if on_switch else "")
                   + ": one switch/link incident, not node incidents")
            jobs = sorted({j for n in hosts for j in self.jobs_on(n)})
            evidence = [Evidence(detector="triage", note=why, ts=now), *evidence_of(window)]
            conf = 0.9 if on_switch else min(0.9, 0.6 + 0.3 * len(hosts) / max(1, len(behind)))
            inc, new = self._open("network", f"switch:{leaf}", suspects, conf, evidence, severity, why, jobs, ids,
                                  first, now)
            return [Assessment(inc, new, frozenset({"leaf_correlated", "kind:network"}), why, first,
                               affected_jobs=tuple(jobs), exclude_nodes=tuple(sorted(hosts))), *dark_now]
        out = dark_now
        congestion = s.congestion_metrics
        for host in sorted({f.node for f in window if not self._is_device(f.node)} - dark):
            mine = [f for f in window if f.node == host]
            if all(is_congestion(f, congestion) for f in mine):
                continue  # traffic waiting for credits on one node: its own load, not a broken link
            ports = sorted({_link(f) for f in mine if f.port})
            suspects = [Suspect(kind="node", name=host), *[Suspect(kind="link", name=p) for p in ports[:4]]]
            why = f"network errors on {host} ({', '.join(ports) or 'its NIC'}), not shared by its leaf's other nodes"
            on_host = self.jobs_on(host)
            inc, new = self._open("network", f"link:{host}", suspects, 0.75, evidence_of(mine),
                                  max_severity(f.severity for f in mine), why, list(on_host), [f.id for f in mine],
                                  min(f.ts for f in mine), now)
            seen = self._warnings(host, lambda g: g.kind == "network" and not is_congestion(g, congestion), now)
            out.append(Assessment(inc, new, frozenset({"link", "kind:network"}), why, inc.first_seen,
                                  affected_jobs=on_host, exclude_nodes=(host,),
                                  confirmed=self._confirmed(inc.severity, seen)))
        return out

    def _went_dark(self, host: str, since: float) -> bool:
        """Links on every leaf ``host`` hangs off (two or more) went down since ``since``."""
        leaves = self.topology.leaves_of(host)
        down = {self.topology.leaf_for_port(host, f.port) for f in self.state.findings.get(host, ())
                if f.ts >= since and f.detector == "link_state" and f.severity == "critical"}
        return len(leaves) >= 2 and leaves <= down

    def _node_down(self, host: str, mine: list[Finding], now: float) -> Assessment:
        ports = sorted({_link(f) for f in mine if f.port})
        why = f"every link of {host} went down at once ({', '.join(ports)}): the node itself is down"
        on_host = self.jobs_on(host)
        inc, new = self._open("hardware", f"node:{host}", [Suspect(kind="node", name=host)], 0.85,
                              evidence_of(mine), "critical", why, list(on_host), [f.id for f in mine],
                              min(f.ts for f in mine), now)
        return Assessment(inc, new, frozenset({"node_down", "kind:network"}), why, inc.first_seen,
                          affected_jobs=on_host, exclude_nodes=(host,))

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

def _link(f: Finding) -> str:
    """A link as the scorer and operators name it: ``device/port`` as findings give it, else ``node:port``."""
    return f.port if "/" in f.port else f"{f.node}:{f.port}"

