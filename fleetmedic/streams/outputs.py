"""What the agents write, through one idempotent producer (``acks=all``, ``enable_idempotence``).

Both stages produce with this aiokafka producer: Faust 0.15 makes its producer idempotent only
inside transactions, and both stages need a flush they can wait for before they write a snapshot
(:meth:`Outputs.flush`). Dead-lettering lives here too; a message goes to ``deadletter`` (key:
source topic, with the original bytes, at most 64 KiB of them with the whole one's SHA-256 and
length, partition, offset and key) when

- it does not decode: the field path and reason (:meth:`Outputs.decode`);
- it is stamped more than ``streams.max_future_skew_s`` ahead of the clock
  (:meth:`Outputs.ahead_of_clock`, the rule in :mod:`fleetmedic.models.event_time`);
- handling it raised (:meth:`Outputs.record_failed`): the exception's type, message and last
  frame, counted in ``fleetmedic_record_errors_total{stage,exception}``. The stage goes on: replay is
  deterministic, so a record that crashed a stage would crash it again after every restart.

A record labelled with another cluster (``cluster`` other than ``cluster.name``: another
cluster's, on a topic they share) is no error: it is skipped and counted
(``fleetmedic_records_skipped_total{reason="other_cluster"}``, :meth:`Outputs.other_cluster`), never
dead-lettered. What the stages produce is labelled with ``cluster.name`` (:meth:`Outputs.send`).

Sending a dead letter never raises: a refused one is logged with the record's place and hash and
counted (``fleetmedic_dead_letters_failed_total``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord, RecordMetadata

from fleetmedic import records as r
from fleetmedic.bus import STAGE_OUTPUTS, TOPICS, producer_options
from fleetmedic.config import Settings
from fleetmedic.models.event_time import reference_clock, refuse_future
from fleetmedic.signing import Headers, sign_bytes
from fleetmedic.streams.metrics import PipelineMetrics

log = logging.getLogger(__name__)

MAX_ERROR = 4096


def _text(key: bytes | None) -> str | None:
    return key.decode("utf-8", "replace") if key is not None else None


def describe(exc: BaseException) -> tuple[str, str, str]:
    """An exception as a dead letter names it: its type, its message, and its traceback's last frame."""
    return r.DeadLetter.describe(exc)


