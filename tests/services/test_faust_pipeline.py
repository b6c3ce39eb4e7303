"""A Faust (faust-streaming) worker runs against the real broker with aiokafka >= 0.13: its agent
consumes a topic and forwards to another with headers intact, it creates its own internal topics
(table changelog, leader assignor), joins a consumer group that commits offsets, and its table
state is written to the changelog.

Quirks of faust-streaming 0.15.3 with aiokafka 0.14 this exercises (see docs/development.md):
the agent's source topic must exist before the worker subscribes (faust creates only internal
topics), and ``faust worker`` needs ``--without-web`` or it serves HTTP on 0.0.0.0:6066.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from fleetmedic.devenv.proc import tail

APP = Path(__file__).with_name("helpers_faust_forwarder.py")
N = 12


async def _create_topics(bootstrap: str, *names: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(n, num_partitions=1, replication_factor=1) for n in names])
    finally:
        await admin.close()


async def _produce(bootstrap: str, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for i in range(N):
            # faust's defaults: keys "raw" (utf-8 text), values "json"
            key, value = f"node-{i % 2}".encode(), json.dumps(f"m{i}").encode()
            await producer.send_and_wait(topic, key=key, value=value, headers=[("trace", f"t{i}".encode())])
    finally:
        await producer.stop()


async def _consume(bootstrap: str, topic: str, n: int, timeout: float, json_keys: bool = False) -> list:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        out = []
        while len(out) < n:
            r = await asyncio.wait_for(consumer.getone(), timeout=timeout)
            key = json.loads(r.key) if json_keys else r.key.decode()
            out.append((key, json.loads(r.value), dict(r.headers)))
        return out
    finally:
        await consumer.stop()


async def _group_state(bootstrap: str, group: str, topic: str) -> tuple[list[str], list[str], int | None]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        topics = await admin.list_topics()
        groups = [g[0] for g in await admin.list_consumer_groups()]
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    meta = offsets.get(TopicPartition(topic, 0))
    return topics, groups, meta.offset if meta else None


def test_faust_agent_forwards_records_and_keeps_table_changelog_on_real_broker(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    app_id = f"fm-smoke-{uuid.uuid4().hex[:6]}"
    src, dst, changelog = f"{app_id}-in", f"{app_id}-out", f"{app_id}-counts-changelog"
    asyncio.run(_create_topics(kafka_bootstrap, src, dst))
    env = {
        **os.environ,
        "FLEETMEDIC_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "FAUST_APP_ID": app_id,
        "FAUST_DATADIR": str(tmp_path / "faust"),
    }
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, str(APP), "worker", "--without-web", "--loglevel", "info"],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        asyncio.run(_produce(kafka_bootstrap, src))
        try:
            forwarded = asyncio.run(_consume(kafka_bootstrap, dst, N, timeout=45))
            # tables serialize keys as json (table_key_serializer), unlike topics
            table = asyncio.run(_consume(kafka_bootstrap, changelog, N, timeout=20, json_keys=True))
        except TimeoutError:
            raise AssertionError(f"worker did not forward in time; worker log:\n{tail(log, 60)}") from None

        assert [v for _, v, _ in forwarded] == [f"m{i}|{i // 2 + 1}" for i in range(N)]
        assert [k for k, _, _ in forwarded] == [f"node-{i % 2}" for i in range(N)]
        assert all(
            h["trace"] == f"t{i}".encode() and h["forwarded-by"] == b"faust" for i, (_, _, h) in enumerate(forwarded)
        )
        last = {k: v for k, v, _ in table}
        assert last == {"node-0": N // 2, "node-1": N // 2}

        topics, groups, committed = asyncio.run(_group_state(kafka_bootstrap, app_id, src))
        assert {changelog, f"{app_id}-__assignor-__leader"} <= set(topics)
        assert app_id in groups
        assert committed is not None and committed > 0
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            rc = worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
            raise AssertionError(f"faust worker ignored SIGTERM; log:\n{tail(log, 60)}") from None
    assert rc == 0, tail(log, 60)
