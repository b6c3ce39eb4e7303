"""Triage's state and vocabulary: what it remembers about jobs, failures and findings (serialisable
structs, part of the engine's state), the :class:`Assessment` it hands to policy, and the small pure
helpers the triage rules share. Pure: no I/O, time comes in as ``now``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Final, Literal, TypeVar, cast

import msgspec

from fleetmedic.config import TriageSettings
from fleetmedic.records import Evidence, Finding, Incident, IncidentClass, Severity
from fleetmedic.remediation.kinds import KIND_RANK, Isolation, IsolationKind

ISOLATING_HINTS: Final = frozenset({"reset_gpu", "reboot_node", "isolate"})
QUIET_HINTS: Final = frozenset({"ignore", "restart_app"})
SEVERITY_RANK: Final = {"info": 0, "warning": 1, "critical": 2}

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


def file_group(table: dict[str, PendingGroup], group: PendingGroup) -> PendingGroup:
    """Add a new ``group`` to ``table``, which is kept in deadline order (then key order), so that
    the due groups are always a prefix of it. A group filed in order (the usual case: the deadline
    is the clock plus a fixed settle time) costs O(1); one filed out of order re-sorts the table."""
    last = next(reversed(table.values()), None)
    table[group.key] = group
    if last is not None and (last.deadline, last.key) > (group.deadline, group.key):
        order_groups(table)
    return group


def order_groups(table: dict[str, PendingGroup]) -> None:
    """Put a table read back from a snapshot (settle times may have changed since) in deadline order."""
    ordered = sorted(table.items(), key=lambda kv: (kv[1].deadline, kv[0]))
    table.clear()
    table.update(ordered)


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
    # unattributed failed jobs a node was part of: the serialised form of triage's failed jobs
    # (:mod:`.history`), written when the engine's state is serialised
    node_failed_jobs: dict[str, list[tuple[float, str]]] = {}
    failed_job_sizes: dict[str, int] = {}  # job -> its nodes at its latest unattributed failure


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
    isolation: dict[str, Isolation] = field(default_factory=dict)  # suspect node -> what isolating it rests on

    @property
    def suspect_nodes(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.incident.suspects if s.kind == "node")

    def isolation_of(self, node: str) -> Isolation:
        """The kind of isolation ``node`` would get (:mod:`fleetmedic.remediation.kinds`): what triage
        found for it, else by the incident's class (degradation: preventive; the rest: uncertain)."""
        found = self.isolation.get(node)
        if found is not None:
            return found
        klass = self.incident.incident_class
        return Isolation("preventive" if klass == "degradation" else "uncertain", f"class:{klass}")

    @property
    def jobs(self) -> tuple[str, ...]:
        return (self.job, *[j for j in self.affected_jobs if j != self.job]) if self.job else self.affected_jobs


# --- what a finding says ------------------------------------------------------------------------------

def finding_class(f: Finding) -> IncidentClass | None:
    """The incident a finding on its own opens (None: network findings, and those to stay quiet on)."""
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


#: hard_rules metrics whose finding proves the device unusable: a GPU lost (it stopped reporting), an
#: uncorrectable (double-bit) ECC error, a failed row remap
DEFINITIVE_METRICS: Final = frozenset({"gpu_count", "ecc_dbe_vol_total", "row_remap_failure"})
#: hard faults that leave the GPU working, slower: HW thermal slowdown and power brake (the
#: clock-event bits), a board's power delivery
PREVENTIVE_HARD_METRICS: Final = frozenset({"clocks_event_reasons"})
#: XIDs that mean the GPU is gone: fallen off the bus
LOST_GPU_XIDS: Final = frozenset({79})
#: log signals (log_patterns.yaml) of a device-level error: the GPU is lost, or memory is corrupt
DEFINITIVE_LOG_SIGNALS: Final = frozenset({"gpu_lost", "cuda_ecc"})


def finding_isolation(f: Finding) -> Isolation:
    """What isolating ``f.node`` on ``f`` alone rests on (:mod:`fleetmedic.remediation.kinds`).
    Definitive: a critical XID whose catalog action isolates (reset, reboot, the NVLink and mechanical
    workflows), or a hard rule on :data:`DEFINITIVE_METRICS`; its device is gone for XID 79 and a lost
    GPU. Preventive: what opens a degradation incident, and hard faults that leave the GPU working
    (thermal slowdown, power brake: :data:`PREVENTIVE_HARD_METRICS`). Uncertain: the rest (NVLink
    links down, other critical findings)."""
    metric = next((e.metric for e in f.evidence if e.metric), "")
    signature = f"{f.detector}:{metric or f.kind}"
    if f.detector == "node_condition":  # a node condition's rule names its kind (connectors/kube/node_conditions.py)
        kind, _, ctype = metric.partition(":")
        if kind in KIND_RANK and finding_class(f) is not None:
            return Isolation(cast(IsolationKind, kind), f"node_condition:{ctype}")
    if f.kind == "hard_fault" and f.severity == "critical" and f.action_hint not in QUIET_HINTS:
        if f.detector == "xid_rules" and f.action_hint in ISOLATING_HINTS:
            value = next((e.value for e in f.evidence if e.metric == "xid" and e.value is not None), None)
            code = int(value) if value is not None else -1
            return Isolation("definitive", f"xid:{code}" if code >= 0 else signature, code in LOST_GPU_XIDS)
        if f.detector == "hard_rules" and metric in DEFINITIVE_METRICS:
            return Isolation("definitive", signature, metric == "gpu_count")
    klass = finding_class(f)
    if klass == "degradation" or (klass == "hardware" and metric in PREVENTIVE_HARD_METRICS):
        return Isolation("preventive", signature)
    return Isolation("uncertain", signature)


