"""What the agents write, through one idempotent producer (``acks=all``, ``enable_idempotence``).

Both stages produce with this aiokafka producer: Faust 0.15 makes its producer idempotent only
inside transactions, and both stages need a flush they can wait for before they write a snapshot
(:meth:`Outputs.flush`). Decoding with dead-lettering lives here
too: a message that does not decode goes to ``deadletter`` (key: source topic) with the field path
and reason, the original bytes, partition, offset and key.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord, RecordMetadata

from fleetmedic import records as r
from fleetmedic.bus import MAX_STATE_BYTES, client_options
from fleetmedic.config import Settings
from fleetmedic.streams.metrics import PipelineMetrics

MAX_ERROR = 4096
TOPICS = ("telemetry.gpu", "telemetry.port", "jobs.events", "findings", "incidents", "remediation.commands",
          "remediation.results", "remediation.audit", "deadletter")


def _text(key: bytes | None) -> str | None:
    return key.decode("utf-8", "replace") if key is not None else None


@dataclass(frozen=True)
class Source:
    """Where a consumed message came from (for dead letters)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes

    @classmethod
    def of_event(cls, event: Any) -> Source:
        """From a Faust event."""
        m = event.message
        value = event.value if isinstance(event.value, bytes) else bytes(event.value or b"")
        return cls(m.topic, m.partition, m.offset, m.key, value)

    @classmethod
    def of_record(cls, rec: ConsumerRecord[bytes, bytes]) -> Source:
        """From an aiokafka record."""
        return cls(rec.topic, rec.partition, rec.offset, rec.key, rec.value or b"")


class Outputs:
    def __init__(self, settings: Settings, metrics: PipelineMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.names = {name: settings.topics.topic(name) for name in TOPICS}
        self._producer: AIOKafkaProducer | None = None
        self._starting = asyncio.Lock()

    async def producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            async with self._starting:
                if self._producer is None:
                    p = AIOKafkaProducer(**client_options(self.settings.kafka), acks="all", enable_idempotence=True,
                                         linger_ms=5, max_request_size=MAX_STATE_BYTES,
                                         max_batch_size=1024 * 1024)
                    await p.start()
                    self._producer = p
        return self._producer

    async def send(self, name: str, key: str, record: r.Record) -> asyncio.Future[RecordMetadata]:
        """Queue ``record`` on the logical topic ``name``; returns once it is in the send buffer, with
        the future of its acknowledgement."""
        return await self.send_raw(self.names[name], key.encode(), r.encode(record))

    async def send_raw(self, topic: str, key: bytes, value: bytes,
                       partition: int | None = None) -> asyncio.Future[RecordMetadata]:
        producer = await self.producer()
        future: asyncio.Future[RecordMetadata] = await producer.send(topic, value=value, key=key, partition=partition)
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

    async def dead_letter(self, src: Source, stage: str, error: str) -> None:
        dl = r.DeadLetter(ts=time.time(), topic=src.topic, stage=stage, error=error[:MAX_ERROR], original=src.value,
                          partition=src.partition, offset=src.offset, key=_text(src.key))
        self.metrics.dead_letters.labels(src.topic, stage).inc()
        await self.send_raw(self.names["deadletter"], src.topic.encode(), r.encode(dl))

    async def findings(self, findings: list[r.Finding]) -> None:
        for f in findings:
            self.metrics.findings.labels(f.detector, f.severity).inc()
            await self.send("findings", f.node, f)
