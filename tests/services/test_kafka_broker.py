"""The real Kafka broker works with aiokafka: a topic created through the admin API carries keyed
records with headers from a producer to a consumer group, in order, and the group's committed
offsets are stored by the broker."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic


async def _roundtrip(bootstrap: str, topic: str, group: str, n: int) -> tuple[list, int | None]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(n):
            await producer.send_and_wait(
                topic, key=f"node-{i % 3}".encode(), value=f"sample-{i}".encode(), headers=[("seq", str(i).encode())]
            )
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    got = []
    try:
        while len(got) < n:
            record = await asyncio.wait_for(consumer.getone(), timeout=20)
            got.append((record.key, record.value, dict(record.headers)))
        await consumer.commit()
        committed = await consumer.committed(TopicPartition(topic, 0))
    finally:
        await consumer.stop()
    return got, committed


def test_records_produced_with_aiokafka_are_consumed_in_order_with_keys_and_headers(kafka_bootstrap: str) -> None:
    topic = f"smoke-{uuid.uuid4().hex[:8]}"
    got, committed = asyncio.run(_roundtrip(kafka_bootstrap, topic, f"{topic}-group", n=20))

    assert [v for _, v, _ in got] == [f"sample-{i}".encode() for i in range(20)]
    assert [k for k, _, _ in got] == [f"node-{i % 3}".encode() for i in range(20)]
    assert [h["seq"] for _, _, h in got] == [str(i).encode() for i in range(20)]
    assert committed == 20


def test_cluster_ids_never_look_like_an_option_to_the_storage_tool() -> None:
    # a base64url id starting with "-" made `kafka-storage format -t <id>` fail (1 start in 64)
    from fleetmedic.devenv.kafka import new_cluster_id

    ids = [new_cluster_id() for _ in range(5000)]
    assert not any(i.startswith("-") for i in ids)
    assert all(len(i) == 22 for i in ids) and len(set(ids)) == len(ids)


def test_extra_broker_properties_override_the_defaults_and_add_new_ones(tmp_path: Path) -> None:
    # java.util.Properties keeps the last value of a repeated key: an override is appended
    from fleetmedic.devenv.kafka import server_properties

    text = server_properties(tmp_path, 9092, 9093, (("group.initial.rebalance.delay.ms", "6000"), ("a.b", "c")))
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition("=")
        values[name] = value  # the last one wins, as for Java
    assert values["group.initial.rebalance.delay.ms"] == "6000" and values["a.b"] == "c"
    assert values["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert values["log.dirs"] == str(tmp_path)
