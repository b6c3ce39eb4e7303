""":class:`Triage`, the one object the engine talks to. It composes the parts of triage over one
:class:`~.records.TriageState`: the :class:`~.book.IncidentBook`, the :class:`~.jobs.JobBoard`,
:class:`~.findings.NodeFindings`, :class:`~.network.NetworkTriage` and
:class:`~.failures.JobFailureTriage`; routes each input to its part; decides the gathered groups
(network findings per leaf, failure reports per job attempt) when they settle; and forgets what no
window reaches any more."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from fleetmedic.config import PolicySettings, TriageSettings
from fleetmedic.records import Finding, Incident, IncidentStatus, JobEvent
from fleetmedic.remediation.log_patterns import PatternLibrary
from fleetmedic.remediation.topology import Topology
from fleetmedic.remediation.triage.book import IncidentBook
from fleetmedic.remediation.triage.failures import JobFailureTriage
from fleetmedic.remediation.triage.findings import NodeFindings
from fleetmedic.remediation.triage.history import FailedJobs
from fleetmedic.remediation.triage.jobs import JobBoard
from fleetmedic.remediation.triage.network import NetworkTriage
from fleetmedic.remediation.triage.records import Assessment, JobRecord, PendingGroup, TriageState, order_groups

# Engine seconds between trims of the failure histories (dropping what no window reaches): a trim
# walks every node's list, and the decision stage ticks every few seconds. Readers filter by their
# window, so a trim an hour late costs memory only: at most an hour's entries more per node and job.
TRIM_EVERY_S: Final = 3600.0

class Triage:
    def __init__(self, settings: TriageSettings, policy: PolicySettings, library: PatternLibrary,
                 topology: Topology | None = None, state: TriageState | None = None,
                 fleet_size: Callable[[], int] | None = None) -> None:
        self.settings = settings
        self.policy = policy
        self.library = library
        self.state = state if state is not None else TriageState()
        self._next_trim = float("-inf")  # when the failure histories are trimmed next
        order_groups(self.state.network)
        order_groups(self.state.failures)
        topology = topology if topology is not None else Topology()
        self.book = IncidentBook(settings, self.state)
        self.job_board = JobBoard(settings, self.state)
        self.node_findings = NodeFindings(settings, self.state, self.book, self.job_board)
        self.network = NetworkTriage(settings, self.state, self.book, self.job_board, topology)
        self.failed_jobs = FailedJobs(self.state)
        self.failures = JobFailureTriage(settings, policy, library, self.state, self.book, topology, fleet_size,
                                         self.failed_jobs, self.job_board)
        self._topology = topology
        #: (the book's version and the classes asked for, node -> the latest evidence of an open
        #: incident of those classes naming it): :meth:`suspected_nodes` reads the incidents again
        #: only when they changed
        self._suspects: tuple[tuple[int, frozenset[str]] | None, dict[str, float]] = (None, {})
        self._classes: tuple[int | None, dict[str, str]] = (None, {})  # (the book's version, suspicion_classes)

    @property
    def topology(self) -> Topology:
        return self._topology

    @topology.setter
    def topology(self, topology: Topology) -> None:
        """The engine learned where nodes sit (labels, a node deleted): the parts that ask see it too."""
        self._topology = self.network.topology = self.failures.topology = topology

    # --- inputs -------------------------------------------------------------------------------------

    def add_finding(self, f: Finding, now: float) -> list[Assessment]:
        """Remember ``f``; a node's own finding may open an incident now, a network finding waits with
        its leaf's group (see :meth:`due`)."""
        self.state.findings.setdefault(f.node, []).append(f)
        if f.severity == "info" or f.kind == "telemetry":
            return []
        if f.kind == "network":
            self.network.gather(f, now)
            return []
        return self.node_findings.assess(f, now)

    def add_job_event(self, e: JobEvent, now: float) -> list[str]:
        """Track the job; gather failure reports. Returns notes for the audit (ignored reports)."""
        return self.job_board.add_event(e, now)

    # --- jobs ---------------------------------------------------------------------------------------

    def suspicion_classes(self) -> dict[str, str]:
        """Node -> the class of the open incidents that suspect it, the likeliest to fail a job first
        (hardware, unknown, network, degradation, then the rest); read-only, read again only when the
        incidents changed."""
        if self._classes[0] == self.book.version:  # the incidents are as they were: read-only, shared
            return self._classes[1]
        order = {"hardware": 0, "unknown": 1, "network": 2, "degradation": 3}
        out: dict[str, str] = {}
        incidents = self.state.incidents
        for inc_id in set(self.state.open_by_subject.values()):
            inc = incidents.get(inc_id)
            if inc is None or inc.status not in ("open", "mitigating"):
                continue
            for s in inc.suspects:
                if s.kind not in ("node", "gpu"):
                    continue
                node = s.name if s.kind == "node" else s.name.rsplit("/", 1)[0]
                if order.get(inc.incident_class, 9) < order.get(out.get(node, ""), 9):
                    out[node] = inc.incident_class
        self._classes = (self.book.version, out)
        return out

    def suspected_nodes(self, classes: frozenset[str], returned: Mapping[str, float] | None = None,
                        gathering: bool = True) -> set[str]:
        """Nodes an open incident of one of ``classes`` suspects (itself or one of its GPUs), confirmed
        or still watched, and (``gathering``) hosts whose network findings are being gathered.
        ``returned``: nodes returned to service (after passing diagnostics) and when; an incident
        whose last evidence is older than the return no longer counts against the node."""
        key = (self.book.version, classes)
        if self._suspects[0] != key:  # the incidents changed: their suspects are read again
            named: dict[str, float] = {}  # node -> the latest evidence of an open incident naming it
            incidents = self.state.incidents
            for inc_id in set(self.state.open_by_subject.values()):
                inc = incidents.get(inc_id)
                if inc is None or inc.status not in ("open", "mitigating") or inc.incident_class not in classes:
                    continue
                seen = inc.last_seen if inc.last_seen is not None else inc.first_seen
                for s in inc.suspects:
                    if s.kind in ("node", "gpu"):
                        node = s.name if s.kind == "node" else s.name.rsplit("/", 1)[0]
                        named[node] = max(seen, named.get(node, seen))
            self._suspects = (key, named)
        back = returned or {}
        out = {node for node, seen in self._suspects[1].items() if node not in back or seen > back[node]}
        if gathering:
            out.update(self.gathering())
        return out

    def gathering(self) -> list[str]:
        """Hosts whose network findings are being gathered."""
        return [key[5:] for key in self.state.network if key.startswith("node:")]

    def jobs_on(self, node: str) -> tuple[str, ...]:
        return self.job_board.jobs_on(node)

    def job(self, job: str) -> JobRecord | None:
        return self.job_board.job(job)

    def expect_failure(self, job: str, attempt: int, until: float) -> None:
        """A failure of this attempt is fleetmedic's own doing (it restarted or drained it)."""
        self.job_board.expect_failure(job, attempt, until)

    def forget_decision(self, job: str, attempt: int) -> None:
        """A new run of that attempt: its failure is decided anew."""
        self.job_board.forget_decision(job, attempt)

    # --- deciding -----------------------------------------------------------------------------------

    def due(self, now: float) -> list[Assessment]:
        """Decide the gathered groups whose settle time has passed (oldest first).

        Each table is kept in deadline order (:func:`~.records.file_group`), so the due groups are
        a prefix, found without looking at the rest."""
        out: list[Assessment] = []
        for key, group in self._ready(self.state.network, now):
            del self.state.network[key]
            out += self.network.decide(group, now)
        for key, group in self._ready(self.state.failures, now):
            del self.state.failures[key]
            self.state.decided[key] = now
            out += self.failures.decide(group, now)
        return out

    @staticmethod
    def _ready(groups: dict[str, PendingGroup], now: float) -> list[tuple[str, PendingGroup]]:
        ready = []
        for key, group in groups.items():  # filed in (deadline, key) order: see records.file_group
            if group.deadline > now:
                break
            ready.append((key, group))
        return ready

    def next_deadline(self) -> float | None:
        tables = (self.state.failures, self.state.network)
        firsts = [next(iter(groups.values())).deadline for groups in tables if groups]
        return min(firsts) if firsts else None

    def set_status(self, incident_id: str, status: IncidentStatus, now: float) -> Incident | None:
        """Change an incident's status; returns the updated incident, or None if nothing changed."""
        return self.book.set_status(incident_id, status, now)

    # --- housekeeping -------------------------------------------------------------------------------

    def write_state(self) -> None:
        """Put what triage keeps outside its state (rule 6's failed jobs, :mod:`.history`) into the
        state: call it before the state is serialised."""
        self.failed_jobs.write()

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
        if now >= self._next_trim:  # readers filter by their windows: an hour late costs nothing
            self._next_trim = now + TRIM_EVERY_S
            _trim(self.state.node_failures, now - p.escalate_window_s)
            _trim(self.state.job_signatures, now - p.escalate_window_s)
            self.failed_jobs.trim(now - p.suspect_window_s)
        self.state.expected = {k: t for k, t in self.state.expected.items() if t >= now}
        self.state.decided = {k: t for k, t in self.state.decided.items() if t >= now - s.incident_merge_s}
        self.book.forget_closed(now)
        self.job_board.forget_finished(now - max(s.incident_merge_s, p.suspect_window_s))


def _trim(table: dict[str, list[Any]], horizon: float) -> None:
    """Drop the entries (``(time, ...)``, appended about in time order) older than ``horizon``, and the
    keys left with none. A list whose first entry is recent is left as it is: readers filter by their
    window, so what lingers behind a recent entry costs memory for one window at most, and the big
    job's hundreds of nodes cost no list rebuilding at every tick."""
    for key in [k for k, v in table.items() if not v or v[0][0] < horizon]:
        kept = [x for x in table[key] if x[0] >= horizon]
        if kept:
            table[key] = kept
        else:
            del table[key]
