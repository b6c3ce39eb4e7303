"""The Kafka broker killed (kill -9) and started again while the executor is in the middle of a
drain on the real control plane. The drain is held by a PodDisruptionBudget; the broker
dies; the budget is lifted while it is down, so the drain finishes with no broker to publish its
result to; the broker comes back. The executor must carry on without a restart: the drain's result
is published once, a command produced after the restart is applied, every command has exactly one
result, and the consumer group's committed offset reaches the end of the commands topic (nothing
stuck). And it keeps renewing its Lease while the broker is down: an offset commit that waits for
the broker for good would stop the renewals (a standby would take the Lease over next to a leader
still acting), and a result whose send timed out is sent again. A dedicated
single broker on free ports (the session's broker is shared with other tests)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition
from kubernetes import client

from fleetmedic import records as r
from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv import proc
from fleetmedic.devenv.kafka import Kafka, produce
from fleetmedic.devenv.waiting import wait
from fleetmedic.executor.service import consumer_group
from fleetmedic.k8s_keys import ANNOTATION_DRAIN, ANNOTATION_INFLIGHT
from fleetmedic.streams.app import ensure_topics
from tests.executor.helpers_executor import Replica, command, pinned_pod, running, settings
from tests.streams.helpers_harness import collect_sync
from tests.streams.helpers_scenario import dedicated_broker


def _kill_9(broker: Kafka) -> None:
    pid = broker._proc(["java"]).pid()
    assert pid is not None, "the broker is not running"
    os.kill(pid, signal.SIGKILL)
    wait("the broker gone", lambda: broker._proc(["java"]).pid() is None and not proc.port_open(broker.port), 30)


async def _committed(bootstrap: str, group: str, topic: str) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        return int(await consumer.committed(TopicPartition(topic, 0)) or 0)
    finally:
        await consumer.stop()


def test_a_broker_killed_and_restarted_mid_drain_the_executor_recovers_and_publishes_each_result_once(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet], tmp_path: Path
) -> None:
    with ThreadPoolExecutor(max_workers=1) as pool:  # the broker starts while the pod and its budget are made
        starting = pool.submit(dedicated_broker, tmp_path / "broker")
        try:
            core, policy = client.CoreV1Api(kube_api), client.PolicyV1Api(kube_api)
            name, other = make_fleet(2).nodes
            core.create_namespaced_pod(namespace, pinned_pod("guarded", name, {"app": "guarded"}))
            policy.create_namespaced_pod_disruption_budget(namespace, client.V1PodDisruptionBudget.from_dict(
                {"metadata": {"name": "guard"},
                 "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}}))
            wait("Running", lambda: running(core, namespace, "guarded"), 60)
            wait("the budget", lambda: (b := policy.read_namespaced_pod_disruption_budget("guard", namespace).status)
                 and b.expected_pods == 1, 60)
        except BaseException:
            with contextlib.suppress(BaseException):
                starting.result().stop()
            raise
        broker = starting.result()
    s = settings(namespace, bootstrap=broker.bootstrap,
                 extra=f"  drain_timeout_s: 300.0\n  namespace_policies: {{{namespace}: evict_now}}\n")
    # a send gives up after 5 s: the outage (a broker start takes longer) outlasts it for sure
    s = msgspec.structs.replace(s, kafka=msgspec.structs.replace(s.kafka, request_timeout_s=5.0))
    coord = client.CoordinationV1Api(kube_api)

    def renewed() -> float:
        lease = coord.read_namespaced_lease(s.executor.lease_name, namespace).spec
        assert lease.holder_identity == "exec-r"
        return float(lease.renew_time.timestamp())
    commands_topic, results_topic = s.topics.topic("remediation.commands"), s.topics.topic("remediation.results")
    replica: Replica | None = None
    try:
        asyncio.run(ensure_topics(s))
        replica = Replica(kube_api, s, "exec-r")
        wait("the executor leading", replica.leading, 30)
        first = [command("cordon", name), command("drain", name)]
        asyncio.run(produce(broker.bootstrap, [(commands_topic, name.encode(), r.encode(c)) for c in first]))
        wait("the drain in flight", lambda: ANNOTATION_INFLIGHT in (core.read_node(name).metadata.annotations or {}),
             30)
        wait("the cordon's result", lambda: replica.service.results_published >= 1, 30)  # type: ignore[union-attr]

        killed = time.monotonic()
        _kill_9(broker)
        # the budget lifted while the broker is down: the drain finishes with nowhere to publish to
        policy.patch_namespaced_pod_disruption_budget("guard", namespace, {"spec": {"minAvailable": 0}})
        wait("the drain done", lambda: json.loads((core.read_node(name).metadata.annotations or {})
                                                  .get(ANNOTATION_DRAIN, "{}")).get("state") == "done", 60)
        dead_since = time.time()
        # the executor meets the broker gone (the result's send times out, its commits fail) and goes
        # on renewing its Lease (every lease_duration_s / 3 = 1 s): it is still the one leader
        wait("a Lease renewal with the broker down", lambda: renewed() > dead_since + 6.0, 30)
        broker.start(timeout=180)
        restarted = time.monotonic()
        later = command("cordon", other)
        asyncio.run(produce(broker.bootstrap, [(commands_topic, other.encode(), r.encode(later))]))
        every = {c.id for c in [*first, later]}

        def all_results(c: object) -> bool:
            return {r.decode(r.RemediationResult, v).command_id
                    for v in c.values(results_topic)} >= every  # type: ignore[attr-defined]

        got = collect_sync(broker.bootstrap, [results_topic], all_results, timeout=60)
        recovered = time.monotonic()
        assert replica.thread.is_alive(), "the executor stopped with the broker"
        wait("the offsets committed to the end", lambda: asyncio.run(
            _committed(broker.bootstrap, consumer_group(s), commands_topic)) == 3, 30)
        time.sleep(1.0)
        got = collect_sync(broker.bootstrap, [results_topic], lambda c: False, timeout=3)
    finally:
        if replica is not None and replica.thread.is_alive():
            replica.close()
        broker.stop()
    results = [r.decode(r.RemediationResult, v) for v in got.values(results_topic)]
    assert Counter(x.command_id for x in results) == Counter(every), f"not one result per command: {results}"
    assert {x.command_id: x.outcome for x in results} == {c: "applied" for c in every}, results
    drained = json.loads(core.read_node(name).metadata.annotations[ANNOTATION_DRAIN])
    assert drained["state"] == "done" and drained["evicted"] == [f"{namespace}/guarded"]
    assert core.read_node(other).spec.unschedulable
    failed_commits = sum(m.value for f in replica.registry.collect() if f.name == "fleetmedic_executor_commit_failures"
                         for m in f.samples if m.name.endswith("_total"))
    assert failed_commits > 0, "the outage was not met by the commit loop"
    print(f"broker down {restarted - killed:.1f}s; all results {recovered - restarted:.1f}s after the restart")
