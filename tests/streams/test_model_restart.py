"""Stage 1's multivariate model survives a kill on the real broker, without pickle.

A ``--role detect`` worker learns the model (short windows, a refit every simulated minute), is
killed with SIGKILL between two checkpoints and restarted: its successor loads the node states
(open windows, streaks) and the model's part of the partition (training rows as arrays), refits
on them, replays the telemetry after the committed offset, and ends with the byte-identical model
part and node states of a worker never killed. One partition: with several, the moments a worker
refits depend on how its partitions' batches interleave (docs/streams.md).
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np

from fleetmedic import records as r
from fleetmedic.bus import detect_group, detect_state_topic
from fleetmedic.devenv.kafka import produce
from fleetmedic.devenv.synth import gpu_message
from fleetmedic.streams.app import ensure_topics
from fleetmedic.streams.state import load_detect_partition
from tests.streams.helpers_harness import Run, new_run, start_worker, worker
from tests.streams.helpers_restart import NODES, committed_offsets
from tests.streams.helpers_scenario import T0

EXTRA = ("streams: {detect_snapshot_every_s: 1.0}\n"
         "detection: {multivariate: {window_s: 30, min_training_windows: 8, refit_interval_s: 60}}\n")
SAMPLES = 60


def phase_telemetry(run: Run, first: int, last: int) -> list[tuple[str, bytes, bytes]]:
    out = []
    for k in range(first, last):
        rng = np.random.default_rng(k)
        for n in NODES:
            msg = gpu_message(n, T0 + 10 * k, rng)
            out.append((run.topic("telemetry.gpu"), n.encode(), r.encode(msg)))
    return out


def _state(run: Run) -> tuple[bytes | None, dict[str, tuple[bytes | None, bytes | None]]]:
    part = asyncio.run(load_detect_partition(run.settings, detect_state_topic(run.settings), 0))
    return part.model, {n: (st.gpu, st.multivariate) for n, st in part.states.items()}


def _commit_all(run: Run, bootstrap: str, proc: subprocess.Popen[bytes], end: int, timeout: float = 90) -> None:
    """Until stage 1 has committed (so checkpointed) every telemetry message up to ``end``."""
    deadline = time.monotonic() + timeout
    group, topic = detect_group(run.settings), run.topic("telemetry.gpu")
    while asyncio.run(committed_offsets(bootstrap, group, topic, 1))[0] < end:
        assert proc.poll() is None, f"worker exited {proc.returncode}:\n{run.log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "stage 1 did not commit every message"
        time.sleep(0.5)


def test_the_multivariate_model_survives_a_kill_exactly(kafka_bootstrap: str, tmp_path: Path) -> None:
    everything = SAMPLES * len(NODES)
    ref = new_run(kafka_bootstrap, tmp_path / "reference", EXTRA, partitions=1)
    asyncio.run(ensure_topics(ref.settings))
    with worker(ref, "detect") as w:
        asyncio.run(produce(kafka_bootstrap, phase_telemetry(ref, 0, SAMPLES)))
        _commit_all(ref, kafka_bootstrap, w, everything)
    expected_model, expected_nodes = _state(ref)
    assert expected_model is not None and set(expected_nodes) == set(NODES)
    assert all(mv is not None for _, mv in expected_nodes.values())

    run = new_run(kafka_bootstrap, tmp_path / "killed", EXTRA, partitions=1)
    asyncio.run(ensure_topics(run.settings))
    w = start_worker(run, "detect")
    half = SAMPLES // 2
    try:
        asyncio.run(produce(kafka_bootstrap, phase_telemetry(run, 0, half)))
        _commit_all(run, kafka_bootstrap, w, half * len(NODES))
        asyncio.run(produce(kafka_bootstrap, phase_telemetry(run, half, half + 10)))
        time.sleep(0.3)  # some of it processed, not checkpointed yet
    finally:
        w.send_signal(signal.SIGKILL)
        w.wait()
    asyncio.run(produce(kafka_bootstrap, phase_telemetry(run, half + 10, SAMPLES)))
    with worker(run, "detect") as again:
        _commit_all(run, kafka_bootstrap, again, everything)
    log = run.log.read_text()
    restored = re.findall(r"restored (\d+) node states in \S+, (\d+) model rows \(refitted: version (\d+)\)", log)
    assert restored and int(restored[-1][1]) > 0 and int(restored[-1][2]) >= 1, log[-3000:]

    model, nodes = _state(run)
    assert model == expected_model  # the same training rows, version and fit time
    assert nodes == expected_nodes  # baselines, open windows and streaks
