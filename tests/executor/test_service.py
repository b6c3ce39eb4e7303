"""Two executor replicas on the real broker and API server: one leads (Lease), acts on each command
exactly once and publishes one result per command; an invalid message is dead-lettered; when the
leader stops, the standby takes the Lease over and goes on from the committed offsets; the metrics
count commands by action and outcome and show the leader; from a commands topic that several
clusters share, an executor acts only on its own cluster's commands."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

import msgspec
from kubernetes import client

from fleetmedic import records as r
from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.kafka import produce
from fleetmedic.devenv.waiting import wait
from fleetmedic.executor.node import plan as p
from fleetmedic.streams.app import ensure_topics
from tests.executor.helpers_executor import Replica, command, settings
from tests.streams.helpers_harness import collect_sync


def test_two_replicas_apply_each_command_exactly_once_and_the_standby_takes_over(
    kube_api: client.ApiClient, kafka_bootstrap: str, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    core = client.CoreV1Api(kube_api)
    nodes = make_fleet(4).nodes
    s = settings(namespace, bootstrap=kafka_bootstrap)
    asyncio.run(ensure_topics(s))
    commands_topic, results_topic = s.topics.topic("remediation.commands"), s.topics.topic("remediation.results")
    a, b = Replica(kube_api, s, "replica-a"), Replica(kube_api, s, "replica-b")
    replicas = {"replica-a": a, "replica-b": b}
    try:
        leader = wait("a leader", lambda: next((x for x in (a, b) if x.leading()), None), timeout=30)
        standby = b if leader is a else a
        assert not standby.leading()
        first = [command(action, n) for n in nodes[:2] for action in ("cordon", "taint")]
        forged = msgspec.structs.replace(command("cordon", nodes[3]), reason="edited in transit")
        batch = [(commands_topic, c.node.encode(), r.encode(c)) for c in [*first, first[0], forged]]
        batch.append((commands_topic, b"junk", b'{"type": "remediation_command", "id": 7}'))
        asyncio.run(produce(kafka_bootstrap, batch))
        wait("the first batch's results", lambda: leader.service.results_published >= 6, timeout=60)

        leader.close()  # graceful: the Lease is handed back, offsets committed
        wait("the standby to lead", standby.leading, timeout=30)
        second = [command(action, n) for n in nodes[2:] for action in ("cordon", "taint")]
        asyncio.run(produce(kafka_bootstrap, [(commands_topic, c.node.encode(), r.encode(c))
                                              for c in [*second, first[1]]]))
        wait("the second batch's results", lambda: standby.service.results_published >= 5, timeout=60)
        time.sleep(1.0)
    finally:
        for x in replicas.values():
            if x.thread.is_alive():
                x.close()

    got = collect_sync(kafka_bootstrap, [results_topic], lambda c: False, timeout=5)
    results = [r.decode(r.RemediationResult, v) for v in got.values(results_topic)]
    applied = Counter(x.command_id for x in results if x.outcome == "applied")
    assert applied == Counter({c.id: 1 for c in first + second})  # each applied exactly once
    skipped = [x for x in results if x.outcome == "skipped"]
    assert sorted(x.reason.split(":")[0] for x in skipped) == [
        "duplicate command id (already applied)", "duplicate command id (already applied)", "signature rejected"]
    by = {x.command_id: x.executor for x in results if x.outcome == "applied"}
    assert {by[c.id] for c in first} == {leader.service.identity}
    assert {by[c.id] for c in second} == {standby.service.identity}
    assert leader.count("cordon", "applied") == 2 and standby.count("taint", "applied") == 2
    assert leader.count("cordon", "skipped") == 2  # the repeat and the forgery
    reg = leader.registry
    assert reg.get_sample_value("fleetmedic_executor_rejected_total", {"reason": "signature"}) == 1
    assert reg.get_sample_value("fleetmedic_executor_rejected_total", {"reason": "invalid"}) == 1
    assert reg.get_sample_value("fleetmedic_executor_action_seconds_count", {"action": "cordon"}) == 4
    assert reg.get_sample_value("fleetmedic_executor_drains_in_progress") == 0
    assert not leader.leading() and not standby.leading()  # both stopped
    for n in nodes[:3]:
        node = core.read_node(n)
        assert node.spec.unschedulable and len(p.applied_ids(node.metadata.annotations)) == 2
    dead = collect_sync(kafka_bootstrap, [s.topics.topic("deadletter")], lambda c: bool(c.by_topic), timeout=10)
    letters = [r.decode(r.DeadLetter, v) for v in dead.values(s.topics.topic("deadletter"))]
    assert len(letters) == 1 and letters[0].stage == "executor" and "$.id" in letters[0].error
    lease = client.CoordinationV1Api(kube_api).read_namespaced_lease(s.executor.lease_name, namespace)
    assert lease.spec.lease_transitions >= 1


def test_an_executor_acts_only_on_its_own_clusters_commands_from_a_shared_topic(
    kube_api: client.ApiClient, kafka_bootstrap: str, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    """One commands topic carries two clusters' commands (and one from an unnamed decision stage):
    the executor of gpu-east-1 cordons only its own node, refuses the others before touching the
    cluster (dead-lettered with the reason, counted, no result), and labels what it publishes."""
    core = client.CoreV1Api(kube_api)
    nodes = make_fleet(3).nodes
    s = settings(namespace, extra="cluster: {name: gpu-east-1}\n", bootstrap=kafka_bootstrap)
    asyncio.run(ensure_topics(s))
    commands_topic, results_topic = s.topics.topic("remediation.commands"), s.topics.topic("remediation.results")
    ours = command("cordon", nodes[0], cluster="gpu-east-1")
    west = command("cordon", nodes[1], cluster="gpu-west-2")  # genuinely signed, for another cluster
    unlabeled = command("cordon", nodes[2])
    asyncio.run(produce(kafka_bootstrap, [(commands_topic, c.node.encode(), r.encode(c))
                                          for c in (west, ours, unlabeled)]))
    replica = Replica(kube_api, s, "east-executor")
    try:
        wait("the leader", replica.leading, timeout=30)
        wait("our command's result", lambda: replica.service.results_published >= 1, timeout=60)
        wait("two refusals", lambda: replica.registry.get_sample_value(
            "fleetmedic_executor_rejected_total", {"reason": "cluster"}) == 2, timeout=30)
    finally:
        replica.close()

    got = collect_sync(kafka_bootstrap, [results_topic], lambda c: False, timeout=5)
    results = [r.decode(r.RemediationResult, v) for v in got.values(results_topic)]
    assert [(x.command_id, x.outcome, x.cluster) for x in results] == [(ours.id, "applied", "gpu-east-1")]
    assert core.read_node(nodes[0]).spec.unschedulable
    assert not core.read_node(nodes[1]).spec.unschedulable and not core.read_node(nodes[2]).spec.unschedulable
    dead = collect_sync(kafka_bootstrap, [s.topics.topic("deadletter")], lambda c: bool(c.by_topic), timeout=10)
    letters = [r.decode(r.DeadLetter, v) for v in dead.values(s.topics.topic("deadletter"))]
    assert [(d.stage, d.cluster) for d in letters] == [("executor", "gpu-east-1")] * 2
    assert "addressed to cluster 'gpu-west-2'" in letters[0].error and "names no cluster" in letters[1].error
    assert replica.count("cordon", "applied") == 1 and replica.count("cordon", "skipped") == 0