def log_isolation(signal: str, pattern: str | None, xid: int | None, hint: str) -> Isolation:
    """What a hardware log line of a failed job (:class:`~fleetmedic.remediation.log_patterns.LineMatch`)
    rests on: a driver XID line like the XID itself; CUDA's own lost-GPU and uncorrectable-ECC errors
    are definitive; other hardware lines (a fatal PCIe error, an NVLink error) uncertain."""
    if xid is not None:
        if hint in ISOLATING_HINTS:
            return Isolation("definitive", f"xid:{xid}", xid in LOST_GPU_XIDS)
        return Isolation("uncertain", f"xid:{xid}")
    if signal in DEFINITIVE_LOG_SIGNALS:
        return Isolation("definitive", f"log:{signal}", signal == "gpu_lost")
    return Isolation("uncertain", f"log:{signal or pattern or 'hardware'}")


def is_hardware_finding(f: Finding) -> bool:
    """Evidence of a hardware fault (isolate at once), as opposed to degradation or network symptoms."""
    return finding_class(f) == "hardware" or (f.kind == "hard_fault" and f.severity == "critical"
                                               and f.action_hint not in QUIET_HINTS)


def is_congestion(f: Finding, metrics: Iterable[str]) -> bool:
    """A network finding whose every measurement is a congestion counter (``metrics``): traffic
    waiting for credits, not a broken link or NIC."""
    measured = [e.metric for e in f.evidence if e.detector != "link_peer"]
    return f.kind == "network" and bool(measured) and set(measured) <= set(metrics)


def link_name(f: Finding) -> str:
    """A link as the scorer and operators name it: ``device/port`` as findings give it, else ``node:port``."""
    return f.port if "/" in f.port else f"{f.node}:{f.port}"


def evidence_of(findings: list[Finding]) -> list[Evidence]:
    out: list[Evidence] = []
    for f in findings[:10]:
        out += f.evidence[:2] or [Evidence(detector=f.detector, ts=f.ts, note=f.summary)]
    return out


def app_xids_spread(state: TriageState, settings: TriageSettings, nodes: AbstractSet[str], since: float) -> bool:
    """Whether ``nodes`` (a job's) reported non-isolating XIDs (13, 31, 43: what an application's
    faults raise) at or after ``since`` as a job bug's failures spread: on ``job_bug_min_nodes`` of
    them, or on at least two and ``job_bug_min_fraction`` of them. Only the nodes with findings are
    read (a lock-step job has thousands of nodes, few of them with findings)."""
    findings = state.findings
    # the smaller side is walked, the other looked up
    with_findings = [n for n in findings if n in nodes] if len(findings) < len(nodes) else [
        n for n in nodes if n in findings]
    count = sum(1 for n in with_findings if any(
        g.detector == "xid_rules" and g.severity != "critical" and g.ts >= since for g in findings[n]))
    return count >= settings.job_bug_min_nodes or (count >= 2 and count >= settings.job_bug_min_fraction * len(nodes))


# --- confirmation: warnings act only once reasserted --------------------------------------------------

def times_seen(state: TriageState, settings: TriageSettings, node: str, same: Callable[[Finding], bool],
               now: float) -> list[float]:
    """When ``node`` reported findings like this one (``same``) within the confirmation window."""
    lo = now - settings.warning_confirm_window_s
    return sorted({f.ts for f in state.findings.get(node, ()) if f.severity != "info" and f.ts >= lo and same(f)})


def confirmed(settings: TriageSettings, severity: Severity, seen: list[float],
              klass: IncidentClass = "network") -> bool:
    """Hardware faults and critical network evidence act at once; warnings, and degradation of
    any severity (statistical evidence), only once the detector has reasserted them over time."""
    if severity == "critical" and klass != "degradation":
        return True
    return len(seen) >= settings.warning_confirmations and seen[-1] - seen[0] >= settings.warning_confirm_min_span_s


# --- small helpers --------------------------------------------------------------------------------------

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


def most_common(counts: Counter[T]) -> tuple[T, int] | None:
    """The most frequent value and its count; None when nothing was counted (never index an empty
    ``Counter.most_common``)."""
    top = counts.most_common(1)
    return top[0] if top else None
