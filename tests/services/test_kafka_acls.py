"""The ACLs each component needs (fleetmedic.acls), as the documented ``kafka-acls`` commands, against
the secure three-broker cluster with its authorizer on.

- pure: the commands for the default config are the ones docs/operations.md lists; every topic of
  the contract is written by some component and read by some component; principals are checked.
- the cluster: the commands of the connector, executor, ctl and subscriber principals are run with
  Kafka's own ``kafka-acls`` code (``kafka.admin.AclCommand``), then each principal, connected with
  its own SCRAM user through fleetmedic's clients, does its job and is refused the rest.

The workers' grants (``detect``, ``decide``) are not run here: a worker start costs about a minute
on two cores. They were checked by running ``--role detect`` and ``--role decide`` as their own
principals until a command came out (docs/operations.md, section 8).
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
)

from fleetmedic import acls
from fleetmedic import records as r
from fleetmedic.bus import DECISIONS, TOPICS, client_options, producer_options
from fleetmedic.cli import ctl
from fleetmedic.config import Settings, parse_config
from fleetmedic.connectors.runtime import KafkaSink, Outgoing
from fleetmedic.devenv.kafka_cluster import KafkaCluster
from fleetmedic.devenv.synth import gpu_message
from fleetmedic.executor.service import consumer_group as executor_group
from fleetmedic.streams.app import ensure_topics
from tests.services.helpers_cluster import secure_run

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
OPERATOR_KEY = b"o" * 40

# --- pure --------------------------------------------------------------------------------------


def test_the_documented_acls_are_the_generated_ones() -> None:
    text = acls.script(Settings(), acls.principals())
    assert text in DOCS.read_text(), ("docs/operations.md's ACL commands are stale: paste the output of "
                                      "`fleetmedic kafka acls`")


def test_every_topic_of_the_contract_is_written_and_read_by_some_component() -> None:
    s = Settings()
    written = {t for c in acls.components(s) for g in c.grants if "Write" in g.operations for t in g.topics}
    read = {t for c in acls.components(s) for g in c.grants if "Read" in g.operations for t in g.topics}
    created = {t for c in acls.components(s) for g in c.grants if "Create" in g.operations for t in g.topics}
    contract = {s.topics.topic(t.name) for t in TOPICS}
    assert not contract - written, f"no component may write {sorted(contract - written)}"
    assert not contract - read, f"no component may read {sorted(contract - read)}"
    assert set(acls.pipeline_topics(s)) <= written & read & created
    groups = {c.name: {g for grant in c.grants for g in grant.groups} for c in acls.components(s)}
    assert groups["executor"] == {executor_group(s)} and groups["decide"] == {s.kafka.consumer_group}


def test_principals_and_the_command_line() -> None:
    p = acls.principals("User:CN=", {"ctl": "User:alice"})
    assert p["executor"] == "User:CN=executor" and p["ctl"] == "User:alice"
    with pytest.raises(ValueError, match="unknown component"):
        acls.principals(overrides={"scheduler": "User:x"})
    with pytest.raises(ValueError, match="TYPE:NAME"):
        acls.principals("fleetmedic-")
    (_, lines), = acls.commands(Settings(), p, bootstrap="k:9093", command_config="", only=("executor",))
    assert lines[0] == ["kafka-acls.sh", "--bootstrap-server", "k:9093", "--add", "--allow-principal",
                        "User:CN=executor", "--operation", "Read", "--operation", "Describe",
                        "--topic", "fleetmedic.remediation.commands", "--group", "fleetmedic-executor"]


def test_fleetmedic_kafka_acls_prints_the_commands_for_a_config(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from fleetmedic.cli.main import main

    config = tmp_path / "c.yaml"
    config.write_text("kafka: {consumer_group: prod}\ntopics: {prefix: p.}\n"
                      "exporters: {kafka: {topics: [telegraf], group_id: imp}}\n")
    assert main(["kafka", "acls", "--config", str(config), "--principal-prefix", "User:",
                 "--principal", "subscriber=User:ticketing", "--subscriber-group", "tickets",
                 "--bootstrap-server", "b:9093"]) == 0
    out = capsys.readouterr().out
    assert "--allow-principal User:executor" in out and "--group prod-executor" in out
    assert "--allow-principal User:ticketing" in out and "--group tickets" in out
    assert "--topic telegraf --group imp" in out and "--topic p.remediation.commands" in out
    assert main(["kafka", "acls", "--principal", "nope=User:x"]) == 2
    assert "unknown component" in capsys.readouterr().err


# --- against the secure cluster with the authorizer on --------------------------------------------


def _as(cluster: KafkaCluster, base: Settings, component: str) -> Settings:
    """``base`` (topic names, groups) connecting as ``component``'s own SCRAM user."""
    doc = {"kafka": cluster.component_section(component, consumer_group=base.kafka.consumer_group,
                                              client_id=f"{base.kafka.client_id}-{component}"),
           "topics": {"prefix": base.topics.prefix, "replication_factor": base.topics.replication_factor}}
    return parse_config(yaml.safe_dump(doc), env={})


