"""The pipeline's state on Kafka: what a worker writes so that a restarted one carries on.

- Decision stage: one :class:`DecideSnapshot` under key ``engine`` in the compacted
  ``<group>-engine-state`` topic (one larger than a record may be is written in parts, with a
  manifest under ``engine``: :mod:`~fleetmedic.streams.snapshot_parts`): the engine's and the
  fleet stage's state, the input offsets they reflect (per topic and partition: the next offset
  to read) and ``commands_from``, an offset of
  ``remediation.commands`` below which every command the snapshot's engine issued is already
  on the topic, and ``audit_from``, the same for ``remediation.audit``. At start the runner reads
  it (:func:`load_snapshot`), points the decision group's offsets back at the snapshot's
  (:func:`reset_group_offsets`) and collects the command ids written since ``commands_from`` and
  the audit ids since ``audit_from`` (:func:`ids_since`): the replayed inputs rebuild the lost
  decisions, and a command or audit record whose id is already on its topic is not sent again.
- Stage 1: one :class:`NodeStageState` per node (key: node) in ``<group>-detect-state``, written
  to the partition of ``telemetry.gpu`` the node's telemetry arrives on, and under
  :data:`MODEL_KEY` the multivariate model's training rows of that partition's nodes (a
  :class:`~fleetmedic.models.multivariate.ModelPart`: plain arrays, refitted on load, no pickle);
  a worker that is assigned that partition loads them (:func:`load_detect_partition`). A node
  stage 1 evicted has a tombstone under its key (no value): it is not loaded.

Corrupt state starts fresh for what cannot be read, never silently and never as a
crash: :func:`load_snapshots` hands the decision stage its latest few snapshots, newest first, so
that one that does not decode is passed over (``decide.restore``); a stage-1 node state that does
not decode is left out and named (:class:`DetectPartition`), and stage 1 counts it and starts that
node fresh. A snapshot carries the SHA-256 of its bytes (:func:`encode_snapshot`): one whose bytes
changed since is refused (:class:`SnapshotCorrupt`) and passed over like one that does not decode,
however plausible the values it would decode to. A node state whose baselines, counts or times are
not finite is refused by the models (:func:`~fleetmedic.models.state.require_finite`): that node
starts fresh, counted.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from fleetmedic import records as r
from fleetmedic.bus import (
    MAX_STATE_BYTES,
    SNAPSHOTS,
    STATE_READER,
    client_options,
    consumer_options,
    producer_options,
    state_topic,
)
from fleetmedic.config import Settings
from fleetmedic.streams.snapshot_parts import SNAPSHOT_KEY as SNAPSHOT_KEY
from fleetmedic.streams.snapshot_parts import SnapshotScan
from fleetmedic.streams.snapshot_parts import SnapshotUnreadable as SnapshotUnreadable

log = logging.getLogger(__name__)

#: the largest record the decision stage writes to the state topic: its max.message.bytes, less the
#: record batch's own headers; a larger snapshot is written in parts (:mod:`.snapshot_parts`)
SNAPSHOT_LIMIT = MAX_STATE_BYTES - 4096
SNAPSHOTS_KEPT = 3  # snapshots :func:`load_snapshots` hands back (one that does not decode is passed over)
MODEL_KEY = b"__multivariate_model__"  # not a node name (Kubernetes names have no "_")


class DecideSnapshot(msgspec.Struct, kw_only=True):
    engine: bytes
    fleet: bytes
    offsets: dict[str, dict[int, int]]  # topic -> partition -> next offset to read
    commands_from: int
    written_at: float = 0.0
    seen_findings: list[str] = []  # the latest finding ids handled, oldest first
    seen_finding_times: list[float] = []  # their event times (empty in a snapshot written without them)
    audit_from: int = 0  # like commands_from, on remediation.audit


class NodeStageState(msgspec.Struct, kw_only=True, array_like=True):
    """Stage 1's memory of one node: GPU baselines and rule state, its NICs' previous counters."""

    gpu: bytes | None
    ports: bytes
    written_at: float
    multivariate: bytes | None = None  # the node's open window and outlier streak
    seen_at: float | None = None  # stage 1's event-time clock when the node was last seen (None: not known)
    kernel: bytes | None = None  # the kernel-log conditions it reported and when (None: none, or an older writer)


#: a snapshot as written: this, the SHA-256 of the msgpack that follows, then the msgpack
CHECKSUMMED_MAGIC: Final = b"FMSNAP1\n"
_DIGEST = 32


class SnapshotCorrupt(ValueError):
    """A snapshot whose bytes do not match the checksum it was written with."""


def encode_snapshot(snap: DecideSnapshot) -> bytes:
    """The snapshot as the state topic holds it: :data:`CHECKSUMMED_MAGIC`, the SHA-256 of its
    msgpack, the msgpack."""
    body = msgspec.msgpack.encode(snap)
    return CHECKSUMMED_MAGIC + hashlib.sha256(body).digest() + body


def decode_snapshot(data: bytes) -> DecideSnapshot:
    """What :func:`encode_snapshot` wrote; :class:`SnapshotCorrupt` when its bytes do not match
    its checksum (a flipped bit anywhere: engine, fleet, offsets). A snapshot of a writer that
    wrote no checksum (plain msgpack) is read as it is."""
    if data.startswith(CHECKSUMMED_MAGIC):
        head = len(CHECKSUMMED_MAGIC)
        digest, body = data[head:head + _DIGEST], data[head + _DIGEST:]
        if hashlib.sha256(body).digest() != digest:
            raise SnapshotCorrupt(f"the snapshot's {len(data)} bytes do not match the SHA-256 they were written "
                                  "with (corrupted since)")
        data = body
    return msgspec.msgpack.decode(data, type=DecideSnapshot)


async def _read_partition(settings: Settings, tp: TopicPartition, timeout: float,
                          take: Callable[[int, bytes, bytes], None],
                          deleted: Callable[[int, bytes], None] | None = None) -> None:
    """``take(offset, key, value)`` for every record of one partition, from its beginning to its end
    now; ``deleted(offset, key)`` for every tombstone (a key with no value) when given."""
    consumer = AIOKafkaConsumer(**consumer_options(settings.kafka, STATE_READER), enable_auto_commit=False,
                                auto_offset_reset="earliest", request_timeout_ms=int(timeout * 1000))
    await consumer.start()
    try:
        consumer.assign([tp])
        begin = (await consumer.beginning_offsets([tp]))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
        if end <= begin:
            return
        # an explicit offset: seek_to_beginning() is lazy and can lose a race with the initial reset
        consumer.seek(tp, begin)
        position = begin
        while position < end:
            batch = await consumer.getmany(tp, timeout_ms=int(timeout * 1000))
            if not batch:
                raise TimeoutError(f"{tp.topic}[{tp.partition}]: no records within {timeout}s "
                                   f"(offset {position} of {end})")
            for rec in batch.get(tp, []):
                if rec.key is not None and rec.value is not None:
                    take(rec.offset, rec.key, rec.value)
                elif rec.key is not None and deleted is not None:
                    deleted(rec.offset, rec.key)
            position = await consumer.position(tp)
    finally:
        await consumer.stop()


async def load_snapshots(settings: Settings, timeout: float = 30.0, keep: int = SNAPSHOTS_KEPT
                         ) -> list[tuple[int, bytes | SnapshotUnreadable]]:
    """The latest ``keep`` decision-stage snapshots still on the state topic (compaction leaves the
    older ones until it cleans their segment), as ``(offset, raw bytes)``, newest first; a snapshot
    written in parts is put together (:mod:`~fleetmedic.streams.snapshot_parts`), and one whose
    parts are missing or damaged is a :class:`SnapshotUnreadable` in its place."""
    return (await scan_snapshots(settings, timeout, keep)).newest_first()


async def scan_snapshots(settings: Settings, timeout: float = 30.0, keep: int = SNAPSHOTS_KEPT) -> SnapshotScan:
    """The state topic read through: its latest snapshots and the part keys in use."""
    scan = SnapshotScan(keep)
    await _read_partition(settings, TopicPartition(state_topic(settings), 0), timeout, scan.take,
                          lambda offset, key: scan.take(offset, key, None))
    return scan


async def load_snapshot(settings: Settings, timeout: float = 30.0) -> bytes | None:
    """The latest decision-stage snapshot (raw :class:`DecideSnapshot` bytes), or None; raises
    :class:`SnapshotUnreadable` if it was written in parts that cannot be put together."""
    latest = await load_snapshots(settings, timeout, keep=1)
    if not latest:
        return None
    raw = latest[0][1]
    if isinstance(raw, SnapshotUnreadable):
        raise raw
    return raw


async def load_node_states(settings: Settings, topic: str, partition: int,
                           timeout: float = 30.0) -> dict[str, NodeStageState]:
    """The latest state of every node in one partition of the stage-1 state topic."""
    return (await load_detect_partition(settings, topic, partition, timeout)).states


@dataclass
class DetectPartition:
    """One partition of the stage-1 state topic, read: the latest state of every node, the latest
    multivariate model part (None if there is none), and the records that could not be read."""

    states: dict[str, NodeStageState] = field(default_factory=dict)
    model: bytes | None = None
    unreadable: dict[str, str] = field(default_factory=dict)  # node (or the key, as text) -> why


def decode_node_state(value: bytes) -> NodeStageState:
    return msgspec.msgpack.decode(value, type=NodeStageState)


async def load_detect_partition(settings: Settings, topic: str, partition: int,
                                timeout: float = 30.0) -> DetectPartition:
    """The latest state of every node in one partition of the stage-1 state topic, and the latest
    multivariate model part. A node whose latest state does not decode is left out of ``states``
    and named in ``unreadable`` (it starts fresh); a later readable one replaces it. A node whose
    latest record is a tombstone (stage 1 evicted it) is left out: it was forgotten."""
    out = DetectPartition()

    def take(offset: int, key: bytes, value: bytes) -> None:
        if key == MODEL_KEY:
            out.model = value
            return
        node = key.decode("utf-8", "replace")
        try:
            out.states[key.decode()] = decode_node_state(value)
            out.unreadable.pop(node, None)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # ValidationError is a DecodeError
            out.states.pop(node, None)
            out.unreadable[node] = f"offset {offset}: {type(exc).__name__}: {exc}"

    def deleted(offset: int, key: bytes) -> None:
        node = key.decode("utf-8", "replace")
        out.states.pop(node, None)
        out.unreadable.pop(node, None)
    await _read_partition(settings, TopicPartition(topic, partition), timeout, take, deleted)
    for node, why in out.unreadable.items():
        log.error("%s[%d]: the state of node %s cannot be read (%s); it starts fresh", topic, partition, node, why)
    return out


async def save_snapshot(settings: Settings, state: bytes) -> None:
    """Write ``state`` to the state topic and wait for the broker's acknowledgement."""
    producer = AIOKafkaProducer(**producer_options(settings.kafka, SNAPSHOTS))
    await producer.start()
    try:
        await producer.send_and_wait(state_topic(settings), key=SNAPSHOT_KEY, value=state)
    finally:
        await producer.stop()


