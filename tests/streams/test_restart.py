"""Restarts and scale-out of the Faust workers on the real broker (workers as subprocesses).

- a worker killed with SIGKILL after its first commands and restarted while more telemetry waits
  emits exactly the command ids of a run that was not killed: none twice, none lost. Once with no
  snapshot before the kill (the restarted worker replays its inputs from the start and finds the
  first commands already on the topic), once with a snapshot every second (it restores the
  engine and replays from the snapshot's offsets).
- a broker stopped and started again (a dedicated broker on free ports) is survived: the worker
  reconnects and turns the telemetry produced after the restart into commands.
- stage 1 killed between two checkpoints ends, after a restart, with byte-identical node
  baselines to a stage 1 never killed (states and offsets are written together).
- two ``--role detect`` workers split the telemetry partitions (each processes messages) and,
  with one ``--role decide`` worker, produce the same findings as one ``--role all`` worker.
"""

from __future__ import annotations

import asyncio
import collections
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from fleetmedic import records as r
from fleetmedic.bus import detect_group, detect_state_topic
from fleetmedic.devenv.kafka import produce
from fleetmedic.streams.app import ensure_topics
from fleetmedic.streams.state import load_node_states
from tests.streams.helpers_harness import (
    Collected,
    Run,
    collect_sync,
    new_run,
    start_worker,
    stop_worker,
    wait_for_log,
    worker,
)
from tests.streams.helpers_restart import (
    NODES,
    PHASES,
    command_ids,
    committed_offsets,
    job_messages,
    phase_telemetry,
    reference_commands,
    wait_phase,
)
from tests.streams.helpers_scenario import T0, dedicated_broker


@pytest.mark.parametrize("snapshot_every_s", [3600.0, 1.0], ids=["no-snapshot-before-kill", "snapshot-every-1s"])
def test_a_worker_killed_mid_stream_emits_no_duplicate_and_no_lost_command(kafka_bootstrap: str, tmp_path: Path,
                                                                           snapshot_every_s: float) -> None:
    extra = f"streams: {{engine_snapshot_every_s: {snapshot_every_s}}}\n"
    expected = reference_commands(kafka_bootstrap, tmp_path / "reference", extra)
    assert len(expected) == len(set(expected)) >= 4

    run = new_run(kafka_bootstrap, tmp_path / "killed", extra)
    asyncio.run(ensure_topics(run.settings))
    asyncio.run(produce(kafka_bootstrap, job_messages(run)))
    first = start_worker(run)
    try:
        asyncio.run(produce(kafka_bootstrap, phase_telemetry(run, 0)))
        wait_phase(run, kafka_bootstrap, 0)
        if snapshot_every_s < 10:
            time.sleep(3 * snapshot_every_s)  # a snapshot holds the first commands
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    before = command_ids(run, kafka_bootstrap)
    asyncio.run(produce(kafka_bootstrap, phase_telemetry(run, 1)))  # waits on the broker for the next worker
    with worker(run) as second:
        wait_for_log(run, second, "[^Worker]: Ready", timeout=90)
        wait_phase(run, kafka_bootstrap, 1, timeout=90)
        time.sleep(2)
    got = command_ids(run, kafka_bootstrap)
    log = run.log.read_text()

    duplicates = [i for i, n in collections.Counter(got).items() if n > 1]
    assert not duplicates, f"commands emitted twice: {duplicates}"
    assert set(got) == set(expected), f"lost: {set(expected) - set(got)}; extra: {set(got) - set(expected)}"
    assert set(before) < set(got)
    if snapshot_every_s < 10:
        assert "decision engine: restored (" in log
    else:  # no snapshot: everything replayed, and the first commands found on the topic, not sent again
        assert "decision engine: fresh state" in log and f"{len(before)} command ids already on the topic" in log
        assert "is already on the commands topic; not sent again" in log


def test_a_broker_restart_is_survived(tmp_path: Path) -> None:
    broker = dedicated_broker(tmp_path / "broker")
    try:
        bootstrap = broker.bootstrap
        run = new_run(bootstrap, tmp_path / "run")
        asyncio.run(ensure_topics(run.settings))
        asyncio.run(produce(bootstrap, job_messages(run)))
        with worker(run) as w:
            asyncio.run(produce(bootstrap, phase_telemetry(run, 0)))
            wait_phase(run, bootstrap, 0, timeout=90)
            assert broker.stop()
            time.sleep(5)  # the worker sees the broker gone
            assert w.poll() is None, "the worker died with the broker"
            broker.start(timeout=180)
            asyncio.run(produce(bootstrap, phase_telemetry(run, 1)))
            wait_phase(run, bootstrap, 1, timeout=120)
            assert w.poll() is None
        ids = command_ids(run, bootstrap)
        assert len(ids) == len(set(ids))
    finally:
        broker.stop()


def _scrape(log: Path) -> str:
    url = re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", log.read_text())
    assert url, "the worker did not log its metrics address"
    with urllib.request.urlopen(url.group(1), timeout=10) as resp:
        return str(resp.read().decode())


FLEET_DETECTORS = {"job_peers", "sku_peers", "straggler", "job_step_time"}  # the decision stage's, on ticks


