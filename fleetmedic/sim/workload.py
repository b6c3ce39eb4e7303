"""Training jobs in lock-step, a gang scheduler, and the job controller's restarts.

- A job spans ``n_nodes`` nodes, one rank per GPU (rank ``r`` runs on ``nodes[r // G]``, GPU ``r % G``).
  Its step is lock-step: ``step = compute x max(rank slowdown) + comm x max(node network slowdown)``
  plus job-wide data stalls, so one slow GPU or link slows every rank. A rank's *own* time (what a
  per-rank profiler reports in ``progress`` events with ``rank`` set) excludes the time it waits for
  slower peers.
- Life of an attempt: ``pending`` → placed (``placement`` event) → ``starting`` (containers, NCCL
  init; ``start`` event) → ``restoring`` (loading the last checkpoint, if any) → ``running`` with a
  blocking ``checkpointing`` phase every checkpoint interval → ``completed``; or ``hung`` (a
  collective never finishes: after the NCCL watchdog timeout every rank aborts) → ``failed``.
  A failure loses the steps since the last checkpoint.
- The job controller (PyTorchJob/JobSet semantics) restarts a failed job after ``restart_delay_s``
  up to ``backoff_limit`` times, preferring the nodes it ran on if they are still schedulable —
  which is how a job lands on a bad node again when nobody cordoned it. Remediation commands
  (``restart_job``, ``requeue_job``, ``retry_in_place``) restart it now, excluding given nodes.
- The scheduler places whole gangs on free, schedulable, up nodes of the job's SKU, packing into
  one scalable unit where it can; a restarting job that does not fit holds back new jobs. A restart
  by a fleetmedic command is topology-aware (the replacements come from the surviving ranks' leaf,
  then rack: what the executor's preferred affinity asks of kube-scheduler); the job controller's
  own restarts are not (``topology_preference``, :mod:`fleetmedic.sim.placement`).
- New jobs arrive to keep about ``target_utilization`` of the fleet busy.

Every interruption is recorded (:class:`Interruption`) with the marks the closed loop's MTTR
decomposition needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from fleetmedic.records import JobEvent, RankPlacement
from fleetmedic.sim.fleet import Fleet
from fleetmedic.sim.logs import FailureReport
from fleetmedic.sim.placement import (
    PREFERENCES,
    Replacement,
    choose_nodes,
    domain_had_room,
    job_domain,
    topology_aware,
)
from fleetmedic.sim.telemetry import MODE_CKPT, MODE_HUNG, MODE_IDLE, MODE_STARTING, MODE_TRAIN, Load

PENDING, STARTING, RESTORING, RUNNING, CHECKPOINTING, HUNG, FAILED, COMPLETED = (
    "pending", "starting", "restoring", "running", "checkpointing", "hung", "failed", "completed")
ACTIVE_STATES: Final = frozenset({STARTING, RESTORING, RUNNING, CHECKPOINTING, HUNG})
_NAMESPACES = ("llm-pretrain", "research", "multimodal", "speech")
_KINDS = ("PyTorchJob", "JobSet")


@dataclass(frozen=True)
class WorkloadSpec:
    target_utilization: float = 0.88
    job_sizes: tuple[int, ...] = ()  # node counts to draw from; () = powers of two up to fleet/4 (/2 if small)
    step_s: tuple[float, float] = (1.5, 4.0)
    comm_fraction: tuple[float, float] = (0.15, 0.35)
    checkpoint_interval_s: float = 1800.0
    checkpoint_s: tuple[float, float] = (30.0, 90.0)
    restore_s: tuple[float, float] = (120.0, 300.0)
    startup_s: tuple[float, float] = (60.0, 150.0)
    run_s: tuple[float, float] = (4 * 3600.0, 24 * 3600.0)
    short_job_fraction: float = 0.2
    short_run_s: tuple[float, float] = (1800.0, 7200.0)
    arrival_gap_s: tuple[float, float] = (60.0, 600.0)
    data_stall: tuple[float, float] = (0.0, 0.02)
    progress_interval_s: float = 60.0
    rank_progress: bool = True
    native_restart: bool = True
    backoff_limit: int = 6
    restart_delay_s: float = 30.0
    nccl_timeout_s: float = 600.0
    # who re-places a job toward its surviving ranks' leaf/rack: "fleetmedic" (its restart_job and
    # requeue_job, not the job controller's own restarts), "none", "all"
    topology_preference: str = "fleetmedic"

    def __post_init__(self) -> None:
        if self.topology_preference not in PREFERENCES:
            raise ValueError(f"topology_preference must be one of {', '.join(PREFERENCES)}, "
                             f"not {self.topology_preference!r}")


@dataclass
class Interruption:
    """One outage of a job: from its first failure to its first good step after recovery.

    A job that fails again before recovering (a repeat failure, e.g. re-placed on the same bad node)
    stays in the same outage: ``failures`` grows and the recovery marks restart from that failure.
    """

    job: str
    t_fail: float
    failures: list[tuple[float, str, int, int, str]]  # (t, cause, cause node, reported node, reason)
    lost_steps: int = 0
    lost_s: float = 0.0  # wall time of the lost steps
    t_restart_req: float | None = None
    restart_by: str = ""  # "controller", a command id, or "user"
    t_placed: float | None = None
    t_resumed: float | None = None
    t_first_step: float | None = None
    nodes_after: list[int] = field(default_factory=list)
    placements: list[Replacement] = field(default_factory=list)  # every re-placement in this outage

    @property
    def cause(self) -> str:
        """A fault id, "remediation" (stopped by a command), "planned", or ""."""
        return self.failures[0][1]

    @property
    def node(self) -> int:
        return self.failures[0][2]


@dataclass
class Job:
    idx: int
    ref: str
    kind: str
    n_nodes: int
    sku: int
    step_s: float
    comm_frac: float
    ckpt_interval: float
    ckpt_s: float
    restore_s: float
    startup_s: float
    total_steps: int
    fb_mib: float
    data_stall: float
    submitted_at: float
    state: str = PENDING
    nodes: list[int] = field(default_factory=list)
    attempt: int = 0
    step: float = 0.0
    ckpt_step: int = 0
    last_ckpt_t: float = 0.0
    pending_ckpt_step: int = 0
    state_until: float = 0.0
    hang_at: float = 0.0
    hang_report: FailureReport | None = None
    hang_cause: str = ""
    hang_node: int = -1
    restart_at: float | None = None
    restart_by: str = ""
    in_place: bool = False
    exclude: set[int] = field(default_factory=set)
    prefer: list[int] = field(default_factory=list)
    priority: int = 0  # restarts go first
    failures: int = 0  # since the last progress
    stall_extra: float = 0.0  # job-wide stall fraction added by faults
    ckpt_mul: float = 1.0
    resumed_at: float = 0.0
    seq: int = 0  # NCCL collective sequence number
    first_step_due: float | None = None
    attempt_started: float = 0.0
    first_placed: float | None = None
    finished_at: float | None = None
    # progress window
    win_t: float = 0.0
    win_steps: float = 0.0
    win_time: float = 0.0
    win_rank_time: np.ndarray | None = None
    next_progress: float = 0.0
    last_step_time: float = 0.0
    nominal_step: float = 0.0

    @property
    def world_size(self) -> int:
        return self.n_nodes * 8

    def active(self) -> bool:
        return self.state in ACTIVE_STATES


class Workload:
    def __init__(self, fleet: Fleet, spec: WorkloadSpec, rng: np.random.Generator, t0: float) -> None:
        self.fleet = fleet
        self.spec = spec
        self.rng = rng
        self.g = fleet.g
        n = fleet.n
        self.node_job = np.full(n, -1, dtype=np.int64)
        self.jobs: list[Job] = []
        self.interruptions: list[Interruption] = []
        self.events: list[JobEvent] = []
        self._open: dict[int, Interruption] = {}  # job idx -> interruption awaiting recovery
        self._next_arrival = t0
        #: the nodes fleetmedic suspects now (set by the harness that runs it): each re-placement
        #: records which of its nodes they were, for the accounting only; the scheduler ignores it
        self.suspected_by: Callable[[], Collection[int]] | None = None
        if spec.job_sizes:
            self.sizes = [s for s in spec.job_sizes if s <= n] or [1]
        else:
            cap = max(1, n // 4 if n > 16 else n // 2)
            self.sizes = [2**k for k in range(int(math.log2(cap)) + 1)]
        self._fill(t0, initial=True)

    # --- job creation ----------------------------------------------------------------------------

    def _new_job(self, t: float, room: int) -> Job:
        rng, spec = self.rng, self.spec
        sizes = [s for s in self.sizes if s <= room] or [min(self.sizes)]
        weights = np.array([math.sqrt(s) for s in sizes])
        size = int(rng.choice(sizes, p=weights / weights.sum()))
        sku = int(rng.integers(0, len(self.fleet.sku_list)))
        sku_nodes = int((self.fleet.node_sku == sku).sum())
        size = min(size, max(1, sku_nodes))
        idx = len(self.jobs)
        ns = _NAMESPACES[int(rng.integers(0, len(_NAMESPACES)))]
        kind = "pretrain" if size >= 8 else ("finetune" if size >= 2 else "eval")
        step_s = float(rng.uniform(*spec.step_s))
        run = float(rng.uniform(*(spec.short_run_s if rng.random() < spec.short_job_fraction else spec.run_s)))
        fb_total = self.fleet.sku_list[sku].fb_total_mib
        job = Job(
            idx=idx,
            ref=f"{ns}/{kind}-{size}n-{idx:03d}",
            kind=_KINDS[int(rng.integers(0, len(_KINDS)))],
            n_nodes=size,
            sku=sku,
            step_s=step_s,
            comm_frac=float(rng.uniform(*spec.comm_fraction)),
            ckpt_interval=spec.checkpoint_interval_s,
            ckpt_s=float(rng.uniform(*spec.checkpoint_s)),
            restore_s=float(rng.uniform(*spec.restore_s)),
            startup_s=float(rng.uniform(*spec.startup_s)),
            total_steps=max(10, int(run / step_s)),
            fb_mib=float(rng.uniform(0.65, 0.9)) * fb_total,
            data_stall=float(rng.uniform(*spec.data_stall)),
            submitted_at=t,
        )
        job.nominal_step = step_s * (1.0 + job.data_stall)
        self.jobs.append(job)
        return job

    def _fill(self, t: float, initial: bool = False) -> None:
        target = self.spec.target_utilization * self.fleet.n
        demand = sum(j.n_nodes for j in self.jobs
                     if j.state != COMPLETED and not (j.state == FAILED and j.restart_at is None))
        while demand < target and (initial or t >= self._next_arrival):
            job = self._new_job(t, max(1, int(target - demand + 0.5)))
            demand += job.n_nodes
            if not initial:
                self._next_arrival = t + float(self.rng.uniform(*self.spec.arrival_gap_s))
                break

    # --- placement ---------------------------------------------------------------------------------

    def schedule(self, t: float, schedulable: np.ndarray, up: np.ndarray) -> None:
        """Place pending gangs on free nodes where ``schedulable & up``."""
        self._fill(t)
        pending = [j for j in self.jobs if j.state == PENDING and (j.restart_at is None or j.restart_at <= t)]
        pending.sort(key=lambda j: (-j.priority, j.submitted_at, j.idx))
        free = (self.node_job < 0) & up
        blocked = False
        for job in pending:
            if blocked and job.priority == 0:
                break
            ok = free & (self.fleet.node_sku == job.sku)
            if not job.in_place:
                ok &= schedulable
            if job.exclude:
                ok[list(job.exclude)] = False
            chosen, record = self._choose(job, ok, t)
            if chosen is None:
                if job.priority > 0:
                    blocked = True
                continue
            free[chosen] = False
            self._place(job, chosen, t, record)

    def _choose(self, job: Job, ok: np.ndarray, t: float) -> tuple[list[int] | None, Replacement | None]:
        if job.in_place:
            if len(job.prefer) == job.n_nodes and all(ok[i] for i in job.prefer):
                return list(job.prefer), None
            return None, None
        fleet = self.fleet
        if not job.prefer:  # a new job
            return choose_nodes(job.n_nodes, ok, (), fleet.node_su, fleet.node_rack, None), None
        aware = topology_aware(self.spec.topology_preference, job.restart_by)
        domain = job_domain(job.prefer, job.exclude, fleet.node_su, fleet.node_rack)
        chosen = choose_nodes(job.n_nodes, ok, job.prefer, fleet.node_su, fleet.node_rack, domain if aware else None)
        if chosen is None:
            return None, None
        room = domain_had_room(job.n_nodes, ok, job.prefer, fleet.node_su, domain)
        flagged = self.suspected_by() if self.suspected_by is not None else ()
        return chosen, Replacement(t=t, by=job.restart_by, topology_aware=aware, before=tuple(job.prefer),
                                   nodes=tuple(chosen), excluded=tuple(sorted(job.exclude)), domain=domain, room=room,
                                   suspected=tuple(n for n in chosen if n in flagged))

    def _place(self, job: Job, nodes: list[int], t: float, record: Replacement | None = None) -> None:
        job.nodes = nodes
        job.state = STARTING
        job.state_until = t + job.startup_s
        job.restart_at = None
        job.in_place = False
        job.priority = 0
        job.attempt_started = t
        if job.first_placed is None:
            job.first_placed = t
        self.node_job[nodes] = job.idx
        names = self.fleet.node_names
        g = self.g
        placement = [RankPlacement(rank=r, node=names[nodes[r // g]], gpus=[r % g]) for r in range(len(nodes) * g)]
        self._emit(job, "placement", t, placement=placement)
        intr = self._open.get(job.idx)
        if intr is not None and record is not None:
            intr.placements.append(record)
        if intr is not None and intr.t_placed is None:
            intr.t_placed = t
            intr.nodes_after = list(nodes)

    def _release(self, job: Job) -> None:
        if job.nodes:
            self.node_job[job.nodes] = -1

    # --- events ---------------------------------------------------------------------------------------

    def _emit(self, job: Job, kind: str, t: float, **kw: object) -> None:
        self.events.append(
            JobEvent(job=job.ref, event=kind, ts=round(t, 3), attempt=job.attempt, workload_kind=job.kind,  # type: ignore[arg-type]
                     world_size=job.world_size, **kw)  # type: ignore[arg-type]
        )

    def drain_events(self) -> list[JobEvent]:
        ev, self.events = self.events, []
        ev.sort(key=lambda e: e.ts)
        return ev

    # --- failures and restarts ------------------------------------------------------------------------

    def fail(self, job: Job, t: float, report: FailureReport, cause: str, cause_node: int) -> None:
        """The attempt dies: failure event, nodes released, progress since the checkpoint lost."""
        if not job.active():
            return
        self._emit(job, "failure", t, rank=report.rank, node=self.fleet.node_names[report.node] if report.node >= 0
                   else "", exit_code=report.exit_code, reason=report.reason, log_excerpt=report.lines[:40],
                   step=int(job.step))
        self._interrupt(job, t, cause, cause_node, report.node, report.reason)
        job.state = FAILED
        job.failures += 1
        self._release(job)
        if self.spec.native_restart and job.failures <= self.spec.backoff_limit:
            job.restart_at = t + self.spec.restart_delay_s
            job.restart_by = "controller"
        else:
            job.restart_at = None

    def _interrupt(self, job: Job, t: float, cause: str, cause_node: int, reported: int, reason: str) -> None:
        lost = max(0, int(job.step) - job.ckpt_step)
        intr = self._open.get(job.idx)
        if intr is None:
            intr = Interruption(job=job.ref, t_fail=t, failures=[])
            self.interruptions.append(intr)
            self._open[job.idx] = intr
        intr.failures.append((t, cause, cause_node, reported, reason))
        intr.lost_steps += lost
        intr.lost_s += lost * (job.last_step_time or job.nominal_step)
        intr.t_restart_req = intr.t_placed = intr.t_resumed = None
        job.step = float(job.ckpt_step)
        job.first_step_due = None

    def hang(self, job: Job, t: float, report: FailureReport, cause: str, cause_node: int) -> None:
        """A collective never completes; every rank aborts when the NCCL watchdog fires."""
        if job.state not in (RUNNING, CHECKPOINTING, STARTING, RESTORING):
            return
        job.state = HUNG
        job.hang_at = t + self.spec.nccl_timeout_s
        job.hang_report = report
        job.hang_cause = cause
        job.hang_node = cause_node

    def restart(self, job: Job, t: float, by: str, reason: str, exclude: set[int] | None = None,
                in_place: bool = False, requeue: bool = False) -> bool:
        """Restart now (a command or the user): stop the attempt if it runs, then re-place."""
        if job.state == COMPLETED:
            return False
        if job.active():
            self._emit(job, "failure", t, exit_code=143, reason="Terminated", step=int(job.step),
                       log_excerpt=[f"attempt stopped for restart: {reason}"])
            self._interrupt(job, t, "remediation" if by != "user" else "planned", -1, -1, "Terminated")
            self._release(job)
        old = list(job.nodes)
        job.attempt += 1
        job.state = PENDING
        job.exclude = set(exclude or ()) | (job.exclude if not requeue else set())
        job.prefer = old
        # a retry in place that excludes one of its nodes (fleetmedic suspects it) is re-placed away
        # from it, preferring the rest, as the executor's preferred affinity does
        job.in_place = in_place and not (job.exclude & set(old))
        job.priority = 0 if requeue else 1
        if requeue:
            job.submitted_at = t
        job.restart_at = t
        job.restart_by = by
        self._emit(job, "restart", t, reason=reason)
        intr = self._open.get(job.idx)
        if intr is not None and intr.t_restart_req is None:
            intr.t_restart_req = t
            intr.restart_by = by
        return True

    def _controller_restarts(self, t: float) -> None:
        for job in self.jobs:
            if job.state == FAILED and job.restart_at is not None and job.restart_at <= t:
                at = job.restart_at
                self.restart(job, at, "controller", f"restarting after failure (attempt {job.attempt + 1}, "
                             f"backoffLimit {self.spec.backoff_limit})")
                job.priority = 1

    # --- time ------------------------------------------------------------------------------------------

    def advance(self, t0: float, t1: float, rank_slow: np.ndarray, net_slow: np.ndarray,
                schedulable: np.ndarray, up: np.ndarray) -> Load:
        """Run every job from ``t0`` to ``t1``; returns the load the telemetry models sample at ``t1``."""
        self._controller_restarts(t1)
        self.schedule(t1, schedulable, up)
        n, g = self.fleet.n, self.g
        load = Load.idle(n, g)
        for job in self.jobs:
            if job.active():
                self._run(job, t0, t1, rank_slow, net_slow, load)
        return load

    def _step_time(self, job: Job, rank_slow: np.ndarray, net_slow: np.ndarray) -> tuple[float, np.ndarray]:
        nodes = job.nodes
        slow = rank_slow[nodes]  # (n, G)
        net = float(net_slow[nodes].max())
        compute = job.step_s * (1.0 - job.comm_frac)
        comm = job.step_s * job.comm_frac * net
        stall = job.step_s * (job.data_stall + job.stall_extra)
        own = compute * slow + job.step_s * job.comm_frac * net_slow[nodes][:, None] + stall
        return compute * float(slow.max()) + comm + stall, own

    def _run(self, job: Job, t0: float, t1: float, rank_slow: np.ndarray, net_slow: np.ndarray, load: Load) -> None:
        t = t0
        st, own = self._step_time(job, rank_slow, net_slow)
        st *= float(np.exp(0.01 * self.rng.standard_normal()))
        job.last_step_time = st
        while t < t1 and job.active():
            if job.state == STARTING:
                if job.state_until > t1:
                    break
                t = job.state_until
                self._emit(job, "start", t)
                if job.ckpt_step > 0:
                    job.state, job.state_until = RESTORING, t + job.restore_s
                else:
                    self._resume(job, t, st)
            elif job.state == RESTORING:
                if job.state_until > t1:
                    break
                t = job.state_until
                self._resume(job, t, st)
            elif job.state == RUNNING:
                next_ckpt = job.last_ckpt_t + job.ckpt_interval
                end = min(t1, next_ckpt)
                steps = (end - t) / st
                if job.step + steps >= job.total_steps:
                    done = t + (job.total_steps - job.step) * st
                    job.step = float(job.total_steps)
                    self._account_window(job, done - t, steps, own)
                    self._complete(job, done)
                    break
                job.step += steps
                self._account_window(job, end - t, steps, own)
                if job.first_step_due is not None and job.first_step_due <= end:
                    intr = self._open.pop(job.idx, None)
                    if intr is not None:
                        intr.t_first_step = job.first_step_due
                    job.failures = 0
                    job.first_step_due = None
                t = end
                if end >= next_ckpt:
                    job.state = CHECKPOINTING
                    job.state_until = end + job.ckpt_s * job.ckpt_mul
                    job.pending_ckpt_step = int(job.step)
            elif job.state == CHECKPOINTING:
                if job.state_until > t1:
                    break
                t = job.state_until
                job.ckpt_step = job.pending_ckpt_step
                job.last_ckpt_t = t
                job.ckpt_mul = 1.0
                job.state = RUNNING
            elif job.state == HUNG:
                if job.hang_at > t1:
                    break
                rep = job.hang_report
                assert rep is not None
                job.state = RUNNING  # let fail() see an active job
                self.fail(job, job.hang_at, rep, job.hang_cause, job.hang_node)
                break
        if job.state == RUNNING and t1 >= job.next_progress:
            self._progress(job, t1)
        self._load(job, st, own, rank_slow, net_slow, load)

    def _resume(self, job: Job, t: float, st: float) -> None:
        job.state = RUNNING
        job.resumed_at = t
        job.last_ckpt_t = t
        job.first_step_due = t + st
        job.win_t, job.win_steps, job.win_time, job.win_rank_time = t, 0.0, 0.0, None
        job.next_progress = t + self.spec.progress_interval_s
        intr = self._open.get(job.idx)
        if intr is not None and intr.t_resumed is None:
            intr.t_resumed = t

    def _account_window(self, job: Job, dt: float, steps: float, own: np.ndarray) -> None:
        job.win_steps += steps
        job.win_time += dt
        rt = own * steps
        job.win_rank_time = rt if job.win_rank_time is None else job.win_rank_time + rt

    def _progress(self, job: Job, t: float) -> None:
        if job.win_steps > 0.5:
            st = job.win_time / job.win_steps
            self._emit(job, "progress", t, step=int(job.step), step_time_s=round(st, 4))
            if self.spec.rank_progress and job.win_rank_time is not None:
                per_rank = job.win_rank_time / job.win_steps  # (n, G)
                worst = per_rank.argmax(axis=1)
                jitter = np.exp(0.005 * self.rng.standard_normal(len(job.nodes)))
                for pos, node in enumerate(job.nodes):
                    gg = int(worst[pos])
                    self._emit(job, "progress", t, step=int(job.step),
                               step_time_s=round(float(per_rank[pos, gg] * jitter[pos]), 4),
                               rank=pos * self.g + gg, node=self.fleet.node_names[node])
        job.win_t, job.win_steps, job.win_time, job.win_rank_time = t, 0.0, 0.0, None
        job.next_progress = t + self.spec.progress_interval_s

    def _complete(self, job: Job, t: float) -> None:
        job.state = COMPLETED
        job.finished_at = t
        self._emit(job, "completion", t, step=int(job.step), exit_code=0, reason="Completed")
        self._release(job)
        self._open.pop(job.idx, None)
        if self._next_arrival <= t:
            self._next_arrival = t + float(self.rng.uniform(*self.spec.arrival_gap_s))

    def _load(self, job: Job, st: float, own: np.ndarray, rank_slow: np.ndarray, net_slow: np.ndarray,
              load: Load) -> None:
        if not job.active():
            return
        nodes = job.nodes
        mode = {STARTING: MODE_STARTING, RESTORING: MODE_STARTING, RUNNING: MODE_TRAIN,
                CHECKPOINTING: MODE_CKPT, HUNG: MODE_HUNG}.get(job.state, MODE_IDLE)
        load.mode[nodes] = mode
        load.fb_mib[nodes] = job.fb_mib if mode != MODE_STARTING else job.fb_mib * 0.3
        if mode == MODE_TRAIN:
            compute = job.step_s * (1.0 - job.comm_frac)
            load.compute[nodes] = compute * rank_slow[nodes] / st
            load.comm[nodes] = job.step_s * job.comm_frac * float(net_slow[nodes].max()) / st
            load.stall[nodes] = job.step_s * (job.data_stall + job.stall_extra) / st
            load.net_util[nodes] = 0.7 * load.comm[nodes]

    # --- queries -------------------------------------------------------------------------------------

    def job_on(self, node: int) -> Job | None:
        j = int(self.node_job[node])
        return self.jobs[j] if j >= 0 else None

    def by_ref(self, ref: str) -> Job | None:
        for j in self.jobs:
            if j.ref == ref:
                return j
        return None

    def running_jobs(self) -> list[Job]:
        return [j for j in self.jobs if j.state in (RUNNING, CHECKPOINTING)]
