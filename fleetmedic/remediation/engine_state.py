"""The decision engine's values: what one call decided (:class:`Decisions`) and the whole state
it keeps between calls (:class:`EngineState`), serialised whole as msgpack by :func:`encode_state`
(the decision stage snapshots it to a compacted Kafka topic, :mod:`fleetmedic.streams.state`).
Keep the encoding compatible: a snapshot written before a change must restore after it
(:meth:`~.engine.DecisionEngine.from_bytes` refuses any other :data:`STATE_VERSION`): new fields
get defaults, so older snapshots still load (``seen``, ``cluster``, the kinds of isolation in the safety state and
node records, the breaker's signatures and domains, and the refusal clocks came that way)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import msgspec

from fleetmedic.records import AuditRecord, Incident, RemediationCommand, Track
from fleetmedic.remediation.accounting import AccountingState
from fleetmedic.remediation.lifecycle import NodeRecord
from fleetmedic.remediation.safety import SafetyState
from fleetmedic.remediation.topology import Placement
from fleetmedic.remediation.triage import TriageState

STATE_VERSION: Final = 1
NODE_CLASSES: Final = frozenset({"hardware", "degradation", "network", "unknown"})


@dataclass
class Decisions:
    """What one call decided. Publish incidents, (signed) commands and audit records in this order."""

    incidents: list[Incident] = field(default_factory=list)
    commands: list[RemediationCommand] = field(default_factory=list)
    audit: list[AuditRecord] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.incidents or self.commands or self.audit)

    def extend(self, other: Decisions) -> None:
        self.incidents += other.incidents
        self.commands += other.commands
        self.audit += other.audit


class CommandInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Where an issued command's result should go."""

    action: str
    track: Track
    incident_id: str
    issued_at: float
    node: str = ""
    job: str = ""


class HeldCommand(msgspec.Struct, frozen=True, kw_only=True):
    """A job-track command waiting for its backoff."""

    due: float
    id: str
    action: str
    incident_id: str
    job: str
    reason: str
    params: dict[str, str] = {}
    attempt: int = 0  # the failed attempt it retries: moot once the job moved on


class MovingJob(msgspec.Struct, kw_only=True):
    """A job fleetmedic restarted or requeued that is not placed yet: the nodes fleetmedic starts
    suspecting meanwhile are added to its exclusions."""

    command_id: str
    action: str
    incident_id: str
    attempt: int  # the job's attempt when it was moved: a placement of a later one ends the wait
    since: float
    exclude: list[str] = []
    reason: str = ""
    updates: int = 0


class IncidentTracks(msgspec.Struct, kw_only=True):
    """What an incident still waits for before it is resolved, and the jobs it already moved."""

    jobs: list[str] = []
    nodes: list[str] = []
    handled: list[str] = []


class EngineState(msgspec.Struct, kw_only=True):
    version: int = STATE_VERSION
    clock: float = 0.0
    seq: int = 0
    topology: dict[str, Placement] = {}
    nodes: dict[str, NodeRecord] = {}
    triage: TriageState = msgspec.field(default_factory=TriageState)
    safety: SafetyState = msgspec.field(default_factory=SafetyState)
    accounting: AccountingState = msgspec.field(default_factory=AccountingState)
    commands: dict[str, CommandInfo] = {}
    held: list[HeldCommand] = []
    tracks: dict[str, IncidentTracks] = {}
    published: dict[str, str] = {}  # incident id -> what was last published of it
    muted: dict[str, float] = {}  # out-of-service node -> since when its findings are not triaged
    seen: dict[str, float] = {}  # node -> last time telemetry, a finding or a placement named it (fleet size)
    cluster: dict[str, float] = {}  # node -> when the node watch first listed it (the fleet, when any)
    moving: dict[str, MovingJob] = {}  # job -> a restart of it not placed yet
    operator_ids: dict[str, float] = {}  # applied operator command id -> its expires_at (replays refused)


_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final = msgspec.msgpack.Decoder(EngineState)


def encode_state(state: EngineState) -> bytes:
    return _ENCODER.encode(state)


def decode_state(data: bytes) -> EngineState:
    return _DECODER.decode(data)
