"""Snapshots on the real broker: a decision worker killed while it writes a snapshot, and
a corrupt record on the snapshot topic (and on stage 1's state topic), end with exactly the command
ids of a run that had neither: none lost, none twice, nothing stuck.

- ``test_a_worker_killed_while_it_writes_a_snapshot_loses_and_repeats_no_command``: a dedicated
  broker is frozen (SIGSTOP) while the worker snapshots every 0.3 s, so the worker is blocked
  inside a snapshot's write (its record sent or half sent, not acknowledged) when it is killed with
  SIGKILL; the broker resumes, more telemetry arrives, the worker restarts.
- ``test_a_corrupt_snapshot_is_passed_over_audited_and_no_command_is_lost_or_repeated``: after a
  kill, a record under the snapshot key that does not decode as a snapshot (truncated bytes; a map
  that decodes but does not validate, the case that made startup raise ``msgspec.ValidationError``)
  is the latest on the state topic; with an earlier snapshot the worker restores that one, without
  one it starts fresh and replays from the beginning. Either way it logs, counts
  (``fleetmedic_state_unreadable_total``) and audits (``state_reset``) the reset. A stage-1 node
  state that does not decode is started fresh (counted), and stage 1 does not stall.
"""

from __future__ import annotations

import asyncio
import collections
import os
import re
import signal
import time
import urllib.request
from pathlib import Path

import msgspec
import pytest

from fleetmedic import records as r
from fleetmedic.bus import detect_state_topic, state_topic
from fleetmedic.devenv.kafka import Kafka, produce
from fleetmedic.streams.app import ensure_topics
from fleetmedic.streams.state import SNAPSHOT_KEY, load_snapshots
from tests.streams.helpers_harness import collect_sync, new_run, start_worker, wait_for_log, worker
from tests.streams.helpers_restart import command_ids, job_messages, phase_telemetry, reference_commands, wait_phase
from tests.streams.helpers_scenario import dedicated_broker


