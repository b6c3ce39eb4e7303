"""fleetmedic against a production-shaped Kafka: three brokers, TLS, SASL.

- ``dev up`` writes the client side as a fleetmedic config (client.yaml) that every client of
  fleetmedic connects with: SCRAM-SHA-512 over TLS (and PLAIN over TLS) on the three-broker
  cluster, mutual TLS on an ``--security ssl`` broker started through the ``dev`` command itself.
- Topics are created with replication factor 3 and ``min.insync.replicas`` 2; a replication
  factor the cluster cannot hold is refused with the broker's reason, not ignored.
- A wrong password, an untrusted certificate and a host-name mismatch each end ``fleetmedic ctl
  audit`` and ``fleetmedic worker`` with one clear line and exit status 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import InvalidReplicationFactorError

from fleetmedic.bus import client_options, state_topic
from fleetmedic.cli.common import kafka_check
from fleetmedic.config import ConfigError, KafkaSettings, TopicSettings, parse_config
from fleetmedic.devenv import proc, tls
from fleetmedic.devenv.kafka import quiet_aiokafka
from fleetmedic.devenv.kafka_cluster import KafkaCluster, replication
from fleetmedic.streams.app import ensure_topics
from tests.conftest import unavailable
from tests.services.helpers_cluster import secure_run

KEY = "k" * 40


# --- pure --------------------------------------------------------------------------------------


def test_min_insync_replicas_follows_the_replication_factor_unless_set() -> None:
    assert [TopicSettings(replication_factor=n).min_isr for n in (1, 2, 3, 5)] == [1, 1, 2, 2]
    assert TopicSettings(replication_factor=5, min_insync_replicas=3).min_isr == 3
    assert [replication(n) for n in (1, 2, 3, 5)] == [(1, 1), (2, 1), (3, 2), (3, 2)]
    with pytest.raises(ConfigError, match="min_insync_replicas"):
        parse_config("topics: {replication_factor: 2, min_insync_replicas: 3}\n", env={})


def test_the_dev_cluster_configures_each_node_as_one_quorum_with_tls_and_scram(tmp_path: Path) -> None:
    c = KafkaCluster(tmp_path, (9092, 9094, 9096), (9093, 9095, 9097), "sasl_ssl")
    props = dict(line.split("=", 1) for line in c.server_properties(2).splitlines())
    assert props["node.id"] == "2" and props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093,2@127.0.0.1:9095,3@127.0.0.1:9097"
    assert props["listener.security.protocol.map"] == "CLIENT:SASL_SSL,CONTROLLER:SSL"
    assert props["default.replication.factor"] == "3" and props["min.insync.replicas"] == "2"
    assert props["sasl.mechanism.inter.broker.protocol"] == "SCRAM-SHA-512"
    assert props["ssl.keystore.type"] == "PEM" and props["auto.create.topics.enable"] == "false"
    assert props["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert set(props["super.users"].split(";")) == {"User:admin", "User:fleetmedic", "User:broker-1",
                                                    "User:broker-2", "User:broker-3"}
    users = [a.split(",")[0].split("=")[-1] for a in c._scram_args() if a.startswith("SCRAM")]
    assert users == ["admin", "fleetmedic", "fleetmedic-detect", "fleetmedic-decide", "fleetmedic-executor",
                     "fleetmedic-connector", "fleetmedic-watch-jobs", "fleetmedic-ctl", "fleetmedic-subscriber"]
    assert "authorizer.class.name" not in KafkaCluster(tmp_path / "open", (1,), (2,), "sasl_ssl",
                                                       authorizer=False).server_properties(1)
    password = c.password_file("fleetmedic")
    assert stat.S_IMODE(password.stat().st_mode) == 0o600
    assert f'user_fleetmedic="{password.read_text().strip()}"' in props["listener.name.client.plain.sasl.jaas.config"]
    k = c.kafka_section()
    assert k["bootstrap_servers"] == "127.0.0.1:9092,127.0.0.1:9094,127.0.0.1:9096"
    assert (k["security_protocol"], k["sasl_mechanism"], k["sasl_username"]) == ("SASL_SSL", "SCRAM-SHA-512",
                                                                                 "fleetmedic")


# --- the secure three-broker cluster ---------------------------------------------------------------


def test_client_yaml_is_a_fleetmedic_config_for_the_cluster(kafka_secure_cluster: KafkaCluster) -> None:
    c = kafka_secure_cluster
    settings = parse_config(c.client_yaml.read_text(), env={})
    k = settings.kafka
    assert (k.security_protocol, k.sasl_mechanism, k.sasl_username) == ("SASL_SSL", "SCRAM-SHA-512", "fleetmedic")
    assert k.bootstrap_servers == c.bootstrap and len(k.bootstrap_servers.split(",")) == 3
    assert Path(k.ssl_cafile).is_file() and Path(k.sasl_password_file).is_file() and k.ssl_check_hostname
    assert (settings.topics.replication_factor, settings.topics.min_isr) == (3, 2)
    assert kafka_check(k) is None
    assert kafka_check(KafkaSettings(**c.kafka_section(sasl_mechanism="PLAIN"))) is None  # PLAIN over TLS too


async def _roundtrip(opts: dict[str, Any], topic: str, group: str, n: int) -> tuple[list[bytes], int | None]:
    producer = AIOKafkaProducer(**opts, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for i in range(n):
            await producer.send_and_wait(topic, key=b"fleet", value=f"op-{i}".encode())
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, **opts, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    got: list[bytes] = []
    try:
        while len(got) < n:
            rec = await asyncio.wait_for(consumer.getone(), timeout=30)
            got.append(rec.value or b"")
        await consumer.commit()
        committed = await consumer.committed(TopicPartition(topic, 0))
    finally:
        await consumer.stop()
    return got, committed


async def _min_isr(opts: dict[str, Any], topics: list[str]) -> tuple[dict[str, str], dict[str, int]]:
    """Each topic's ``min.insync.replicas``, and the error code of each topic the broker asked
    could not describe (a broker that has not yet applied the topic's record answers
    UNKNOWN_TOPIC_OR_PARTITION with no entries: CI once met it just after the fault tests)."""
    admin = AIOKafkaAdminClient(**opts)
    await admin.start()
    try:
        found = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t) for t in topics])
    finally:
        await admin.close()
    out: dict[str, str] = {}
    errors: dict[str, int] = {}
    for response in found:
        for error, _, _, name, entries, *_ in response.resources:
            if error:
                errors[name] = error
            out.update((name, value) for key, value, *_ in entries if key == "min.insync.replicas")
    return out, errors


def _settled_min_isr(opts: dict[str, Any], topics: list[str], timeout: float = 60.0) -> dict[str, str]:
    """:func:`_min_isr`, asked again while a broker answers an error for one of ``topics`` or
    leaves one out."""
    deadline = time.monotonic() + timeout
    while True:
        with quiet_aiokafka():
            found, errors = asyncio.run(_min_isr(opts, topics))
        if (not errors and set(found) == set(topics)) or time.monotonic() > deadline:
            assert not errors, f"describing the topics' configs: error codes {errors}"
            return found
        time.sleep(1.0)


def test_topics_are_replicated_three_times_and_every_client_speaks_scram_over_tls(kafka_secure_cluster: KafkaCluster,
                                                                                  tmp_path: Path) -> None:
    c = kafka_secure_cluster
    run = secure_run(c, tmp_path)
    created = asyncio.run(ensure_topics(run.settings))
    some = [run.topic("remediation.commands"), run.topic("telemetry.gpu"), state_topic(run.settings)]
    assert set(some) <= set(created)
    deadline, parts = time.monotonic() + 60, []
    while time.monotonic() < deadline:  # a broker answers from its metadata, which a new topic reaches late
        with quiet_aiokafka():
            parts = asyncio.run(c.partitions(some))
        if len(parts) == 1 + 3 + 1 and all(len(p["isr"]) == 3 for p in parts):
            break
        time.sleep(1.0)
    assert len(parts) == 1 + 3 + 1
    assert all(len(p["replicas"]) == 3 and len(p["isr"]) == 3 for p in parts), parts
    assert _settled_min_isr(client_options(run.settings.kafka), some) == dict.fromkeys(some, "2")
    got, committed = asyncio.run(_roundtrip(client_options(run.settings.kafka), run.topic("remediation.operator"),
                                            f"{run.settings.kafka.consumer_group}-roundtrip", 5))
    assert got == [f"op-{i}".encode() for i in range(5)] and committed == 5


def test_a_replication_factor_the_cluster_cannot_hold_is_refused_with_the_brokers_reason(
        kafka_secure_cluster: KafkaCluster, tmp_path: Path) -> None:
    run = secure_run(kafka_secure_cluster, tmp_path)
    text = run.config.read_text().replace("replication_factor: 3", "replication_factor: 5")
    with pytest.raises(InvalidReplicationFactorError, match=r"creating topic .*3 broker"):
        asyncio.run(ensure_topics(parse_config(text, env={})))


def _cli(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETMEDIC__")}
    env["FLEETMEDIC_SIGNING_KEY"] = KEY
    return subprocess.Popen([sys.executable, "-m", "fleetmedic.cli.main", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


class Relay:
    """Accepts TCP connections on ``127.0.0.2`` (a free port) and relays each to ``target``: the broker
    reached by an address its certificate does not list, with no resolver involved."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(("127.0.0.2", 0))
        self.address: tuple[str, int] = self.server.getsockname()[:2]
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, name="relay", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target, timeout=10)
            upstream.settimeout(None)
            self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.server.close()
        for s in self._open:
            with contextlib.suppress(OSError):
                s.close()


