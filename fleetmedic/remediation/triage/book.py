"""The incident book: opens incidents, merges new evidence into the open incident with the same class
and subject, changes their status, and forgets closed ones. The incidents live in the triage state."""

from __future__ import annotations

from typing import Final

import msgspec

from fleetmedic.config import TriageSettings
from fleetmedic.records import Evidence, Incident, IncidentClass, IncidentStatus, Severity, Suspect
from fleetmedic.remediation.triage.records import TriageState, max_severity, union

MAX_EVIDENCE: Final = 40
MAX_IDS: Final = 200


class IncidentBook:
    def __init__(self, settings: TriageSettings, state: TriageState) -> None:
        self.settings = settings
        self.state = state
        # incident id -> its "class|subject" keys in open_by_subject: closing one is O(1), not a scan
        self._subjects: dict[str, set[str]] = {}
        for key, inc_id in state.open_by_subject.items():
            self._subjects.setdefault(inc_id, set()).add(key)
        # closed incidents in the order they closed (so by last_seen): pruning looks at the due ones only
        closed = sorted((inc.last_seen or inc.first_seen, inc_id) for inc_id, inc in state.incidents.items()
                        if inc.status in ("resolved", "dismissed"))
        self._closed: dict[str, None] = dict.fromkeys(inc_id for _, inc_id in closed)
        #: incident -> its place in the book (the order the incidents were opened in)
        self.serial: dict[str, int] = {inc_id: k for k, inc_id in enumerate(state.incidents)}
        self._next_serial = len(self.serial)
        #: the open (or mitigating) incidents, in the book's order
        self.open_ids: dict[str, None] = {}
        self._order_open()
        #: moves on with every change to the incidents: what is derived from them is derived again
        self.version = 0

    def _order_open(self) -> None:
        self.open_ids = dict.fromkeys(i for i, inc in self.state.incidents.items()
                                      if inc.status in ("open", "mitigating"))

    def open(self, klass: IncidentClass, subject: str, suspects: list[Suspect], confidence: float,
             evidence: list[Evidence], severity: Severity, summary: str, jobs: list[str],
             finding_ids: list[str], first_seen: float, now: float) -> tuple[Incident, bool]:
        """Open an incident, or merge into the open one with the same class and subject seen within
        ``incident_merge_s``. Returns the incident and whether it is new."""
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
            self.version += 1
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
        self.serial[inc_id] = self._next_serial
        self._next_serial += 1
        self.open_ids[inc_id] = None
        self.version += 1
        replaced = self.state.open_by_subject.get(key)
        if replaced is not None:
            self._subjects.get(replaced, set()).discard(key)
        self.state.open_by_subject[key] = inc_id
        self._subjects.setdefault(inc_id, set()).add(key)
        return inc, True

    def is_open(self, klass: IncidentClass, subject: str) -> bool:
        """Whether an open (or mitigating) incident of that class and subject is on the book."""
        inc_id = self.state.open_by_subject.get(f"{klass}|{subject}")
        if not inc_id:
            return False
        return self.state.incidents[inc_id].status in ("open", "mitigating")

    def set_status(self, incident_id: str, status: IncidentStatus, now: float) -> Incident | None:
        """Change an incident's status; returns the updated incident, or None if nothing changed."""
        inc = self.state.incidents.get(incident_id)
        if inc is None or inc.status == status:
            return None
        was_open = inc.status in ("open", "mitigating")
        inc = msgspec.structs.replace(inc, status=status, last_seen=max(now, inc.last_seen or 0.0))
        self.state.incidents[incident_id] = inc
        self.version += 1
        if status in ("open", "mitigating") and not was_open:  # reopened: back in its place in the book
            self._order_open()
        elif status not in ("open", "mitigating"):
            self.open_ids.pop(incident_id, None)
        if status in ("resolved", "dismissed"):
            self._closed.pop(incident_id, None)
            self._closed[incident_id] = None
            for key in self._subjects.pop(incident_id, ()):
                if self.state.open_by_subject.get(key) == incident_id:
                    del self.state.open_by_subject[key]
        return inc

    def forget_closed(self, now: float) -> None:
        """Drop incidents resolved or dismissed longer than ``incident_merge_s`` ago."""
        horizon = now - self.settings.incident_merge_s
        while self._closed:
            inc_id = next(iter(self._closed))
            inc = self.state.incidents.get(inc_id)
            if inc is not None and inc.status in ("resolved", "dismissed"):
                if (inc.last_seen or inc.first_seen) >= horizon:
                    return  # closed later than this one: not due either
                del self.state.incidents[inc_id]
                self.serial.pop(inc_id, None)
                self.version += 1
            del self._closed[inc_id]
