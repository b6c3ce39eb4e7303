"""The service's ordering rule, without a broker: a job command that excludes a node waits for the
quick commands (cordon, taint) received before it for that node, and for nothing else."""

from __future__ import annotations

import asyncio

from fleetmedic.executor.service import IsolationOrder, _Offsets


def test_a_replacement_waits_for_the_isolation_received_before_it() -> None:
    async def scenario() -> None:
        order = IsolationOrder()
        cordon, taint = order.quick("n1"), order.quick("n1")
        other = order.quick("n2")
        waits = order.before_replacing(["n1"])
        assert waits == [cordon, taint]
        cordon.set_result(None)
        assert order.before_replacing(["n1"]) == [taint]
        taint.set_result(None)
        assert order.before_replacing(["n1", "n3"]) == []
        assert order.before_replacing(["n2"]) == [other]
        later = order.quick("n1")  # received after the job command: not waited for by it
        assert later not in waits

    asyncio.run(scenario())


def test_the_committed_offset_is_the_lowest_command_without_a_result() -> None:
    o = _Offsets()
    for offset in (5, 6, 7):
        o.start(offset)
    o.finish(6)
    assert o.committable() == 5
    o.finish(5)
    assert o.committable() == 7
    o.finish(7)
    assert o.committable() == 8