def _bad_config(c: KafkaCluster, tmp: Path, case: str, relay_at: tuple[str, int]) -> Path:
    if case == "wrong password":
        bad = tmp / "wrong.password"
        bad.write_text("not-the-password\n")
        kafka = c.kafka_section(sasl_password_file=str(bad))
    elif case == "untrusted certificate":
        kafka = c.kafka_section(ssl_cafile=str(tls.make_ca(tmp / "other-ca", cn="another CA").cert))
    else:  # through a relay on 127.0.0.2 (loopback too): an address the certificate (localhost, 127.0.0.1) lacks
        kafka = c.kafka_section(bootstrap_servers=f"{relay_at[0]}:{relay_at[1]}")
    path = tmp / "client.yaml"
    path.write_text(yaml.safe_dump({"kafka": kafka}))
    return path


@pytest.mark.parametrize(("case", "says"), [
    ("wrong password", "SASL: the Kafka broker at 127.0.0.1:{port} refused user 'fleetmedic' (SCRAM-SHA-512): "
                       "wrong user name or password"),
    ("untrusted certificate", "TLS: the certificate of the Kafka broker at 127.0.0.1:{port} is not trusted"),
    ("host-name mismatch", "TLS: the certificate of the Kafka broker at 127.0.0.2:{relay} is not valid for the name "
                           "'127.0.0.2' (host-name mismatch"),
])
def test_a_bad_credential_ends_ctl_and_the_worker_with_one_clear_line(kafka_secure_cluster: KafkaCluster,
                                                                      tmp_path: Path, case: str, says: str) -> None:
    relay = Relay(("127.0.0.1", kafka_secure_cluster.ports[0]))
    try:
        config = _bad_config(kafka_secure_cluster, tmp_path, case, relay.address)
        runs = {"ctl audit": _cli(["ctl", "audit", "--config", str(config)], tmp_path),
                "worker": _cli(["worker", "--config", str(config), "--datadir", str(tmp_path / "faust")], tmp_path)}
        expected = says.format(port=kafka_secure_cluster.ports[0], relay=relay.address[1])
        for name, p in runs.items():
            out, err = p.communicate(timeout=180)
            lines = err.strip().splitlines()
            assert p.returncode == 1, f"{name}: exit {p.returncode}\n{out}\n{err}"
            assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], f"{name}:\n{err}"
    finally:
        relay.close()


