"""Where each incident stands once the engine acted on it: the jobs it moved and the nodes it
isolated that it still waits for (:class:`~.engine_state.IncidentTracks`), its status (resolved when
nothing waits any more; closed when stale) and its publication (emitted when new or changed
materially, not for every piece of evidence)."""

from __future__ import annotations

import heapq

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
        # what :meth:`close_stale` keeps: the open incidents queued by their evidence's time when last
        # looked at (evidence only gets later: one is looked at again once that time is stale), those
        # it kept open for their tracks (looked at again once a track of theirs empties: ``_released``),
        # and the book's version they reflect
        self._queue: list[tuple[float, int, str]] = []
        self._queued: set[str] = set()
        self._held: set[str] = set()
        self._released: set[str] = set()
        self._version = -1

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
            self._release(incident_id)
            self.set_status(incident_id, "resolved", now, out)

    def stop_waiting_for(self, incident_id: str, node: str) -> None:
        """The incident no longer waits for ``node`` (its isolation was dropped); nothing is resolved."""
        t = self.state.tracks.get(incident_id)
        if t is not None:
            t.nodes = [n for n in t.nodes if n != node]
            if not t.nodes and not t.jobs:
                self._release(incident_id)

    def _release(self, incident_id: str) -> None:
        """Nothing waits for the incident any more: if :meth:`close_stale` kept it open for that, it
        looks at it again."""
        if incident_id in self._held:
            self._held.discard(incident_id)
            self._released.add(incident_id)

    def set_status(self, incident_id: str, status: IncidentStatus, now: float, out: Decisions) -> None:
        inc = self.triage.set_status(incident_id, status, now)
        if inc is not None:
            self.publish(inc, out)
            self.issuer.audit(out, now, "incident", f"incident {status}", incident=inc)

    def close_stale(self, now: float, out: Decisions) -> None:
        """Incidents nothing waits for and no evidence renewed within ``incident_merge_s`` close:
        ``resolved`` if fleetmedic acted on them, else ``dismissed``. Only those whose evidence, when
        last looked at, is older than that are looked at (and those their tracks held), in the
        book's order."""
        horizon = now - self.settings.triage.incident_merge_s
        book, incidents = self.triage.book, self.triage.state.incidents
        queue, queued = self._queue, self._queued
        if book.version != self._version:  # incidents opened or reopened since join the queue
            for inc_id in book.open_ids.keys() - queued:
                opened = incidents[inc_id]
                heapq.heappush(queue, (opened.last_seen or opened.first_seen, book.serial[inc_id], inc_id))
                queued.add(inc_id)
            self._version = book.version
        due, self._released = self._released, set()
        while queue and queue[0][0] <= horizon:
            due.add(heapq.heappop(queue)[2])
        if not due:
            return
        for inc_id in sorted(due, key=lambda i: book.serial.get(i, -1)):
            inc = incidents.get(inc_id)
            if inc is None or inc.status not in ("open", "mitigating"):
                queued.discard(inc_id)
                continue
            seen = inc.last_seen or inc.first_seen
            if seen > horizon:  # renewed since: queued again by its new time
                heapq.heappush(queue, (seen, book.serial[inc_id], inc_id))
                continue
            t = self.state.tracks.get(inc.id)
            if t is not None and (t.nodes or t.jobs):
                self._held.add(inc_id)
                continue
            queued.discard(inc_id)
            if inc.id not in self.state.published:  # watched, never confirmed: forget it quietly
                self.triage.set_status(inc.id, "dismissed", now)
                continue
            self.set_status(inc.id, "resolved" if inc.status == "mitigating" else "dismissed", now, out)

    def forget_gone(self) -> None:
        """Drop the tracks and publication keys of incidents triage no longer holds."""
        incidents = self.triage.state.incidents
        for inc_id in [i for i in self.state.tracks if i not in incidents]:
            del self.state.tracks[inc_id]
            self._held.discard(inc_id)
        for inc_id in [i for i in self.state.published if i not in incidents]:
            del self.state.published[inc_id]
