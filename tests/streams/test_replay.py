"""A decision worker killed after tick-fired timeouts and an operator command, on the real broker.

The run (the worker as a subprocess, as in ``test_restart.py``): an XID 79 on ``gpu-node-2``
(cordon, job restart); a clean stop and start (a snapshot); a record that moves event time past the
cordon's deadline, so that a *tick* times the cordon out and issues it again (attempt 2, a new
command id); the executor's results, the first one late (after its timeout: ignored), the second
one confirming it; an operator command (``node_repaired`` on a healthy node: audited,
nothing to do); then SIGKILL, more telemetry (an XID on ``gpu-node-5``) and a restart.

The restarted worker replays everything since the snapshot, the logged ticks among the inputs at
the place they fired, and must end with exactly the commands *and the audit records* (ids,
decisions, nodes, command ids, actors) of the same run never killed, none twice: a tick fired at
another place in the replay would have let the late result confirm the first cordon (other audit
records, other numbers), and the replayed operator command must not repeat its audit record.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import time
from collections.abc import Callable
from pathlib import Path

from fleetmedic import records as r
from fleetmedic.devenv.kafka import produce
from fleetmedic.signing import sign
from fleetmedic.streams.app import ensure_topics
from tests.streams.helpers_harness import (
    OPERATOR_KEY,
    Collected,
    Run,
    collect_sync,
    new_run,
    start_worker,
    stop_worker,
    wait_for_log,
)
from tests.streams.helpers_restart import job_messages, phase_telemetry, wait_phase
from tests.streams.helpers_scenario import T0

# ticks every 2 s; deadlines far beyond the test's wall time: only the records move time past them
EXTRA = ("streams: {engine_snapshot_every_s: 3600}\n"
         "detection: {sample_interval_s: 2}\n"
         "policy: {action_timeout_s: 300, action_retries: 2}\n")
SICK = "gpu-node-2"

AuditKey = tuple[str, str, str, str, tuple[str, ...], str]


def _commands(c: Collected, run: Run) -> list[r.RemediationCommand]:
    return [r.decode(r.RemediationCommand, v) for v in c.values(run.topic("remediation.commands"))]


def _audit(c: Collected, run: Run) -> list[r.AuditRecord]:
    return [r.decode(r.AuditRecord, v) for v in c.values(run.topic("remediation.audit"))]


def _wait(run: Run, bootstrap: str, what: str, done: Callable[[Collected], bool], timeout: float = 60) -> Collected:
    topics = [run.topic("remediation.commands"), run.topic("remediation.audit")]
    got = collect_sync(bootstrap, topics, done, timeout=timeout)
    assert done(got), f"no {what} after {timeout}s: commands {[c.id for c in _commands(got, run)]}"
    return got


def _result(run: Run, command_id: str, ts: float, action: str = "cordon") -> tuple[str, bytes, bytes]:
    res = r.RemediationResult(command_id=command_id, action=action, outcome="applied", ts=ts,  # type: ignore[arg-type]
                              node=SICK, executor="test")
    return run.topic("remediation.results"), SICK.encode(), r.encode(res)


def _cordons(c: Collected, run: Run) -> list[str]:
    return [x.id for x in _commands(c, run) if x.node == SICK and x.action == "cordon"]


def _drive(run: Run, bootstrap: str, kill: bool) -> tuple[list[str], list[AuditKey], str]:
    """The run described above; ``kill``: with the clean restart, the SIGKILL and the restart."""
    asyncio.run(ensure_topics(run.settings))
    asyncio.run(produce(bootstrap, job_messages(run)))
    proc = start_worker(run)
    try:
        asyncio.run(produce(bootstrap, phase_telemetry(run, 0)))
        wait_phase(run, bootstrap, 0)
        _wait(run, bootstrap, "cordon", lambda c: len(_cordons(c, run)) == 1)
        if kill:  # a clean stop writes a snapshot: the rest happens after it
            stop_worker(proc, run.log)
            proc = start_worker(run)
            wait_for_log(run, proc, "[^Worker]: Ready", count=2, timeout=90)
        # a result for no command moves event time past the cordon's deadline: the next tick times it out
        asyncio.run(produce(bootstrap, [_result(run, "nothing/at/all/1", T0 + 400)]))
        got = _wait(run, bootstrap, "cordon retry", lambda c: len(_cordons(c, run)) == 2)
        first, retry = _cordons(got, run)
        # the first cordon's result comes late (after its timeout): ignored; the retry's confirms it
        asyncio.run(produce(bootstrap, [_result(run, first, T0 + 401), _result(run, retry, T0 + 402)]))
        time.sleep(2)  # (a cordon confirmed is not audited: nothing to wait for; the replay would redo it anyway)
        op = sign(r.OperatorCommand(id="op-1", action="node_repaired", actor="dave", reason="checked the cables",
                                    node="gpu-node-7", issued_at=T0 + 403, expires_at=T0 + 3600), OPERATOR_KEY.encode())
        asyncio.run(produce(bootstrap, [(run.topic("remediation.operator"), b"gpu-node-7", r.encode(op))]))
        _wait(run, bootstrap, "operator audit", lambda c: any(a.actor == "operator:dave" for a in _audit(c, run)))
        if kill:
            time.sleep(1)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        asyncio.run(produce(bootstrap, phase_telemetry(run, 1)))  # waits on the broker for the next worker
        if kill:
            proc = start_worker(run)
            wait_for_log(run, proc, "[^Worker]: Ready", count=3, timeout=90)
        wait_phase(run, bootstrap, 1, timeout=90)
        time.sleep(3)
    finally:
        if proc.poll() is None:
            stop_worker(proc, run.log)
    got = collect_sync(bootstrap, [run.topic("remediation.commands"), run.topic("remediation.audit")],
                       lambda c: False, timeout=4)
    audit: list[AuditKey] = [(a.id, str(a.decision), a.node, a.job, tuple(a.command_ids), a.actor)
                             for a in _audit(got, run)]
    return [c.id for c in _commands(got, run)], audit, run.log.read_text()


def test_a_restart_replays_tick_fired_timeouts_and_operator_commands_exactly(kafka_bootstrap: str,
                                                                            tmp_path: Path) -> None:
    expected_ids, expected_audit, _ = _drive(new_run(kafka_bootstrap, tmp_path / "reference", EXTRA),
                                             kafka_bootstrap, kill=False)
    ids, audit, log = _drive(new_run(kafka_bootstrap, tmp_path / "killed", EXTRA), kafka_bootstrap, kill=True)

    assert any(i.endswith("/e1.2") for i in expected_ids if "/cordon/" in i), expected_ids  # the tick's retry
    duplicates = [i for i, n in collections.Counter(ids).items() if n > 1]
    assert not duplicates, f"commands emitted twice: {duplicates}"
    assert set(ids) == set(expected_ids), f"lost: {set(expected_ids) - set(ids)}; extra: {set(ids) - set(expected_ids)}"
    twice = [k for k, n in collections.Counter(a[0] for a in audit).items() if n > 1]
    assert not twice, f"audit records published twice: {twice}"
    assert sorted(audit) == sorted(expected_audit), (
        f"missing: {sorted(set(expected_audit) - set(audit))}\nextra: {sorted(set(audit) - set(expected_audit))}")
    assert sum(a[5] == "operator:dave" for a in audit) == 1
    assert "decision engine: restored (" in log and "audit ids on theirs" in log

