"""Where each incident stands once the engine acted on it: the jobs it moved and the nodes it
isolated that it still waits for (:class:`~.engine_state.IncidentTracks`), its status (resolved when
nothing waits any more; closed when stale) and its publication (emitted when new or changed
materially, not for every piece of evidence)."""

from __future__ import annotations

import math

import msgspec

from fleetmedic.config import Settings
from fleetmedic.records import Incident, IncidentStatus
from fleetmedic.remediation.engine_state import Decisions, EngineState, IncidentTracks
from fleetmedic.remediation.issuer import Issuer
from fleetmedic.remediation.triage import Triage


class IncidentTracker:
    def __init__(self, settings: Settings, state: EngineState, triage: Triage, issuer: Issuer) -> None:
        self.settings = settings
        self.state = state
        self.triage = triage
        self.issuer = issuer
        # what the last walk over every open incident left for :meth:`close_stale`: no open incident
        # outside ``_held`` has evidence older than ``_recent`` (new evidence and new incidents are
        # later), and ``_held`` are those it kept open for their tracks, in the book's order
        self._recent = -math.inf
        self._held: dict[str, None] = {}

    def publish(self, inc: Incident, out: Decisions) -> bool:
        """Emit an incident when it is new or changed materially (not for every piece of evidence)."""
        sources = sorted({e.detector for e in inc.evidence})  # a new kind of evidence is news; more of it is not
        key = msgspec.json.encode([inc.status, inc.incident_class, inc.suspects, inc.severity, inc.confidence,
                                   inc.jobs, sources]).decode()
        if self.state.published.get(inc.id) == key:
            return False
        self.state.published[inc.id] = key
        out.incidents.append(inc)
        return True

    def first_decision(self, incident_id: str) -> bool:
        """Open the incident's tracks; True the first time (the engine decides on it for the first time)."""
        if incident_id in self.state.tracks:
            return False
        self.state.tracks[incident_id] = IncidentTracks()
        return True

    def handled_jobs(self, incident_id: str) -> list[str]:
        """The jobs this incident already moved (the live list: it grows as jobs are moved)."""
        return self.state.tracks.get(incident_id, IncidentTracks()).handled

    def track(self, incident_id: str, node: str = "", job: str = "", wait: bool = True) -> None:
        """The incident waits for ``node`` (back in service or repair), and for ``job`` if ``wait``."""
        t = self.state.tracks.setdefault(incident_id, IncidentTracks())
        if node and node not in t.nodes:
            t.nodes.append(node)
        if job and wait and job not in t.jobs:
            t.jobs.append(job)
        if job and job not in t.handled:
            t.handled.append(job)

    def untrack(self, incident_id: str, now: float, out: Decisions, node: str = "", job: str = "") -> None:
        """``node`` or ``job`` is done with; once nothing waits, the incident is resolved."""
        t = self.state.tracks.get(incident_id)
        if t is None:
            return
        t.nodes = [n for n in t.nodes if n != node]
        t.jobs = [j for j in t.jobs if j != job]
        if not t.nodes and not t.jobs:
            self.set_status(incident_id, "resolved", now, out)

    def stop_waiting_for(self, incident_id: str, node: str) -> None:
        """The incident no longer waits for ``node`` (its isolation was dropped); nothing is resolved."""
        t = self.state.tracks.get(incident_id)
        if t is not None:
            t.nodes = [n for n in t.nodes if n != node]

    def set_status(self, incident_id: str, status: IncidentStatus, now: float, out: Decisions) -> None:
        inc = self.triage.set_status(incident_id, status, now)
        if inc is not None:
            self.publish(inc, out)
            self.issuer.audit(out, now, "incident", f"incident {status}", incident=inc)

    def close_stale(self, now: float, out: Decisions) -> None:
        """Incidents nothing waits for and no evidence renewed within ``incident_merge_s`` close:
        ``resolved`` if fleetmedic acted on them, else ``dismissed``."""
        horizon = now - self.settings.triage.incident_merge_s
        incidents = self.triage.state.incidents
        walk = horizon >= self._recent  # else only those the tracks held may be due
        ids = list(self.triage.book.open_ids if walk else self._held)  # (in the book's order)
        recent, held = now, dict[str, None]()
        for inc in [incidents[i] for i in ids if i in incidents]:
            seen = inc.last_seen or inc.first_seen
            if inc.status not in ("open", "mitigating"):
                continue
            if seen > horizon:
                recent = min(recent, seen)
                continue
            t = self.state.tracks.get(inc.id)
            if t is not None and (t.nodes or t.jobs):
                held[inc.id] = None
                continue
            if inc.id not in self.state.published:  # watched, never confirmed: forget it quietly
                self.triage.set_status(inc.id, "dismissed", now)
                continue
            self.set_status(inc.id, "resolved" if inc.status == "mitigating" else "dismissed", now, out)
        if walk:
            self._recent, self._held = recent, held
        else:  # the held ones still open, recent or held again (their evidence is later than ``_recent``)
            self._held = {i: None for i in ids if i in self.triage.book.open_ids}

    def forget_gone(self) -> None:
        """Drop the tracks and publication keys of incidents triage no longer holds."""
        incidents = self.triage.state.incidents
        for inc_id in [i for i in self.state.tracks if i not in incidents]:
            del self.state.tracks[inc_id]
        for inc_id in [i for i in self.state.published if i not in incidents]:
            del self.state.published[inc_id]
