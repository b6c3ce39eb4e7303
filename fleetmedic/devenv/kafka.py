"""A single-node Apache Kafka broker (KRaft, broker+controller in one JVM) on loopback.

Runs the jars ``fleetmedic dev build`` fetched from Maven Central: formats the storage directory,
then starts ``kafka.Kafka`` with a generated ``server.properties``. Ready means an aiokafka admin
client can list topics (an open port is not enough: the broker answers before it has joined its
own KRaft quorum).

:func:`produce` publishes messages in order, each acknowledged, for tests and benches.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fleetmedic.devenv import proc, settings

DEFAULT_PORT = 19092
DEFAULT_CONTROLLER_PORT = 19093

LOG4J = """\
log4j.rootLogger=WARN, out
log4j.logger.kafka.server.KafkaServer=INFO
log4j.logger.kafka.server.BrokerServer=INFO
log4j.appender.out=org.apache.log4j.ConsoleAppender
log4j.appender.out.layout=org.apache.log4j.PatternLayout
log4j.appender.out.layout.ConversionPattern=[%d] %p %m (%c)%n
"""


def server_properties(data_dir: Path, port: int, controller_port: int, extra: tuple[tuple[str, str], ...] = ()) -> str:
    """A KRaft single-node config with static voters: formats without --standalone on 3.9 and 4.x;
    ``extra`` (name, value) pairs override or add to it."""
    return _DEFAULTS.format(data_dir=data_dir, port=port, controller_port=controller_port) + "".join(
        f"{name}={value}\n" for name, value in extra)


_DEFAULTS = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={data_dir}
num.partitions=1
default.replication.factor=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
log.flush.interval.messages=9223372036854775807
"""


@dataclass(frozen=True)
class Kafka:
    """A broker instance rooted at ``dir`` (config, data, log and pidfile live there)."""

    dir: Path
    port: int = DEFAULT_PORT
    controller_port: int = DEFAULT_CONTROLLER_PORT
    heap: str = "512m"
    #: (name, value) pairs added to server.properties (a later one wins), e.g. a bench's group settings
    extra: tuple[tuple[str, str], ...] = ()

    @classmethod
    def load(cls, dir: Path) -> Kafka:
        """The instance in ``dir`` with the ports it was started with (defaults if none)."""
        try:
            ports = json.loads((dir / "instance.json").read_text())["ports"]
        except (OSError, ValueError, KeyError):
            return cls(dir)
        return cls(dir, port=ports["port"], controller_port=ports["controller_port"])

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.dir / "kafka.log"

    def _proc(self, argv: list[str]) -> proc.Proc:
        return proc.Proc("kafka", argv, self.log, self.dir / "kafka.pid")

    def _java(self) -> list[str]:
        return java_argv(self.heap, self.dir / "log4j.properties")

    def running(self) -> bool:
        return self._proc(["java"]).pid() is not None

    def start(self, timeout: float = 90.0) -> float:
        """Format (first time) and start the broker; return seconds until ready."""
        self.dir.mkdir(parents=True, exist_ok=True)
        java = self._java()
        config = self.dir / "server.properties"
        config.write_text(server_properties(self.dir / "data", self.port, self.controller_port, self.extra))
        (self.dir / "log4j.properties").write_text(LOG4J)
        for port in (self.port, self.controller_port):
            if proc.port_open(port):
                raise proc.ServiceError(f"port 127.0.0.1:{port} is taken; is another broker running?")
        if not (self.dir / "data" / "meta.properties").exists():
            cluster_id = new_cluster_id()
            fmt = [*java, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config)]
            with self.log.open("ab") as out:
                done = subprocess.run(fmt, stdout=out, stderr=subprocess.STDOUT, timeout=60, check=False)
            if done.returncode != 0:
                raise proc.failure("formatting Kafka storage failed", self.log)
        p = self._proc([*java, "kafka.Kafka", str(config)])
        p.start()
        (self.dir / "instance.json").write_text(
            json.dumps(
                {"bootstrap": self.bootstrap, "ports": {"port": self.port, "controller_port": self.controller_port}}
            )
        )
        try:
            with quiet_aiokafka():
                return proc.wait_until(
                    lambda: asyncio.run(_list_topics(self.bootstrap)) is not None,
                    timeout=timeout,
                    what=f"Kafka at {self.bootstrap} to list topics",
                    log=self.log,
                    procs=[p],
                    interval=0.5,
                )
        except proc.ServiceError:
            p.stop()
            raise

    def stop(self) -> bool:
        return self._proc(["java"]).stop(timeout=20)

    def wipe(self) -> None:
        """Remove data and logs (only when stopped)."""
        if not self.running():
            shutil.rmtree(self.dir, ignore_errors=True)


def java_argv(heap: str, log4j: Path) -> list[str]:
    """``java`` with the flags every broker of ours runs with and the cached jars on the class path."""
    java = shutil.which("java")
    if java is None:
        raise proc.ServiceError("java not found on PATH (Kafka needs a JDK 17+)")
    libs = settings.layout().kafka_libs
    if not (libs / ".complete").exists():
        raise proc.ServiceError(f"Kafka jars missing in {libs}: run `fleetmedic dev build` first")
    return [
        java,
        "-Xms128m",
        f"-Xmx{heap}",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-Djava.awt.headless=true",
        f"-Dlog4j.configuration=file:{log4j}",
        "-cp",
        f"{libs}/*",
    ]


@contextlib.contextmanager
def quiet_aiokafka() -> Iterator[None]:
    """aiokafka logs every refused connection at ERROR; not news while a broker starts."""
    logger = logging.getLogger("aiokafka")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


async def _list_topics(bootstrap: str) -> list[str]:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
    try:
        await admin.start()
        return list(await admin.list_topics())
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


async def produce(bootstrap: str, messages: list[tuple[str, bytes, bytes]]) -> None:
    """``(topic, key, value)`` in order, each acknowledged before the next."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for topic, key, value in messages:
            await producer.send_and_wait(topic, key=key, value=value)
    finally:
        await producer.stop()


def reachable(bootstrap: str, timeout: float = 10.0) -> bool:
    """True if a broker at ``bootstrap`` answers an admin list_topics within ``timeout``."""
    try:
        with quiet_aiokafka():
            asyncio.run(asyncio.wait_for(_list_topics(bootstrap), timeout))
    except Exception:
        return False
    return True


def new_cluster_id() -> str:
    """A random KRaft cluster id (base64url of a UUID), as ``kafka-storage random-uuid`` makes it: never
    starting with ``-``, which the storage tool's argument parser would take for an option (1 in 64
    ids; the broker then never starts)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id
