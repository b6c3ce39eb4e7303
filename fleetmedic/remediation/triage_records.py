"""Triage's state and vocabulary: what it remembers about jobs, failures and findings (serialisable
structs), the :class:`Assessment` it hands to policy, the incident book (open or merge an incident)
and the small pure helpers the triage rules share. Pure: no I/O, time comes in as ``now``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, Literal, TypeVar

import msgspec

from fleetmedic.config import TriageSettings
from fleetmedic.records import Evidence, Finding, Incident, IncidentClass, Severity, Suspect

ISOLATING_HINTS: Final = frozenset({"reset_gpu", "reboot_node", "isolate"})
QUIET_HINTS: Final = frozenset({"ignore", "restart_app"})
SEVERITY_RANK: Final = {"info": 0, "warning": 1, "critical": 2}
MAX_EVIDENCE: Final = 40
MAX_IDS: Final = 200

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



class IncidentBook:
    """Opens incidents, merges evidence into the open one with the same class and subject, and
    changes their status; the incidents live in the triage state."""

    settings: TriageSettings
    state: TriageState

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
                suspects=union(old.suspects, suspects),
                confidence=max(old.confidence, confidence),
                evidence=(old.evidence + evidence)[-MAX_EVIDENCE:],
                last_seen=max(now, old.last_seen or 0.0),
                severity=max_severity((old.severity, severity)),
                jobs=union(old.jobs, jobs),
                finding_ids=union(old.finding_ids, finding_ids)[-MAX_IDS:],
            )
            self.state.incidents[merged.id] = merged
            return merged, False
        base = f"{klass}:{subject}:{int(first_seen * 1000)}"
        inc_id, n = base, 1
        while inc_id in self.state.incidents:
            n += 1
            inc_id = f"{base}.{n}"
        inc = Incident(id=inc_id, incident_class=klass, suspects=union([], suspects), confidence=round(confidence, 3),
                       evidence=evidence[-MAX_EVIDENCE:], first_seen=first_seen, last_seen=now, status="open",
                       severity=severity, summary=summary[:4096], jobs=union([], jobs),
                       finding_ids=union([], finding_ids)[-MAX_IDS:])
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

def finding_class(f: Finding) -> IncidentClass | None:
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


def is_congestion(f: Finding, metrics: Iterable[str]) -> bool:
    """A network finding whose every measurement is a congestion counter (``metrics``): traffic
    waiting for credits, not a broken link or NIC."""
    measured = [e.metric for e in f.evidence if e.detector != "link_peer"]
    return f.kind == "network" and bool(measured) and set(measured) <= set(metrics)


def is_hardware_finding(f: Finding) -> bool:
    """Evidence of a hardware fault (isolate at once), as opposed to degradation or network symptoms."""
    return is_hardware(f)


def is_hardware(f: Finding) -> bool:
    return finding_class(f) == "hardware" or (f.kind == "hard_fault" and f.severity == "critical"
                                               and f.action_hint not in QUIET_HINTS)


def max_severity(values: Iterable[Severity]) -> Severity:
    best: Severity = "info"
    for v in values:
        if SEVERITY_RANK[v] > SEVERITY_RANK[best]:
            best = v
    return best


T = TypeVar("T")


def union(a: Iterable[T], b: Iterable[T]) -> list[T]:
    """``a`` then ``b``, without repeats, in order."""
    out: list[T] = []
    for x in [*a, *b]:
        if x not in out:
            out.append(x)
    return out


def evidence_of(findings: list[Finding]) -> list[Evidence]:
    out: list[Evidence] = []
    for f in findings[:10]:
        out += f.evidence[:2] or [Evidence(detector=f.detector, ts=f.ts, note=f.summary)]
    return out

