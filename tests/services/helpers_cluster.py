"""Helpers for the tests on the secure three-broker cluster (``kafka_secure_cluster``): a run's
config from the cluster's client side, a steady telemetry load with XID faults on request, reading
topics and consumer-group lag with the run's own (SASL_SSL) client options.

The worker itself runs as in tests/streams (:mod:`tests.streams.helpers_harness`: a subprocess of
``python -m fleetmedic.cli.main worker``), with the config written here; the jobs and rounds of
telemetry are those of :mod:`tests.streams.helpers_scenario`, as in tests/streams/test_restart.py.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from fleetmedic import records as r
from fleetmedic.bus import client_options
from fleetmedic.config import parse_config
from fleetmedic.devenv.kafka_cluster import KafkaCluster
from tests.streams import helpers_scenario as scenario
from tests.streams.helpers_harness import Run
from tests.streams.helpers_scenario import gpu_round


def secure_run(cluster: KafkaCluster, tmp: Path, extra: dict[str, Any] | None = None, partitions: int = 3,
               **kafka: Any) -> Run:
    """A unique topic prefix and consumer group on ``cluster``, connecting as its client.yaml says
    (``kafka`` overrides that section), replication factor 3 and ``min.insync.replicas`` 2."""
    u = uuid.uuid4().hex[:8]
    doc: dict[str, Any] = {
        "kafka": cluster.kafka_section(consumer_group=f"fm-s{u}", client_id=f"fm-s{u}", **kafka),
        "topics": {"prefix": f"s{u}.", "default_partitions": partitions, "replication_factor": 3,
                   "min_insync_replicas": 2},
        "metrics": {"port": 0},
        **(extra or {}),
    }
    text = yaml.safe_dump(doc, sort_keys=False)
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "fleetmedic.yaml"
    config.write_text(text)
    return Run(parse_config(text, env={}), config, tmp / "worker.log", tmp)


def options(run: Run) -> dict[str, Any]:
    return client_options(run.settings.kafka)


async def produce(run: Run, messages: list[tuple[str, bytes, bytes]]) -> None:
    """``(topic, key, value)``, idempotent with acks=all, all acknowledged on return."""
    producer = AIOKafkaProducer(**options(run), acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for topic, key, value in messages:
            await producer.send_and_wait(topic, key=key, value=value)
    finally:
        await producer.stop()


@dataclass
class Record:
    key: bytes | None
    value: bytes
    partition: int
    offset: int
    timestamp_ms: int


@dataclass
class Read:
    by_topic: dict[str, list[Record]] = field(default_factory=dict)

    def records(self, topic: str) -> list[Record]:
        return self.by_topic.get(topic, [])


async def read(run: Run, topics: list[str], done: Callable[[Read], bool], timeout: float) -> Read:
    """``topics`` from the beginning until ``done(read)`` or ``timeout`` seconds."""
    consumer = AIOKafkaConsumer(*topics, **client_options(run.settings.kafka, metadata_max_age_ms=2000),
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    got = Read()
    deadline = time.monotonic() + timeout
    try:
        while not done(got) and time.monotonic() < deadline:
            for tp, recs in (await consumer.getmany(timeout_ms=500)).items():
                got.by_topic.setdefault(tp.topic, []).extend(
                    Record(x.key, x.value or b"", tp.partition, x.offset, x.timestamp) for x in recs)
        return got
    finally:
        await consumer.stop()


def read_sync(run: Run, topics: list[str], done: Callable[[Read], bool], timeout: float) -> Read:
    return asyncio.run(read(run, topics, done, timeout))


async def lag(run: Run, group: str, topics: list[str]) -> dict[tuple[str, int], int]:
    """Per partition of ``topics``: end offset minus ``group``'s committed offset (no commit: the end)."""
    admin = AIOKafkaAdminClient(**options(run), request_timeout_ms=10_000)
    consumer = AIOKafkaConsumer(**options(run), enable_auto_commit=False)
    await admin.start()
    await consumer.start()
    try:
        parts = [TopicPartition(t["topic"], p["partition"]) for t in await admin.describe_topics(topics)
                 for p in t["partitions"]]
        assert {tp.topic for tp in parts} == set(topics), f"topics without partitions: {topics}"
        ends = await consumer.end_offsets(parts)
        committed = await admin.list_consumer_group_offsets(group, partitions=parts)
        return {(tp.topic, tp.partition): ends[tp] - max(0, committed[tp].offset if tp in committed else 0)
                for tp in parts}
    finally:
        await consumer.stop()
        await admin.close()


# --- a steady load of GPU telemetry, with XID faults on request -----------------------------------

JOBS = {f"team/j{j}": [f"gpu-node-{2 * j}", f"gpu-node-{2 * j + 1}"] for j in range(8)}
NODES = [n for nodes in JOBS.values() for n in nodes]


@dataclass
class Xid:
    node: str
    job: str
    round: int
    acked_at: float = 0.0  # monotonic: the broker acknowledged the sample carrying it


class Load:
    """A thread producing one GPU sample per node per round (10 s of event time apart) at
    ``rate`` messages per second, idempotent with acks=all, until :meth:`stop`. :meth:`xid` asks
    for an XID 79 on a node of the next job not yet hit, in the next round."""

    def __init__(self, run: Run, rate: float = 32.0) -> None:
        self.run = run
        self.rate = rate
        self.rounds = 0
        self.messages = 0
        self.xids: list[Xid] = []
        self.error: BaseException | None = None
        self._asked: collections.deque[Xid] = collections.deque()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._main, name="load", daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def xid(self) -> Xid:
        with self._lock:
            job = list(JOBS)[len(self.xids) + len(self._asked)]
            x = Xid(JOBS[job][0], job, -1)
            self._asked.append(x)
        return x

    def stop(self, timeout: float = 120.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the load producer did not stop"
        if self.error is not None:
            raise AssertionError(f"the load producer failed: {self.error!r}") from self.error

    def _main(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as exc:
            self.error = exc

    async def _produce(self) -> None:
        producer = AIOKafkaProducer(**options(self.run), acks="all", enable_idempotence=True, linger_ms=5)
        await producer.start()
        rng = np.random.default_rng(7)
        started = time.monotonic()
        try:
            while not self._stop.is_set():
                self.rounds += 1
                k = self.rounds
                with self._lock:
                    hits = {x.node: x for x in self._asked}
                    self._asked.clear()
                futures = []
                for n, (topic, key, value) in zip(NODES, gpu_round(self.run, k, NODES, rng, set(hits)), strict=True):
                    futures.append((hits.get(n), await producer.send(topic, key=key, value=value)))
                    self.messages += 1
                for x, fut in futures:
                    await fut
                    if x is not None:
                        x.round, x.acked_at = k, time.monotonic()
                        self.xids.append(x)
                ahead = started + self.messages / self.rate - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)
        finally:
            await producer.stop()


def job_events(run: Run) -> list[tuple[str, bytes, bytes]]:
    return scenario.job_events(run, JOBS)


def commands(run: Run, got: Read) -> list[tuple[r.RemediationCommand, Record]]:
    return [(r.decode(r.RemediationCommand, rec.value), rec) for rec in got.records(run.topic("remediation.commands"))]