def _scrape(log: Path) -> str:
    """The metrics page of the worker that logged its address last (the log is shared by restarts)."""
    urls = re.findall(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", log.read_text())
    assert urls, "the worker did not log its metrics address"
    with urllib.request.urlopen(urls[-1], timeout=10) as resp:
        return str(resp.read().decode())


def _no_duplicates_none_lost(got: list[str], expected: list[str]) -> None:
    duplicates = [i for i, n in collections.Counter(got).items() if n > 1]
    assert not duplicates, f"commands emitted twice: {duplicates}"
    assert set(got) == set(expected), f"lost: {set(expected) - set(got)}; extra: {set(got) - set(expected)}"


def _dedicated_broker(tmp_path: Path) -> Kafka:
    return dedicated_broker(tmp_path / "broker")


@pytest.mark.parametrize("part_bytes", [0, 4096], ids=["whole", "in-parts"])
def test_a_worker_killed_while_it_writes_a_snapshot_loses_and_repeats_no_command(tmp_path: Path,
                                                                                 part_bytes: int) -> None:
    """``in-parts``: the snapshot is larger than one record of the state topic may be,
    so it is written in parts and a manifest; the kill lands among them."""
    broker = _dedicated_broker(tmp_path)
    try:
        bootstrap = broker.bootstrap
        extra = "streams: {engine_snapshot_every_s: 0.3" + (f", snapshot_part_bytes: {part_bytes}" if part_bytes
                                                             else "") + "}\n"
        expected = reference_commands(bootstrap, tmp_path / "reference", extra)
        assert len(expected) == len(set(expected)) >= 4

        run = new_run(bootstrap, tmp_path / "killed", extra)
        asyncio.run(ensure_topics(run.settings))
        asyncio.run(produce(bootstrap, job_messages(run)))
        first = start_worker(run)
        pid = int((broker.dir / "kafka.pid").read_text().strip())
        frozen = False
        try:
            asyncio.run(produce(bootstrap, phase_telemetry(run, 0)))
            wait_phase(run, bootstrap, 0, timeout=90)
            time.sleep(1.0)
            os.kill(pid, signal.SIGSTOP)  # the next snapshot's write cannot complete
            frozen = True
            time.sleep(2.0)  # > 0.3 s: the snapshot timer has fired and waits on the broker
            assert first.poll() is None
            first.send_signal(signal.SIGKILL)
            first.wait()
        finally:
            if frozen:
                os.kill(pid, signal.SIGCONT)
            if first.poll() is None:
                first.kill()
                first.wait()
        snapshots = asyncio.run(load_snapshots(run.settings, keep=1000))
        assert snapshots, "no snapshot was written before the kill"
        before = command_ids(run, bootstrap)
        asyncio.run(produce(bootstrap, phase_telemetry(run, 1)))
        with worker(run) as second:
            wait_for_log(run, second, "[^Worker]: Ready", timeout=120)
            wait_phase(run, bootstrap, 1, timeout=120)
            time.sleep(2)
        got = command_ids(run, bootstrap)
        _no_duplicates_none_lost(got, expected)
        assert set(before) < set(got)
        log = run.log.read_text()
        assert "decision engine: restored (" in log
        assert ("written in" in log and "parts (slot 1)" in log) == bool(part_bytes)
    finally:
        broker.stop()


CORRUPT = {
    "truncated": None,  # the latest snapshot cut in half
    "not-a-snapshot": msgspec.msgpack.encode({"engine": "not bytes", "fleet": 1}),  # decodes, does not validate
}


@pytest.mark.parametrize(("snapshot_every_s", "corrupt"), [(1.0, "truncated"), (3600.0, "not-a-snapshot")],
                         ids=["an-earlier-snapshot-is-restored", "none-readable-fresh-start"])
def test_a_corrupt_snapshot_is_passed_over_audited_and_no_command_is_lost_or_repeated(
        kafka_bootstrap: str, tmp_path: Path, snapshot_every_s: float, corrupt: str) -> None:
    extra = f"streams: {{engine_snapshot_every_s: {snapshot_every_s}}}\n"
    expected = reference_commands(kafka_bootstrap, tmp_path / "reference", extra)

    run = new_run(kafka_bootstrap, tmp_path / "corrupt", extra)
    asyncio.run(ensure_topics(run.settings))
    asyncio.run(produce(kafka_bootstrap, job_messages(run)))
    first = start_worker(run)
    try:
        asyncio.run(produce(kafka_bootstrap, phase_telemetry(run, 0)))
        wait_phase(run, kafka_bootstrap, 0)
        time.sleep(3 if snapshot_every_s < 10 else 1)  # a snapshot holds the first commands; stage 1 checkpointed
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    snapshots = asyncio.run(load_snapshots(run.settings))
    assert bool(snapshots) == (snapshot_every_s < 10)
    value = CORRUPT[corrupt] or snapshots[0][1][: len(snapshots[0][1]) // 2]
    # the latest on the state topic: a snapshot that cannot be read; and one node's stage-1 state
    garbage = [(state_topic(run.settings), SNAPSHOT_KEY, value)]
    garbage += [(detect_state_topic(run.settings), b"gpu-node-1", b"\xc1 not msgpack")]
    asyncio.run(_produce_to_partitions(kafka_bootstrap, garbage))

    asyncio.run(produce(kafka_bootstrap, phase_telemetry(run, 1)))
    with worker(run) as second:
        wait_for_log(run, second, "[^Worker]: Ready", timeout=90)
        wait_phase(run, kafka_bootstrap, 1, timeout=90)
        time.sleep(2)
        metrics = _scrape(run.log)
    got = command_ids(run, kafka_bootstrap)
    log = run.log.read_text()
    _no_duplicates_none_lost(got, expected)
    assert "decision state cannot be read: snapshot (offset" in log and "decision state reset: " in log
    assert 'fleetmedic_state_unreadable_total{part="snapshot",stage="decide"} 1.0' in metrics
    if snapshot_every_s < 10:
        assert "decision engine: restored (" in log
    else:
        assert "decision engine: fresh state" in log
    audit_topic = run.topic("remediation.audit")
    audit = [r.decode(r.AuditRecord, v) for v in collect_sync(kafka_bootstrap, [audit_topic], lambda c: False,
                                                                timeout=4).values(audit_topic)]
    resets = [a for a in audit if a.rule == "state_reset"]
    assert len(resets) == 1 and "snapshot (offset" in resets[0].explanation and resets[0].decision == "escalated"
    # stage 1: the node whose state was unreadable started fresh, counted; nothing stalled (phase 1 above)
    assert "the state of node gpu-node-1 cannot be read" in log
    assert 'fleetmedic_state_unreadable_total{part="node",stage="detect"}' in metrics


async def _produce_to_partitions(bootstrap: str, messages: list[tuple[str, bytes, bytes]]) -> None:
    """Each ``(topic, key, value)`` to every partition of its topic (a key's state lives in one of them)."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=16 << 20)
    await producer.start()
    try:
        for topic, key, value in messages:
            for partition in sorted(await producer.partitions_for(topic)):
                await producer.send_and_wait(topic, key=key, value=value, partition=partition)
    finally:
        await producer.stop()
