"""Broker faults on the secure three-broker cluster, under load (docs/operations.md has the figures).

Each test runs a worker (``--role all``, SASL_SSL, replication factor 3, ``min.insync.replicas``
2, engine snapshots every second) while a steady stream of GPU telemetry (16 nodes, 32 messages a
second, idempotent, ``acks=all``) flows, and asks for an XID 79 on a node of a new job before, at
and after each fault. Faults: kill -9 of the broker leading ``remediation.commands``, restarted,
then kill -9 of the one leading the decision stage's state topic (one worker for both, to save its
start); the commands leader stalled (SIGSTOP for :data:`STALL_S`, then SIGCONT); a rolling restart
of all three (SIGTERM, start, back in sync, next).

Each must end with: every XID answered (a ``restart_job`` for its job, a command for its node),
no command id twice on the topic, every command audited and every audited command on the topic,
both consumer groups' lag back to zero, the worker alive throughout and exiting 0 on SIGTERM, and
every partition back in sync. Time to recover is the time from the fault until the command for
the XID asked for at the fault is on the topic (``baseline_s``: the same for the XID before it).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetmedic import records as r
from fleetmedic.bus import detect_group, state_topic
from fleetmedic.devenv.kafka_cluster import KafkaCluster, stalled
from fleetmedic.streams.app import ensure_topics
from fleetmedic.streams.decide import decide_inputs
from tests.services.cluster_harness import Load, Read, Xid, commands, job_events, lag, produce, read_sync, secure_run
from tests.streams.harness import Run, wait_for_log, worker

STALL_S = 15.0  # longer than broker.session.timeout.ms (9 s): the stalled broker is fenced, leadership moves


@dataclass
class Ctx:
    cluster: KafkaCluster
    run: Run
    load: Load
    started: float = 0.0


def _reaction(run: Run, x: Xid, timeout: float = 120.0) -> float:
    """Wall time (Kafka's CreateTime) of the ``restart_job`` for ``x``'s job on the commands topic."""
    topic = run.topic("remediation.commands")

    def found(got: Read) -> list[float]:
        return [rec.timestamp_ms / 1000 for cmd, rec in commands(run, got) if cmd.action == "restart_job"
                and cmd.job == x.job]

    got = read_sync(run, [topic], lambda g: bool(found(g)), timeout)
    assert found(got), f"no restart_job for {x.job} (XID 79 on {x.node}) within {timeout:.0f}s"
    return min(found(got))


def _wait_leader_moved(cluster: KafkaCluster, topic: str, old: int, timeout: float = 60.0) -> float:
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            if cluster.leader(topic) not in (old, -1):
                return time.time() - t0
        except Exception:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{topic}: no new leader {timeout:.0f}s after node {old} went")


def _wait_lag_zero(run: Run, timeout: float = 120.0) -> None:
    groups = {run.settings.kafka.consumer_group: list(decide_inputs(run.settings)),
              detect_group(run.settings): [run.topic("telemetry.gpu"), run.topic("telemetry.port")]}
    deadline = time.monotonic() + timeout
    while True:
        behind = {g: {tp: n for tp, n in asyncio.run(lag(run, g, topics)).items() if n}
                  for g, topics in groups.items()}
        if not any(behind.values()):
            return
        assert time.monotonic() < deadline, f"consumer lag not back to zero after {timeout:.0f}s: {behind}"
        time.sleep(1.0)


Fault = Callable[[Ctx], dict[str, Any]]


def _scenario(cluster: KafkaCluster, tmp: Path, faults: dict[str, Fault], wait_s: float = 120.0) -> None:
    """One worker under load through ``faults`` in turn (each leaves the cluster whole), then the checks."""
    assert len(cluster.running()) == 3 and not cluster.under_replicated(), "the cluster is not whole"
    run = secure_run(cluster, tmp, extra={"streams": {"engine_snapshot_every_s": 1.0}})
    t_start = time.monotonic()
    asyncio.run(ensure_topics(run.settings))
    asyncio.run(produce(run, job_events(run)))
    with worker(run) as w:
        wait_for_log(run, w, "[^Worker]: Ready", timeout=180)
        load = Load(run).start()
        try:
            base = load.xid()
            asked = time.time()
            figures: dict[str, Any] = {"baseline_s": round(_reaction(run, base) - asked, 1)}
            for name, fault in faults.items():
                figures[name] = fault(Ctx(cluster, run, load))
                assert w.poll() is None, f"the worker died ({name})"
            after = load.xid()
            asked = time.time()
            figures["after_s"] = round(_reaction(run, after, timeout=wait_s) - asked, 1)
        finally:
            load.stop()
        _wait_lag_zero(run, timeout=wait_s)
        assert w.poll() is None, "the worker died"
    figures["in_sync_s"] = round(cluster.wait_in_sync(timeout=120), 1)

    got = read_sync(run, [run.topic("remediation.commands"), run.topic("remediation.audit")], lambda g: False, 5)
    cmds = [c for c, _ in commands(run, got)]
    ids = collections.Counter(c.id for c in cmds)
    assert not [i for i, n in ids.items() if n > 1], f"commands twice on the topic: {ids}"
    audited = {cid for rec in got.records(run.topic("remediation.audit"))
               for cid in r.decode(r.AuditRecord, rec.value).command_ids}
    assert set(ids) == audited, f"not audited: {set(ids) - audited}; audited, not on the topic: {audited - set(ids)}"
    for x in load.xids:
        assert [c for c in cmds if c.action == "restart_job" and c.job == x.job], f"lost: restart_job for {x.job}"
        assert [c for c in cmds if c.node == x.node], f"lost: the command for {x.node}"
    assert len(load.xids) >= 3
    figures.update(commands=len(ids), telemetry=load.messages, wall_s=round(time.monotonic() - t_start, 1))
    print(f"\n{' + '.join(faults)}: {json.dumps(figures)}")


def _kill_leader_of(topic_of: Callable[[Run], str]) -> Callable[[Ctx], dict[str, Any]]:
    def fault(ctx: Ctx) -> dict[str, Any]:
        topic = topic_of(ctx.run)
        node = ctx.cluster.leader(topic)
        assert node in ctx.cluster.ids
        t0 = time.time()
        ctx.cluster.kill(node)
        probe = ctx.load.xid()
        failover_s = _wait_leader_moved(ctx.cluster, topic, node)
        recover_s = _reaction(ctx.run, probe) - t0
        restart_s = ctx.cluster.start_broker(node, timeout=180)
        return {"node": node, "leader_moved_s": round(failover_s, 1), "recover_s": round(recover_s, 1),
                "broker_restart_s": round(restart_s, 1)}
    return fault


def test_kill_9_of_the_commands_leader_then_of_the_state_leader_loses_and_duplicates_no_command(
        kafka_secure_cluster: KafkaCluster, tmp_path: Path) -> None:
    _scenario(kafka_secure_cluster, tmp_path, {
        "kill -9 commands leader": _kill_leader_of(lambda run: run.topic("remediation.commands")),
        "kill -9 state-topic leader": _kill_leader_of(lambda run: state_topic(run.settings)),
    })


# Found by this test, in 2 runs of 3 (it passed in the third): when the stalled broker is also a group
# coordinator, the consumers rejoin after SIGCONT and one of them can stop consuming a partition.
# - aiokafka 0.14 retried the offset reset of a stage-1 partition against its old leader ("Failed fetch
#   offsets from N: NotLeaderForPartitionError", ten times a second) for the 2 min the test waited: the
#   fetcher does not refresh metadata on that error, only every metadata_max_age_ms (5 min by default).
# - the decision stage's Faust consumer delivered no record of one findings partition after its rejoin
#   (the other inputs flowed) for the 2 min the test waited (faust-streaming issues #629, #523).
# No command was sent twice; a fault's command came late or not within the wait. docs/operations.md
# (section 8) has what to watch and do.
@pytest.mark.xfail(reason="intermittent: a consumer stuck after a stalled coordinator's return (aiokafka, faust)",
                   strict=False)
def test_a_stalled_commands_leader_loses_and_duplicates_no_command(kafka_secure_cluster: KafkaCluster,
                                                                 tmp_path: Path) -> None:
    def fault(ctx: Ctx) -> dict[str, Any]:
        topic = ctx.run.topic("remediation.commands")
        node = ctx.cluster.leader(topic)
        t0 = time.time()
        with stalled(ctx.cluster, node):
            probe = ctx.load.xid()
            moved_s = _wait_leader_moved(ctx.cluster, topic, node, timeout=STALL_S + 30)
            time.sleep(max(0.0, STALL_S - (time.time() - t0)))
        recover_s = _reaction(ctx.run, probe) - t0
        return {"node": node, "stall_s": STALL_S, "leader_moved_s": round(moved_s, 1),
                "recover_s": round(recover_s, 1)}

    _scenario(kafka_secure_cluster, tmp_path, {"SIGSTOP commands leader": fault}, wait_s=60.0)


def test_a_rolling_restart_of_all_three_brokers_loses_and_duplicates_no_command(kafka_secure_cluster: KafkaCluster,
                                                                              tmp_path: Path) -> None:
    def fault(ctx: Ctx) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for node in ctx.cluster.ids:
            t0 = time.time()
            assert ctx.cluster.stop_broker(node)
            stop_s = time.time() - t0
            probe = ctx.load.xid()
            ctx.cluster.start_broker(node, timeout=180)
            ctx.cluster.wait_in_sync(timeout=120)
            out[f"node{node}"] = {"stop_s": round(stop_s, 1), "back_in_sync_s": round(time.time() - t0, 1),
                                  "recover_s": round(_reaction(ctx.run, probe) - t0, 1)}
        out["recover_s"] = max(v["recover_s"] for v in out.values())
        return out

    _scenario(kafka_secure_cluster, tmp_path, {"rolling restart": fault})


@pytest.fixture(autouse=True)
def _whole_again(kafka_secure_cluster: KafkaCluster) -> Any:
    """Whatever a test did, the next one starts with all three brokers up and continued."""
    yield
    c = kafka_secure_cluster
    for node in c.ids:
        pid = c.pid(node)
        if pid is not None:
            with contextlib.suppress(Exception):
                c.signal(node, signal.SIGCONT)
        else:
            c.start_broker(node, timeout=180)
    c.wait_in_sync(timeout=120)
