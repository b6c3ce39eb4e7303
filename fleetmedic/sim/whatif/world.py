"""The replayed cluster: nodes, the faults of a history, a workload, and the time lost, event by event.

:class:`World` keeps a heap of timed events and the state a policy acts on:

- **Nodes** are schedulable unless cordoned (by a policy or for planned work), NotReady (a node
  condition of a host that is down: Kubernetes stops placing there whatever the policy), or busy
  with diagnostics, a GPU reset, a reboot or a repair.
- **Faults** start at the history's ``start``. What they do comes from the mapping's entry:
  ``crash`` fails a job running on the node at once and every job placed there later
  (``crash_after_s`` into its start); ``slow`` slows a lock-step job by ``slowdown`` while it runs
  there; a degradation left in service turns into its ``then`` entry after ``then_after_s``. A fault
  ends only by a repair: it starts when a policy sends the node to repair and lasts the history's
  ``end - start`` (a fault without an end is not repaired within the history).
- **The workload**: one lock-step job on ``big_job_fraction`` of the nodes and single-node jobs on
  ``small_job_fraction``, the rest spare. A failure loses the work since the job's last checkpoint
  (every ``checkpoint_s`` of running); the job's controller restarts it after
  ``controller_restart_s`` (at most ``backoff_limit`` times in a row; a policy may restart it
  sooner, excluding nodes); a restart needs free schedulable nodes (the big job may preempt small
  ones) and costs ``restart_overhead_s`` before it runs again.

Time lost is accounted per job in GPU-seconds and per node in node-seconds (:class:`Tally`), as
each state changes, so a run costs O(events), not O(time x nodes).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import operator
import random
import sys
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

from fleetmedic.sim.whatif.history import History, HistoryFault
from fleetmedic.sim.whatif.mapping import Entry, Mapping

SAMPLE_S: Final = 3600.0  # the capacity timeline's interval
JobState = Literal["running", "waiting_to_detect", "waiting_for_capacity", "restart_overhead"]
#: where a job's GPU time goes
JOB_BUCKETS: Final = ("useful", "running_degraded", "lost_since_checkpoint", "waiting_to_detect",
                      "waiting_for_capacity", "restart_overhead")


@dataclass(frozen=True)
class Assumptions:
    """Every assumption of a replay (printed with its results; each is a ``whatif`` flag)."""

    nodes: int
    gpus_per_node: int = 8
    big_job_fraction: float = 0.9
    small_job_fraction: float = 0.05
    preempt_small: bool = True
    checkpoint_s: float = 1800.0
    restart_overhead_s: float = 600.0
    controller_restart_s: float = 30.0
    backoff_limit: int = 6
    crash_after_s: float = 60.0
    human_delay_s: float = 1800.0
    human_spread: float = 0.5  # sigma of the lognormal spread around human_delay_s
    human_suspect_after: int = 2  # failures on one node before a person suspects it without device evidence
    npd_delay_s: float = 30.0  # node-problem-detector's condition + draino's cordon and drain
    not_ready_after_s: float = 40.0  # Kubernetes' node-monitor-grace-period
    executor_latency_s: float = 2.0
    drain_grace_s: float = 30.0
    diagnostics_s: tuple[float, float, float, float] = (90.0, 600.0, 1500.0, 7200.0)
    diag_false_fail: float = 0.01
    diag_false_pass: float = 0.05
    reset_gpu_s: float = 90.0
    reboot_s: float = 600.0
    repair_no_fault_s: float = 7200.0  # a technician who finds nothing returns the node after this
    nodes_per_leaf: int = 32
    nodes_per_rack: int = 4
    tick_s: float = 10.0
    seed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


@dataclass
class Fault:
    """A history fault as it plays out: its current entry (a degradation may turn hard)."""

    id: int
    source: HistoryFault
    entry: Entry
    node: int
    onset: float
    active: bool = True
    turned_at: float | None = None
    evidence_at: float = 0.0  # when the current evidence becomes observable
    confirmable_at: float = 0.0  # when it could first be acted on
    repaired_at: float | None = None
    passed_diagnostics: bool = False  # a diagnostic passed on its node while it was active (an escape)

    @property
    def harmful(self) -> bool:
        return self.entry.effect in ("crash", "slow") or self.entry.evidence == "planned"

    @property
    def visible(self) -> bool:
        return self.entry.kind.visible


class Parking:
    """The lock-step job released last, while it waits to be placed again: its nodes (those still its
    own, see :class:`Node`) stay out of the world's ``free`` set, so its release and its placement back
    where it ran do not move thousands of nodes out of ``free`` and into it again. ``out``: those of its
    nodes that are not schedulable (the others are free). ``room``: moves on whenever a node may have
    become placeable for a waiting job (a node changed, a job released or placed, an exclusion lifted),
    so a placement that found no room is not tried again before it does."""

    __slots__ = ("job", "out", "room")

    def __init__(self) -> None:
        self.job: Job | None = None
        self.out: set[int] = set()
        self.room = 0


class Node:
    """A node of the replayed cluster. Its placement state (``cordoned_by``, ``not_ready``, ``busy``,
    ``job``) keeps ``free``, the world's set of nodes a job may be placed on now (but the parked job's,
    :class:`Parking`), up to date as it changes, and ``blocked``, the world's set of nodes that are not
    schedulable, so placing a job looks at the free nodes only.

    ``job`` is the job whose pods run here: ``_job`` names the job last placed on the node, and counts
    only while that job holds its nodes (its ``nodes`` are not empty). A failed job so releases its
    nodes without visiting them, and a job placed again where it ran writes only the nodes that
    changed (see :meth:`World._assign`)."""

    __slots__ = ("_busy", "_cordoned_by", "_job", "_not_ready", "acct", "blocked", "busy_until", "faults", "free",
                 "index", "name", "parking", "repair_waiters", "since", "validating")

    def __init__(self, name: str, index: int, since: float = 0.0, free: set[int] | None = None,
                 blocked: set[int] | None = None, parking: Parking | None = None) -> None:
        self.name = name
        self.index = index
        self._cordoned_by = ""  # "" | policy name | "planned"
        self._not_ready = False
        self._busy = ""  # "" | diagnostics | reset_gpu | reboot | repair
        self.busy_until = 0.0
        self.validating = False  # repaired after a real fault, held until it returns to service
        self.repair_waiters: list[Callable[[float], None]] = []  # told when the repair ends
        self._job: Job | None = None
        self.faults: list[Fault] = []
        self.since = since  # when the accounted state below began
        # (schedulable, held without a harmful fault, the harmful fault's effect, visible, confirmable_at, evidence)
        self.acct: tuple[bool, bool, str, bool, float, str, str, bool] = (
            True, False, "", False, 0.0, "", "", False)
        self.free = free if free is not None else set()
        self.blocked = blocked if blocked is not None else set()
        self.parking = parking if parking is not None else Parking()
        self.free.add(index)

    def _sync(self) -> None:
        self.parking.room += 1
        parked = self.parking.job
        if parked is not None and self._job is parked:  # the parked job's: in ``parking.out`` or free
            if self._cordoned_by or self._not_ready or self._busy:
                self.blocked.add(self.index)
                self.parking.out.add(self.index)
            else:
                self.blocked.discard(self.index)
                self.parking.out.discard(self.index)
            return
        if self._cordoned_by or self._not_ready or self._busy:
            self.blocked.add(self.index)
            self.free.discard(self.index)
        else:
            self.blocked.discard(self.index)
            if self.job is None:
                self.free.add(self.index)
            else:
                self.free.discard(self.index)

    @property
    def cordoned_by(self) -> str:
        return self._cordoned_by

    @cordoned_by.setter
    def cordoned_by(self, value: str) -> None:
        self._cordoned_by = value
        self._sync()

    @property
    def not_ready(self) -> bool:
        return self._not_ready

    @not_ready.setter
    def not_ready(self, value: bool) -> None:
        self._not_ready = value
        self._sync()

    @property
    def busy(self) -> str:
        return self._busy

    @busy.setter
    def busy(self, value: str) -> None:
        self._busy = value
        self._sync()

    @property
    def job(self) -> Job | None:
        job = self._job
        return job if job is not None and job.nodes else None

    @property
    def schedulable(self) -> bool:
        return not (self._cordoned_by or self._not_ready or self._busy)

    def fault(self) -> Fault | None:
        """The active fault (the most harmful first: crash, then slow)."""
        faults = self.faults
        if len(faults) == 1:  # most often
            return faults[0] if faults[0].active else None
        live = [f for f in faults if f.active]
        if not live:
            return None
        return min(live, key=lambda f: ({"crash": 0, "slow": 1, "none": 2}[f.entry.effect], f.onset))


@dataclass
class Job:
    name: str
    index: int
    size: int
    gpus_per_node: int
    big: bool
    nodes: list[int] = field(default_factory=list)
    state: JobState = "running"
    since: float = 0.0
    run_since: float = 0.0  # start of the current running stretch (checkpoints count from it)
    slow: float = 0.0
    attempt: int = 0
    failures_in_a_row: int = 0
    restart_requested: bool = False
    exclude: set[int] = field(default_factory=set)
    prev_nodes: list[int] = field(default_factory=list)  # where its last attempt ran
    prev_set: set[int] = field(default_factory=set)  # the same, as a set (read-only: shared with ``owned``)
    #: the nodes whose ``_job`` is this job (the nodes of its last placement, less ``lost``); read-only,
    #: replaced at each placement
    owned: set[int] = field(default_factory=set)
    lost: set[int] = field(default_factory=set)  # of ``owned``, nodes placed for another job since
    started_at: float = 0.0  # when its current attempt was placed
    restarted_by: str = ""  # who asked for its current placement: controller, a policy
    buckets: dict[str, float] = field(default_factory=lambda: dict.fromkeys(JOB_BUCKETS, 0.0))
    interruptions: int = 0
    #: what its last placement found no room on: the world's ``parking.room``, the exclusions (the set
    #: and its size) and ``prev_set``; the placement is not tried again while they stay
    no_room: tuple[int, set[int] | frozenset[int], int, set[int]] | None = None

    @property
    def ref(self) -> str:
        return f"default/{self.name}"

    @property
    def gpus(self) -> int:
        return self.size * self.gpus_per_node


@dataclass
class Tally:
    """What a replay counts besides the jobs' time."""

    dangerous_s: float = 0.0  # node-seconds: a crash fault on a schedulable node
    degraded_s: float = 0.0  # node-seconds: a slow fault on a schedulable node
    dangerous_past_decision_s: float = 0.0  # of those, past the confirmable evidence plus one decision interval
    dangerous_after_passed_diagnostics_s: float = 0.0  # of those, after a diagnostic passed despite the fault
    degraded_past_decision_s: float = 0.0
    schedulable_by_evidence: dict[str, list[float]] = field(default_factory=dict)  # [all, past decision]
    silent_schedulable_s: float = 0.0  # harmful faults without visible evidence, schedulable
    false_held_s: float = 0.0  # node-seconds: held by the policy without a harmful fault
    validation_held_s: float = 0.0  # node-seconds: held after a real fault's repair until back in service
    unschedulable_by: dict[str, float] = field(default_factory=dict)  # "who|busy|fault?" -> node-seconds
    placements_on_faulty: int = 0
    placements_on_suspected: int = 0
    placements_on_suspected_by: dict[str, int] = field(default_factory=dict)  # who restarted the job
    placements_on_undetected: dict[str, int] = field(default_factory=dict)
    isolations: int = 0
    false_isolations: int = 0
    repairs: int = 0
    diagnostics: int = 0
    mttr_phases: dict[str, list[float]] = field(default_factory=lambda: {
        "detect": [], "wait_for_capacity": [], "restart": [], "total": []})