@dataclass(frozen=True)
class Source:
    """Where a consumed message came from (for dead letters)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int | None = None  # the record's Kafka timestamp
    headers: tuple[tuple[str, bytes], ...] = ()  # the record's Kafka headers (signatures: fleetmedic.signing)

    @classmethod
    def of_event(cls, event: Any) -> Source:
        """From a Faust event."""
        m = event.message
        value = event.value if isinstance(event.value, bytes) else bytes(event.value or b"")
        ts = getattr(m, "timestamp", None)  # Faust: seconds
        return cls(m.topic, m.partition, m.offset, m.key, value,
                   int(ts * 1000) if isinstance(ts, int | float) and ts > 0 else None,
                   _headers(getattr(m, "headers", None)))

    @classmethod
    def of_record(cls, rec: ConsumerRecord[bytes, bytes]) -> Source:
        """From an aiokafka record."""
        ts = rec.timestamp if isinstance(rec.timestamp, int) and rec.timestamp > 0 else None
        return cls(rec.topic, rec.partition, rec.offset, rec.key, rec.value or b"", ts,
                   _headers(getattr(rec, "headers", None)))


def _headers(raw: Any) -> tuple[tuple[str, bytes], ...]:
    """Kafka headers as ``(name, value)`` pairs, from aiokafka's sequence or Faust's (a mapping or pairs)."""
    pairs = raw.items() if isinstance(raw, dict) else (raw or ())
    return tuple((str(k), bytes(v or b"")) for k, v in pairs)


class Outputs:
    def __init__(self, settings: Settings, metrics: PipelineMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.names = {t.name: settings.topics.topic(t.name) for t in TOPICS}
        self.cluster = settings.cluster.name
        self._skip_logged: set[tuple[str, str]] = set()
        self._producer: AIOKafkaProducer | None = None
        self._starting = asyncio.Lock()

    async def producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            async with self._starting:
                if self._producer is None:
                    p = AIOKafkaProducer(**producer_options(self.settings.kafka, STAGE_OUTPUTS))
                    await p.start()
                    self._producer = p
        return self._producer

    async def send(self, name: str, key: str, record: r.Record) -> asyncio.Future[RecordMetadata]:
        """Queue ``record``, labelled with ``cluster.name``, on the logical topic ``name``; returns once
        it is in the send buffer, with the future of its acknowledgement."""
        return await self.send_raw(self.names[name], key.encode(), r.encode(r.labelled(record, self.cluster)))

    async def send_signed(self, name: str, key: str, record: r.Record, key_id: str,
                          signing_key: bytes) -> asyncio.Future[RecordMetadata]:
        """As :meth:`send`, with the signature headers over the value bytes exactly as produced
        (:func:`~fleetmedic.signing.sign_bytes`). The record goes out as signed: its issuer labelled
        it, inside its in-body signature (relabelled, it would no longer verify)."""
        if record.cluster != self.cluster:
            raise ValueError(f"a signed record for cluster {record.cluster!r} in a stage of cluster {self.cluster!r}")
        value = r.encode(record)
        headers = sign_bytes(value, key_id, signing_key)
        return await self.send_raw(self.names[name], key.encode(), value, headers=headers)

    async def send_raw(self, topic: str, key: bytes, value: bytes | None, partition: int | None = None,
                       headers: Headers | None = None) -> asyncio.Future[RecordMetadata]:
        producer = await self.producer()
        future: asyncio.Future[RecordMetadata] = await producer.send(topic, value=value, key=key, partition=partition,
                                                                     headers=headers)
        self.metrics.messages_out.labels(topic).inc()
        return future

    async def flush(self) -> None:
        """Wait until everything queued so far is acknowledged by the broker."""
        if self._producer is not None:
            await self._producer.flush()

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def decode(self, record_type: type[r.R], src: Source, stage: str) -> r.R | None:
        try:
            return r.decode(record_type, src.value)
        except r.InvalidRecord as exc:
            await self.dead_letter(src, stage, f"{exc.path}: {exc.reason}")
            return None

    async def dead_letter(self, src: Source, stage: str, error: str, exception: str = "", frame: str = "") -> None:
        """Send ``src`` to ``deadletter`` with the reason; never raises (a dead letter the producer
        refuses is logged, with the record's place and hash, and counted)."""
        dl = r.DeadLetter(ts=time.time(), topic=src.topic, stage=stage, error=error[:MAX_ERROR], original=src.value,
                          partition=src.partition, offset=src.offset, key=_text(src.key), exception=exception,
                          frame=frame, cluster=self.cluster)
        self.metrics.dead_letters.labels(src.topic, stage).inc()
        try:
            await self.send_raw(self.names["deadletter"], src.topic.encode(), r.encode(dl))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the stage goes on: the record stays on its topic, its place logged
            self.metrics.dead_letters_failed.labels(src.topic, stage).inc()
            log.error("%s: dead letter for %s[%d]@%d (%d bytes, sha256 %s) not sent: %r; its error: %s", stage,
                      src.topic, src.partition, src.offset, dl.original_length, dl.original_sha256, exc, error)

    async def record_failed(self, src: Source, stage: str, exc: Exception) -> None:
        """Handling ``src`` raised ``exc``: log, count, dead-letter it with the exception."""
        kind, message, frame = describe(exc)
        self.metrics.record_errors.labels(stage, kind).inc()
        log.error("%s: %s[%d]@%d raised %s: %s (at %s); dead-lettered, going on", stage, src.topic, src.partition,
                  src.offset, kind, message, frame, exc_info=exc)
        await self.dead_letter(src, stage, f"{kind}: {message}", exception=kind, frame=frame)

    def other_cluster(self, record: r.Record, src: Source, stage: str) -> bool:
        """True (and counted) if ``record`` names a cluster other than ``cluster.name``: the stage
        skips it. A record that names no cluster is every cluster's (:func:`~fleetmedic.records.foreign`)."""
        if not r.foreign(record, self.cluster):
            return False
        self.skipped(src.topic, stage, "other_cluster")
        return True

    def skipped(self, topic: str, stage: str, reason: str, n: int = 1) -> None:
        """Count ``n`` records of ``topic`` the stage left alone on purpose, with the reason (logged
        once per topic and reason)."""
        self.metrics.skipped.labels(topic, stage, reason).inc(n)
        if (topic, reason) not in self._skip_logged:
            self._skip_logged.add((topic, reason))
            log.info("%s: skipping records of %s: %s (counted in fleetmedic_records_skipped_total; logged once)",
                     stage, topic, reason)

    async def ahead_of_clock(self, record: object, src: Source, stage: str) -> bool:
        """True (and ``src`` dead-lettered, counted) if ``record`` is stamped more than
        ``streams.max_future_skew_s`` ahead of the clock: the wall clock, or the record's broker
        timestamp when earlier (:func:`~fleetmedic.models.event_time.reference_clock`)."""
        why = refuse_future(record, reference_clock(time.time(), src.timestamp_ms),
                            self.settings.streams.max_future_skew_s)
        if why is None:
            return False
        self.metrics.ahead_of_clock.labels(src.topic, stage).inc()
        log.warning("%s: %s[%d]@%d refused: %s", stage, src.topic, src.partition, src.offset, why)
        await self.dead_letter(src, stage, why)
        return True

    async def findings(self, findings: list[r.Finding]) -> None:
        for f in findings:
            self.metrics.findings.labels(f.detector, f.severity).inc()
            await self.send("findings", f.node, f)
