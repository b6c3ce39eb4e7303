"""When the engine last saw each node (``EngineState.seen``: telemetry, findings, job placements),
and the forgetting of nodes silent for ``safety.fleet_forget_after_s``.

:class:`Sightings` keeps the nodes in the order they were last seen, the longest unseen first, so
that the forgetting looks only at those that expired. A job's placement seen again whole (the same
list of nodes: a lock-step job restarted where it ran) is one entry of that order, a *bulk*
standing for its nodes at that time, instead of a write a node: ``seen`` then holds an older time
for those nodes until :meth:`Sightings.write` brings it up to date (the engine calls it before the
state is serialised), or the forgetting reaches them. Pure: time comes in as ``now``."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from typing import Final

from fleetmedic.remediation.placements import changed_at, swapped

#: placements of fewer nodes are written node by node
BULK_MIN: Final = 64
_BULK: Final = "\x00"  # the order's keys for bulks start with it (a node's name never does)


@dataclass
class _Bulk:
    job: str
    nodes: list[str]
    members: set[str]
    at: float


class Sightings:
    """``seen`` (node -> when last seen) and the order of its nodes (see the module's docstring)."""

    def __init__(self, seen: dict[str, float], bulk_min: int = BULK_MIN) -> None:
        self.seen = seen
        self.bulk_min = bulk_min
        #: node names and bulk keys, the longest unseen first (None: to be sorted, after a restore or
        #: a sighting stamped earlier than the last); only its keys are read
        self._order: dict[str, float | None] | None = None
        self._last = float("-inf")  # the latest sighting in the order
        self._bulks: dict[str, _Bulk] = {}  # key -> bulk, each in the order
        self._live: dict[str, str] = {}  # job -> the key of its placement's bulk
        #: job -> its placement's nodes, every one in ``seen``, and their set (built when first needed)
        self._whole: dict[str, tuple[list[str], set[str] | None]] = {}
        self._covered: set[str] = set()  # nodes of ``seen`` a bulk stands for in the order
        self._serial = 0
        self.next_forget = float("-inf")  # when the oldest sighting may expire

    def nodes(self, nodes: list[str], now: float) -> None:
        """``nodes`` were seen at ``now``: written node by node, O(1) a node."""
        fresh = dict.fromkeys(nodes, now)
        order = self._order
        if order is None or now < self._last:  # (a sighting stamped earlier than the last replaces it)
            self.write()
            self.seen.update(fresh)
            return
        self.seen.update(fresh)
        self._last = now
        if self._covered:
            self._covered.difference_update(nodes)
        deque(map(order.pop, nodes, repeat(None)), maxlen=0)  # out of their places: last seen now
        order.update(fresh)

    def placement(self, job: str, nodes: list[str], now: float) -> None:
        """``job`` was placed on ``nodes`` (read-only, the same list while the placement is the same)
        at ``now``. The same list as its last placement's, every node still in ``seen``, costs one
        bulk, and so does one that differs from it in a few positions (but for its new nodes, written
        node by node); another is written node by node, and the job's last bulk keeps standing for
        the nodes that left it."""
        whole, order = self._whole.get(job), self._order
        if whole is not None and order is not None and now >= self._last:
            if whole[0] is nodes:
                members = whole[1] if whole[1] is not None else set(nodes)
                old = self._live.pop(job, None)
                if old is not None:  # the same nodes seen later: the new bulk stands for them
                    del self._bulks[old], order[old]
                self._bulk(job, nodes, members, now)
                return
            if self._changed(job, whole, nodes, now):
                return
        old = self._live.pop(job, None)
        if old is not None:
            bulk = self._bulks[old]
            left = bulk.members.difference(nodes)
            if left:
                bulk.nodes, bulk.members = sorted(left), left
            else:
                del self._bulks[old]
                if order is not None:
                    del order[old]
        self.nodes(nodes, now)
        if len(nodes) >= self.bulk_min:
            self._whole[job] = (nodes, None)
        else:
            self._whole.pop(job, None)

    def _bulk(self, job: str, nodes: list[str], members: set[str], now: float) -> None:
        """A bulk standing for ``nodes`` (``members``, their set), the job's placement, seen at ``now``."""
        assert self._order is not None
        self._whole[job] = (nodes, members)
        key = f"{_BULK}{self._serial}"
        self._serial += 1
        self._bulks[key] = _Bulk(job, nodes, members, now)
        self._live[job] = key
        self._order[key] = None
        self._last = now

    def _changed(self, job: str, whole: tuple[list[str], set[str] | None], nodes: list[str], now: float) -> bool:
        """``nodes`` differ from the job's last placement (``whole``: its list of distinct nodes and
        their set) in a few positions (:mod:`.placements`): the nodes gained are written node by node,
        the job's last bulk keeps standing for those it left, and a new bulk for the placement takes
        the last one's set, changed. False: ``nodes`` are to be written node by node."""
        before, members = whole
        at = changed_at(before, nodes)
        if at is None:
            return False
        if members is None:
            members = set(before)
        if len(members) != len(before):
            return False
        change = swapped(before, nodes, at, members)
        if change is None:
            return False
        left, gained = change
        if gained:
            self.nodes(sorted(gained), now)
        old = self._live.pop(job, None)
        if old is not None:  # its set is the last placement's (``members``): it stands on for those left
            bulk = self._bulks[old]
            if left:
                bulk.nodes, bulk.members = sorted(left), left
            else:
                del self._bulks[old]
                assert self._order is not None
                del self._order[old]
        members.difference_update(left)
        members.update(gained)
        self._bulk(job, nodes, members, now)
        return True

    def write(self) -> None:
        """Bring ``seen`` up to date with the bulks (the order is sorted again when next needed)."""
        seen = self.seen
        for bulk in self._bulks.values():
            at = bulk.at
            for n in bulk.nodes:
                if seen.get(n, at) < at:
                    seen[n] = at
        self._bulks.clear()
        self._live.clear()
        self._covered.clear()
        self._order = None

    def remove(self, node: str) -> None:
        """``node`` leaves ``seen`` (deleted from the cluster): a later sighting adds it back."""
        self.seen.pop(node, None)
        if self._order is not None:
            self._order.pop(node, None)
        self._covered.discard(node)
        self._whole.clear()  # a placement seen again is written node by node: this one may be in it

    def forget(self, now: float, after: float, may_forget: Callable[[str], bool]) -> None:
        """Nodes not seen for ``after`` leave ``seen`` if ``may_forget`` them; the others are renewed
        (seen now) so that they are not looked at again at each call."""
        if now < self.next_forget:
            return
        horizon = now - after
        seen, order = self.seen, self._order
        if order is None or len(order) - len(self._bulks) + len(self._covered) != len(seen):
            self.write()
            order = self._order = dict.fromkeys(sorted(seen, key=seen.__getitem__))
            self._last = max(seen.values(), default=float("-inf"))
        # a node's time only moves forward, so none expires before the oldest does
        self.next_forget = self._oldest(now) + after
        if self.next_forget > now:
            return
        nodes: list[str] = []
        bulks: list[str] = []
        for key in order:  # the longest unseen first
            if key.startswith(_BULK):
                if self._bulks[key].at >= horizon:
                    break
                bulks.append(key)
            elif seen[key] >= horizon:
                break
            else:
                nodes.append(key)
        forgot: set[str] = set()
        for n in nodes:
            del order[n]
            if self._expire(n, horizon, now, may_forget):
                forgot.add(n)
        for key in bulks:
            bulk = self._bulks.pop(key)
            del order[key]
            if self._live.get(bulk.job) == key:
                del self._live[bulk.job]
            for n in bulk.nodes:  # those it stands for in the order expired with it
                if n in self._covered and seen.get(n, float("inf")) <= bulk.at:
                    self._covered.discard(n)
                    if self._expire(n, horizon, now, may_forget):
                        forgot.add(n)
        if forgot:  # a placement with a node forgotten is written node by node when seen again
            self._whole = {job: (w[0], members) for job, w in self._whole.items()
                           if (members := w[1] if w[1] is not None else set(w[0])).isdisjoint(forgot)}
        self._last = max(self._last, now)
        self.next_forget = self._oldest(now) + after

    def _expire(self, n: str, horizon: float, now: float, may_forget: Callable[[str], bool]) -> bool:
        """``n``, out of the order, was last seen before ``horizon`` unless a later bulk stands for it
        (then it takes that bulk's time, and the bulk its place in the order); else it is forgotten
        (True) or renewed."""
        later = max((b.at for b in self._bulks.values() if b.at >= horizon and n in b.members), default=None)
        if later is not None:
            self.seen[n] = later
            self._covered.add(n)
            return False
        order = self._order
        assert order is not None
        if may_forget(n):
            del self.seen[n]
            return True
        self.seen[n] = now
        order[n] = None
        return False

    def _oldest(self, now: float) -> float:
        order = self._order
        if not order:
            return now
        first = next(iter(order))
        return self._bulks[first].at if first.startswith(_BULK) else self.seen[first]
