"""The Kafka producer mode's rate limiter (a token bucket on an injected clock) lets through the
target rate with a bounded burst; the Kafka round trip runs against a broker that is already up
(``FLEETMEDIC_KAFKA_BOOTSTRAP``), and is skipped otherwise."""

from __future__ import annotations

import asyncio

import pytest

from fleetmedic.sim.kafka_producer import TokenBucket


def test_bucket_holds_the_target_rate_over_time() -> None:
    b = TokenBucket(rate=1000.0, burst=10.0)
    now, sent = 0.0, 0
    while now < 5.0:
        wait = b.wait_for(1, now)
        now += wait
        sent += 1
    assert sent == pytest.approx(5000 + 10, rel=0.01)


def test_bucket_allows_a_burst_then_asks_to_wait() -> None:
    b = TokenBucket(rate=100.0, burst=5.0)
    assert [b.wait_for(1, 0.0) for _ in range(5)] == [0.0] * 5
    assert b.wait_for(1, 0.0) == pytest.approx(0.01)
    assert b.wait_for(1, 10.0) == 0.0  # refilled, capped at the burst


def test_zero_rate_is_unlimited_and_negative_is_refused() -> None:
    assert TokenBucket(rate=0.0).wait_for(1_000_000, 0.0) == 0.0
    with pytest.raises(ValueError):
        TokenBucket(rate=-1.0)


def test_produce_streams_records_to_kafka(kafka_bootstrap: str) -> None:
    from aiokafka import AIOKafkaConsumer

    from fleetmedic.config import KafkaSettings, Settings, TopicSettings
    from fleetmedic.records import GpuTelemetry, decode
    from fleetmedic.sim.engine import SimConfig, Simulator
    from fleetmedic.sim.fleet import FleetSpec
    from fleetmedic.sim.kafka_producer import produce

    settings = Settings(kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap),
                        topics=TopicSettings(prefix="simtest."))
    sim = Simulator(SimConfig(fleet=FleetSpec(nodes=2), duration_s=60, seed=1, faults="none"))

    async def go() -> list[GpuTelemetry]:
        stats = await produce(sim, settings, rate=0)
        assert stats.messages > 12
        consumer = AIOKafkaConsumer("simtest.telemetry.gpu", bootstrap_servers=kafka_bootstrap,
                                    auto_offset_reset="earliest", group_id="simtest")
        await consumer.start()
        try:
            got = []
            while len(got) < 12:
                rec = await asyncio.wait_for(consumer.getone(), timeout=30)
                got.append(decode(GpuTelemetry, rec.value))
            return got
        finally:
            await consumer.stop()

    got = asyncio.run(go())
    assert {g.node for g in got} == {"gpu-node-0000", "gpu-node-0001"}


class _FakeProducer:
    sent: list[tuple[str, bytes, bytes]] = []

    def __init__(self, **kw: object) -> None:
        self.kw = kw

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def flush(self) -> None: ...

    async def send(self, topic: str, value: bytes, key: bytes) -> None:
        _FakeProducer.sent.append((topic, key, value))


def test_produce_sends_every_record_to_its_topic_keyed_by_its_entity(monkeypatch: pytest.MonkeyPatch) -> None:
    import aiokafka

    from fleetmedic.config import Settings
    from fleetmedic.records import GpuTelemetry, JobEvent, PortTelemetry, decode
    from fleetmedic.sim.engine import SimConfig, Simulator
    from fleetmedic.sim.fleet import FleetSpec
    from fleetmedic.sim.kafka_producer import produce

    monkeypatch.setattr(aiokafka, "AIOKafkaProducer", _FakeProducer)
    _FakeProducer.sent = []
    sim = Simulator(SimConfig(fleet=FleetSpec(nodes=2), duration_s=120, seed=1, faults="none"))
    now = [0.0]

    async def fake_sleep(s: float) -> None:
        now[0] += s

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    stats = asyncio.run(produce(sim, Settings(), rate=100.0, clock=lambda: now[0]))
    topics = {t for t, _, _ in _FakeProducer.sent}
    assert topics == {"fleetmedic.telemetry.gpu", "fleetmedic.telemetry.port", "fleetmedic.jobs.events"}
    for topic, key, value in _FakeProducer.sent:
        if topic.endswith("gpu"):
            assert decode(GpuTelemetry, value).node == key.decode()
        elif topic.endswith("port"):
            assert decode(PortTelemetry, value).device == key.decode()
        else:
            assert decode(JobEvent, value).job == key.decode()
    assert stats.messages == len(_FakeProducer.sent)
    assert now[0] == pytest.approx((stats.messages - 10) / 100.0, rel=0.02)  # 100 msg/s after a 10-message burst