def _findings(run: Run, bootstrap: str) -> set[str]:
    """Stage 1's finding ids once the last sample's XIDs (on every node) are in: all telemetry is processed."""
    topic = run.topic("findings")
    last = T0 + 10 * PHASES[0][1]

    def done(c: Collected) -> bool:
        fs = [r.decode(r.Finding, v) for v in c.values(topic)]
        return {f.node for f in fs if f.ts == last and f.detector == "xid_rules"} == set(NODES)
    got = collect_sync(bootstrap, [topic], done, timeout=90)
    assert done(got), "not every node's last sample was processed"
    return {f.id for f in (r.decode(r.Finding, v) for v in got.values(topic)) if f.detector not in FLEET_DETECTORS}


def _partitions(log: Path) -> str:
    found = re.findall(r"detect: partitions (\[[\d, ]*\])", log.read_text(errors="replace"))
    return found[-1] if found else ""


def test_two_detect_workers_split_the_partitions_and_find_what_one_worker_finds(kafka_bootstrap: str,
                                                                                tmp_path: Path) -> None:
    one = new_run(kafka_bootstrap, tmp_path / "one")
    asyncio.run(ensure_topics(one.settings))
    asyncio.run(produce(kafka_bootstrap, job_messages(one)))
    with worker(one):
        asyncio.run(produce(kafka_bootstrap, phase_telemetry(one, 0, final_xid_everywhere=True)))
        expected = _findings(one, kafka_bootstrap)

    two = new_run(kafka_bootstrap, tmp_path / "two")
    asyncio.run(ensure_topics(two.settings))
    asyncio.run(produce(kafka_bootstrap, job_messages(two)))
    logs = [two.tmp / "detect-1.log", two.tmp / "detect-2.log"]
    decide = start_worker(two, "decide", two.tmp / "decide.log")
    detect = [start_worker(two, "detect", log) for log in logs]
    try:
        deadline = time.monotonic() + 90
        while sorted(_partitions(log) for log in logs) != ["[0]", "[1]"]:  # after the rebalance, one each
            for p, log in zip(detect, logs, strict=True):
                assert p.poll() is None, f"detect worker exited {p.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the detect workers did not split: {[_partitions(x) for x in logs]}"
            time.sleep(0.5)
        asyncio.run(produce(kafka_bootstrap, phase_telemetry(two, 0, final_xid_everywhere=True)))
        got = _findings(two, kafka_bootstrap)
        gpu = two.topic("telemetry.gpu")
        pattern = rf'fleetmedic_messages_in_total{{stage="detect",topic="{re.escape(gpu)}"}} (\S+)'
        processed = [re.search(pattern, _scrape(log)) for log in logs]
    finally:
        for p, log in [*zip(detect, logs, strict=True), (decide, two.tmp / "decide.log")]:
            stop_worker(p, log)
    counts = [float(m.group(1)) if m else 0.0 for m in processed]
    assert all(c > 0 for c in counts) and sum(counts) == len(NODES) * PHASES[0][1], counts
    assert got == expected and len(got) >= len(NODES) + 1


def _wait_committed(run: Run, bootstrap: str, proc: subprocess.Popen[bytes], end: int, timeout: float = 90) -> None:
    """Until stage 1 has committed (so checkpointed) every telemetry message."""
    deadline = time.monotonic() + timeout
    group, topic = detect_group(run.settings), run.topic("telemetry.gpu")
    while sum(asyncio.run(committed_offsets(bootstrap, group, topic, 2)).values()) < end:
        assert proc.poll() is None, f"worker exited {proc.returncode}:\n{run.log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "stage 1 did not commit every message"
        time.sleep(0.5)


def _node_states(run: Run) -> dict[str, bytes | None]:
    return {n: (st.gpu if st.gpu is None else bytes(st.gpu)) for p in range(2)
            for n, st in asyncio.run(load_node_states(run.settings, detect_state_topic(run.settings), p)).items()}


def test_stage1_baselines_survive_a_kill_exactly(kafka_bootstrap: str, tmp_path: Path) -> None:
    """A detect worker killed between two checkpoints: its successor loads the node states and
    resumes at the committed offsets, and ends with byte-identical baselines to a worker never killed."""
    extra = "streams: {detect_snapshot_every_s: 1.0}\n"
    first, second = _telemetry_for(0), _telemetry_for(1)

    ref = new_run(kafka_bootstrap, tmp_path / "reference", extra)
    asyncio.run(ensure_topics(ref.settings))
    with worker(ref, "detect") as w:
        asyncio.run(produce(kafka_bootstrap, first(ref) + second(ref)))
        _wait_committed(ref, kafka_bootstrap, w, len(first(ref) + second(ref)))
    expected = _node_states(ref)
    assert set(expected) == set(NODES) and all(expected.values())

    run = new_run(kafka_bootstrap, tmp_path / "killed", extra)
    asyncio.run(ensure_topics(run.settings))
    w = start_worker(run, "detect")
    try:
        asyncio.run(produce(kafka_bootstrap, first(run)))
        _wait_committed(run, kafka_bootstrap, w, len(first(run)))
        asyncio.run(produce(kafka_bootstrap, second(run)[: len(second(run)) // 2]))
        time.sleep(0.3)  # some of it processed, not checkpointed yet
    finally:
        w.send_signal(signal.SIGKILL)
        w.wait()
    asyncio.run(produce(kafka_bootstrap, second(run)[len(second(run)) // 2:]))
    with worker(run, "detect") as again:
        _wait_committed(run, kafka_bootstrap, again, len(first(run) + second(run)))
    assert re.search(r"restored [1-9]\d* node states", run.log.read_text())
    assert _node_states(run) == expected


def _telemetry_for(phase: int):  # type: ignore[no-untyped-def]
    return lambda run: phase_telemetry(run, phase)
