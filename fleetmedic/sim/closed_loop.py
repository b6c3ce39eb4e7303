"""The closed loop: remediation commands change the simulated fleet, and the run is accounted for.

The simulator plays the Kubernetes executor. :meth:`ClosedLoop.submit` queues a
:class:`~fleetmedic.records.RemediationCommand`; it takes effect at ``max(issued_at, now) + latency``
and yields a :class:`~fleetmedic.records.RemediationResult` when done. A command id is applied at
most once (a repeat is ``skipped``); an expired command (``expires_at`` before it could apply) and a
``dry_run`` command are ``skipped``.

Effects:

- ``cordon``/``taint`` (``uncordon``/``untaint``, ``return_to_service``): the node gets no new ranks
  (again). Running ranks stay.
- ``drain``: cordon, then the node's ranks are evicted after the grace period: their job fails
  (``Evicted``, exit 143) and its controller re-places it — away from the cordoned node.
- ``restart_job`` (``exclude_nodes``), ``requeue_job`` (back of the queue), ``retry_in_place`` (same
  nodes, ignoring cordons): the attempt stops, the job is re-placed when capacity allows, restores
  its last checkpoint (the restore delay) and resumes. With ``params.only_if_waiting``: a job still
  waiting to be placed gets the exclusions added; a placed one is left alone (``skipped``).
- ``run_diagnostics`` (``params.level`` 1-4, default 3): needs a node without ranks; takes minutes
  (r3: 25 min), during which the node is unschedulable; fails with the active fault's detection
  probability, or with a 1 % false-failure rate on a healthy node. A node that goes down during its
  diagnostics without a fault they detect (planned maintenance reboots it) has run none: as the
  diagnostics Job's pod, they run again, whole, once the node is back up (no verdict while it is down).
- ``reset_gpu`` (``params.gpu``, default all): needs no ranks on the GPU's node; 90 s; clears faults
  whose remedy is a GPU reset, restarts that GPU's volatile counters.
- ``reboot_node``: kills ranks on it, 10 min down; clears faults whose remedy is a reset or reboot;
  new boot id, counters from zero.
- ``escalate`` with ``params.escalation: repair`` (repair/RMA): the node goes to repair for 2-6 h,
  comes back fixed, rebooted and still cordoned — it returns to service only by
  ``return_to_service``/``uncordon``. Any other escalate (``notify``: a human should look; a switch,
  ``params.target_kind: switch``) is a ticket only.
- ``label``: recorded, no effect.

Accounting (:class:`Accounting`): per job outage (:class:`~fleetmedic.sim.workload.Interruption`)
the MTTR and its decomposition into consecutive phases that sum to it::

    onset ─detect─▶ detected ─isolate─▶ isolated ─wait for capacity─▶ placed ─restore─▶ resumed ─first good step─▶ good

``onset`` is the causing fault's onset (or the failure time when no fault caused it); ``detected`` is
the first remediation command about the fault's nodes or the job, or the failure itself if earlier
(the job controller noticed); ``isolated`` is when the bad node became unschedulable (cordon, taint,
drain, escalate) or, if that never happened or came later, when the job's final restart was
requested (it moved away) — clamped to [detected, restart]; for faults that need no isolation it is
``detected``. Each mark is clamped to be no earlier than the previous one. Also: repeat failures
(a fault that kills jobs more than once), effective training time ratio (retained steps at nominal
step time / job wall time since first placement), node-hours "dangerous but schedulable" (a node
with an active fault whose truth says isolate it, schedulable and up; also per fault,
``dangerous_by_fault``: how long each such fault left a node of it schedulable) and "healthy but
unschedulable" (no such fault, but cordoned, tainted, diagnosing, rebooting, in repair, or holding a
GPU the device plugin marked Unhealthy after an XID). Re-placements (``placement``, by who restarted
the job: ``all``, ``fleetmedic``, ``job_controller``, ``user``): leaf locality where the leaf had
room and placements on suspect or excluded nodes (:class:`~fleetmedic.sim.placement.PlacementCounts`).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import msgspec
import numpy as np
from msgspec import Struct

from fleetmedic.evaluation.scoring import is_repair
from fleetmedic.records import RemediationCommand, RemediationResult
from fleetmedic.sim import logs
from fleetmedic.sim.faults import REMEDY_LEVEL, Fault, FaultSet
from fleetmedic.sim.logs import FailureReport
from fleetmedic.sim.placement import PlacementCounts, Replacement, count_replacements, restarter
from fleetmedic.sim.workload import PENDING

if TYPE_CHECKING:
    from fleetmedic.sim.fleet import Fleet
    from fleetmedic.sim.telemetry import GpuModel, PortModel
    from fleetmedic.sim.workload import Interruption, Workload

EXECUTOR = "fleetmedic-simulator"


@dataclass(frozen=True)
class LoopSpec:
    executor_latency_s: float = 2.0
    drain_grace_s: float = 30.0
    diagnostics_s: tuple[float, float, float, float] = (90.0, 600.0, 1500.0, 7200.0)  # dcgmi diag -r 1..4
    reset_gpu_s: float = 90.0
    reboot_s: float = 600.0
    repair_s: tuple[float, float] = (2 * 3600.0, 6 * 3600.0)
    diag_false_fail: float = 0.01


@dataclass
class NodeState:
    cordoned: bool = False
    tainted: bool = False
    down_fault: bool = False  # down because of a fault (crash) or planned maintenance
    operator_cordon: bool = False  # cordoned by a person (planned maintenance), not by fleetmedic
    action: str = ""  # diagnostics | reset_gpu | reboot | repair
    action_until: float = 0.0
    action_cmd: RemediationCommand | None = None
    action_params: dict[str, str] = field(default_factory=dict)
    action_started: float = 0.0  # when the diagnostics in progress last (re)started
    up_since: float = float("-inf")  # when the node last came back up after being down


@dataclass
class CommandLog:
    cmd: RemediationCommand
    applied_at: float | None = None
    outcome: str = ""


class PhaseStats(Struct, frozen=True, kw_only=True):
    n: int
    mean_s: float | None
    p50_s: float | None
    p90_s: float | None
    max_s: float | None = None


class OutageRecord(Struct, frozen=True, kw_only=True):
    job: str
    cause: str
    fault_kind: str
    fault_class: str
    node: str
    onset: float
    t_fail: float
    failures: int
    repeat_failures: int
    lost_steps: int
    recovered: bool
    detect_s: float | None = None
    isolate_s: float | None = None
    wait_capacity_s: float | None = None
    restore_s: float | None = None
    first_good_step_s: float | None = None
    mttr_s: float | None = None
    detected_by: str = ""


class Accounting(Struct, frozen=True, kw_only=True):
    """What the closed loop measured over the run (``accounting.json``)."""

    start: float
    end: float
    nodes: int
    node_hours: float
    dangerous_schedulable_node_h: float
    healthy_unschedulable_node_h: float
    job_wall_h: float
    productive_h: float
    effective_training_time_ratio: float | None
    job_failures: int
    repeat_failures: int
    repeat_failures_same_node: int
    outages: list[OutageRecord]
    phases: dict[str, PhaseStats]
    commands: int
    results: dict[str, int]
    isolations: list[tuple[str, float, str]]  # (node, time, action) of applied isolating commands
    placement: dict[str, PlacementCounts] = {}  # re-placements: "all" and by restarter
    dangerous_by_fault: dict[str, float] = {}  # fault id -> seconds a node it should isolate stayed schedulable


def _stats(xs: list[float]) -> PhaseStats:
    if not xs:
        return PhaseStats(n=0, mean_s=None, p50_s=None, p90_s=None)
    a = np.array(xs)
    return PhaseStats(n=len(xs), mean_s=round(float(a.mean()), 3), p50_s=round(float(np.percentile(a, 50)), 3),
                      p90_s=round(float(np.percentile(a, 90)), 3), max_s=round(float(a.max()), 3))


class LoopHost(Protocol):
    """What the closed loop may touch (the simulator implements it)."""

    seed: int
    start: float
    fleet: Fleet
    workload: Workload
    gpu: GpuModel
    ports: PortModel
    faults: FaultSet

    def skew(self, node: int) -> float: ...
    def faults_on(self, node: int, t: float) -> list[Fault]: ...
    def fault_cause(self, node: int, t: float) -> str: ...
    def clear_faults(self, node: int, t: float, level: int, by: str, gpu: int | None) -> list[str]: ...


class ClosedLoop:
    def __init__(self, sim: LoopHost, spec: LoopSpec) -> None:
        self.sim = sim
        self.spec = spec
        n = sim.fleet.n
        self.nodes = [NodeState() for _ in range(n)]
        self.queue: list[tuple[float, int, RemediationCommand]] = []
        self.timers: list[tuple[float, int, Callable[[float], None]]] = []
        self.log: list[CommandLog] = []
        self._by_id: dict[str, CommandLog] = {}
        self.results: list[RemediationResult] = []
        self._seq = 0
        self.dangerous_s = 0.0
        self.dangerous_by_fault: dict[str, float] = {}
        self.healthy_unsched_s = 0.0
        self.isolations: list[tuple[int, float, str]] = []
        self._masks: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._busy: set[int] = set()  # nodes with a timed action in progress

    # --- masks ---------------------------------------------------------------------------------

    def mark_dirty(self) -> None:
        """Node state changed: recompute the masks on next use."""
        self._masks = None

    def _get_masks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._masks is None:
            sched = np.array([not (s.cordoned or s.operator_cordon or s.tainted or s.action) for s in self.nodes])
            up = np.array([not (s.down_fault or s.action in ("reboot", "repair")) for s in self.nodes])
            down_fault = np.array([s.down_fault or s.operator_cordon for s in self.nodes])  # not ours
            self._masks = (sched, up, down_fault)
        return self._masks

    def schedulable(self) -> np.ndarray:
        """(N,) bool: the scheduler may place new ranks there (read-only)."""
        return self._get_masks()[0]

    def up(self) -> np.ndarray:
        """(N,) bool: the node is running (read-only)."""
        return self._get_masks()[1]

    # --- commands ------------------------------------------------------------------------------

    def submit(self, cmd: RemediationCommand, now: float) -> None:
        at = max(cmd.issued_at, now) + self.spec.executor_latency_s
        self._seq += 1
        self.queue.append((at, self._seq, cmd))
        self.queue.sort(key=lambda q: (q[0], q[1]))

    def _result(self, cmd: RemediationCommand, t: float, outcome: str, reason: str = "",
                details: dict[str, str] | None = None) -> None:
        self.results.append(RemediationResult(
            command_id=cmd.id, action=cmd.action, outcome=outcome, ts=round(t, 3), reason=reason,  # type: ignore[arg-type]
            node=cmd.node, job=cmd.job, executor=EXECUTOR, dry_run=cmd.dry_run, details=details or {}))
        entry = self._by_id.get(cmd.id)
        if entry is not None:
            entry.outcome = outcome

    def process(self, t0: float, t1: float) -> None:
        """Apply commands due by ``t1`` and finish actions that complete by then."""
        while self.queue and self.queue[0][0] <= t1:
            at, _, cmd = self.queue.pop(0)
            self.mark_dirty()
            self._apply(cmd, at)
        while self.timers and self.timers[0][0] <= t1:
            at, _, fn = self.timers.pop(0)
            self.mark_dirty()
            fn(at)
        if self._busy:
            for i in sorted(self._busy):
                s = self.nodes[i]
                if s.action and s.action_until <= t1:
                    self.mark_dirty()
                    self._finish(i, s.action_until)

    def _apply(self, cmd: RemediationCommand, t: float) -> None:
        if cmd.id in self._by_id:
            self._result(cmd, t, "skipped", "duplicate command id (already applied)")
            return
        entry = CommandLog(cmd)
        self.log.append(entry)
        self._by_id[cmd.id] = entry
        if cmd.dry_run:
            self._result(cmd, t, "skipped", "dry run")
            return
        if cmd.expires_at < t:
            self._result(cmd, t, "skipped", "expired before it could be applied")
            return
        node = self.sim.fleet.node_index.get(cmd.node, -1) if cmd.node else -1
        if cmd.node and node < 0:
            self._result(cmd, t, "failed", f"unknown node {cmd.node}")
            return
        entry.applied_at = t
        handler = getattr(self, f"_do_{cmd.action}")
        handler(cmd, node, t)

    def _isolated(self, node: int, t: float, action: str) -> None:
        self.isolations.append((node, t, action))

    def _do_cordon(self, cmd: RemediationCommand, node: int, t: float) -> None:
        if node < 0:
            self._result(cmd, t, "failed", "cordon needs a node")
            return
        self.nodes[node].cordoned = True
        self._isolated(node, t, "cordon")
        self._result(cmd, t, "applied")

    def _do_taint(self, cmd: RemediationCommand, node: int, t: float) -> None:
        if node < 0:
            self._result(cmd, t, "failed", "taint needs a node")
            return
        self.nodes[node].tainted = True
        self._isolated(node, t, "taint")
        self._result(cmd, t, "applied")

    def _do_uncordon(self, cmd: RemediationCommand, node: int, t: float) -> None:
        if node < 0:
            self._result(cmd, t, "failed", "uncordon needs a node")
            return
        self.nodes[node].cordoned = False
        self._result(cmd, t, "applied")

    def _do_untaint(self, cmd: RemediationCommand, node: int, t: float) -> None:
        if node < 0:
            self._result(cmd, t, "failed", "untaint needs a node")
            return
        self.nodes[node].tainted = False
        self._result(cmd, t, "applied")

    def _do_return_to_service(self, cmd: RemediationCommand, node: int, t: float) -> None:
        if node < 0:
            self._result(cmd, t, "failed", "return_to_service needs a node")
            return
        s = self.nodes[node]
        if s.action:
            self._result(cmd, t, "failed", f"node busy: {s.action}")
            return
        s.cordoned = s.tainted = False
        self._result(cmd, t, "applied")

    def _do_label(self, cmd: RemediationCommand, node: int, t: float) -> None:
        self._result(cmd, t, "applied")

    def _do_escalate(self, cmd: RemediationCommand, node: int, t: float) -> None:
        if node < 0 or not is_repair(cmd):
            self._result(cmd, t, "applied", "escalated (ticket only)")
            return
        self._evict(node, t, "NodeLost", "node sent to repair")
        s = self.nodes[node]
        s.cordoned = True
        self._isolated(node, t, "escalate")
        rng = self._rng(cmd)
        self._start(node, "repair", t + float(rng.uniform(*self.spec.repair_s)), cmd)

    def _do_drain(self, cmd: RemediationCommand, node: int, t: float) -> None:
        if node < 0:
            self._result(cmd, t, "failed", "drain needs a node")
            return
        self.nodes[node].cordoned = True
        self._isolated(node, t, "drain")

        def evict(at: float) -> None:
            evicted = self._evict(node, at, "Evicted", "drained")
            self._result(cmd, at, "applied", details={"evicted_jobs": ",".join(evicted)} if evicted else {})

        self._timer(t + self.spec.drain_grace_s, evict)

    def _timer(self, at: float, fn: Callable[[float], None]) -> None:
        self._seq += 1
        self.timers.append((at, self._seq, fn))
        self.timers.sort(key=lambda q: (q[0], q[1]))

    def _evict(self, node: int, t: float, reason: str, why: str) -> list[str]:
        sim = self.sim
        job = sim.workload.job_on(node)
        if job is None or not job.active():
            return []
        g = sim.fleet.g
        pos = job.nodes.index(node)
        pid = int(self._rng_t(t, node).integers(1000, 400_000))
        code = 143 if reason == "Evicted" else -1
        lines = logs.sigterm(t + sim.skew(node), pid) if reason == "Evicted" else [
            f"pod's node {sim.fleet.node_names[node]} is NotReady ({why})"]
        rep = FailureReport(code, reason, pos * g, node, lines)
        cause = self.sim.fault_cause(node, t)
        sim.workload.fail(job, t, rep, cause or "remediation", node)
        return [job.ref]

    def _do_restart_job(self, cmd: RemediationCommand, node: int, t: float, in_place: bool = False,
                        requeue: bool = False) -> None:
        sim = self.sim
        job = sim.workload.by_ref(cmd.job) if cmd.job else (sim.workload.job_on(node) if node >= 0 else None)
        if job is None:
            self._result(cmd, t, "failed", f"unknown job {cmd.job or '(none on node)'}")
            return
        exclude = {sim.fleet.node_index[n] for n in cmd.exclude_nodes if n in sim.fleet.node_index}
        if cmd.params.get("only_if_waiting") == "true":  # as the executor: more exclusions for waiting pods only
            waiting = job.state == PENDING and not job.in_place
            if waiting:
                job.exclude |= exclude
            self._result(cmd, t, "applied" if waiting else "skipped", "" if waiting else "the job is placed already")
            return
        ok = sim.workload.restart(job, t, cmd.id, f"fleetmedic {cmd.action}: {cmd.reason}", exclude,
                                  in_place=in_place, requeue=requeue)
        self._result(cmd, t, "applied" if ok else "skipped", "" if ok else "job already completed")

    def _do_requeue_job(self, cmd: RemediationCommand, node: int, t: float) -> None:
        self._do_restart_job(cmd, node, t, requeue=True)

    def _do_retry_in_place(self, cmd: RemediationCommand, node: int, t: float) -> None:
        self._do_restart_job(cmd, node, t, in_place=True)

    def _busy_with_ranks(self, cmd: RemediationCommand, node: int, t: float) -> bool:
        job = self.sim.workload.job_on(node)
        if job is not None and job.active():
            self._result(cmd, t, "failed", f"node has running ranks of {job.ref}; drain it first")
            return True
        if self.nodes[node].action:
            self._result(cmd, t, "failed", f"node busy: {self.nodes[node].action}")
            return True
        return False

    def _do_run_diagnostics(self, cmd: RemediationCommand, node: int, t: float) -> None:
        if node < 0:
            self._result(cmd, t, "failed", "run_diagnostics needs a node")
            return
        if self._busy_with_ranks(cmd, node, t):
            return
        level = int(cmd.params.get("level", "3"))
        level = min(4, max(1, level))
        self._start(node, "diagnostics", t + self.spec.diagnostics_s[level - 1], cmd, {"level": str(level)})
        self.nodes[node].action_started = t

    def _do_reset_gpu(self, cmd: RemediationCommand, node: int, t: float) -> None:
        if node < 0:
            self._result(cmd, t, "failed", "reset_gpu needs a node")
            return
        if self._busy_with_ranks(cmd, node, t):
            return
        self._start(node, "reset_gpu", t + self.spec.reset_gpu_s, cmd, {"gpu": cmd.params.get("gpu", "")})

    def _do_reboot_node(self, cmd: RemediationCommand, node: int, t: float) -> None:
        if node < 0:
            self._result(cmd, t, "failed", "reboot_node needs a node")
            return
        if self.nodes[node].action:
            self._result(cmd, t, "failed", f"node busy: {self.nodes[node].action}")
            return
        self._evict(node, t, "NodeLost", "rebooting")
        self._start(node, "reboot", t + self.spec.reboot_s, cmd)

    def _start(self, node: int, action: str, until: float, cmd: RemediationCommand,
               params: dict[str, str] | None = None) -> None:
        s = self.nodes[node]
        s.action, s.action_until, s.action_cmd, s.action_params = action, until, cmd, dict(params or {})
        self._busy.add(node)
        self.mark_dirty()

    def _diagnostics_rerun(self, node: int, t: float) -> float | None:
        """When diagnostics due at ``t`` end instead, if the node went down while they ran and no fault
        they detect is active (planned maintenance, not a crash, which fails them): they wait while the
        node is down and run again, whole, from when it is back up. None: they ran, the verdict is due."""
        s = self.nodes[node]
        if not (s.down_fault or s.up_since > s.action_started):
            return None
        if any(f.info.diag_detect > 0 for f in self.sim.faults_on(node, t)):
            return None
        s.action_started = t if s.down_fault else s.up_since
        return s.action_started + self.spec.diagnostics_s[int(s.action_params.get("level", "3")) - 1]

    def _finish(self, node: int, t: float) -> None:
        s = self.nodes[node]
        if s.action == "diagnostics":
            rerun = self._diagnostics_rerun(node, t)
            if rerun is not None:
                s.action_until = rerun
                return
        cmd = s.action_cmd
        action = s.action
        s.action, s.action_cmd = "", None
        self._busy.discard(node)
        assert cmd is not None
        sim = self.sim
        if action == "diagnostics":
            faults = [f for f in sim.faults_on(node, t) if f.info.diag_detect > 0]
            rng = self._rng(cmd)
            fail = any(rng.random() < f.info.diag_detect for f in faults) or (
                not faults and rng.random() < self.spec.diag_false_fail)
            details = {"diagnostics": "fail" if fail else "pass", "level": s.action_params.get("level", "3")}
            if fail:
                details["failed_tests"] = ",".join(sorted({_diag_test(f) for f in faults})) or "memory"
            self._result(cmd, t, "applied", details=details)
        elif action == "reset_gpu":
            gpu_s = s.action_params.get("gpu", "")
            gpu = int(gpu_s) if gpu_s.isdigit() else None
            sim.gpu.reset_gpu(node, gpu)
            cleared = sim.clear_faults(node, t, REMEDY_LEVEL["reset_gpu"], cmd.id, gpu)
            self._result(cmd, t, "applied", details={"cleared": ",".join(cleared)} if cleared else {})
        elif action in ("reboot", "repair"):
            level = REMEDY_LEVEL["reboot" if action == "reboot" else "repair"]
            cleared = sim.clear_faults(node, t, level, cmd.id, None)
            still_down = s.down_fault
            sim.gpu.reboot(node)
            sim.ports.reboot_device(node)
            details = {"cleared": ",".join(cleared)} if cleared else {}
            if action == "repair":
                details["repair"] = "completed"
            if still_down:
                self._result(cmd, t, "failed", "node did not come back", details)
            else:
                self._result(cmd, t, "applied", details=details)

    def _rng(self, cmd: RemediationCommand) -> np.random.Generator:
        h = hashlib.blake2b(f"{self.sim.seed}:{cmd.id}".encode(), digest_size=8).digest()
        return np.random.default_rng(int.from_bytes(h, "little"))

    def _rng_t(self, t: float, node: int) -> np.random.Generator:
        return np.random.default_rng([self.sim.seed, node, int(t * 1000)])

    # --- accounting ----------------------------------------------------------------------------

    def account(self, dt: float, faulty: np.ndarray, schedulable: np.ndarray | None = None,
                active: list[Fault] | None = None) -> None:
        """Integrate node-time: ``faulty`` nodes should be isolated; ``schedulable`` (default: this
        loop's view) is the scheduler's effective view, which may also exclude unhealthy GPUs;
        ``active``: the faults behind ``faulty``, each charged while a node of it stays schedulable."""
        sched, up, down_fault = self._get_masks()
        if schedulable is not None:
            sched = schedulable
        ok = sched & up
        self.dangerous_s += dt * float(np.count_nonzero(faulty & ok))
        for f in active or ():
            nodes = f.isolate_nodes(self.sim.fleet)
            if len(nodes) and bool(ok[nodes].any()):
                self.dangerous_by_fault[f.id] = self.dangerous_by_fault.get(f.id, 0.0) + dt
        self.healthy_unsched_s += dt * float(np.count_nonzero(~faulty & ~ok & ~down_fault))

    def report(self, end: float) -> Accounting:
        sim = self.sim
        wl = sim.workload
        start = sim.start
        outages: list[OutageRecord] = []
        phases: dict[str, list[float]] = {k: [] for k in
                                          ("detect", "isolate", "wait_capacity", "restore", "first_good_step", "mttr")}
        fault_by_id = {f.id: f for f in sim.faults.faults}
        kills_by_fault: dict[str, list[int]] = {}
        failures = 0
        for intr in wl.interruptions:
            failures += sum(1 for f in intr.failures if f[1] != "planned")
            for _, cause, cnode, _, _ in intr.failures:
                if cause in fault_by_id and fault_by_id[cause].info.component != "job":
                    kills_by_fault.setdefault(cause, []).append(cnode)
            rec = self._outage(intr, fault_by_id, end)
            outages.append(rec)
            if rec.recovered and rec.cause != "planned":  # a planned restart is not a failure to recover from
                for k, v in (("detect", rec.detect_s), ("isolate", rec.isolate_s),
                             ("wait_capacity", rec.wait_capacity_s), ("restore", rec.restore_s),
                             ("first_good_step", rec.first_good_step_s), ("mttr", rec.mttr_s)):
                    if v is not None:
                        phases[k].append(v)
        repeat = sum(max(0, len(v) - 1) for v in kills_by_fault.values())
        repeat_same = sum(max(0, len(v) - len(set(v))) for v in kills_by_fault.values())
        wall = productive = 0.0
        for job in wl.jobs:
            if job.first_placed is None:
                continue
            fin = job.finished_at if job.finished_at is not None else end
            wall += max(0.0, fin - job.first_placed)
            productive += job.step * job.nominal_step
        by_outcome: dict[str, int] = {}
        for r in self.results:
            by_outcome[r.outcome] = by_outcome.get(r.outcome, 0) + 1
        names = sim.fleet.node_names
        return Accounting(
            start=start,
            end=end,
            nodes=sim.fleet.n,
            node_hours=round(sim.fleet.n * (end - start) / 3600.0, 3),
            dangerous_schedulable_node_h=round(self.dangerous_s / 3600.0, 4),
            healthy_unschedulable_node_h=round(self.healthy_unsched_s / 3600.0, 4),
            job_wall_h=round(wall / 3600.0, 4),
            productive_h=round(productive / 3600.0, 4),
            effective_training_time_ratio=round(productive / wall, 4) if wall > 0 else None,
            job_failures=failures,
            repeat_failures=repeat,
            repeat_failures_same_node=repeat_same,
            outages=outages,
            phases={k: _stats(v) for k, v in phases.items()},
            commands=len(self.log),
            results=dict(sorted(by_outcome.items())),
            isolations=[(names[n], round(t, 3), a) for n, t, a in self.isolations],
            placement=placement_counts(wl.interruptions, fault_by_id, sim.fleet.node_su),
            dangerous_by_fault={k: round(v, 3) for k, v in sorted(self.dangerous_by_fault.items())},
        )

    def _outage(self, intr: Interruption, fault_by_id: dict[str, Fault], end: float) -> OutageRecord:
        sim = self.sim
        fault = fault_by_id.get(intr.cause)
        onset = fault.onset if fault is not None else intr.t_fail
        onset = min(onset, intr.t_fail)
        fnodes = set(fault.nodes(sim.fleet)) if fault is not None else set()
        fnodes |= {f[2] for f in intr.failures if f[2] >= 0}
        names = {sim.fleet.node_names[n] for n in fnodes}
        first_cmd = None
        detected_by = "job_controller"
        for e in self.log:
            c = e.cmd
            if c.issued_at >= onset - 1.0 and (c.job == intr.job or (c.node and c.node in names)):
                first_cmd = c.issued_at
                detected_by = c.id
                break
        detected = intr.t_fail if first_cmd is None else min(first_cmd, intr.t_fail)
        if first_cmd is not None and first_cmd > intr.t_fail:
            detected_by = "job_controller"
        repeats = 0
        seen: set[int] = set()
        for f in intr.failures:
            if f[2] >= 0 and f[2] in seen:
                repeats += 1
            seen.add(f[2])
        rec = dict(job=intr.job, cause=intr.cause, fault_kind=fault.kind if fault else "",
                   fault_class=fault.info.fault_class if fault else "", node=sim.fleet.node_names[intr.node]
                   if intr.node >= 0 else "", onset=round(onset, 3), t_fail=round(intr.t_fail, 3),
                   failures=len(intr.failures), repeat_failures=repeats, lost_steps=intr.lost_steps,
                   recovered=intr.t_first_step is not None, detected_by=detected_by)
        if intr.t_first_step is None or intr.t_placed is None or intr.t_resumed is None:
            return OutageRecord(**rec)  # type: ignore[arg-type]
        restart = intr.t_restart_req if intr.t_restart_req is not None else intr.t_placed
        needs_isolation = fault is not None and fault.info.expected.startswith("isolate_")
        iso_times = [t for n, t, _ in self.isolations if n in fnodes and t >= onset - 1.0]
        if needs_isolation:
            raw_iso = min(iso_times) if iso_times else restart
            isolated = min(max(raw_iso, detected), max(restart, detected))
        else:
            isolated = detected
        marks = [onset, detected, isolated, intr.t_placed, intr.t_resumed, intr.t_first_step]
        for i in range(1, len(marks)):
            marks[i] = max(marks[i], marks[i - 1])
        d = [round(b - a, 3) for a, b in itertools.pairwise(marks)]
        rec.update(detect_s=d[0], isolate_s=d[1], wait_capacity_s=d[2], restore_s=d[3], first_good_step_s=d[4],
                   mttr_s=round(marks[-1] - marks[0], 3))
        return OutageRecord(**rec)  # type: ignore[arg-type]


def suspects(causes: Iterable[Fault], t: float) -> dict[int, str]:
    """The nodes of the faults behind an outage that are active at ``t`` and whose truth says isolate
    the node (or the node behind the bad link), with their fault's kind; a switch fault blames no node."""
    return {f.node: f.info.name for f in causes
            if f.node >= 0 and f.leaf < 0 and f.info.expected in ("isolate_node", "isolate_link")
            and f.onset <= t < f.end and (f.cleared_at is None or t < f.cleared_at)}


def placement_counts(interruptions: Iterable[Interruption], fault_by_id: dict[str, Fault],
                     node_su: np.ndarray) -> dict[str, PlacementCounts]:
    """The re-placements of every outage, summed: ``all`` and per restarter."""
    groups: dict[str, list[tuple[Replacement, dict[int, str]]]] = {"all": []}
    for intr in interruptions:
        for rec in intr.placements:  # the faults behind the failures so far, not a later one
            causes = [fault_by_id[f[1]] for f in intr.failures if f[1] in fault_by_id and f[0] <= rec.t]
            pair = (rec, suspects(causes, rec.t))
            groups["all"].append(pair)
            groups.setdefault(restarter(rec.by), []).append(pair)
    return {k: count_replacements(v, node_su) for k, v in groups.items()}


def _diag_test(f: Fault) -> str:
    c = f.info.component
    if f.kind in ("hbm_degradation", "xid48", "xid64", "xid95"):
        return "memory"
    if f.kind in ("nvlink_errors", "xid74"):
        return "nvlink"
    if f.kind == "pcie_degradation":
        return "pcie"
    if c in ("nic", "link", "switch"):
        return "ib_loopback"
    if f.kind in ("straggler", "fan_failure", "psu_failure"):
        return "targeted_power"
    return "software"


def encode_accounting(acc: Accounting) -> bytes:
    return msgspec.json.format(msgspec.json.encode(acc), indent=2) + b"\n"
