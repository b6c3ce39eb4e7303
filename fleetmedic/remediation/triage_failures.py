"""Triage of a failed job attempt: hardware, network, preemption, job bug, a software failure on
a few nodes, or history (see :mod:`.triage` for the rules in order). The failure reports of one
attempt, gathered for ``failure_settle_s``, are classified by the pattern library and weighed
against the findings remembered per node. Pure: time comes in as ``now``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Final

from fleetmedic.config import PolicySettings
from fleetmedic.records import Evidence, IncidentClass, Suspect
from fleetmedic.remediation.log_patterns import LineMatch, PatternLibrary
from fleetmedic.remediation.topology import Topology
from fleetmedic.remediation.triage_records import (
    Assessment,
    IncidentBook,
    JobRecord,
    PendingGroup,
    evidence_of,
    is_congestion,
    is_hardware,
)

LOG_EVIDENCE_PER_NODE: Final = 3


class JobFailureTriage(IncidentBook):
    """Decides what a failed job attempt's reports and the surrounding evidence point at."""

    policy: PolicySettings
    library: PatternLibrary
    topology: Topology

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
                                                            if is_hardware(f) and lo <= f.ts <= now])}
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
            ev = [*evidence_of([f for n in ranked for f in hw_findings.get(n, ())]), *log_ev]
            ids = [f.id for n in ranked for f in hw_findings.get(n, ())]
            return [self._failure("hardware", f"node:{ranked[0]}", suspects, conf, ev, why, ctx, now,
                                  signals | hints | {"hardware_evidence"}, ids, gpu=gpus[0] if gpus else None)]
        if len(hw_nodes) > s.max_hardware_suspects:
            signals.add("widespread_hardware_evidence")

        # 2. network, unless the log names a cause of its own and no network error: an OOM on a node
        # behind a broken leaf is still an OOM, and a job its owner or the scheduler terminated (SIGTERM,
        # preempted, evicted; reported per rank or for the whole job) was not killed by the fabric
        net_logs = {n for n, m in distinct.items() if m.incident_class == "network"}
        own_cause = any(m.incident_class in ("transient_software", "job_bug")
                        for m in (*distinct.values(), *([loose_best] if loose_best and loose_best.distinctive else [])))
        for leaf in sorted({leaf for n in ctx.nodes for leaf in self.topology.leaves_of(n)}
                           if net_logs or not own_cause else ()):
            inc_id = self.state.open_by_subject.get(f"network|switch:{leaf}")
            if inc_id and self.state.incidents[inc_id].status in ("open", "mitigating"):
                behind = self.topology.behind_leaf(leaf)
                why = f"job {group.job} failed with nodes behind leaf {leaf}, which has an open network incident"
                return [self._failure("network", f"switch:{leaf}", [Suspect(kind="switch", name=leaf)], 0.85,
                                      log_ev, why, ctx, now, signals | {"leaf_correlated"}, [],
                                      exclude=sorted(behind & set(ctx.nodes)))]
        congestion = s.congestion_metrics
        net_findings = {n for n in job_nodes if any(f.kind == "network" and f.severity != "info" and lo <= f.ts <= now
                                                    and not is_congestion(f, congestion)
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
                if soft[n].signal not in self.policy.node_neutral_signals:
                    self.state.node_failures.setdefault(n, []).append((first, group.job))
            why = (f"job {group.job} failed with {soft[ranked[0]].pattern} on {', '.join(ranked)}: "
                   "a software failure, retried; repeated failures on the same node escalate it")
            # a software failure: the job first (what to retry), then where it happened; a job that ran on
            # one node alone cannot tell its own bug from the node's fault (policy: no probation shortcut)
            suspects = [Suspect(kind="job", name=group.job)] + [Suspect(kind="node", name=n) for n in ranked]
            alone = {"single_node_job"} if len(ctx.nodes) == 1 else set()
            return [self._failure(klass, f"job:{group.job}", suspects, 0.6, log_ev, why, ctx, now, signals | alone,
                                  [], exclude=[])]

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


@dataclass(frozen=True)
class _FailureContext:
    group: PendingGroup
    rec: JobRecord
    nodes: list[str]
    first: float
    signals: set[str]
    log_evidence: list[Evidence]



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