def _among(nodes: set[int], table: dict[int, Fault]) -> list[int]:
    """The keys of ``table`` in ``nodes``, looking up the smaller in the larger (``set.intersection``
    with a dict walks the whole dict)."""
    if len(nodes) <= len(table):
        return [n for n in nodes if n in table]
    return [n for n in table if n in nodes]


def _keep_ranks(job: Job, kept: set[int], fill: Iterable[int]) -> list[int]:
    """The nodes of ``job``'s ranks, rank ``i`` on the ``i``-th: those of ``kept`` (nodes its last
    attempt ran on) each where its rank ran, the ranks whose node is not kept on ``fill``'s nodes in
    its order, as the scheduler gives them (a restarted pod keeps its name and index: a lock-step
    job placed again without a node or two changes those ranks only). A job placed for the first
    time, or at another size, takes ``kept`` and ``fill`` in node order."""
    prev = job.prev_nodes
    if len(prev) != job.size:
        return sorted([*kept, *fill])
    chosen = list(prev)
    to_fill = iter(fill)
    for i in itertools.compress(itertools.count(), map(operator.not_, map(kept.__contains__, prev))):
        chosen[i] = next(to_fill)
    return chosen


def shuffle(rng: random.Random, x: list[int], batch: int = 0) -> None:
    """``rng.shuffle(x)``: the same permutation from the same generator, drawn faster. Python's shuffle
    draws ``_randbelow(i + 1)`` for each ``i`` from the end, each draw taking 32-bit words of the
    generator's output until one's top ``k`` bits (``getrandbits(k)``, ``k`` the bit length of
    ``i + 1``) are below ``i + 1``; here the words come in batches (the generator is left further on)
    and the loop runs per bit length. ``batch``: words a batch (default: enough for one shuffle, most
    often)."""

    def words(count: int) -> array[int]:
        out = array("I", rng.getrandbits(32 * count).to_bytes(4 * count, "little"))
        if sys.byteorder != "little":
            out.byteswap()
        return out

    top = len(x) - 1
    buf, p = words(batch or top + top // 2 + 64), 0
    if _native_shuffle is not None:  # the same loop in C (_shuffle.c)
        while top >= 1:
            top, p, done = _native_shuffle(x, buf, p, top)
            if done:
                return
            buf, p = words(batch or top + 64), 0  # the batch ran out: the next one, drawing again for top
        return
    while top >= 1:
        k = (top + 1).bit_length()
        lo = max(1, (1 << (k - 1)) - 1)  # the draws below i + 1 in [2**(k-1), 2**k) keep k bits
        shift = 32 - k
        i = top
        try:
            for i in range(top, lo - 1, -1):
                b = i + 1
                j = buf[p] >> shift
                p += 1
                while j >= b:
                    j = buf[p] >> shift
                    p += 1
                x[i], x[j] = x[j], x[i]
        except IndexError:  # the batch ran out: the next one, drawing again for this i
            buf, p, top = words(batch or i + 64), 0, i
            continue
        top = lo - 1


try:  # the shuffle's loop in C (_shuffle.c), built with the package where a C compiler is found
    from fleetmedic.sim.whatif._shuffle import run as _native_shuffle
except ImportError:  # pragma: no cover - the Python loop below draws the same permutation
    _native_shuffle = None


class Policy(Protocol):
    """What the world calls on the policy it replays (the policies implement it)."""

    name: str

    def start(self, world: World, t: float) -> None: ...
    def fault_started(self, world: World, f: Fault, t: float) -> None: ...
    def fault_repaired(self, world: World, f: Fault, t: float) -> None: ...
    def job_failed(self, world: World, job: Job, node: int, was_on: list[int], t: float, why: str) -> None: ...
    def job_placed(self, world: World, job: Job, t: float) -> None: ...
    def suspected(self, world: World, node: int, t: float) -> bool: ...
    def unbindable(self, world: World, t: float) -> frozenset[int]: ...


class World:
    def __init__(self, history: History, mapping: Mapping, assumptions: Assumptions, policy: Policy,
                 decision_interval_s: float, confirm_s: float = 600.0) -> None:
        self.a = a = assumptions
        self.history = history
        self.mapping = mapping
        self.policy = policy
        self.decision_interval_s = decision_interval_s
        self.confirm_s = confirm_s
        self.t = history.start
        self.end = history.end
        self._heap: list[tuple[float, int, Callable[[float], object]]] = []
        self._seq = itertools.count()
        names = list(history.nodes)
        names += [f"spare-{i:05d}" for i in range(max(0, a.nodes - len(names)))]
        #: the nodes a job may be placed on now (no job, schedulable): the nodes keep it up to date
        self.free: set[int] = set()
        #: the nodes that are not schedulable (cordoned, NotReady or busy)
        self.blocked: set[int] = set()
        #: the lock-step job released last, whose free nodes are not in ``free`` (:meth:`free_now`)
        self.parking = Parking()
        self.nodes = [Node(n, i, since=self.t, free=self.free, blocked=self.blocked, parking=self.parking)
                      for i, n in enumerate(names)]
        #: the nodes with an active fault, and of those the nodes whose fault (:meth:`Node.fault`) crashes jobs
        self.faulty: set[int] = set()
        self.crashing: dict[int, Fault] = {}  # node -> its fault (:meth:`Node.fault`), which crashes jobs
        #: the nodes small jobs hold (the big job may preempt them)
        self._small: set[int] = set()
        #: the jobs waiting for capacity, by index
        self._waiting: dict[int, Job] = {}
        self._waiting_big: dict[int, Job] = {}  # of those, the big jobs (they may preempt small ones)
        #: the jobs whose ``exclude`` may name nodes, by index (a node back in service leaves theirs)
        self._excluding: dict[int, Job] = {}
        self.index = {n.name: n.index for n in self.nodes}
        self.unmapped: dict[str, int] = {}
        self.faults: list[Fault] = []
        self.tally = Tally()
        self.jobs: list[Job] = []
        self._by_ref: dict[str, Job] = {}  # (:meth:`job_by_ref`)
        self._outage: dict[int, dict[str, float]] = {}
        self.schedulable_count = len(self.nodes)
        #: (time, schedulable nodes, GPUs doing useful work): the capacity plot's points, hourly
        self.timeline: list[tuple[float, int, float]] = []
        self._place_initial(random.Random(f"{a.seed}:placement"))
        self.at(self.t, self._sample)
        for hf in history.faults:
            entry = mapping.lookup(hf.category)
            if entry is None:
                self.unmapped[hf.category] = self.unmapped.get(hf.category, 0) + 1
                continue
            self.at(hf.start, functools.partial(self._onset, hf, entry))

    # --- the event loop ---------------------------------------------------------------------------

    def at(self, t: float, fn: Callable[[float], object]) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), fn))

    def run(self, progress: Callable[[float], None] | None = None) -> None:
        self.policy.start(self, self.t)
        span = max(1.0, self.end - self.history.start)
        shown = -1
        while self._heap and self._heap[0][0] <= self.end:
            t, _, fn = heapq.heappop(self._heap)
            self.t = max(self.t, t)
            fn(self.t)
            if progress is not None:  # told at each thousandth of the history
                done = int(1000 * (self.t - self.history.start) / span)
                if done != shown:
                    shown = done
                    progress(done / 1000)
        self.t = self.end
        for job in self.jobs:
            self._job_state(job, job.state, self.end)
        for node in self.nodes:
            self._account_node(node, self.end)

    def _sample(self, t: float) -> None:
        useful = sum(j.gpus * (1 - j.slow) for j in self.jobs if j.state == "running")
        self.timeline.append((t, self.schedulable_count, useful))
        self.at(t + SAMPLE_S, self._sample)

    def rng(self, *key: object) -> random.Random:
        return random.Random(":".join(map(str, (self.a.seed, *key))))

    def human_delay(self, *key: object) -> float:
        z = self.rng("human", *key).gauss(0.0, 1.0)
        return self.a.human_delay_s * math.exp(self.a.human_spread * z - self.a.human_spread ** 2 / 2)

    # --- workload ---------------------------------------------------------------------------------

    def job_by_ref(self, ref: str) -> Job | None:
        """The job a command names (``namespace/name``), or None."""
        if len(self._by_ref) != len(self.jobs):
            self._by_ref = {j.ref: j for j in self.jobs}
        return self._by_ref.get(ref)

    def _place_initial(self, rng: random.Random) -> None:
        a = self.a
        order = list(range(len(self.nodes)))
        rng.shuffle(order)
        big = max(1, round(a.big_job_fraction * len(self.nodes)))
        small = max(0, min(len(self.nodes) - big, round(a.small_job_fraction * len(self.nodes))))
        job = Job("big", 0, big, a.gpus_per_node, True, since=self.t, run_since=self.t)
        self.jobs.append(job)
        self._assign(job, order[:big])
        for k, n in enumerate(order[big:big + small]):
            j = Job(f"small-{k:05d}", k + 1, 1, a.gpus_per_node, False, since=self.t, run_since=self.t)
            self.jobs.append(j)
            self._assign(j, [n])

    def _assign(self, job: Job, nodes: list[int], chosen: set[int] | None = None) -> None:
        """Place ``job`` on ``nodes`` (free; ``chosen``: the same as a set, when the caller has it).
        Only the nodes that differ from the job's last placement, or were placed for another job
        since, are written: a lock-step job placed again where it ran costs its set operations, not
        a step per node."""
        chosen = set(nodes) if chosen is None else chosen
        owned, lost, table = job.owned, job.lost, self.nodes
        self.parking.room += 1  # (a small job's nodes are more the big job may preempt)
        same = chosen is owned  # placed where it ran
        back = same and self.parking.job is job  # parked, and back on its nodes: none of them is in ``free``
        if back:
            self.free.difference_update(lost)  # but those placed for another job since, freed by it
            self.parking.job, self.parking.out = None, set()
        elif self.parking.job is job:  # placed elsewhere: its free nodes are free nodes like the others
            self._unpark()
        for n in () if same else owned.difference(chosen).difference(lost):  # the nodes it leaves: clear their job
            table[n]._job = None
        for n in lost.intersection(chosen) if same else chosen.difference(owned).union(lost.intersection(chosen)):
            node = table[n]
            before = node._job
            if before is not None and before is not job:
                before.lost.add(n)
            node._job = job
        job.nodes, job.owned, job.lost = nodes, chosen, set()
        if not back:
            free = self.free
            free.difference_update(nodes)
            if len(nodes) > 4 * len(free):
                # a set keeps the table it grew to: the few free nodes left after a lock-step job took
                # the rest would cost a walk over that table at every look (each waiting job's room)
                left = list(free)
                free.clear()
                free.update(left)
        if not job.big:
            self._small.update(nodes)

    def _release(self, job: Job) -> None:
        """The job's pods are gone: its nodes (all still its own: a node is placed for another job only
        when free) are free again unless not schedulable; ``job.nodes`` empty, each node's ``_job``
        no longer counts. A lock-step job's nodes are parked (:class:`Parking`), not put in ``free``."""
        self.parking.room += 1
        if job.big:
            self._unpark()
            self.parking.job, self.parking.out = job, self.blocked.intersection(job.owned).difference(job.lost)
            job.nodes = []
            return
        blocked = self.blocked  # (``free`` holds no blocked node: only the job's nodes are looked up)
        self.free.update([n for n in job.nodes if n not in blocked])
        self._small.difference_update(job.nodes)
        job.nodes = []

    def _unpark(self) -> None:
        """The parked job's free nodes go into ``free``: none is parked any more."""
        if self.parking.job is not None:
            self.free.update(self._parked())
            self.parking.job, self.parking.out = None, set()

    def _parked(self) -> set[int]:
        """The parked job's free nodes (empty when none is parked)."""
        parked = self.parking.job
        return set() if parked is None else parked.owned.difference(parked.lost).difference(self.parking.out)

    def free_count(self) -> int:
        """How many nodes a job may be placed on now (``free`` and the parked job's free nodes)."""
        parked = self.parking.job
        if parked is None:
            return len(self.free)
        return len(self.free) + len(parked.owned) - len(parked.lost) - len(self.parking.out)

    def free_now(self) -> set[int]:
        """The nodes a job may be placed on now (read-only: ``free`` itself when no job is parked)."""
        return self.free if self.parking.job is None else self.free.union(self._parked())

    def _all_free(self, nodes: set[int]) -> bool:
        """Whether a job may be placed on every one of ``nodes`` now."""
        parked = self.parking.job
        if parked is None:
            return self.free.issuperset(nodes)
        if nodes is parked.owned:  # the parked job's own nodes: none out, those placed for another job since free
            return not self.parking.out and self.free.issuperset(parked.lost)
        rest = nodes.difference(self.free)  # the others must be the parked job's free nodes
        return rest <= parked.owned and rest.isdisjoint(parked.lost) and rest.isdisjoint(self.parking.out)

    def _free_among(self, nodes: set[int]) -> int:
        """How many of ``nodes`` a job may be placed on now."""
        n = len(self.free.intersection(nodes))
        parked = self.parking.job
        if parked is not None:
            n += len(parked.owned.intersection(nodes).difference(parked.lost).difference(self.parking.out))
        return n

    def _faults_changed(self, node: Node) -> None:
        """A fault of ``node`` started, turned hard or ended: ``faulty`` and ``crashing`` follow."""
        f = node.fault()
        if f is None:
            self.faulty.discard(node.index)
            self.crashing.pop(node.index, None)
            return
        self.faulty.add(node.index)
        if f.entry.effect == "crash":
            self.crashing[node.index] = f
        else:
            self.crashing.pop(node.index, None)

    def _job_state(self, job: Job, state: JobState, t: float) -> None:
        """Account the job's time since its last change, then enter ``state``."""
        o = self._outage.get(job.index)
        if o is not None and job.state != "running":
            o[job.state] = o.get(job.state, 0.0) + max(0.0, t - job.since)
        dt = max(0.0, t - job.since) * job.gpus
        if job.state == "running":
            job.buckets["useful"] += dt * (1 - job.slow)
            job.buckets["running_degraded"] += dt * job.slow
        else:
            job.buckets[job.state] += dt
        job.state, job.since = state, t
        if state == "waiting_for_capacity":
            self._waiting[job.index] = job
            if job.big:
                self._waiting_big[job.index] = job
        else:
            self._waiting.pop(job.index, None)
            self._waiting_big.pop(job.index, None)

    def _update_slow(self, job: Job, t: float) -> None:
        slow = 0.0
        # of the job's nodes (those it owns, while it holds them), only those with an active fault slow it
        for n in self.faulty.intersection(job.owned) if job.nodes else ():
            f = self.nodes[n].fault()
            if f is not None and f.entry.effect == "slow":
                slow = max(slow, f.entry.slowdown)
        if slow != job.slow:
            self._job_state(job, job.state, t)
            job.slow = slow

    def fail_job(self, job: Job, node: int, t: float, why: str) -> None:
        """The job's attempt dies on ``node``: work since its checkpoint is lost, its nodes freed."""
        if job.state not in ("running", "restart_overhead"):
            return
        if job.state == "running":
            ran = t - job.run_since
            since_ckpt = ran - self.a.checkpoint_s * math.floor(ran / self.a.checkpoint_s)
            lost = min(since_ckpt, t - job.since) * job.gpus * (1 - job.slow)
            self._job_state(job, "waiting_to_detect", t)
            moved = min(lost, job.buckets["useful"])
            job.buckets["useful"] -= moved
            job.buckets["lost_since_checkpoint"] += moved
        else:
            self._job_state(job, "waiting_to_detect", t)
        if job.index not in self._outage:
            job.interruptions += 1
            self._outage[job.index] = {"failed": t}
        job.failures_in_a_row += 1
        job.restart_requested = False
        # the exclusions a restart wrote into the job's template stay for the controller's restarts
        was_on = job.nodes  # (read-only: a placement replaces the list)
        if was_on:
            job.prev_nodes, job.prev_set = was_on, job.owned
        self._release(job)
        job.slow = 0.0
        attempt = job.attempt
        self.policy.job_failed(self, job, node, was_on, t, why)
        if job.failures_in_a_row <= self.a.backoff_limit:
            self.at(t + self.a.controller_restart_s,
                    lambda at: self.request_restart(job, set(), at, "controller", attempt))

    def request_restart(self, job: Job, exclude: set[int], t: float, by: str, attempt: int | None = None) -> bool:
        """Restart a failed job (``attempt``: only if it is still that attempt's failure); a running job
        is stopped first (its ranks killed). False when there is nothing to restart."""
        if attempt is not None and (job.attempt != attempt or job.state != "waiting_to_detect"):
            return False
        if job.state in ("running", "restart_overhead"):
            self.fail_job(job, min(job.nodes) if job.nodes else -1, t, f"stopped by {by}")
        if job.state == "waiting_to_detect":
            self._job_state(job, "waiting_for_capacity", t)
        job.restart_requested = True
        self.add_exclusions(job, exclude)
        job.restarted_by = by
        self.try_place(t)
        return True

    def add_exclusions(self, job: Job, nodes: set[int]) -> None:
        """The job's pods may not go to ``nodes`` (a required NotIn on its template) until each is back
        in service (:meth:`uncordon`)."""
        job.exclude |= nodes
        if job.exclude:
            self._excluding[job.index] = job

    def try_place(self, t: float) -> None:
        """Place waiting jobs, the big job first (it may preempt small ones)."""
        if not self._waiting:
            return
        if not self.free_count() and not self._waiting_big:
            return  # no free node, and no job that may preempt: none can be placed
        for job in sorted(self._waiting.values(), key=lambda j: (not j.big, j.index)):
            # a job that may not preempt needs as many free nodes as it has pods
            if job.state == "waiting_for_capacity" and (job.big or job.size <= self.free_count()):
                self._place(job, t)

    def _place(self, job: Job, t: float) -> None:
        # the scheduler puts the pods back where they ran when it may (images cached, the gang's
        # topology kept), and takes the rest from the free nodes in random order
        again, chosen_set = job.prev_set, None
        # a bind-time check (the policy's, where it has one) refuses the nodes whose cordon is on its way
        refused = self.policy.unbindable(self, t)
        exclude = job.exclude | refused if refused else job.exclude
        room_at, last = self.parking.room, job.no_room
        if (last is not None and last[0] == room_at and last[1] is exclude and last[2] == len(exclude)
                and last[3] is again):
            return  # it found no room, and nothing that could make some has happened since
        if len(again) == job.size and self._all_free(again) and again.isdisjoint(exclude):
            chosen = job.prev_nodes  # every pod goes back, each rank where it ran: no random order
            chosen_set = again
        else:
            room = self.free_count() - self._free_among(exclude)
            preempt = room < job.size and job.big and self.a.preempt_small
            # the schedulable nodes of small jobs (each holds its nodes: they are its own)
            victims = sorted(self._small.difference(self.blocked).difference(exclude)) if preempt else []
            if room + len(victims) < job.size:
                job.no_room = (room_at, exclude, len(exclude), again)
                return  # not enough room, even preempting: the free nodes need not be ordered
            self._unpark()  # the scheduler's random order is over every free node: the parked ones join ``free``
            free = sorted(self.free - exclude if exclude else self.free)
            for n in victims[: job.size - len(free)] if preempt else ():  # room enough with them
                small = self.nodes[n].job
                assert small is not None
                self.fail_job(small, n, t, "preempted by the big job")
                free.append(n)
            if len(free) < job.size:
                return
            kept = again.intersection(free)  # (``free`` holds distinct nodes)
            if len(kept) < job.size:
                shuffle(self.rng("place", job.name, job.attempt, round(t)), free)
                # where the pods ran first (all of them), then the rest in the scheduler's order
                rest = itertools.filterfalse(again.__contains__, free)
                chosen = _keep_ranks(job, kept, itertools.islice(rest, job.size - len(kept)))
            else:
                chosen = sorted(list(filter(again.__contains__, free))[: job.size])
        job.attempt += 1
        job.restart_requested = False
        job.started_at = t
        self._assign(job, chosen, chosen_set)
        self._job_state(job, "restart_overhead", t)
        attempt = job.attempt
        faulty = sorted(_among(job.owned, self.crashing))  # the chosen nodes with a fault that crashes
        # what the policy suspected when the scheduler placed the pods, before it hears of the placement
        suspected = {n for n in faulty if self.policy.suspected(self, n, t)}
        self.policy.job_placed(self, job, t)
        crashing, tally, crash = [], self.tally, self.crashing
        for n in faulty:
            f = crash.get(n)  # (the policy hears of the placement: what it does comes later)
            if f is not None:
                tally.placements_on_faulty += 1
                if n in suspected:
                    tally.placements_on_suspected += 1
                    by = tally.placements_on_suspected_by
                    by[job.restarted_by] = by.get(job.restarted_by, 0) + 1
                else:
                    k = f.entry.evidence
                    tally.placements_on_undetected[k] = tally.placements_on_undetected.get(k, 0) + 1
                crashing.append(n)
        if crashing:  # one event for them all: they come due together, in this order
            self.at(t + self.a.crash_after_s, functools.partial(self._crash_first, job, attempt, crashing))
        self.at(t + self.a.restart_overhead_s, lambda at: self._resume(job, attempt, at))

    def _crash_first(self, job: Job, attempt: int, nodes: list[int], t: float) -> None:
        """The attempt dies on the first of ``nodes`` whose crash fault is still active there; once it
        died (its nodes released, or placed again as a later attempt) the others have nothing to do."""
        for node in nodes:
            if job.attempt != attempt:
                return
            f = self.nodes[node].fault()
            if f is not None and f.entry.effect == "crash" and node in job.owned:
                self.fail_job(job, node, t, f"{f.entry.category} on {self.nodes[node].name}")
                return

    def _resume(self, job: Job, attempt: int, t: float) -> None:
        if job.attempt != attempt or job.state != "restart_overhead":
            return
        self._job_state(job, "running", t)
        job.run_since = t
        job.failures_in_a_row = 0
        o = self._outage.pop(job.index, None)
        if o is not None:
            ph = self.tally.mttr_phases
            ph["detect"].append(o.get("waiting_to_detect", 0.0))
            ph["wait_for_capacity"].append(o.get("waiting_for_capacity", 0.0))
            ph["restart"].append(o.get("restart_overhead", 0.0))
            ph["total"].append(t - o["failed"])
        self._update_slow(job, t)

    # --- faults -----------------------------------------------------------------------------------

    def _onset(self, hf: HistoryFault, entry: Entry, t: float) -> None:
        node = self.nodes[self.index[hf.node]]
        self._account_node(node, t)
        f = Fault(len(self.faults), hf, entry, node.index, t, evidence_at=t + entry.detection_delay_s)
        self._confirmable(f)
        self.faults.append(f)
        node.faults.append(f)
        self._faults_changed(node)
        if entry.evidence == "software":  # the job fails; the node is fine
            f.active = False
            self._faults_changed(node)
            if node.job is not None:
                self.fail_job(node.job, node.index, t, entry.category)
            return
        self._account_node(node, t)
        if entry.evidence == "planned":
            self.cordon(node.index, t, "planned")
            if node.job is not None:
                self.at(t + self.a.drain_grace_s, lambda at: self._evict(node.index, at, "planned maintenance"))
            self._start_repair(node, f, t, by="planned")
            return
        if entry.evidence.startswith("node_condition:Ready"):
            self.at(t + self.a.not_ready_after_s, lambda at: self._not_ready(node, f, at))
        self._effect(node, f, t)
        self.policy.fault_started(self, f, t)
        then = entry.then_entry()
        if then is not None:
            self.at(t + entry.then_after_s, lambda at: self._turn_hard(f, then, at))

    def _confirmable(self, f: Fault) -> None:
        """``f.confirmable_at``: when its evidence could first be acted on; a degradation needs the
        detector's second report (``confirm_s`` later) before triage confirms it."""
        f.confirmable_at = f.evidence_at + (0.0 if f.entry.kind.hard else self.confirm_s)

    def _effect(self, node: Node, f: Fault, t: float) -> None:
        if node.job is not None:
            if f.entry.effect == "crash":
                self.fail_job(node.job, node.index, t, f"{f.entry.category} on {node.name}")
            elif f.entry.effect == "slow":
                self._update_slow(node.job, t)

    def _not_ready(self, node: Node, f: Fault, t: float) -> None:
        if f.active:
            self._account_node(node, t)
            node.not_ready = True
            self._account_node(node, t)

    def _turn_hard(self, f: Fault, then: Entry, t: float) -> None:
        node = self.nodes[f.node]
        if not f.active or node.busy == "repair":
            return
        self._account_node(node, t)
        f.entry, f.turned_at, f.evidence_at = then, t, t + then.detection_delay_s
        self._faults_changed(node)
        self._confirmable(f)
        self._account_node(node, t)
        self._effect(node, f, t)
        if then.evidence.startswith("node_condition:Ready"):
            self.at(t + self.a.not_ready_after_s, lambda at: self._not_ready(node, f, at))
        self.policy.fault_started(self, f, t)

    # --- actions a policy takes -------------------------------------------------------------------

    def cordon(self, n: int, t: float, by: str) -> None:
        node = self.nodes[n]
        if node.cordoned_by:
            return
        self._account_node(node, t)
        node.cordoned_by = by
        self._account_node(node, t)
        if by != "planned":
            self.tally.isolations += 1
            f = node.fault()
            if f is None or not f.harmful:
                self.tally.false_isolations += 1

    def uncordon(self, n: int, t: float) -> None:
        node = self.nodes[n]
        self._account_node(node, t)
        node.cordoned_by = ""
        node.validating = False
        self._account_node(node, t)
        self.parking.room += 1  # (its exclusions are lifted)
        for job in list(self._excluding.values()):  # back in service: no restart keeps excluding it
            job.exclude.discard(n)
            if not job.exclude:
                del self._excluding[job.index]
        self.try_place(t)

    def drain(self, n: int, t: float, why: str) -> list[str]:
        """Evict the node's job now (the grace period is the caller's)."""
        return self._evict(n, t, why)

    def _evict(self, n: int, t: float, why: str) -> list[str]:
        job = self.nodes[n].job
        if job is None or job.state not in ("running", "restart_overhead"):
            return []
        self.fail_job(job, n, t, why)
        return [job.ref]

    def start_busy(self, n: int, what: str, until: float, t: float, done: Callable[[float], None]) -> None:
        node = self.nodes[n]
        self._account_node(node, t)
        if what == "reboot" and node.job is not None:
            self._evict(n, t, "rebooting")
        node.busy, node.busy_until = what, until
        self._account_node(node, t)
        if what == "diagnostics":
            self.tally.diagnostics += 1

        def finish(at: float) -> None:
            self._account_node(node, at)
            node.busy = ""
            done(at)
            self._account_node(node, at)
            self.try_place(at)

        self.at(until, finish)

    def diagnose(self, n: int, level: int, key: object) -> bool:
        """Whether diagnostics of ``level`` fail on node ``n`` now: a real fault's draw (once per fault),
        or the run's for a false failure of a healthy node."""
        f = self.nodes[n].fault()
        rng = self.rng("diag", n, key)
        if f is not None and f.entry.evidence == "xid:79":
            return True  # a GPU gone from the bus fails every test
        if f is not None and f.entry.diagnostics_confirm and f.entry.effect != "none":
            # whether diagnostics catch a fault is the fault's, not the run's: one that escapes the
            # tests escapes them every time
            caught = self.rng("diag-escapes", f.id).random() >= self.a.diag_false_pass
            if not caught:
                self._account_node(self.nodes[n], self.t)
                f.passed_diagnostics = True
                self._account_node(self.nodes[n], self.t)
            return caught
        return rng.random() < self.a.diag_false_fail

    def send_to_repair(self, n: int, t: float, by: str, done: Callable[[float], None]) -> None:
        node = self.nodes[n]
        if node.busy == "repair":  # already in repair (planned, or asked by someone else): told when it ends
            node.repair_waiters.append(done)
            return
        if node.job is not None:
            self._evict(n, t, "sent to repair")
        f = node.fault()
        self._start_repair(node, f, t, by, done)

    def _start_repair(self, node: Node, f: Fault | None, t: float, by: str,
                      done: Callable[[float], None] | None = None) -> None:
        if f is None:
            duration = self.a.repair_no_fault_s
        else:
            rs = f.source.repair_s
            duration = math.inf if rs is None else rs
        self.tally.repairs += 1
        until = t + duration

        def repaired(at: float) -> None:
            for g in node.faults:
                if g.active:
                    g.active, g.repaired_at = False, at
                    self._faults_changed(node)
                    self.policy.fault_repaired(self, g, at)
            node.not_ready = False
            node.validating = f is not None and by != "planned"
            if by == "planned":
                node.cordoned_by = ""
            if node.job is not None:
                self._update_slow(node.job, at)
            waiters, node.repair_waiters = node.repair_waiters, []
            for tell in ([done] if done is not None else []) + waiters:
                tell(at)

        if math.isinf(until):
            self._account_node(node, t)
            node.busy, node.busy_until = "repair", until
            self._account_node(node, t)
            return
        self.start_busy(node.index, "repair", until, t, repaired)

    # --- node accounting --------------------------------------------------------------------------

    def _account_node(self, node: Node, t: float) -> None:
        """Account ``node``'s time since its last change, then take its state now (call it before and
        after every change of the node: a second call at the same time only takes the state)."""
        schedulable, false_held, effect, visible, evidence_at, evidence, why, escaped = node.acct
        dt = max(0.0, t - node.since)
        if dt > 0:
            if why:
                self.tally.unschedulable_by[why] = self.tally.unschedulable_by.get(why, 0.0) + dt
            if schedulable and effect:
                lo = max(node.since, evidence_at + self.decision_interval_s)
                past = max(0.0, t - lo)
                by = self.tally.schedulable_by_evidence.setdefault(f"{effect}:{evidence}", [0.0, 0.0])
                by[0] += dt
                by[1] += past
                if not visible:
                    self.tally.silent_schedulable_s += dt
                elif effect == "crash":
                    self.tally.dangerous_s += dt
                    self.tally.dangerous_past_decision_s += past
                    if escaped:
                        self.tally.dangerous_after_passed_diagnostics_s += past
                else:
                    self.tally.degraded_s += dt
                    self.tally.degraded_past_decision_s += past
            if false_held:
                if node.validating:
                    self.tally.validation_held_s += dt
                else:
                    self.tally.false_held_s += dt
        f = node.fault()
        effect_now = f.entry.effect if f is not None and f.entry.effect in ("crash", "slow") else ""
        harmful_now = f is not None and f.harmful
        held_now = (bool(node.cordoned_by) and node.cordoned_by != "planned") or bool(node.busy)
        self.schedulable_count += int(node.schedulable) - int(schedulable)
        node.acct = (node.schedulable, held_now and not harmful_now, effect_now,
                     f is not None and f.visible, f.confirmable_at if f is not None else 0.0,
                     f.entry.evidence.split(":", 1)[0] if f is not None else "",
                     "" if node.schedulable else "|".join((node.cordoned_by or "-", node.busy or "-",
                                                           "not_ready" if node.not_ready else "ready",
                                                           "fault" if harmful_now else "no_fault")),
                     f is not None and f.passed_diagnostics)
        node.since = t

    def account_all(self, t: float) -> None:
        for node in self.nodes:
            self._account_node(node, t)
