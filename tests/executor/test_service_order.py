"""The service's ordering rules, without a broker: within what it fetched, a job command that
excludes a node waits for that node's cordon and taint (even when published after it, as the
decision stage does), a drain waits for the job commands re-placing pods off its node, nothing else
waits; and the committed offset is the lowest command without a result."""

from __future__ import annotations

import asyncio
import time

from fleetmedic.executor.queueing import IsolationOrder, Offsets
from fleetmedic.records import RemediationCommand


def _cmd(action: str, node: str = "", job: str = "", exclude: list[str] | None = None) -> RemediationCommand:
    now = time.time()
    return RemediationCommand(id=f"{action}/{node or job}", action=action, incident_id="i", reason="r", issued_at=now,
                              expires_at=now + 60, node=node, job=job, exclude_nodes=exclude or [])


def test_the_tracks_of_one_incident_wait_for_each_other_as_far_as_they_must() -> None:
    async def scenario() -> None:
        order = IsolationOrder()
        # the decision stage's order: restart_job, then cordon, taint, drain of the suspect
        fetched = [_cmd("restart_job", job="ns/train", exclude=["n1"]), _cmd("cordon", "n1"), _cmd("taint", "n1"),
                   _cmd("drain", "n1"), _cmd("cordon", "n2"), _cmd("run_diagnostics", "n1")]
        done = [order.register(c) for c in fetched]
        waits = [order.waits_for(c) for c in fetched]
        assert waits[0] == [done[1], done[2]]  # restart_job waits for n1's cordon and taint
        assert waits[3] == [done[0]]  # the drain waits for the re-placement
        assert waits[1] == waits[2] == waits[4] == waits[5] == []
        assert done[3] is None and done[5] is None  # nothing waits for long node actions
        for f in (done[1], done[2]):
            assert f is not None
            f.set_result(None)
        assert order.waits_for(fetched[0]) == []

    asyncio.run(scenario())


def test_the_committed_offset_is_the_lowest_command_without_a_result() -> None:
    o = Offsets()
    for offset in (5, 6, 7):
        o.start(offset)
    o.finish(6)
    assert o.committable() == 5
    o.finish(5)
    assert o.committable() == 7
    o.finish(7)
    assert o.committable() == 8
