"""The simulator: one tick loop over fleet, workload, faults, telemetry and the closed loop.

In-process use (the embedded engine, benchmarks, tests)::

    sim = Simulator(SimConfig(nodes=64, duration_s=6 * 3600, seed=7, faults="mix"))
    for out in sim.run():              # one TickOutput per GPU sampling interval
        out.gpu                        # GpuBatch (columnar) or None
        out.ports                      # PortBatch every port interval, else None
        out.job_events                 # list[JobEvent], ts-ordered within the tick
        out.results                    # list[RemediationResult] of commands that completed
        sim.submit(command)            # closed loop: a RemediationCommand takes effect from now on
    sim.truth()                        # list[TruthRecord]: the injected faults
    sim.accounting()                   # Accounting: MTTR phases, ETTR, node-hours, repeat failures

Each tick ``(t0, t1]`` (``t1 = t0 + gpu_interval_s``): due commands and timed actions complete;
faults start, strike and end; ranks and links are slowed by the active faults; jobs run (and are
placed, restarted, checkpointed, failed); the GPU model samples at ``t1`` (and the port model
every ``port_interval_s``); node-time is accounted.

Determinism: everything random draws from generators seeded from ``seed`` (separate streams for the
fleet, the fault plan, each fault, the workload and each telemetry model), the clock is simulated
time from ``start``, and nothing iterates over unordered collections — the same seed, config and
commands give byte-identical output.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from fleetmedic.evaluation.truth import RunMeta, TruthRecord
from fleetmedic.records import JobEvent, RemediationCommand, RemediationResult
from fleetmedic.sim.batch import GpuBatch, Identity, PortBatch
from fleetmedic.sim.closed_loop import Accounting, ClosedLoop, LoopSpec
from fleetmedic.sim.fault_spec import plan_faults
from fleetmedic.sim.faults import REMEDY_LEVEL, Fault, FaultSet, make_fault
from fleetmedic.sim.fleet import Fleet, FleetSpec, build_fleet
from fleetmedic.sim.logs import FailureReport
from fleetmedic.sim.telemetry import GpuModel, NoiseSpec, PortModel
from fleetmedic.sim.workload import Job, Workload, WorkloadSpec

DEFAULT_START = 1_767_225_600.0  # 2026-01-01T00:00:00Z
JOB_RETARGET_S = 1800.0  # a job-level fault waits this long for a running job before it is dropped


@dataclass(frozen=True)
class SimConfig:
    nodes: int = 64
    duration_s: float = 6 * 3600.0
    seed: int = 0
    faults: str = "mix"
    start: float = DEFAULT_START
    gpu_interval_s: float = 10.0
    port_interval_s: float = 30.0
    noise: NoiseSpec = field(default_factory=NoiseSpec)
    fleet: FleetSpec | None = None  # overrides ``nodes`` when given
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    loop: LoopSpec = field(default_factory=LoopSpec)
    ports: bool = True  # generate port telemetry
    device_plugin_health: bool = True  # GPUs with non-application XIDs become unallocatable

    def fleet_spec(self) -> FleetSpec:
        return self.fleet if self.fleet is not None else FleetSpec(nodes=self.nodes)


@dataclass(frozen=True)
class NodeObservation:
    """What an executor watching Kubernetes sees change on a node: its cordon and who made it
    (feed it to :meth:`fleetmedic.remediation.engine.DecisionEngine.node_observed`)."""

    node: str
    cordoned: bool
    cordoned_by_fleetmedic: bool


@dataclass
class TickOutput:
    t: float
    gpu: GpuBatch | None
    ports: PortBatch | None
    job_events: list[JobEvent]
    results: list[RemediationResult]
    nodes: list[NodeObservation] = field(default_factory=list)


class Simulator:
    def __init__(self, config: SimConfig) -> None:
        if config.gpu_interval_s <= 0 or config.duration_s <= 0:
            raise ValueError("intervals and duration must be positive")
        self.config = config
        self.seed = config.seed
        self.start = config.start
        self.end = config.start + config.duration_s
        ss = np.random.SeedSequence([config.seed, 0x51])
        s_gpu, s_port, s_work, s_fault = ss.spawn(4)
        self.fleet: Fleet = build_fleet(config.fleet_spec(), config.seed)
        self.identity = Identity(self.fleet, config.seed)
        self.gpu = GpuModel(self.fleet, self.identity, np.random.default_rng(s_gpu), config.gpu_interval_s,
                            config.noise)
        self.port_every = max(1, round(config.port_interval_s / config.gpu_interval_s))
        self.ports = PortModel(self.fleet, self.identity, np.random.default_rng(s_port),
                               self.port_every * config.gpu_interval_s, config.noise)
        self.workload = Workload(self.fleet, config.workload, np.random.default_rng(s_work), self.start)
        self.loop = ClosedLoop(self, config.loop)
        plan = plan_faults(config.faults, self.fleet, config.duration_s, config.seed)
        fseeds = s_fault.spawn(max(1, len(plan)))
        faults = []
        for i, p in enumerate(plan):
            f = make_fault(p.kind, f"f{i:04d}-{p.kind}", self.start + p.onset_s, p.duration_s,
                           np.random.default_rng(fseeds[i]), node=p.node, gpu=p.gpu, nic=p.nic, leaf=p.leaf,
                           source=p.source, params=dict(p.params))
            f.pinned = p.pinned
            faults.append(f)
        self.faults = FaultSet(faults)
        self.now = self.start
        self._ticks = 0
        self._observed: list[NodeObservation] = []

    # --- FaultHost -----------------------------------------------------------------------------

    def kill(self, job: Job, t: float, report: FailureReport, fault: Fault) -> None:
        if job.ref not in fault.affected:
            fault.affected.append(job.ref)
        self.workload.fail(job, t, report, fault.id, fault.node)

    def hang(self, job: Job, t: float, report: FailureReport, fault: Fault) -> None:
        if job.ref not in fault.affected:
            fault.affected.append(job.ref)
        self.workload.hang(job, t, report, fault.id, fault.node)

    def set_node_down(self, node: int, t: float, down: bool) -> None:
        self.loop.nodes[node].down_fault = down
        if not down:
            self.loop.nodes[node].up_since = t
        self.loop.mark_dirty()
        if down:
            self.gpu.node_up[node] = False
            job = self.workload.job_on(node)
            if job is not None and job.active():  # nobody handled it: the pod's node is lost
                rep = FailureReport(-1, "NodeLost", job.nodes.index(node) * self.fleet.g, node,
                                    [f"pod's node {self.fleet.node_names[node]} is NotReady "
                                     "(node.kubernetes.io/unreachable)"])
                self.workload.fail(job, t, rep, self.fault_cause(node, t) or "node_down", node)

    def set_operator_cordon(self, node: int, t: float, cordoned: bool) -> None:
        """A person cordons (uncordons) the node, e.g. for planned maintenance."""
        s = self.loop.nodes[node]
        s.operator_cordon = cordoned
        self.loop.mark_dirty()
        self._observed.append(NodeObservation(self.fleet.node_names[node], cordoned or s.cordoned, s.cordoned))

    def skew(self, node: int) -> float:
        return float(self.gpu.delivery.skew[node])

    # --- queries used by the closed loop --------------------------------------------------------

    def schedulable(self) -> np.ndarray:
        """(N,) bool: new ranks may go there — not cordoned, tainted or busy with an action, and
        (with ``device_plugin_health``) every GPU allocatable."""
        sched = self.loop.schedulable()
        if self.config.device_plugin_health:
            sched = sched & ~self.gpu.unhealthy.any(axis=1)
        return sched

    def faults_on(self, node: int, t: float) -> list[Fault]:
        return [f for f in self.faults.faults if f.active and node in f.isolate_nodes(self.fleet)]

    def fault_cause(self, node: int, t: float) -> str:
        hits = self.faults_on(node, t)
        return hits[0].id if hits else ""

    def clear_faults(self, node: int, t: float, level: int, by: str, gpu: int | None) -> list[str]:

        cleared = []
        for f in self.faults.faults:
            if not f.active or f.node != node or f.leaf >= 0:
                continue
            need = REMEDY_LEVEL.get(f.remedy)
            if need is None or need == 0 or need > level:
                continue
            if gpu is not None and f.gpu >= 0 and f.gpu != gpu:
                continue
            f.stop(self, t, by)
            cleared.append(f.id)
        return cleared

    # --- the closed loop -------------------------------------------------------------------------

    def submit(self, command: RemediationCommand) -> None:
        """Queue a remediation command; it applies at ``max(issued_at, now) + executor latency``."""
        self.loop.submit(command, self.now)

    def submit_all(self, commands: Iterable[RemediationCommand]) -> None:
        for c in commands:
            self.submit(c)

    # --- time ------------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.now >= self.end - 1e-9

    def step(self) -> TickOutput | None:
        if self.done:
            return None
        cfg = self.config
        dt = cfg.gpu_interval_s
        t0, t1 = self.now, min(self.end, self.now + dt)
        self.loop.process(t0, t1)
        self._faults(t0, t1)
        active = self.faults.active()
        rank_slow = self.fleet.compute_speed.copy()
        net_slow = np.ones(self.fleet.n)
        for f in active:
            f.slow(t1, rank_slow, net_slow)
        up = self.loop.up()
        self.gpu.node_up[:] = up
        sched = self.schedulable()
        load = self.workload.advance(t0, t1, rank_slow, net_slow, sched, up)
        gpu = self.gpu.step(t1, load, active)
        ports = None
        self._ticks += 1
        if cfg.ports and self._ticks % self.port_every == 0:
            ports = self.ports.step(t1, load, active, up)
        faulty = np.zeros(self.fleet.n, dtype=bool)
        for f in active:
            faulty[f.isolate_nodes(self.fleet)] = True
        self.loop.account(t1 - t0, faulty, sched, [f for f in active if f.info.expected.startswith("isolate_")])
        self.now = t1
        results, self.loop.results = self.loop.results, []
        observed, self._observed = self._observed, []
        return TickOutput(t1, gpu, ports, self.workload.drain_events(), results, observed)

    def _faults(self, t0: float, t1: float) -> None:
        for f in self.faults.faults:
            if not f.started and f.onset <= t1 and f.onset < self.end:
                self._retarget(f)
                f.start(self, max(f.onset, t0))
                if f.dropped and f.planned_onset + JOB_RETARGET_S > t1 + self.config.gpu_interval_s:
                    f.started = f.dropped = False
                    f.end += t1 + self.config.gpu_interval_s - f.onset
                    f.onset = t1 + self.config.gpu_interval_s
            if f.active:
                f.on_tick(self, t0, t1)
                if not f.observed:  # a fault only a technician saw (its nodes away for repair) is unobserved
                    nodes = f.nodes(self.fleet)
                    f.observed = not nodes or any(self.loop.nodes[n].action != "repair" for n in nodes)
            if f.active and f.end <= t1:
                f.stop(self, f.end)

    def _retarget(self, f: Fault) -> None:
        """Faults that need a busy GPU (application XIDs) or an idle node (planned reboots) pick one at
        onset unless their target was given."""
        if f.pinned or f.node < 0:
            return
        wl = self.workload
        if f.info.target == "busy_gpu" and wl.job_on(f.node) is None:
            busy = [i for i in range(self.fleet.n) if wl.job_on(i) is not None]
            if busy:
                f.node = busy[int(f.rng.integers(0, len(busy)))]
        elif f.info.target == "idle_node" and wl.job_on(f.node) is not None:
            idle = [i for i in range(self.fleet.n) if wl.job_on(i) is None and self.loop.up()[i]]
            if idle:
                f.node = idle[int(f.rng.integers(0, len(idle)))]

    def run(self) -> Iterator[TickOutput]:
        while True:
            out = self.step()
            if out is None:
                return
            yield out

    # --- results ---------------------------------------------------------------------------------

    def truth(self) -> list[TruthRecord]:
        return [f.truth(self.fleet) for f in self.faults.faults if f.started and not f.dropped]

    def accounting(self) -> Accounting:
        return self.loop.report(self.now)

    def meta(self) -> RunMeta:
        fleet = self.fleet
        return RunMeta(
            seed=self.seed,
            start=self.start,
            end=self.end,
            nodes=list(fleet.node_names),
            gpus_per_node=fleet.g,
            switches=list(fleet.leaf_names) + list(fleet.spine_names),
            racks={n: fleet.rack_names[int(fleet.node_rack[i])] for i, n in enumerate(fleet.node_names)},
            leaf_of={n: sorted({fleet.leaf_names[int(x)] for x in fleet.ports.leaf_of[i]})
                     for i, n in enumerate(fleet.node_names)},
            faults_spec=self.config.faults,
            gpu_interval_s=self.config.gpu_interval_s,
            port_interval_s=self.port_every * self.config.gpu_interval_s,
        )


def simulate(config: SimConfig, commands: Iterable[RemediationCommand] = ()) -> Simulator:
    """Run a whole simulation (optionally with commands replayed at their ``issued_at``)."""
    sim = Simulator(config)
    pending = sorted(commands, key=lambda c: c.issued_at)
    i = 0
    while not sim.done:
        while i < len(pending) and pending[i].issued_at <= sim.now + config.gpu_interval_s:
            sim.submit(pending[i])
            i += 1
        sim.step()
    return sim

