"""The decision stage's replay: its inputs since a snapshot, read back, and the order to handle them in.

The decision stage's time line has two sources: the records (their own ``ts``) and the tick, a
timer that advances event time by the wall time that passed (timeouts, backoffs and settle windows
fire on it). A tick's moment is not in any input, so a replay could fire it elsewhere: a timeout
before or after a result, an attempt number and hence a command id different from the first run.

So every live tick is an input too: before its decisions are sent, the stage writes a
:class:`TickRecord` (the tick's ``now`` and the input offsets it had handled, i.e. which input
records came before it) to the one-partition ``<group>-ticks`` topic and waits for the broker's
acknowledgement. A replay (:func:`replay_order`) handles, for each logged tick in turn, the input
records that tick had seen (merged by record timestamp, per partition in offset order), then the
tick with its logged ``now``; the records after the last tick come last. A tick therefore fires in
a replay at exactly the place and event time it fired in the first run.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord

from fleetmedic.bus import REPLAY_READER, consumer_options
from fleetmedic.config import Settings

Offsets = dict[str, dict[int, int]]  # topic -> partition -> next offset to read


class TickRecord(msgspec.Struct, array_like=True):
    """One tick of the decision stage, as logged before its decisions were sent."""

    now: float  # the event time the tick ran at
    offsets: Offsets  # the input offsets handled before it (next offset to read)


@dataclass(frozen=True)
class Tick:
    """A logged tick to replay: its record and its offset on the ticks topic."""

    record: TickRecord
    offset: int


_decode_tick = msgspec.msgpack.Decoder(TickRecord).decode
encode_tick = msgspec.msgpack.Encoder().encode


def decode_tick(data: bytes) -> TickRecord:
    return _decode_tick(data)


async def read_ranges(settings: Settings, todo: dict[TopicPartition, tuple[int, int]],
                      timeout: float) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
    """The records of each partition from ``start`` (or its beginning, if later) up to ``end``."""
    out: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]] = {tp: [] for tp in todo}
    if not todo:
        return out
    consumer = AIOKafkaConsumer(**consumer_options(settings.kafka, REPLAY_READER), enable_auto_commit=False,
                                request_timeout_ms=int(timeout * 1000))
    await consumer.start()
    try:
        consumer.assign(list(todo))
        begins = await consumer.beginning_offsets(list(todo))
        for tp, (start, _) in todo.items():
            consumer.seek(tp, max(start, begins[tp]))
        remaining = {tp for tp, (start, end) in todo.items() if max(start, begins[tp]) < end}
        while remaining:
            batch = await consumer.getmany(*remaining, timeout_ms=int(timeout * 1000))
            if not batch:
                raise TimeoutError(f"replay: no records within {timeout}s from {sorted(map(str, remaining))}")
            for tp, recs in batch.items():
                out[tp] += [rec for rec in recs if rec.offset < todo[tp][1]]
                if await consumer.position(tp) >= todo[tp][1]:
                    remaining.discard(tp)
        return out
    finally:
        await consumer.stop()


def replay_order(by_partition: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]],
                 ticks: list[Tick]) -> Iterator[ConsumerRecord[bytes, bytes] | Tick]:
    """Records and ticks in the order to handle them: for each tick, the records it had seen (merged
    by record timestamp; a partition's records stay in offset order), then the tick; then the rest.

    ``by_partition`` holds each partition's records in offset order; ``ticks`` are in log order."""
    pending = {tp: list(recs) for tp, recs in by_partition.items() if recs}
    for tick in ticks:
        before: list[list[ConsumerRecord[bytes, bytes]]] = []
        for tp, recs in pending.items():
            bound = tick.record.offsets.get(tp.topic, {}).get(tp.partition)
            if bound is None:
                continue
            n = next((i for i, rec in enumerate(recs) if rec.offset >= bound), len(recs))
            if n:
                before.append(recs[:n])
                pending[tp] = recs[n:]
        yield from heapq.merge(*before, key=lambda rec: rec.timestamp)
        yield tick
    yield from heapq.merge(*pending.values(), key=lambda rec: rec.timestamp)
