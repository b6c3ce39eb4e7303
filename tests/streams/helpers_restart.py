"""The restart scenario (no tests here): two 4-node jobs, two phases each with an XID 79 on one node,
waiting for a phase's commands, and the command ids of a reference run without a crash."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import numpy as np

from fleetmedic import records as r
from fleetmedic.devenv.kafka import produce
from fleetmedic.streams.app import ensure_topics
from tests.streams.helpers_harness import (
    Collected,
    Run,
    collect_sync,
    new_run,
    worker,
)
from tests.streams.helpers_scenario import gpu_round, job_events

JOBS = {"team/a": [f"gpu-node-{i}" for i in range(4)], "team/b": [f"gpu-node-{i}" for i in range(4, 8)]}
NODES = [n for nodes in JOBS.values() for n in nodes]
# (first sample, last sample, node with an XID 79, at sample)
PHASES = [(1, 6, "gpu-node-2", 3), (7, 12, "gpu-node-5", 9)]


def job_messages(run: Run) -> list[tuple[str, bytes, bytes]]:
    return job_events(run, JOBS)


def phase_telemetry(run: Run, phase: int, final_xid_everywhere: bool = False) -> list[tuple[str, bytes, bytes]]:
    first, last, sick, at = PHASES[phase]
    rng = np.random.default_rng(phase)
    return [m for k in range(first, last + 1)
            for m in gpu_round(run, k, NODES, rng, set(NODES) if final_xid_everywhere and k == last
                               else {sick} if k == at else set())]


def job_of(node: str) -> str:
    return next(j for j, nodes in JOBS.items() if node in nodes)


def phase_done(run: Run, phase: int):  # type: ignore[no-untyped-def]
    sick = PHASES[phase][2]
    commands, audit = run.topic("remediation.commands"), run.topic("remediation.audit")

    def done(c: Collected) -> bool:
        cmds = [r.decode(r.RemediationCommand, v) for v in c.values(commands)]
        audited = {cid for a in (r.decode(r.AuditRecord, v) for v in c.values(audit)) for cid in a.command_ids}
        # the job restarted; the node cordoned, or (the budget holds one node: no topology) escalated
        return (any(x.action == "restart_job" and x.job == job_of(sick) for x in cmds)
                and any(x.node == sick for x in cmds) and {x.id for x in cmds} <= audited)
    return done


def wait_phase(run: Run, bootstrap: str, phase: int, timeout: float = 60) -> None:
    topics = [run.topic("remediation.commands"), run.topic("remediation.audit")]
    got = collect_sync(bootstrap, topics, phase_done(run, phase), timeout=timeout)
    assert phase_done(run, phase)(got), f"phase {phase}: no commands after {timeout}s"


def command_ids(run: Run, bootstrap: str) -> list[str]:
    topic = run.topic("remediation.commands")
    got = collect_sync(bootstrap, [topic], lambda c: False, timeout=4)
    return [r.decode(r.RemediationCommand, v).id for v in got.values(topic)]


_REFERENCE: dict[str, list[str]] = {}
_SNAPSHOT_ONLY = re.compile(r"(engine_snapshot_every_s|snapshot_part_bytes): [0-9.]+,? ?")


def reference_commands(bootstrap: str, tmp: Path, extra: str) -> list[str]:
    """The command ids of the scenario run without a crash. When and how the decision stage
    snapshots does not change its decisions (that is what these tests prove), so one reference run
    serves every variant that differs only in those settings (it saves a worker run per test)."""
    key = _SNAPSHOT_ONLY.sub("", extra)
    if key not in _REFERENCE:
        _REFERENCE[key] = _run_reference(bootstrap, tmp, extra)
    return list(_REFERENCE[key])


def _run_reference(bootstrap: str, tmp: Path, extra: str) -> list[str]:
    run = new_run(bootstrap, tmp, extra)
    asyncio.run(ensure_topics(run.settings))
    asyncio.run(produce(bootstrap, job_messages(run)))
    with worker(run):
        for phase in (0, 1):
            asyncio.run(produce(bootstrap, phase_telemetry(run, phase)))
            wait_phase(run, bootstrap, phase)
        time.sleep(2)
    return command_ids(run, bootstrap)


async def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        return {p: (await consumer.committed(TopicPartition(topic, p))) or 0 for p in range(partitions)}
    finally:
        await consumer.stop()
