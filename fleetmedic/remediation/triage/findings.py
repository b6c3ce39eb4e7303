"""Findings about one node on their own: a hard fault that isolates (XID/hint ``reset_gpu``/
``reboot_node``/``isolate``) opens a hardware incident at once; ``investigate`` hints, degradations
and stragglers open degradation incidents, acted on once the detector has reasserted them. Each
assessment says what isolating the node would rest on (definitive, preventive or uncertain:
:func:`~.records.finding_isolation`). Network
findings are not decided here but gathered per leaf (:mod:`.network`)."""

from __future__ import annotations

from fleetmedic.config import TriageSettings
from fleetmedic.records import Finding, Suspect
from fleetmedic.remediation.triage.book import IncidentBook
from fleetmedic.remediation.triage.jobs import JobBoard
from fleetmedic.remediation.triage.records import (
    Assessment,
    TriageState,
    app_xids_spread,
    confirmed,
    finding_class,
    finding_isolation,
    times_seen,
)


class NodeFindings:
    def __init__(self, settings: TriageSettings, state: TriageState, book: IncidentBook, jobs: JobBoard) -> None:
        self.settings = settings
        self.state = state
        self.book = book
        self.jobs = jobs

    def assess(self, f: Finding, now: float) -> list[Assessment]:
        """The incident ``f`` opens or adds to (none for findings that open no incident on their own)."""
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
        jobs = self.jobs.jobs_on(f.node)
        why = f"{f.detector} on {f.node}: {f.summary}"
        inc, new = self.book.open(klass, f"node:{f.node}", suspects, confidence, list(f.evidence)[:5], f.severity,
                                  why, list(jobs), [f.id], f.ts, now)
        seen = times_seen(self.state, self.settings, f.node, lambda g: finding_class(g) == klass, now)
        return [Assessment(inc, new, frozenset(signals), why, f.ts, affected_jobs=jobs, exclude_nodes=(f.node,),
                           gpu=f.gpu, isolation={f.node: finding_isolation(f)},
                           confirmed=klass == "hardware" or confirmed(self.settings, inc.severity, seen, klass))]

    def _xids_across_job(self, f: Finding, now: float) -> str:
        """The job (if any) ``f.node`` ran in whose nodes reported non-isolating XIDs within the evidence
        window as a job bug's failures spread: on ``job_bug_min_nodes`` nodes, or on at least two and
        ``job_bug_min_fraction`` of them. A GPU's repeated application XIDs are then the job's doing."""
        lo = now - self.settings.evidence_window_s
        for job in self.jobs.jobs_placed_on(f.node):
            rec = self.state.jobs[job]
            if app_xids_spread(self.state, self.settings, self.jobs.node_set(rec), lo):
                return rec.job
        return ""