async def end_offsets(settings: Settings, topics: dict[str, int], timeout: float = 30.0) -> dict[TopicPartition, int]:
    """The end offset of every partition of ``topics`` (name -> partition count)."""
    consumer = AIOKafkaConsumer(**client_options(settings.kafka), enable_auto_commit=False,
                                request_timeout_ms=int(timeout * 1000))
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t, n in topics.items() for p in range(n)]
        return {tp: int(o) for tp, o in (await consumer.end_offsets(tps)).items()}
    finally:
        await consumer.stop()


async def command_ids_since(settings: Settings, offset: int, timeout: float = 30.0) -> set[str]:
    """Ids of the commands on ``remediation.commands`` (one partition) from ``offset`` on."""
    return await ids_since(settings, "remediation.commands", r.RemediationCommand, offset, timeout)


async def ids_since(settings: Settings, name: str, record_type: type[r.RemediationCommand] | type[r.AuditRecord],
                    offset: int, timeout: float = 30.0) -> set[str]:
    """Ids of this cluster's records on the one-partition logical topic ``name`` from ``offset`` on
    (another cluster's, on a topic they share, may carry the same ids: they are not ours)."""
    tp = TopicPartition(settings.topics.topic(name), 0)
    consumer = AIOKafkaConsumer(**client_options(settings.kafka), enable_auto_commit=False,
                                auto_offset_reset="earliest", request_timeout_ms=int(timeout * 1000))
    await consumer.start()
    ids: set[str] = set()
    try:
        consumer.assign([tp])
        begin = (await consumer.beginning_offsets([tp]))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
        position = max(offset, begin)
        if position >= end:
            return ids
        consumer.seek(tp, position)
        while position < end:
            batch = await consumer.getmany(tp, timeout_ms=int(timeout * 1000))
            if not batch:
                raise TimeoutError(f"{tp.topic}: no records within {timeout}s (offset {position} of {end})")
            for rec in batch.get(tp, []):
                try:
                    record = r.decode(record_type, rec.value or b"")
                except r.InvalidRecord:
                    continue
                if not r.foreign(record, settings.cluster.name):
                    ids.add(record.id)
            position = await consumer.position(tp)
        return ids
    finally:
        await consumer.stop()


async def reset_group_offsets(settings: Settings, group: str, topics: dict[str, int],
                              offsets: dict[str, dict[int, int]], wait_s: float) -> dict[TopicPartition, int]:
    """Commit, for ``group``, the snapshot's offsets of ``topics`` (name -> partitions; the beginning
    where it has none).

    Kafka takes such a commit only while the group has no live member, so this also makes a
    restarted decision worker wait until its predecessor has left the group (at most one session
    timeout after a crash), and refuses to start next to a running one.
    """
    consumer = AIOKafkaConsumer(**client_options(settings.kafka), group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t, n in topics.items() for p in range(n)]
        begin = await consumer.beginning_offsets(tps)
        target = {tp: max(offsets.get(tp.topic, {}).get(tp.partition, 0), begin[tp]) for tp in tps}
        consumer.assign(tps)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                await consumer.commit(target)
                return target
            except KafkaError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"consumer group {group} still has a live member after {wait_s:.0f}s "
                                       f"(is another decision worker running?): {exc!r}") from exc
                log.info("waiting for the previous member of %s to leave (%s)", group, type(exc).__name__)
                await asyncio.sleep(1.0)
    finally:
        await consumer.stop()
