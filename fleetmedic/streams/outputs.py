"""What the agents write, through one idempotent producer (``acks=all``, ``enable_idempotence``).

The agents consume with Faust and produce with this aiokafka producer: Faust 0.15 makes its
producer idempotent only inside transactions, and the decision stage needs a flush it can wait
for before it writes a snapshot (:meth:`Outputs.flush`). Decoding with dead-lettering lives here
too: a message that does not decode goes to ``deadletter`` (key: source topic) with the field path
and reason, the original bytes, partition, offset and key.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.structs import RecordMetadata

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.streams.app import MAX_STATE_BYTES, kafka_client_options
from fleetmedic.streams.metrics import PipelineMetrics

MAX_ERROR = 4096
TOPICS = ("telemetry.gpu", "telemetry.port", "jobs.events", "findings", "incidents", "remediation.commands",
          "remediation.results", "remediation.audit", "deadletter")


def _text(key: bytes | None) -> str | None:
    return key.decode("utf-8", "replace") if key is not None else None


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
                    p = AIOKafkaProducer(**kafka_client_options(self.settings), acks="all", enable_idempotence=True,
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

    async def decode(self, record_type: type[r.R], event: Any, stage: str) -> r.R | None:
        try:
            return r.decode(record_type, event.value)
        except r.InvalidRecord as exc:
            await self.dead_letter(event, stage, f"{exc.path}: {exc.reason}")
            return None

    async def dead_letter(self, event: Any, stage: str, error: str) -> None:
        m = event.message
        value = event.value if isinstance(event.value, bytes) else bytes(event.value or b"")
        dl = r.DeadLetter(ts=time.time(), topic=m.topic, stage=stage, error=error[:MAX_ERROR], original=value,
                          partition=m.partition, offset=m.offset, key=_text(m.key))
        self.metrics.dead_letters.labels(m.topic, stage).inc()
        await self.send_raw(self.names["deadletter"], m.topic.encode(), r.encode(dl))

    async def findings(self, findings: list[r.Finding]) -> None:
        for f in findings:
            self.metrics.findings.labels(f.detector, f.severity).inc()
            await self.send("findings", f.node, f)
