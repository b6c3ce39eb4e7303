"""In-process stand-ins for the stages' Kafka side: an :class:`~fleetmedic.streams.outputs.Outputs`
that keeps what it would send, and consumer records to feed the stages with."""

from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace
from typing import Any

from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.structs import ConsumerRecord
from prometheus_client import CollectorRegistry

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.streams.metrics import PipelineMetrics
from fleetmedic.streams.outputs import Outputs

BROKER_LIMIT = 1_048_588  # a broker's default message.max.bytes


class FakeOutputs(Outputs):
    """Records every send as ``(topic, key, value)``; a value over ``limits[topic]`` (the broker's
    1 MiB by default) fails as the broker would refuse it."""

    def __init__(self, settings: Settings, metrics: PipelineMetrics | None = None) -> None:
        super().__init__(settings, metrics or PipelineMetrics(CollectorRegistry()))
        self.sent: list[tuple[str, bytes, bytes | None]] = []  # None: a tombstone
        self.limits: dict[str, int] = {}
        self.refuse: set[str] = set()  # topics whose sends fail
        self.headers: list[list[tuple[str, bytes]]] = []  # of every send, in order
        self._offsets = itertools.count()

    async def send_raw(self, topic: str, key: bytes, value: bytes | None, partition: int | None = None,
                       headers: Any = None) -> asyncio.Future[Any]:
        self.headers.append(list(headers or ()))
        if topic in self.refuse:
            raise MessageSizeTooLargeError(f"{topic}: refused (test)")
        if value is not None and len(value) > self.limits.get(topic, BROKER_LIMIT):
            raise MessageSizeTooLargeError(f"{topic}: {len(value)} bytes")
        self.sent.append((topic, key, value))
        self.metrics.messages_out.labels(topic).inc()
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        done.set_result(SimpleNamespace(offset=next(self._offsets)))
        return done

    async def flush(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def values(self, name: str) -> list[bytes]:
        """What was sent to the logical topic ``name`` (or to the topic named so)."""
        topic = self.names.get(name, name)
        return [v for t, _, v in self.sent if t == topic and v is not None]

    def dead_letters(self) -> list[r.DeadLetter]:
        return [r.decode(r.DeadLetter, v) for v in self.values("deadletter")]

    def records(self, name: str, record_type: type[r.R]) -> list[r.R]:
        return [r.decode(record_type, v) for v in self.values(name)]


def consumer_record(topic: str, value: bytes, *, partition: int = 0, offset: int = 0, key: bytes = b"k",
                    timestamp_ms: int = -1) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(topic, partition, offset, timestamp_ms, 0, key, value, None, len(key), len(value), ())


def sample(metrics: PipelineMetrics, name: str, **labels: str) -> float:
    """The value of one metric sample (0.0 if it was never set)."""
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value
