"""Kafka producer mode of the simulator: stream a simulation's records to the telemetry topics at a
target rate, and (optionally) close the loop by applying commands read from the commands topic.

- GPU telemetry -> ``telemetry.gpu`` (key: node), port telemetry -> ``telemetry.port`` (key: device),
  job events -> ``jobs.events`` (key: job), remediation results -> ``remediation.results`` (key:
  command id); topic names from the config (prefix and overrides).
- ``rate`` is messages per second over all topics (a token bucket with a small burst); ``0`` means
  as fast as the broker takes them. Simulated time advances with the records, not the wall clock.
- With ``closed_loop``, a consumer on ``remediation.commands`` submits every command it decodes to
  the simulator, which applies it from the current simulated time on.

The pure simulator knows nothing of Kafka; only this adapter imports aiokafka.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fleetmedic.bus import TELEMETRY, client_options, producer_options
from fleetmedic.config import Settings
from fleetmedic.records import RemediationCommand, decode, encode
from fleetmedic.sim.engine import Simulator


@dataclass
class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up. Pure: the caller passes the clock."""

    rate: float
    burst: float = 0.0
    tokens: float = field(default=0.0, init=False)
    last: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.rate < 0:
            raise ValueError("rate must be >= 0")
        if self.burst <= 0:
            self.burst = max(1.0, self.rate / 10.0)
        self.tokens = self.burst

    def wait_for(self, n: float, now: float) -> float:
        """Seconds to wait before ``n`` more messages may go (0 = now); takes the tokens."""
        if self.rate == 0:
            return 0.0
        if self.last is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        self.tokens -= n
        if self.tokens >= 0:
            return 0.0
        return -self.tokens / self.rate


@dataclass
class ProduceStats:
    messages: int = 0
    bytes: int = 0
    commands: int = 0
    wall_s: float = 0.0


async def produce(sim: Simulator, settings: Settings, rate: float = 0.0, closed_loop: bool = False,
                  clock: Callable[[], float] = time.monotonic) -> ProduceStats:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topics = settings.topics
    t_gpu, t_port = topics.topic("telemetry.gpu"), topics.topic("telemetry.port")
    t_jobs, t_results = topics.topic("jobs.events"), topics.topic("remediation.results")
    kw = client_options(settings.kafka)
    producer = AIOKafkaProducer(**producer_options(settings.kafka, TELEMETRY))
    consumer = None
    if closed_loop:
        consumer = AIOKafkaConsumer(topics.topic("remediation.commands"), group_id=f"{settings.kafka.client_id}-sim",
                                    auto_offset_reset="latest", **kw)
    bucket = TokenBucket(rate)
    stats = ProduceStats()
    t0 = clock()
    await producer.start()
    if consumer is not None:
        await consumer.start()
    try:
        for tick in sim.run():
            batch: list[tuple[str, bytes, bytes]] = []
            if tick.gpu is not None:
                batch += [(t_gpu, r.node.encode(), encode(r)) for r in tick.gpu.to_records()]
            if tick.ports is not None:
                batch += [(t_port, r.device.encode(), encode(r)) for r in tick.ports.to_records()]
            batch += [(t_jobs, e.job.encode(), encode(e)) for e in tick.job_events]
            batch += [(t_results, r.command_id.encode(), encode(r)) for r in tick.results]
            for topic, key, value in batch:
                delay = bucket.wait_for(1, clock())
                if delay > 0:
                    await asyncio.sleep(delay)
                await producer.send(topic, value=value, key=key)
                stats.messages += 1
                stats.bytes += len(value)
            if consumer is not None:
                polled = await consumer.getmany(timeout_ms=0)
                for records in polled.values():
                    for rec in records:
                        if rec.value is None:
                            continue
                        try:
                            sim.submit(decode(RemediationCommand, rec.value))
                            stats.commands += 1
                        except ValueError:
                            continue
        await producer.flush()
    finally:
        await producer.stop()
        if consumer is not None:
            await consumer.stop()
    stats.wall_s = clock() - t0
    return stats
