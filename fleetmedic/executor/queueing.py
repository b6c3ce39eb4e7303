"""Per-target queueing for the executor's loop: commands for one target (a node, or a job) run in
order, one at a time, and different targets in parallel; between the tracks of one incident,
:class:`IsolationOrder`; what may be committed, :class:`Offsets`.

- :class:`TargetQueues`: one queue and one worker task per target (:func:`~.dispatch.target`),
  made on the target's first command; closing them lets quick actions finish and stops the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from fleetmedic import records as r
from fleetmedic.actions import JOB_ACTIONS, NODE_QUICK
from fleetmedic.executor.dispatch import target

ORDER_WAIT_S = 30.0
CLOSE_WAIT_S = 10.0
T = TypeVar("T")


@dataclass
class Offsets:
    """Offsets handed out and finished; ``committable`` is the lowest unfinished one."""

    pending: set[int] = field(default_factory=set)
    high: int = -1

    def start(self, offset: int) -> None:
        self.pending.add(offset)
        self.high = max(self.high, offset)

    def finish(self, offset: int) -> None:
        self.pending.discard(offset)

    def committable(self) -> int:
        return min(self.pending) if self.pending else self.high + 1


class IsolationOrder:
    """Ordering between the two tracks of one incident, which the decision stage publishes together
    (``restart_job`` first, then ``cordon``, ``taint``, ``drain`` of the suspect node):

    - a job command that excludes a node waits for the quick commands (cordon, taint) for that node
      received in the same fetch or earlier: the replacement pods must not meet a node that is about
      to be tainted but is not yet;
    - a drain waits for the job commands re-placing workloads off its node: evicting a pod the
      re-placement is about to delete anyway would count as a pod failure and hold the replacement
      back by the Job controller's failure backoff.

    Waits are bounded (:data:`ORDER_WAIT_S`), so no cycle can block a command for good."""

    def __init__(self) -> None:
        self._quick: dict[str, list[asyncio.Future[None]]] = {}
        self._replacing: dict[str, list[asyncio.Future[None]]] = {}

    @staticmethod
    def _add(table: dict[str, list[asyncio.Future[None]]], keys: Sequence[str]) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for key in keys:
            table[key] = [*(f for f in table.get(key, []) if not f.done()), done]
        return done

    def register(self, cmd: r.RemediationCommand) -> asyncio.Future[None] | None:
        """The future to resolve when ``cmd`` is done, for commands others may wait for."""
        if cmd.action in JOB_ACTIONS and cmd.exclude_nodes:
            return self._add(self._replacing, cmd.exclude_nodes)
        if cmd.node and cmd.action in NODE_QUICK:
            return self._add(self._quick, [cmd.node])
        return None

    def waits_for(self, cmd: r.RemediationCommand) -> list[asyncio.Future[None]]:
        """What ``cmd`` waits for (call after registering every command of the fetch)."""
        if cmd.action in JOB_ACTIONS:
            return [f for n in cmd.exclude_nodes for f in self._quick.get(n, []) if not f.done()]
        if cmd.action == "drain" and cmd.node:
            return [f for f in self._replacing.get(cmd.node, []) if not f.done()]
        return []




class TargetQueues(Generic[T]):
    """One queue per target, each drained in order by its own ``worker`` task (``None`` ends it)."""

    def __init__(self, worker: Callable[[asyncio.Queue[T | None]], Coroutine[Any, Any, None]]) -> None:
        self.worker = worker
        self.queues: dict[str, asyncio.Queue[T | None]] = {}
        self.workers: list[asyncio.Task[None]] = []

    def put(self, cmd: r.RemediationCommand, item: T) -> None:
        """Queue ``item`` behind the earlier commands for ``cmd``'s target."""
        key = target(cmd)
        if key not in self.queues:
            self.queues[key] = asyncio.Queue()
            self.workers.append(asyncio.create_task(self.worker(self.queues[key])))
        self.queues[key].put_nowait(item)

    async def close(self, timeout: float = CLOSE_WAIT_S) -> None:
        """End every worker after what it is doing: quick actions finish; a worker still busy after
        ``timeout`` (a long action that missed the stop) is cancelled."""
        for q in self.queues.values():
            q.put_nowait(None)
        for w in self.workers:
            try:
                await asyncio.wait_for(asyncio.shield(w), timeout=timeout)
            except (TimeoutError, asyncio.CancelledError):
                w.cancel()
