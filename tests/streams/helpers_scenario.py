"""The workload the broker-fault tests share (no tests here): jobs placed on GPU nodes, rounds of
GPU telemetry 10 s of event time apart with XID 79 on chosen nodes, and a dedicated broker for a
test that stops or kills it. Used by tests/streams/test_restart.py (and the tests built on it) and
tests/services/helpers_cluster.py (the secure three-broker cluster)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fleetmedic import records as r
from fleetmedic.devenv import proc
from fleetmedic.devenv.kafka import Kafka
from fleetmedic.devenv.synth import gpu_message
from tests.conftest import unavailable
from tests.streams.helpers_harness import Run

T0 = 1_700_000_000.0


def job_events(run: Run, jobs: dict[str, list[str]]) -> list[tuple[str, bytes, bytes]]:
    """What a job watcher publishes for each of ``jobs`` (job -> its nodes, rank order), placed at
    :data:`T0`: its placement, then its start; ``(topic, key, value)`` for ``jobs.events``."""
    out = []
    for job, nodes in jobs.items():
        placement = r.JobEvent(job=job, event="placement", ts=T0, world_size=len(nodes),
                               placement=[r.RankPlacement(rank=i, node=n, gpus=list(range(8)))
                                          for i, n in enumerate(nodes)])
        out += [(run.topic("jobs.events"), job.encode(), r.encode(e))
                for e in (placement, r.JobEvent(job=job, event="start", ts=T0))]
    return out


def gpu_round(run: Run, k: int, nodes: list[str], rng: np.random.Generator,
              xid_on: frozenset[str] | set[str] = frozenset()) -> list[tuple[str, bytes, bytes]]:
    """Round ``k``: one GPU sample per node at ``T0 + 10 k``, with an XID 79 on GPU 3 of the nodes
    in ``xid_on``; ``(topic, key, value)`` for ``telemetry.gpu``, key the node."""
    t = T0 + 10 * k
    out = []
    for n in nodes:
        msg = gpu_message(n, t, rng, xids=[r.XidEvent(gpu=3, xid=79, ts=t)] if n in xid_on else None)
        out.append((run.topic("telemetry.gpu"), n.encode(), r.encode(msg)))
    return out


def dedicated_broker(where: Path) -> Kafka:
    """A single broker of its own on free loopback ports, started (the session's broker is shared:
    a test that stops or kills its broker takes this one). Stop it when done. One that does not
    start fails the test under CI and skips it elsewhere."""
    port, controller_port = proc.free_ports(2)
    broker = Kafka(where, port=port, controller_port=controller_port)
    try:
        broker.start(timeout=180)
    except (proc.ServiceError, OSError) as exc:
        broker.stop()
        unavailable("a dedicated Kafka broker", str(exc))
    return broker