async def _produce(settings: Settings, topic: str, value: bytes, **kw: Any) -> None:
    producer = AIOKafkaProducer(**producer_options(settings.kafka, DECISIONS) | kw)
    await producer.start()
    try:
        await producer.send_and_wait(topic, key=b"k", value=value)
    finally:
        await producer.stop()


async def _consume_one(settings: Settings, topic: str, group: str | None) -> bytes:
    consumer = AIOKafkaConsumer(topic, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False,
                                **client_options(settings.kafka, request_timeout_ms=10_000))
    await consumer.start()
    try:
        rec = await asyncio.wait_for(consumer.getone(), timeout=30)
        if group is not None:
            await consumer.commit()
        return rec.value or b""
    finally:
        await consumer.stop()


def _denied(coro: Any, error: type[Exception] | tuple[type[Exception], ...] = TopicAuthorizationFailedError) -> None:
    with pytest.raises(error):
        asyncio.run(asyncio.wait_for(coro, timeout=60))


def test_each_component_principal_does_its_job_and_is_refused_the_rest(kafka_secure_cluster: KafkaCluster,
                                                                       tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    c = kafka_secure_cluster
    admin = secure_run(c, tmp_path)  # the super user: makes the topics and writes what the others read
    s = admin.settings
    t0 = time.monotonic()
    asyncio.run(ensure_topics(s))
    subscribers = f"{s.kafka.consumer_group}-subscriber"
    todo = ("connector", "executor", "ctl", "subscriber")
    applied_s = c.kafka_acls([line for _, lines in acls.commands(s, acls.principals(), subscriber_group=subscribers,
                                                                 only=todo) for line in lines])
    connector, executor, operator, subscriber = (_as(c, s, name) for name in todo)
    command = f"cmd-{uuid.uuid4().hex[:8]}".encode()
    asyncio.run(_produce(s, s.topics.topic("remediation.commands"), command))

    # a connector writes telemetry through its own sink (idempotent, acks=all) and may not command
    async def sink(topic: str) -> None:
        out = KafkaSink(connector)
        try:
            sample = gpu_message("gpu-node-0", 1.7e9, np.random.default_rng(1))
            await out.send_batch([Outgoing(topic, "gpu-node-0", sample)])
        finally:
            await out.stop()

    asyncio.run(sink(s.topics.topic("telemetry.gpu")))
    assert asyncio.run(_consume_one(s, s.topics.topic("telemetry.gpu"), None))
    _denied(sink(s.topics.topic("remediation.commands")))
    _denied(_consume_one(connector, s.topics.topic("remediation.commands"), None))

    # the executor reads commands in its group and writes results, as fleetmedic.executor.service does
    assert asyncio.run(_consume_one(executor, s.topics.topic("remediation.commands"), executor_group(s))) == command
    asyncio.run(_produce(executor, s.topics.topic("remediation.results"), b"result"))
    _denied(_produce(executor, s.topics.topic("remediation.commands"), b"forged"))

    # ctl sends operator commands and reads the audit log; it may not write the audit log
    now = time.time()
    op = r.OperatorCommand(id=f"op-{uuid.uuid4().hex[:8]}", action="resume_breaker", actor="alice", reason="acl test",
                           issued_at=now, expires_at=now + 60)
    asyncio.run(ctl._publish(operator, op, "operator", OPERATOR_KEY))
    sent = asyncio.run(_consume_one(s, s.topics.topic("remediation.operator"), None))
    assert r.decode(r.OperatorCommand, sent).id == op.id
    audit = r.AuditRecord(id=f"a-{uuid.uuid4().hex[:8]}", ts=now, decision="breaker_resumed", actor="alice",
                          explanation="acl test")
    asyncio.run(_produce(s, s.topics.topic("remediation.audit"), r.encode(audit)))
    capsys.readouterr()
    asyncio.run(ctl._audit(operator, argparse.Namespace(since=0, follow=False, node="", json=True)))
    assert "acl test" in capsys.readouterr().out
    _denied(_produce(operator, s.topics.topic("remediation.audit"), b"forged"))

    # a subscriber reads commands in its own group, in no other group, and may not write them
    assert asyncio.run(_consume_one(subscriber, s.topics.topic("remediation.commands"), subscribers)) == command
    _denied(_consume_one(subscriber, s.topics.topic("remediation.commands"), "another-group"),
            GroupAuthorizationFailedError)
    _denied(_produce(subscriber, s.topics.topic("remediation.commands"), b"forged", acks=1, enable_idempotence=False))
    # an idempotent producer needs Write on some topic (or IdempotentWrite) before it may send at all
    _denied(_produce(subscriber, s.topics.topic("remediation.commands"), b"forged"), ClusterAuthorizationFailedError)
    print(f"\nACLs applied in {applied_s:.1f}s; the whole check {time.monotonic() - t0:.1f}s")