# --- `fleetmedic dev up --security ssl`: mutual TLS ------------------------------------------------


@pytest.mark.kafka
def test_dev_up_with_ssl_starts_a_mutual_tls_broker_and_writes_its_client_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from fleetmedic.cli.main import main
    from fleetmedic.devenv import settings

    monkeypatch.setenv(settings.ENV_RUN_DIR, str(tmp_path / "run"))
    for _ in range(20):  # two neighbouring free ports: the broker's and its controller's
        port = proc.free_ports(1)[0]
        if port < 65535 and not proc.port_open(port + 1):
            break
    try:
        code = main(["dev", "up", "--only", "kafka", "--brokers", "1", "--security", "ssl", "--kafka-port", str(port),
                     "--timeout", "240"])
        out = capsys.readouterr()
        if code != 0:  # fails under CI=true, with the log tail
            unavailable("an ssl broker (fleetmedic dev up --security ssl)", out.err[-2000:])
        client = tmp_path / "run" / "kafka" / "client.yaml"
        assert f"client config: {client}" in out.out
        k = parse_config(client.read_text(), env={}).kafka
        assert k.security_protocol == "SSL" and k.ssl_certfile and k.ssl_keyfile and k.ssl_cafile
        assert kafka_check(k) is None
        # without a client certificate the broker refuses the handshake
        anonymous = KafkaSettings(bootstrap_servers=k.bootstrap_servers, security_protocol="SSL",
                                  ssl_cafile=k.ssl_cafile)
        assert kafka_check(anonymous) is not None
        topic = f"ssl-{uuid.uuid4().hex[:6]}"
        run = parse_config(client.read_text() + f"topics: {{prefix: {topic}.}}\n", env={})
        assert asyncio.run(ensure_topics(run)), "no topic created over mutual TLS"
    finally:
        main(["dev", "down", "--only", "kafka", "--wipe"])


def test_move_leader_hands_a_partition_to_each_of_its_replicas_in_turn(kafka_secure_cluster: KafkaCluster,
                                                                       tmp_path: Path) -> None:
    """The devenv's leader move (the fault tests stall a broker chosen so) reaches every replica,
    stays put, and refuses a node that holds no replica, with the broker's reason."""
    c = kafka_secure_cluster
    run = secure_run(c, tmp_path)
    asyncio.run(ensure_topics(run.settings))
    topic = run.topic("remediation.commands")
    c.wait_in_sync(timeout=120)
    deadline = time.monotonic() + 60
    while -1 in (seen := c.leaders_seen(topic)).values() and time.monotonic() < deadline:  # a new topic: late
        time.sleep(0.5)
    assert set(seen) == set(c.ids) and len(set(seen.values())) == 1, seen
    first = seen[1]
    for node in [n for n in c.ids if n != first] + [first]:
        c.move_leader(topic, 0, node)  # returns once every broker's metadata says so
        assert c.leaders_seen(topic) == dict.fromkeys(c.ids, node)
        parts = asyncio.run(c.partitions([topic]))
        assert [(p["leader"], p["replicas"][0]) for p in parts] == [(node, node)], parts
    with pytest.raises(proc.ServiceError, match="is not among its replicas"):
        c.move_leader(topic, 0, 99)
