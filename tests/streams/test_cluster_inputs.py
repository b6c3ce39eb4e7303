"""The decision stage's cluster inputs on the real broker, with the worker as a subprocess:

- ``cluster.nodes``: NodeObservations for N nodes (what ``watch-jobs``'s Node watch publishes) make
  the engine's fleet N nodes (the ``fleetmedic_fleet_nodes`` gauge on the worker's metrics page);
- ``remediation.operator``: after an XID storm on half the fleet tripped the circuit breaker, an
  operator command published by ``fleetmedic ctl resume-breaker`` (the CLI as a subprocess, pointed
  at the run's broker and topic prefix by environment overrides) closes it, audited as
  ``breaker_resumed`` by ``operator:<actor>``; a forged command (wrong key) lands on the dead-letter
  topic with the reason, and the stage goes on; a deleted node's record shrinks the fleet;
- ``--role detect`` starts without a signing key, ``--role decide`` refuses to (exit 2).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from fleetmedic import records as r
from fleetmedic.devenv.kafka import produce
from fleetmedic.devenv.synth import gpu_message
from fleetmedic.signing import sign
from fleetmedic.streams.app import ensure_topics
from tests.streams.helpers_harness import (
    OPERATOR_KEY,
    Collected,
    Run,
    collect_sync,
    new_run,
    stop_worker,
    wait_for_log,
    worker,
)
from tests.streams.helpers_worker import scrape

N = 8
NODES = [f"gpu-node-{i}" for i in range(N)]
STORM = NODES[:4]  # trip level: max(trip_min_nodes=3, 10% of 8)


def _gauge(page: str, name: str) -> float | None:
    for line in page.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return None


def _wait_for_gauge(run: Run, name: str, value: float, timeout: float = 40) -> str:
    """The metrics page once gauge ``name`` reads ``value`` (the engine's gauges move at its ticks)."""
    deadline, got = time.monotonic() + timeout, None
    while True:
        page = scrape(run.log.read_text())
        got = _gauge(page, name)
        if got == value:
            return page
        assert time.monotonic() < deadline, f"{name} is {got}, not {value}"
        time.sleep(0.5)


def test_node_observations_size_the_fleet_and_ctl_resumes_the_breaker_tripped_by_a_storm(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    run = new_run(kafka_bootstrap, tmp_path, extra="safety: {max_quarantined_fraction: 0.5, max_per_rack: 8}\n")
    asyncio.run(ensure_topics(run.settings))
    t0 = time.time()
    nodes_topic, audit, dead = run.topic("cluster.nodes"), run.topic("remediation.audit"), run.topic("deadletter")
    observations = [r.NodeObservation(node=n, ts=t0 - 60, labels={"fleetmedic.io/rack": f"r{i // 4}"})
                    for i, n in enumerate(NODES)]
    # half of them on the broker before the worker starts (replayed), half after (live)
    asyncio.run(produce(kafka_bootstrap, [(nodes_topic, o.node.encode(), r.encode(o)) for o in observations[:4]]))

    with worker(run) as proc:
        wait_for_log(run, proc, "[^Worker]: Ready", timeout=60)
        asyncio.run(produce(kafka_bootstrap, [(nodes_topic, o.node.encode(), r.encode(o))
                                              for o in observations[4:]]))
        _wait_for_gauge(run, "fleetmedic_fleet_nodes", N)

        rng = np.random.default_rng(3)
        gpu = run.topic("telemetry.gpu")
        storm = [gpu_message(n, t0 + k, rng, xids=[r.XidEvent(gpu=1, xid=79, ts=t0 + k)]) for k, n in enumerate(STORM)]
        asyncio.run(produce(kafka_bootstrap, [(gpu, m.node.encode(), r.encode(m)) for m in storm]))

        def decisions(c: Collected) -> list[r.AuditRecord]:
            return [r.decode(r.AuditRecord, v) for v in c.values(audit)]

        tripped = collect_sync(kafka_bootstrap, [audit],
                               lambda c: any(a.decision == "breaker_tripped" for a in decisions(c)), timeout=60)
        assert any(a.decision == "breaker_tripped" for a in decisions(tripped)), \
            sorted({a.decision for a in decisions(tripped)})
        _wait_for_gauge(run, "fleetmedic_breaker_open", 1.0)

        # a deleted node leaves the topology: the fleet shrinks
        gone = r.NodeObservation(node=NODES[-1], ts=time.time(), deleted=True)
        asyncio.run(produce(kafka_bootstrap, [(nodes_topic, gone.node.encode(), r.encode(gone))]))
        _wait_for_gauge(run, "fleetmedic_fleet_nodes", N - 1)

        # a forged command: the right shape, signed with another key
        forged = sign(r.OperatorCommand(id="op-forged", action="resume_breaker", actor="mallory", reason="let me in",
                                        issued_at=time.time(), expires_at=time.time() + 600), b"x" * 32)
        operator = run.topic("remediation.operator")
        asyncio.run(produce(kafka_bootstrap, [(operator, b"fleet", r.encode(forged))]))

        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETMEDIC")}
        env.update(FLEETMEDIC_OPERATOR_KEY=OPERATOR_KEY, FLEETMEDIC__KAFKA__BOOTSTRAP_SERVERS=kafka_bootstrap,
                   FLEETMEDIC__TOPICS__PREFIX=run.settings.topics.prefix)
        ctl = subprocess.run([sys.executable, "-m", "fleetmedic.cli.main", "ctl", "resume-breaker", "--actor", "carol",
                              "--reason", "exporter rollout fixed"], env=env, capture_output=True, text=True,
                             timeout=60)
        assert ctl.returncode == 0, ctl.stderr
        assert "published resume_breaker" in ctl.stdout

        def resumed(c: Collected) -> bool:
            return any(a.decision == "breaker_resumed" for a in decisions(c)) and bool(c.values(dead))

        got = collect_sync(kafka_bootstrap, [audit, dead], resumed, timeout=60)
        assert resumed(got), f"audit {sorted({a.decision for a in decisions(got)})}, dead letters {got.values(dead)}"
        page = _wait_for_gauge(run, "fleetmedic_breaker_open", 0.0)

    (resume,) = [a for a in decisions(got) if a.decision == "breaker_resumed"]
    assert resume.actor == "operator:carol" and "exporter rollout fixed" in resume.explanation
    assert not any(a.actor == "operator:mallory" for a in decisions(got))
    letters = [r.decode(r.DeadLetter, v) for v in got.values(dead)]
    (letter,) = [d for d in letters if d.topic == operator]
    assert letter.stage == "decide" and "op-forged" in letter.error and "signature" in letter.error
    assert r.decode(r.OperatorCommand, letter.original) == forged
    assert 'fleetmedic_operator_commands_total{outcome="rejected"} 1.0' in page
    assert 'fleetmedic_operator_commands_total{outcome="applied"} 1.0' in page
    assert f'fleetmedic_dead_letters_total{{stage="decide",topic="{operator}"}} 1.0' in page
    assert _gauge(page, "fleetmedic_fleet_nodes") == N - 1
    # the operator's view of the stage: consumer lag of both stages, nodes by lifecycle state
    for stage in ("detect", "decide"):
        lags = re.findall(rf'^fleetmedic_consumer_lag{{[^}}]*stage="{stage}"[^}}]*}} (\S+)$', page, flags=re.M)
        assert lags and all(float(v) >= 0 for v in lags), f"no {stage} lag on the metrics page"
    assert re.search(r'^fleetmedic_nodes\{state="healthy"\} \S+$', page, flags=re.M)
    assert any(a.decision == "state_change" and a.node == NODES[-1] and "deleted" in a.explanation
               for a in decisions(got))


def test_detect_workers_need_no_signing_key_and_decide_workers_do(kafka_bootstrap: str, tmp_path: Path) -> None:
    run = new_run(kafka_bootstrap, tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETMEDIC")}
    decide = subprocess.run([sys.executable, "-m", "fleetmedic.cli.main", "worker", "--config", str(run.config),
                             "--role", "decide"], env=env, capture_output=True, text=True, timeout=60)
    assert decide.returncode == 2 and "signing key" in decide.stderr
    with run.log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "fleetmedic.cli.main", "worker", "--config", str(run.config),
                                 "--role", "detect"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_log(run, proc, "role detect: ready", timeout=60)
    finally:
        stop_worker(proc, run.log)
