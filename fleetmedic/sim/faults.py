"""The fault library: what each fault does to the fleet, its jobs and its telemetry, and its truth.

A fault is a small object with an onset, a natural end and a target (a GPU, a node, a NIC, a leaf
switch or a job). While active it

- changes the physics of its slice through the telemetry hooks (``gpu_pre``/``gpu_post``,
  ``port_pre``/``port_post``: extra heat, clock multipliers, throttle reasons, counters that climb,
  a GPU that stops answering, a link that goes down, a switch that goes silent),
- slows ranks or links (``slow``: a rank's compute multiplier, a node's communication multiplier),
- emits XID events as the driver would, and
- strikes jobs: a *crash* (the failing rank exits; other ranks see NCCL errors) or a *hang*
  (a collective never completes; every rank aborts when the NCCL watchdog fires after
  ``nccl_timeout_s``). Persistent hardware faults also strike every later attempt placed on the
  node (the repeat failure a missing cordon causes).

Each kind (:data:`KINDS`) declares its class, component, expected response, the remediation that
clears it (``remedy``: ``reset_gpu`` < ``reboot`` < ``repair``; ``switch_repair`` and ``none``
cannot be cleared by a node command), its natural duration, how likely diagnostics are to catch it
and the symptoms it claims (checked by the tests). ``xid<N>`` for any code not listed picks its
behaviour from the XID bucket: isolating buckets crash the job like a hard fault, others are
negative controls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fleetmedic.evaluation.truth import Blame, Component, ExpectedResponse, FaultClass, TruthRecord
from fleetmedic.sim import logs
from fleetmedic.sim import xids as xidlib
from fleetmedic.sim.batch import PORT_FIELD_INDEX
from fleetmedic.sim.logs import FailureReport
from fleetmedic.sim.telemetry import (
    HW_POWER_BRAKE,
    HW_SLOWDOWN,
    HW_THERMAL,
    SW_POWER_CAP,
    SW_THERMAL,
    GpuTick,
    PortTick,
)

if TYPE_CHECKING:
    from fleetmedic.sim.fleet import Fleet
    from fleetmedic.sim.telemetry import GpuModel, PortModel
    from fleetmedic.sim.workload import Job, Workload

_P = PORT_FIELD_INDEX
_ELASTIC_HINT = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
REMEDY_LEVEL = {"none": 0, "reset_gpu": 1, "reboot": 2, "repair": 3}
ReportFn = Callable[["FaultHost", "Job", float], FailureReport]


class FaultHost(Protocol):
    """What a fault may touch (the engine implements it)."""

    fleet: Fleet
    workload: Workload
    gpu: GpuModel
    ports: PortModel

    def kill(self, job: Job, t: float, report: FailureReport, fault: Fault) -> None: ...
    def hang(self, job: Job, t: float, report: FailureReport, fault: Fault) -> None: ...
    def set_node_down(self, node: int, t: float, down: bool) -> None: ...
    def set_operator_cordon(self, node: int, t: float, cordoned: bool) -> None: ...
    def skew(self, node: int) -> float: ...


@dataclass(frozen=True)
class KindInfo:
    name: str
    fault_class: FaultClass
    component: Component
    expected: ExpectedResponse
    remedy: str
    duration_s: tuple[float, float]
    target: str  # gpu | node | nic | leaf | job | idle_node
    weight: float  # share in the random mix
    diag_detect: float  # probability that diagnostics fail while it is active
    symptoms: tuple[str, ...]
    description: str
    factory: Callable[..., Fault]


class Fault:
    """Base: lifecycle, job strikes, truth. Subclasses override the hooks they need."""

    def __init__(self, info: KindInfo, fid: str, onset: float, end: float, rng: np.random.Generator, *,
                 node: int = -1, gpu: int = -1, nic: int = -1, leaf: int = -1, source: str = "spec",
                 params: dict[str, Any] | None = None) -> None:
        self.info = info
        self.id = fid
        self.onset = onset
        self.planned_onset = onset
        self.end = end
        self.rng = rng
        self.pinned = False
        self.node = node
        self.gpu = gpu
        self.nic = nic
        self.leaf = leaf
        self.source = source
        self.params: dict[str, Any] = dict(params or {})
        self.job_ref = ""
        self.started = False
        self.active = False
        self.cleared_at: float | None = None
        self.cleared_by = ""
        self.affected: list[str] = []
        self.emitted_xids: list[int] = []
        self.dropped = False
        self._plan: dict[tuple[int, int], float] = {}
        self._struck: set[tuple[int, int]] = set()

    # --- identity ------------------------------------------------------------------------------

    @property
    def kind(self) -> str:
        return self.info.name

    @property
    def remedy(self) -> str:
        return self.info.remedy

    def nodes(self, fleet: Fleet) -> list[int]:
        if self.leaf >= 0:
            return fleet.leaf_nodes(self.leaf)
        return [self.node] if self.node >= 0 else []

    def isolate_nodes(self, fleet: Fleet) -> list[int]:
        if self.info.expected in ("isolate_node", "isolate_link", "isolate_switch"):
            return self.nodes(fleet)
        return []

    def blame(self, fleet: Fleet) -> list[Blame]:
        names = fleet.node_names
        c = self.info.component
        if c == "switch":
            return [Blame(kind="switch", name=fleet.leaf_names[self.leaf])]
        if c == "job":
            return [Blame(kind="job", name=self.job_ref)] if self.job_ref else []
        out: list[Blame] = []
        if c == "gpu" and self.node >= 0 and self.gpu >= 0:
            out.append(Blame(kind="gpu", name=f"{names[self.node]}/{self.gpu}"))
        if c in ("link", "nic") and self.node >= 0 and self.nic >= 0:
            pi = fleet.ports
            leaf = fleet.leaf_names[int(pi.leaf_of[self.node, self.nic])]
            out.append(Blame(kind="link", name=f"{leaf}:{pi.name[int(pi.leaf_port[self.node, self.nic])]}"))
            out.append(Blame(kind="link", name=f"{names[self.node]}:mlx5_{self.nic}"))
        if self.node >= 0:
            out.append(Blame(kind="node", name=names[self.node]))
        return out

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self, host: FaultHost, t: float) -> None:
        self.started = True
        self.active = True
        self.on_start(host, t)

    def stop(self, host: FaultHost, t: float, by: str = "") -> None:
        if not self.active:
            return
        self.active = False
        if by:
            self.cleared_at = t
            self.cleared_by = by
        self.on_stop(host, t)

    def on_start(self, host: FaultHost, t: float) -> None:
        pass

    def on_stop(self, host: FaultHost, t: float) -> None:
        pass

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        self.note_jobs(host)

    def slow(self, t: float, rank_slow: np.ndarray, net_slow: np.ndarray) -> None:
        pass

    def gpu_pre(self, tick: GpuTick) -> None:
        pass

    def gpu_post(self, tick: GpuTick) -> None:
        pass

    def port_pre(self, tick: PortTick) -> None:
        pass

    def port_post(self, tick: PortTick) -> None:
        pass

    # --- helpers for subclasses ------------------------------------------------------------------

    def note_jobs(self, host: FaultHost) -> None:
        for job in self.jobs_on(host):
            if job.ref not in self.affected:
                self.affected.append(job.ref)

    def jobs_on(self, host: FaultHost) -> list[Job]:
        wl = host.workload
        seen: dict[int, Job] = {}
        for n in self.nodes(host.fleet):
            j = wl.job_on(n)
            if j is not None and j.active():
                seen.setdefault(j.idx, j)
        return list(seen.values())

    def strike(self, host: FaultHost, t0: float, t1: float, mode: str, report: ReportFn,
               first_delay: tuple[float, float] = (1.0, 5.0), later_delay: tuple[float, float] = (20.0, 60.0),
               persistent: bool = True, since: float | None = None) -> None:
        """Crash or hang every job attempt on the fault's nodes: the one running at ``since`` (default:
        the onset) after ``first_delay``, later attempts (if ``persistent``) ``later_delay`` after they
        start."""
        since = self.onset if since is None else since
        for job in self.jobs_on(host):
            if job.ref not in self.affected:
                self.affected.append(job.ref)
            key = (job.idx, job.attempt)
            if key in self._struck:
                continue
            at = self._plan.get(key)
            if at is None:
                if job.attempt_started <= since:
                    at = since + float(self.rng.uniform(*first_delay))
                elif persistent:
                    at = max(t0, job.attempt_started + float(self.rng.uniform(*later_delay)))
                else:
                    continue
                self._plan[key] = at
            if at > t1:
                continue
            self._struck.add(key)
            rep = report(host, job, at)
            if mode == "hang":
                host.hang(job, at, rep, self)
            else:
                host.kill(job, at, rep, self)

    def rank_of(self, host: FaultHost, job: Job, node: int, gpu: int) -> int:
        return job.nodes.index(node) * host.fleet.g + max(gpu, 0) if node in job.nodes else 0

    def pid(self) -> int:
        return int(self.rng.integers(1000, 400_000))

    def culprit_or_peer(self, host: FaultHost, job: Job, t: float, node: int, gpu: int, exit_code: int,
                        reason: str, culprit_lines: list[str], p_culprit: float = 0.85) -> FailureReport:
        """The controller reports the first pod that exited: usually the culprit's, sometimes a peer
        that died of the NCCL error first."""
        fleet = host.fleet
        g = fleet.g
        others = [n for n in job.nodes if n != node]
        if node in job.nodes and (not others or self.rng.random() < p_culprit):
            rank = self.rank_of(host, job, node, gpu)
            pid = self.pid()
            ts = t + host.skew(node)
            lines = [*culprit_lines,
                     *logs.torchrun_root_cause(ts, fleet.node_names[node], rank, rank % g, 1, pid, _ELASTIC_HINT)]
            return FailureReport(exit_code, reason, rank, node, lines)
        peer = others[int(self.rng.integers(0, len(others)))] if others else node
        lg = int(self.rng.integers(0, g))
        rank = job.nodes.index(peer) * g + lg
        pid = self.pid()
        lines = logs.nccl_peer_lost(fleet.node_names[peer], pid, pid + 31, lg,
                                    fleet.node_names[node] if node >= 0 else "unknown", rank)
        return FailureReport(1, "Error", rank, peer, lines)

    def watchdog_report(self, host: FaultHost, job: Job, t: float) -> FailureReport:
        """Every rank times out together; the controller reports whichever pod exited first."""
        fleet = host.fleet
        g = fleet.g
        pos = int(self.rng.integers(0, len(job.nodes)))
        node = job.nodes[pos]
        lg = int(self.rng.integers(0, g))
        rank = pos * g + lg
        job.seq += int(self.rng.integers(1000, 5000))
        ts = t + host.skew(node)
        pid = self.pid()
        lines = [*logs.nccl_watchdog_timeout(ts, rank, job.seq, int(self.rng.integers(1, 64)) * 4_194_304,
                                             int(host.workload.spec.nccl_timeout_s * 1000)),
                 *logs.torchrun_root_cause(ts + 4, fleet.node_names[node], rank, lg, -6, pid,
                                           f"Signal 6 (SIGABRT) received by PID {pid}")]
        return FailureReport(1, "Error", rank, node, lines)

    def xid(self, host: FaultHost, t: float, code: int, gpu: int | None = None, node: int | None = None) -> None:
        n = self.node if node is None else node
        g = self.gpu if gpu is None else gpu
        pid = self.pid() if host.workload.job_on(n) is not None else None
        host.gpu.emit_xid(n, g, code, t, xidlib.nvrm_line(code, host.fleet.pci(g), pid))
        if code not in self.emitted_xids:
            self.emitted_xids.append(code)

    # --- truth ------------------------------------------------------------------------------------

    def truth(self, fleet: Fleet) -> TruthRecord:
        names = fleet.node_names
        pi = fleet.ports
        port = ""
        if self.nic >= 0 and self.node >= 0:
            port = (f"mlx5_{self.nic}" if self.info.component == "nic"
                    else pi.name[int(pi.leaf_port[self.node, self.nic])])
        switch = ""
        if self.leaf >= 0:
            switch = fleet.leaf_names[self.leaf]
        elif self.nic >= 0 and self.node >= 0:
            switch = fleet.leaf_names[int(pi.leaf_of[self.node, self.nic])]
        return TruthRecord(
            id=self.id,
            kind=self.kind,
            fault_class=self.info.fault_class,
            component=self.info.component,
            onset=round(self.onset, 3),
            end=round(self.end, 3),
            expected_response=self.info.expected,
            blame=self.blame(fleet),
            node=names[self.node] if self.node >= 0 else "",
            nodes=[names[n] for n in self.nodes(fleet)],
            isolate_nodes=[names[n] for n in self.isolate_nodes(fleet)],
            gpu=self.gpu if self.gpu >= 0 else None,
            port=port,
            switch=switch,
            job=self.job_ref,
            affected_jobs=list(self.affected) or ([self.job_ref] if self.job_ref else []),
            xids=sorted(self.emitted_xids),
            symptoms=list(self.info.symptoms),
            source=self.source,
            description=self.info.description,
            params={k: str(v) for k, v in sorted(self.params.items())},
            cleared_at=round(self.cleared_at, 3) if self.cleared_at is not None else None,
            cleared_by=self.cleared_by,
        )


# --- hard GPU faults ------------------------------------------------------------------------------

_CUDA_MSG = {
    79: "unspecified launch failure",
    48: "uncorrectable ECC error encountered",
    64: "uncorrectable ECC error encountered",
    95: "uncorrectable ECC error encountered",
    140: "uncorrectable ECC error encountered",
    74: "unspecified launch failure",
    62: "unknown error",
    143: "initialization error",
}
_HANGS = frozenset({119, 120, 46, 109, 158})


class GpuHardFault(Fault):
    """A fatal GPU error (an XID with a RESET_GPU/RESTART_BM/workflow bucket): crash or hang the job,
    and every later job on the node, until the remedy or a technician clears it."""

    @property
    def code(self) -> int:
        return int(self.params.get("xid", 79))

    def on_start(self, host: FaultHost, t: float) -> None:
        code = self.code
        m = host.gpu
        n, g = self.node, self.gpu
        if code == 64:
            self.xid(host, t, 48)
            m.dbe[n, g] += 1
            m.uncorr_rows[n, g] += 1
        self.xid(host, t, code)
        if code in (48, 95, 140):
            m.dbe[n, g] += 1
        if code == 48:
            m.uncorr_rows[n, g] += 1
            m.remap_pending[n, g] = 1
            self.xid(host, t + 0.02, 63)
        if code == 74:
            m.nvl_recovery[n, g] += 3
        self._next_xid = t + float(self.rng.uniform(120, 400))

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        code = self.code
        mode = "hang" if code in _HANGS else "crash"
        self.strike(host, t0, t1, mode, self._report)
        if code in _HANGS and t1 >= self._next_xid:  # GSP keeps timing out while the GPU is wedged
            self.xid(host, self._next_xid, code)
            self._next_xid += float(self.rng.uniform(120, 400))

    def _report(self, host: FaultHost, job: Job, t: float) -> FailureReport:
        code = self.code
        if code in _HANGS:
            return self.watchdog_report(host, job, t)
        if job.attempt_started > self.onset:  # a later attempt touching the bad GPU: XID again
            self.xid(host, t - 0.5, code)
        msg = _CUDA_MSG.get(code, "unspecified launch failure")
        pid = self.pid()
        lines = (logs.nccl_unhandled_cuda(self.rank_of(host, job, self.node, self.gpu),
                                          host.fleet.node_names[self.node], pid, pid + 17, self.gpu, msg)
                 if code in (79, 74) else logs.cuda_error(msg))
        return self.culprit_or_peer(host, job, t, self.node, self.gpu, 1, "Error", lines)

    def gpu_pre(self, tick: GpuTick) -> None:
        if self.code in _HANGS:  # a wedged GPU: kernels never retire, no real work
            n, g = self.node, self.gpu
            tick.util[n, g] = 100.0
            tick.sm_active[n, g] = 0.0
            tick.tensor[n, g] = 0.0
            tick.dram[n, g] = 0.0
            tick.demand_level[n, g] = 0.12

    def gpu_post(self, tick: GpuTick) -> None:
        n, g = self.node, self.gpu
        if self.code == 79:
            tick.blank[n, g] = True
        elif self.code == 64:
            tick.model.remap_failure[n, g] = 1
        elif self.code == 74:
            tick.model.links_down[n, g] = 2


# --- degradation ------------------------------------------------------------------------------------


class HbmDegradation(Fault):
    """HBM wearing out: correctable ECC errors climb exponentially, rows get remapped (XID 63, pending
    remap), XID 92 when the SBE rate is excessive, then an uncorrectable error (XID 48 + 64) kills the
    job; after that the GPU behaves like a hard DBE fault until repaired."""

    def on_start(self, host: FaultHost, t: float) -> None:
        span = self.end - self.onset
        self.fail_at = self.onset + float(self.params.get("fail_after_s", min(span * 0.85, 4 * 3600.0)))
        self.params["fail_after_s"] = round(self.fail_at - self.onset, 1)
        self._next_remap = t + float(self.rng.uniform(300, 900))
        self._said92 = False
        self._failed = False

    def _rate(self, t: float) -> float:
        frac = min(1.0, max(0.0, (t - self.onset) / max(1.0, self.fail_at - self.onset)))
        return float(0.02 * (150.0**frac))  # 0.02/s -> 3/s

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        m = host.gpu
        n, g = self.node, self.gpu
        if not self._failed:
            m.sbe[n, g] += self.rng.poisson(self._rate(t1) * (t1 - t0))
            while self._next_remap <= t1 and self._next_remap < self.fail_at:
                m.corr_rows[n, g] += 1
                m.remap_pending[n, g] = 1
                self.xid(host, self._next_remap, 63)
                frac = (self._next_remap - self.onset) / max(1.0, self.fail_at - self.onset)
                self._next_remap += float(self.rng.uniform(300, 900)) * (1.0 - 0.7 * frac)
            if not self._said92 and self._rate(t1) > 1.0:
                self._said92 = True
                self.xid(host, t1 - 1.0, 92)
            if t1 >= self.fail_at:
                self._failed = True
                m.dbe[n, g] += 1
                m.uncorr_rows[n, g] += 1
                m.remap_failure[n, g] = 1
                self.xid(host, self.fail_at, 48)
                self.xid(host, self.fail_at + 0.05, 64)
        if self._failed:  # the job running when the HBM gives out is the first victim
            self.strike(host, t0, t1, "crash", self._report, first_delay=(0.5, 3.0), since=self.fail_at)
        else:
            self.note_jobs(host)

    def _report(self, host: FaultHost, job: Job, t: float) -> FailureReport:
        return self.culprit_or_peer(host, job, t, self.node, self.gpu, 1, "Error",
                                    logs.cuda_error("uncorrectable ECC error encountered"))

    def gpu_post(self, tick: GpuTick) -> None:
        if self._failed:
            tick.model.remap_failure[self.node, self.gpu] = 1


class Straggler(Fault):
    """One GPU 5-30 % slower: thermal (hot, HW_SLOWDOWN|SW_THERMAL) or power (brake, SW_POWER_CAP|
    HW_POWER_BRAKE). Its rank's compute time grows, so the whole job's step time does."""

    def on_start(self, host: FaultHost, t: float) -> None:
        self.params.setdefault("slowdown", round(float(self.rng.uniform(0.05, 0.30)), 3))
        self.params.setdefault("variant", "thermal" if self.rng.random() < 0.6 else "power")

    @property
    def s(self) -> float:
        return float(self.params["slowdown"])

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        self.note_jobs(host)
        if self.params["variant"] == "power":
            host.gpu.power_viol[self.node, self.gpu] += (t1 - t0) * 1e6 * 0.8

    def slow(self, t: float, rank_slow: np.ndarray, net_slow: np.ndarray) -> None:
        rank_slow[self.node, self.gpu] *= 1.0 + self.s

    def gpu_pre(self, tick: GpuTick) -> None:
        n, g = self.node, self.gpu
        tick.clock_mul[n, g] /= 1.0 + self.s
        if self.params["variant"] == "thermal":
            tick.heat_c[n, g] += 8.0 + 40.0 * self.s
            tick.mem_heat_c[n, g] += 4.0
            tick.reasons[n, g] |= HW_SLOWDOWN | SW_THERMAL
        else:
            tick.power_limit[n, g] *= 1.0 - 1.5 * self.s
            tick.reasons[n, g] |= SW_POWER_CAP | HW_POWER_BRAKE


class NvlinkErrors(Fault):
    """NVLink CRC and replay errors rising on one GPU; collectives slow a little."""

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        self.note_jobs(host)
        m = host.gpu
        n, g = self.node, self.gpu
        frac = min(1.0, (t1 - self.onset) / 3600.0)
        rate = 0.5 * (40.0 ** frac)  # 0.5/s -> 20/s over the first hour
        dt = t1 - t0
        flit = self.rng.poisson(rate * dt)
        m.nvl_flit[n, g] += flit
        m.nvl_data[n, g] += self.rng.poisson(rate * dt / 10.0)
        m.nvl_replay[n, g] += self.rng.poisson(rate * dt / 4.0)
        m.nvl_recovery[n, g] += self.rng.poisson(rate * dt / 200.0)

    def slow(self, t: float, rank_slow: np.ndarray, net_slow: np.ndarray) -> None:
        net_slow[self.node] *= 1.0 + float(self.params.setdefault("slowdown", 0.04))


def _nvlink_errors(host: FaultHost, rng: np.random.Generator, node: int, gpu: int, flit: float) -> None:
    """Add NVLink errors to one GPU's counters: ``flit`` CRC flit errors expected, data, replay and
    recovery errors in proportion (as :class:`NvlinkErrors`)."""
    m = host.gpu
    m.nvl_flit[node, gpu] += rng.poisson(flit)
    m.nvl_data[node, gpu] += rng.poisson(flit / 10.0)
    m.nvl_replay[node, gpu] += rng.poisson(flit / 4.0)
    m.nvl_recovery[node, gpu] += rng.poisson(flit / 200.0)


class NvlinkDegradingSlow(Fault):
    """NVLink errors on one GPU rising slowly: from none to ``peak_per_s`` CRC flit errors a second
    (data, replay and recovery errors in proportion) linearly over ``ramp_s``, then steady, while
    its siblings stay flat. A link wearing out (a marginal connector, cable or retimer): a per-GPU
    baseline that learns as it goes would take the rise for normal; collectives slow a little as it
    grows."""

    def on_start(self, host: FaultHost, t: float) -> None:
        self.params.setdefault("ramp_s", 7200.0)
        self.params.setdefault("peak_per_s", 0.2)

    def _frac(self, t: float) -> float:
        return min(1.0, max(0.0, (t - self.onset) / float(self.params["ramp_s"])))

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        self.note_jobs(host)
        rate = float(self.params["peak_per_s"]) * self._frac(0.5 * (t0 + t1))
        _nvlink_errors(host, self.rng, self.node, self.gpu, rate * (t1 - t0))

    def slow(self, t: float, rank_slow: np.ndarray, net_slow: np.ndarray) -> None:
        net_slow[self.node] *= 1.0 + 0.02 * self._frac(t)


class NvlinkBurst(Fault):
    """Bursts of NVLink errors on one GPU: ``burst_s`` (30-120 s) of ``burst_per_s`` CRC flit errors
    a second (data, replay and recovery errors in proportion), then quiet for 5-20 min, again and
    again, while its siblings stay flat. An intermittent link (a loose connector, a link retraining
    under load): collectives slow while a burst lasts."""

    def on_start(self, host: FaultHost, t: float) -> None:
        self.params.setdefault("burst_per_s", 200.0)
        self.params.setdefault("burst_s", round(float(self.rng.uniform(30.0, 120.0)), 1))
        self._burst = (self.onset, self.onset + float(self.params["burst_s"]))

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        self.note_jobs(host)
        start, end = self._burst
        overlap = max(0.0, min(t1, end) - max(t0, start))
        if overlap > 0:
            _nvlink_errors(host, self.rng, self.node, self.gpu, float(self.params["burst_per_s"]) * overlap)
        if t1 >= end:
            quiet = float(self.rng.uniform(300.0, 1200.0))
            self._burst = (end + quiet, end + quiet + float(self.params["burst_s"]))

    def slow(self, t: float, rank_slow: np.ndarray, net_slow: np.ndarray) -> None:
        if self._burst[0] <= t <= self._burst[1]:
            net_slow[self.node] *= 1.1


class PcieDegradation(Fault):
    """The GPU's PCIe link trained down (x16 -> x8) and replays climb; host transfers slow its rank."""

    def on_start(self, host: FaultHost, t: float) -> None:
        self.params.setdefault("width", 8)
        self.params.setdefault("slowdown", round(float(self.rng.uniform(0.05, 0.12)), 3))

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        self.note_jobs(host)
        host.gpu.pcie_replay[self.node, self.gpu] += self.rng.poisson(2.0 * (t1 - t0))

    def slow(self, t: float, rank_slow: np.ndarray, net_slow: np.ndarray) -> None:
        rank_slow[self.node, self.gpu] *= 1.0 + float(self.params["slowdown"])

    def gpu_post(self, tick: GpuTick) -> None:
        tick.model.pcie_width[self.node, self.gpu] = float(self.params["width"])

    def on_stop(self, host: FaultHost, t: float) -> None:
        # the fault is over when the link retrains at full width: the telemetry must say so too
        # (otherwise detectors keep seeing x8 after the truth window ends, and are scored false)
        host.gpu.pcie_width[self.node, self.gpu] = float(host.fleet.sku_of(self.node).pcie_width)


# --- network ---------------------------------------------------------------------------------------


def _ib_report(fault: Fault, host: FaultHost, job: Job, t: float, node: int, nic: int) -> FailureReport:
    fleet = host.fleet
    g = fleet.g
    if node in job.nodes:
        pos = job.nodes.index(node)
    else:
        pos = int(fault.rng.integers(0, len(job.nodes)))
        node = job.nodes[pos]
    lg = nic % g if nic >= 0 else int(fault.rng.integers(0, g))
    rank = pos * g + lg
    peers = [n for n in job.nodes if n != node] or [node]
    peer = peers[int(fault.rng.integers(0, len(peers)))]
    k = max(nic, 0)
    pid = fault.pid()
    lines = logs.nccl_ib_completion_error(fleet.node_names[node], pid, pid + 40, lg, fleet.node_ip[peer][k],
                                          fleet.node_ip[node][k], f"mlx5_{k}", rank)
    return FailureReport(1, "Error", rank, node, lines)


class NicFlap(Fault):
    """A host NIC's link flaps: down for seconds to minutes every few minutes. Long flaps outlast
    NCCL's IB retries and kill the job (status=12, retry exceeded); every flap counts a link-down on
    both ends and bursts symbol errors."""

    def on_start(self, host: FaultHost, t: float) -> None:
        flaps: list[tuple[float, float]] = []
        s = t + float(self.rng.uniform(5, 60))
        while s < self.end:
            d = float(self.rng.choice([self.rng.uniform(5, 25), self.rng.uniform(60, 150)], p=[0.6, 0.4]))
            flaps.append((s, s + d))
            s += d + float(self.rng.uniform(120, 600))
        self.flaps = flaps
        self.params["flaps"] = len(flaps)

    def down_at(self, t: float) -> bool:
        return any(a <= t < b for a, b in self.flaps)

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        self.note_jobs(host)
        for a, b in self.flaps:
            if b - a >= 60 and t0 < a + 45 <= t1:
                for job in self.jobs_on(host):
                    key = (job.idx, job.attempt)
                    if key not in self._struck:
                        self._struck.add(key)
                        host.kill(job, a + 45, _ib_report(self, host, job, a + 45, self.node, self.nic), self)

    def slow(self, t: float, rank_slow: np.ndarray, net_slow: np.ndarray) -> None:
        if self.down_at(t):
            net_slow[self.node] *= 3.0

    def port_pre(self, tick: PortTick) -> None:
        pi = tick.model.fleet.ports
        hp, lp = int(pi.host_port[self.node, self.nic]), int(pi.leaf_port[self.node, self.nic])
        t0 = tick.t - tick.dt
        if any(a < tick.t and b > t0 for a, b in self.flaps):
            c = tick.model.ctr
            c[_P["symbol_error_counter"], [hp, lp]] += self.rng.poisson(40, 2)
            c[_P["link_error_recovery_counter"], [hp, lp]] += 1
            # a flap shorter than a round is still seen by the link-downed counter
            if not self.down_at(tick.t):
                c[_P["link_downed_counter"], [hp, lp]] += 1
        if self.down_at(tick.t):
            tick.link_down[[hp, lp]] = True


class IbBer(Fault):
    """A marginal cable or transceiver on one leaf port: effective BER climbs from 1e-12 towards 1e-8
    over 15 minutes, symbol and receive errors count up, occasional link recoveries; the node behind
    it communicates slower (retransmissions: its collectives take 15-50 % longer)."""

    def on_start(self, host: FaultHost, t: float) -> None:
        self.params.setdefault("peak_log_ber", round(float(self.rng.uniform(-9.5, -7.5)), 2))
        self.params.setdefault("slowdown", round(float(self.rng.uniform(0.15, 0.5)), 3))

    def _ramp(self, t: float) -> float:
        return min(1.0, max(0.0, (t - self.onset) / 900.0))

    def log_ber(self, t: float) -> float:
        return -12.0 + (float(self.params["peak_log_ber"]) + 12.0) * self._ramp(t)

    def slow(self, t: float, rank_slow: np.ndarray, net_slow: np.ndarray) -> None:
        net_slow[self.node] *= 1.0 + float(self.params["slowdown"]) * self._ramp(t)

    def port_post(self, tick: PortTick) -> None:
        pi = tick.model.fleet.ports
        hp, lp = int(pi.host_port[self.node, self.nic]), int(pi.leaf_port[self.node, self.nic])
        lb = self.log_ber(tick.t)
        tick.ber[lp] = 10.0**lb * float(np.exp(0.3 * self.rng.standard_normal()))
        tick.ber[hp] = max(float(tick.ber[hp]), 10.0 ** (lb - 1.5))
        rate = 10.0 ** (lb + 9.0)  # symbol errors per second
        c = tick.model.ctr
        sym = self.rng.poisson(rate * tick.dt)
        c[_P["symbol_error_counter"], lp] += sym
        c[_P["port_rcv_errors"], lp] += self.rng.poisson(rate * tick.dt / 5.0)
        c[_P["port_rcv_remote_physical_errors"], hp] += self.rng.poisson(rate * tick.dt / 20.0)
        c[_P["symbol_error_counter"], hp] += self.rng.poisson(rate * tick.dt / 30.0)
        if lb > -9.0 and self.rng.random() < 0.05:
            c[_P["link_error_recovery_counter"], [hp, lp]] += 1

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        self.note_jobs(host)


class LeafFailure(Fault):
    """A leaf switch dies: it stops reporting, every node behind it loses that rail (host ports down,
    one link-down each), every job with ranks there fails with NCCL IB errors, and jobs placed there
    fail at start until the switch is replaced. No node is to blame."""

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        leaf = self.leaf
        pi = host.fleet.ports
        nodes = self.nodes(host.fleet)

        def report(h: FaultHost, job: Job, t: float) -> FailureReport:
            on = [n for n in job.nodes if n in nodes]
            node = on[int(self.rng.integers(0, len(on)))] if on else job.nodes[0]
            nic = int(np.flatnonzero(pi.leaf_of[node] == leaf)[0]) if on else -1
            return _ib_report(self, h, job, t, node, nic)

        self.strike(host, t0, t1, "crash", report, first_delay=(25.0, 45.0), later_delay=(30.0, 90.0))

    def port_pre(self, tick: PortTick) -> None:
        fleet = tick.model.fleet
        pi = fleet.ports
        dev = fleet.n + self.leaf
        tick.device_absent[dev] = True
        mask = pi.leaf_of == self.leaf
        tick.link_down[pi.host_port[mask]] = True
        tick.link_down[pi.leaf_port[mask]] = True
        tick.link_down[tick.model.spine_rows[:, self.leaf]] = True

    def slow(self, t: float, rank_slow: np.ndarray, net_slow: np.ndarray) -> None:
        pass


class NicDown(Fault):
    """A host NIC is lost (or its RoCE GID is wrong): its link stays down; jobs there fail with IB
    errors, and so does every job placed on the node until the NIC is replaced."""

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        self.strike(host, t0, t1, "crash",
                    lambda h, job, t: _ib_report(self, h, job, t, self.node, self.nic),
                    first_delay=(20.0, 40.0), later_delay=(30.0, 90.0))

    def port_pre(self, tick: PortTick) -> None:
        pi = tick.model.fleet.ports
        tick.link_down[[int(pi.host_port[self.node, self.nic]), int(pi.leaf_port[self.node, self.nic])]] = True


class NicSpeedLow(Fault):
    """A NIC trained at a lower speed (400 -> 200 Gb/s, width 4x -> 2x): that rail of the node halves
    its bandwidth, every collective of its job slows."""

    def on_start(self, host: FaultHost, t: float) -> None:
        self.params.setdefault("speed_gbps", 200.0)

    def slow(self, t: float, rank_slow: np.ndarray, net_slow: np.ndarray) -> None:
        net_slow[self.node] *= 1.4

    def port_pre(self, tick: PortTick) -> None:
        pi = tick.model.fleet.ports
        rows = [int(pi.host_port[self.node, self.nic]), int(pi.leaf_port[self.node, self.nic])]
        tick.speed_gbps[rows] = float(self.params["speed_gbps"])
        tick.width[rows] = 2.0


# --- node-level hardware ---------------------------------------------------------------------------


class FanFailure(Fault):
    """A failed fan: the whole node runs hotter, the GPUs nearest the fan throttle (HW_THERMAL) and
    their ranks slow."""

    def on_start(self, host: FaultHost, t: float) -> None:
        g = host.fleet.g
        k = int(self.rng.integers(1, 4))
        first = int(self.rng.integers(0, g))
        self.hot = sorted({(first + i) % g for i in range(k)})
        self.params["hot_gpus"] = ",".join(map(str, self.hot))

    def gpu_pre(self, tick: GpuTick) -> None:
        tick.heat_c[self.node] += 8.0
        tick.mem_heat_c[self.node] += 6.0
        for g in self.hot:
            tick.heat_c[self.node, g] += 22.0
            tick.clock_mul[self.node, g] *= 0.88
            tick.reasons[self.node, g] |= HW_THERMAL | SW_THERMAL

    def slow(self, t: float, rank_slow: np.ndarray, net_slow: np.ndarray) -> None:
        for g in self.hot:
            rank_slow[self.node, g] *= 1.13


class PsuFailure(Fault):
    """A failed power supply: the node's GPUs hit the power brake in bursts (HW_POWER_BRAKE,
    clocks collapse), so every rank on the node is slower on average."""

    def braking(self, t: float) -> bool:
        return int((t - self.onset) // 120) % 2 == 0

    def gpu_pre(self, tick: GpuTick) -> None:
        if self.braking(tick.t):
            tick.power_limit[self.node] *= 0.55
            tick.clock_mul[self.node] *= 0.6
            tick.reasons[self.node] |= HW_POWER_BRAKE | HW_SLOWDOWN

    def slow(self, t: float, rank_slow: np.ndarray, net_slow: np.ndarray) -> None:
        rank_slow[self.node] *= 1.35 if self.braking(t) else 1.0


class NodeCrash(Fault):
    """The node goes down (kernel panic, machine check, board failure): no telemetry, its link ports
    go down, the job's surviving ranks report their peer lost. It comes back, rebooted, when repaired
    (or rebooted, for the software variants)."""

    def on_start(self, host: FaultHost, t: float) -> None:
        self._down = False
        self._crash_at = t

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        if not self._down and t1 >= self._crash_at:
            self._down = True
            for job in self.jobs_on(host):
                if job.ref not in self.affected:
                    self.affected.append(job.ref)
                at = self._crash_at + float(self.rng.uniform(5, 30))
                others = [n for n in job.nodes if n != self.node]
                if others:
                    rep = self.culprit_or_peer(host, job, at, self.node, 0, 1, "Error", [], p_culprit=0.0)
                else:
                    rep = FailureReport(-1, "NodeLost", job.nodes.index(self.node) * host.fleet.g, self.node,
                                        [f"pod's node {host.fleet.node_names[self.node]} is NotReady "
                                         "(node.kubernetes.io/unreachable)"])
                host.kill(job, at, rep, self)
            host.set_node_down(self.node, self._crash_at, True)

    def on_stop(self, host: FaultHost, t: float) -> None:
        if self._down:
            host.set_node_down(self.node, t, False)


# --- transient software and job faults ---------------------------------------------------------------


class JobFault(Fault):
    """Base of faults that target a running job (picked at onset); ``nodes`` are the job's nodes."""

    job_nodes: list[int]

    def nodes(self, fleet: Fleet) -> list[int]:
        return list(getattr(self, "job_nodes", []))

    def pick_job(self, host: FaultHost, t: float) -> Job | None:
        jobs = host.workload.running_jobs()
        if self.job_ref:
            jobs = [j for j in jobs if j.ref == self.job_ref]
        if not jobs:
            return None
        jobs.sort(key=lambda j: j.idx)
        job = jobs[int(self.rng.integers(0, len(jobs)))]
        self.job_ref = job.ref
        self.job_idx = job.idx
        self.job_nodes = list(job.nodes)
        if job.ref not in self.affected:
            self.affected.append(job.ref)
        return job

    def on_start(self, host: FaultHost, t: float) -> None:
        job = self.pick_job(host, t)
        if job is None:
            self.dropped = True
            self.active = False
            return
        self.job_started(host, job, t)

    def job_started(self, host: FaultHost, job: Job, t: float) -> None:
        pass

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        pass


class NcclTimeout(JobFault):
    """One collective hangs (a transient fabric or software hiccup): the NCCL watchdog aborts every
    rank after the timeout; a retry succeeds."""

    def job_started(self, host: FaultHost, job: Job, t: float) -> None:
        host.hang(job, t, self.watchdog_report(host, job, t + host.workload.spec.nccl_timeout_s), self)
        self.end = t + host.workload.spec.nccl_timeout_s


class WorkerCrash(JobFault):
    """One worker dies (a data-loader worker killed, a segfault in a Python extension); a retry succeeds."""

    def job_started(self, host: FaultHost, job: Job, t: float) -> None:
        fleet = host.fleet
        pos = int(self.rng.integers(0, len(job.nodes)))
        lg = int(self.rng.integers(0, fleet.g))
        node = job.nodes[pos]
        sig, code = ("Killed", 1) if self.rng.random() < 0.6 else ("Segmentation fault", 139)
        self.params["signal"] = sig
        pid = self.pid()
        at = t + float(self.rng.uniform(1, 5))
        lines = [*logs.dataloader_killed(pid + 211, sig),
                 *logs.torchrun_root_cause(at + host.skew(node), fleet.node_names[node], pos * fleet.g + lg, lg, 1,
                                           pid, _ELASTIC_HINT)]
        host.kill(job, at, FailureReport(code, "Error", pos * fleet.g + lg, node, lines), self)
        self.end = at


class Oom(JobFault):
    """A transient CUDA OOM on one rank (fragmentation at an unlucky batch): its GPU's memory climbs
    to the limit over a few minutes, then the rank dies with ``torch.OutOfMemoryError``; a retry
    succeeds."""

    def job_started(self, host: FaultHost, job: Job, t: float) -> None:
        fleet = host.fleet
        pos = int(self.rng.integers(0, len(job.nodes)))
        self.node = job.nodes[pos]
        self.gpu = int(self.rng.integers(0, fleet.g))
        self.rank = pos * fleet.g + self.gpu
        self.crash_at = t + float(self.rng.uniform(120, 300))
        self.end = self.crash_at

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        if t0 < self.crash_at <= t1:
            job = host.workload.jobs[self.job_idx]
            if not job.active() or self.node not in job.nodes:
                return
            total = host.fleet.sku_of(self.node).fb_total_mib / 1024.0
            pid = self.pid()
            lines = [*logs.cuda_oom(self.gpu, float(self.rng.uniform(1.0, 8.0)), total - 0.45,
                                    float(self.rng.uniform(0.2, 1.0)), pid),
                     *logs.torchrun_root_cause(self.crash_at + host.skew(self.node), host.fleet.node_names[self.node],
                                               self.rank, self.gpu, 1, pid, _ELASTIC_HINT)]
            host.kill(job, self.crash_at, FailureReport(1, "Error", self.rank, self.node, lines), self)

    def gpu_pre(self, tick: GpuTick) -> None:
        if self.node >= 0 and tick.t <= self.crash_at + tick.dt:
            total = float(tick.model.fb_total[self.node, self.gpu])
            frac = min(1.0, max(0.0, 1.0 - (self.crash_at - tick.t) / 300.0))
            cur = float(tick.fb_used[self.node, self.gpu])
            tick.fb_used[self.node, self.gpu] = cur + (total - 600.0 - cur) * frac

    def nodes(self, fleet: Fleet) -> list[int]:
        return [self.node] if self.node >= 0 else []


class JobBug(JobFault):
    """A bug in the job: the same exception on every rank, on every attempt, a few steps in, until the
    owner fixes it (the fault's end). Variant ``cuda``: an illegal memory access, with XID 13 (or 31)
    on every GPU of the job — on healthy nodes. No node may be isolated for it."""

    def job_started(self, host: FaultHost, job: Job, t: float) -> None:
        self.params["variant"] = "cuda" if self.rng.random() < 0.4 else "python"
        self.bug = int(self.rng.integers(0, len(logs.JOB_BUGS)))
        self._xid = 13 if self.rng.random() < 0.6 else 31

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        job = host.workload.jobs[self.job_idx]
        if job.state != "running":
            return
        if job.ref not in self.affected:
            self.affected.append(job.ref)
        for n in job.nodes:
            if n not in self.job_nodes:
                self.job_nodes.append(n)
        key = (job.idx, job.attempt)
        if key in self._struck:
            return
        hit = max(self.onset, job.resumed_at) + 3 * job.last_step_time
        if hit > t1:
            return
        self._struck.add(key)
        hit = max(hit, t0)
        if self.params["variant"] == "cuda":
            for n in job.nodes:
                for g in range(host.fleet.g):
                    self.xid(host, hit - 0.2, self._xid, gpu=g, node=n)
        host.kill(job, hit, self._report(host, job, hit), self)

    def _report(self, host: FaultHost, job: Job, t: float) -> FailureReport:
        fleet = host.fleet
        pos = int(self.rng.integers(0, len(job.nodes)))
        node = job.nodes[pos]
        lg = int(self.rng.integers(0, fleet.g))
        pid = self.pid()
        body = (logs.cuda_error("an illegal memory access was encountered") if self.params["variant"] == "cuda"
                else logs.job_bug(self.bug))
        lines = [*body, *logs.torchrun_root_cause(t + host.skew(node), fleet.node_names[node], pos * fleet.g + lg,
                                                  lg, 1, pid, _ELASTIC_HINT)]
        return FailureReport(1, "Error", pos * fleet.g + lg, node, lines)


# --- negative controls ---------------------------------------------------------------------------------


class AppXid(Fault):
    """An XID caused by the application (13, 31: its process dies with an illegal memory access and a
    retry succeeds; 43: reported as the process is killed; others per bucket). Never a reason to
    isolate the node."""

    @property
    def code(self) -> int:
        return int(self.params.get("xid", 13))

    def on_start(self, host: FaultHost, t: float) -> None:
        self._done = False

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        if self._done:
            return
        self._done = True
        code = self.code
        self.xid(host, self.onset, code)
        job = host.workload.job_on(self.node)
        if job is not None and job.active():
            self.affected.append(job.ref)
            if code in (13, 31) or xidlib.info(code).bucket == "RESTART_APP":
                lines = logs.cuda_error("an illegal memory access was encountered")
                rep = self.culprit_or_peer(host, job, self.onset + 1, self.node, self.gpu, 1, "Error", lines, 0.9)
                host.kill(job, self.onset + 1.0, rep, self)
        self.end = self.onset + 1.0


class PartialScrape(Fault):
    """Partial scrapes: now and then one round of the node's telemetry lacks one GPU (an exporter
    timing out on one device, a scrape cut short), one round at a time, 2-10 min apart. The GPU is
    fine: missing data, not a GPU fallen off the bus. No action."""

    def on_start(self, host: FaultHost, t: float) -> None:
        self._next = t

    def gpu_post(self, tick: GpuTick) -> None:
        if tick.t >= self._next:
            tick.blank[self.node, self.gpu] = True
            self._next = tick.t + float(self.rng.uniform(120.0, 600.0))


class MisalignedScrape(Fault):
    """Misaligned scrapes: now and then one GPU's series are stamped a millisecond apart from the
    rest of the node's scrape, so one round arrives as two records (the node's other GPUs, then that
    GPU alone), 2-10 min apart. Nothing is wrong with the GPU. No action."""

    def on_start(self, host: FaultHost, t: float) -> None:
        self._next = t

    def gpu_post(self, tick: GpuTick) -> None:
        if tick.t >= self._next:
            tick.split[self.node, self.gpu] = True
            self._next = tick.t + float(self.rng.uniform(120.0, 600.0))


class Xid63Single(Fault):
    """One row remap (XID 63): a correctable-rows count goes up and a remap is pending until the next
    GPU reset. Normal wear; no action."""

    def on_start(self, host: FaultHost, t: float) -> None:
        host.gpu.corr_rows[self.node, self.gpu] += 1
        host.gpu.remap_pending[self.node, self.gpu] = 1
        self.xid(host, t, 63)
        self.end = t + 1.0


class CheckpointSlowdown(JobFault):
    """The job's next checkpoint takes 5-10x longer (slow storage): every rank idles meanwhile."""

    def job_started(self, host: FaultHost, job: Job, t: float) -> None:
        mul = float(self.params.setdefault("factor", round(float(self.rng.uniform(5.0, 10.0)), 2)))
        job.ckpt_mul = mul
        nxt = max(t, job.last_ckpt_t + job.ckpt_interval)
        self.end = nxt + job.ckpt_s * mul


class DataloaderStall(JobFault):
    """Input pipeline stalls slow every rank of the job (step time +20-60 %) for a while."""

    def job_started(self, host: FaultHost, job: Job, t: float) -> None:
        self.params.setdefault("stall", round(float(self.rng.uniform(0.2, 0.6)), 3))
        job.stall_extra += float(self.params["stall"])

    def on_stop(self, host: FaultHost, t: float) -> None:
        job = host.workload.jobs[self.job_idx]
        job.stall_extra = max(0.0, job.stall_extra - float(self.params["stall"]))


class PlannedRestart(JobFault):
    """The owner restarts the job (new code, new hyper-parameters): it stops and resumes from its last
    checkpoint."""

    def job_started(self, host: FaultHost, job: Job, t: float) -> None:
        host.workload.restart(job, t, "user", "user requested restart (kubectl delete pods)")
        self.end = t + 1.0


class PlannedReboot(Fault):
    """Planned maintenance on an idle node (kernel update), as an operator does it: cordon the node,
    drain what runs there, reboot (down for a few minutes, back with a new boot id and counters
    restarted from zero), uncordon a couple of minutes after it is back (``params.uncordon_after_s``).
    fleetmedic sees the cordon, made by someone else, through its node observations."""

    def on_start(self, host: FaultHost, t: float) -> None:
        after = float(self.params.setdefault("uncordon_after_s", 120.0))
        self.params["up_at"] = self.end
        self.end += after
        host.set_operator_cordon(self.node, t, True)
        job = host.workload.job_on(self.node)
        if job is not None and job.active():  # the operator drains it first: a planned restart elsewhere
            self.affected.append(job.ref)
            host.workload.restart(job, t, "user", f"node {host.fleet.node_names[self.node]} drained for planned "
                                  "maintenance", exclude={self.node})
        host.set_node_down(self.node, t, True)

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        if "booted" not in self.params and t1 >= float(self.params["up_at"]):
            self.params["booted"] = True
            self._boot(host, t1)

    def on_stop(self, host: FaultHost, t: float) -> None:
        if "booted" not in self.params:
            self.params["booted"] = True
            self._boot(host, t)
        host.set_operator_cordon(self.node, t, False)

    def _boot(self, host: FaultHost, t: float) -> None:
        host.gpu.reboot(self.node)
        host.ports.reboot_device(self.node)
        host.set_node_down(self.node, t, False)


# --- the registry -------------------------------------------------------------------------------------

H, M = 3600.0, 60.0
_HARD = (6 * H, 24 * H)


def _k(name: str, cls: FaultClass, comp: Component, exp: ExpectedResponse, remedy: str, dur: tuple[float, float],
       target: str, weight: float, diag: float, symptoms: tuple[str, ...], factory: Callable[..., Fault],
       desc: str = "") -> KindInfo:
    return KindInfo(name, cls, comp, exp, remedy, dur, target, weight, diag, symptoms,
                    desc or " ".join((factory.__doc__ or "").split("\n\n")[0].split()), factory)


def _hard(code: int, remedy: str, weight: float, symptoms: tuple[str, ...], desc: str) -> KindInfo:
    return _k(f"xid{code}", "hardware", "gpu", "isolate_node", remedy, _HARD, "gpu", weight, 0.97,
              (f"xid:{code}", *symptoms), GpuHardFault, desc)


KINDS: dict[str, KindInfo] = {
    k.name: k
    for k in (
        _hard(79, "reboot", 8, ("gpu_missing", "job_failure", "log:unspecified launch failure"),
              "GPU has fallen off the bus"),
        _hard(48, "reset_gpu", 6, ("xid:63", "up:ecc_dbe_vol_total", "up:row_remap_pending", "job_failure",
                                  "log:uncorrectable ECC error"), "double-bit ECC error"),
        _hard(64, "repair", 2, ("xid:48", "up:row_remap_failure", "job_failure"), "row remapping failure"),
        _hard(95, "reset_gpu", 2, ("up:ecc_dbe_vol_total", "job_failure"), "uncontained memory error"),
        _hard(119, "reset_gpu", 4, ("job_hang", "log:Watchdog caught collective operation timeout"),
              "GSP RPC timeout: the GPU is wedged"),
        _hard(74, "reset_gpu", 3, ("up:nvlink_links_down", "up:nvlink_recovery_error_count_total", "job_failure"),
              "fatal NVLink error"),
        _k("hbm_degradation", "degradation", "gpu", "isolate_node", "repair", (2 * H, 5 * H), "gpu", 5, 0.9,
           ("up:ecc_sbe_vol_total", "up:correctable_remapped_rows", "xid:63", "xid:48", "job_failure"), HbmDegradation),
        _k("straggler", "degradation", "gpu", "isolate_node", "repair", (2 * H, 8 * H), "gpu", 8, 0.8,
           ("down:sm_clock", "reason:throttle", "rank_slowdown", "step_slowdown"), Straggler),
        _k("nvlink_errors", "degradation", "gpu", "isolate_node", "repair", (2 * H, 8 * H), "gpu", 4, 0.9,
           ("up:nvlink_crc_flit_error_count_total", "up:nvlink_replay_error_count_total"), NvlinkErrors),
        # weight 0: not drawn by `mix` (its plan stays as it was); in `all`, or asked for by name
        _k("nvlink_degrading_slow", "degradation", "gpu", "isolate_node", "repair", (3 * H, 8 * H), "gpu", 0, 0.9,
           ("up:nvlink_crc_flit_error_count_total", "up:nvlink_replay_error_count_total", "nvlink_siblings_flat"),
           NvlinkDegradingSlow),
        _k("nvlink_burst", "degradation", "gpu", "isolate_node", "repair", (1 * H, 4 * H), "gpu", 0, 0.9,
           ("up:nvlink_crc_flit_error_count_total", "up:nvlink_replay_error_count_total", "nvlink_siblings_flat"),
           NvlinkBurst),
        _k("pcie_degradation", "degradation", "gpu", "isolate_node", "repair", (2 * H, 8 * H), "gpu", 3, 0.9,
           ("down:pcie_link_width", "up:pcie_replay_counter", "rank_slowdown"), PcieDegradation),
        _k("nic_flap", "network", "nic", "isolate_node", "repair", (40 * M, 3 * H), "nic", 6, 0.6,
           ("link_down", "port_up:link_downed_counter", "port_up:symbol_error_counter"), NicFlap),
        _k("ib_ber", "network", "link", "isolate_link", "repair", (1 * H, 6 * H), "nic", 5, 0.3,
           ("ber_up", "port_up:symbol_error_counter", "port_up:port_rcv_errors", "step_slowdown"), IbBer),
        _k("leaf_switch", "network", "switch", "isolate_switch", "switch_repair", (30 * M, 2 * H), "leaf", 1.5, 1.0,
           ("device_missing", "link_down", "job_failure", "log:NET/IB : Got completion from peer"), LeafFailure),
        _k("nic_down", "network", "nic", "isolate_node", "repair", _HARD, "nic", 2, 1.0,
           ("link_down", "job_failure", "log:status=12"), NicDown),
        _k("nic_speed_low", "network", "nic", "isolate_node", "repair", _HARD, "nic", 2, 0.5,
           ("port_speed_low", "step_slowdown"), NicSpeedLow),
        _k("fan_failure", "hardware", "node", "isolate_node", "repair", (2 * H, 12 * H), "node", 2, 0.8,
           ("gauge_up:gpu_temp", "reason:throttle", "step_slowdown"), FanFailure),
        _k("psu_failure", "hardware", "node", "isolate_node", "repair", (2 * H, 12 * H), "node", 2, 0.7,
           ("reason:power_brake", "step_slowdown"), PsuFailure),
        _k("node_crash", "hardware", "node", "isolate_node", "repair", (2 * H, 12 * H), "node", 3, 1.0,
           ("node_missing", "job_failure"), NodeCrash),
        _k("nccl_timeout", "transient_software", "job", "retry_in_place", "none", (10 * M, 10 * M), "job", 5, 0.0,
           ("job_hang", "job_failure", "log:Watchdog caught collective operation timeout"), NcclTimeout),
        _k("worker_crash", "transient_software", "job", "retry_in_place", "none", (1 * M, 1 * M), "job", 4, 0.0,
           ("job_failure", "log:DataLoader worker"), WorkerCrash),
        _k("oom", "transient_software", "job", "retry_in_place", "none", (5 * M, 5 * M), "job", 3, 0.0,
           ("fb_high", "job_failure", "log:torch.OutOfMemoryError: CUDA out of memory"), Oom),
        _k("job_bug", "job_bug", "job", "fix_job", "none", (45 * M, 3 * H), "job", 3, 0.0,
           ("job_failure", "repeat_failure"), JobBug),
        _k("xid13", "negative_control", "gpu", "no_action", "none", (1.0, 1.0), "busy_gpu", 3, 0.0,
           ("xid:13", "job_failure", "log:an illegal memory access"), AppXid, "XID 13 from an application fault"),
        _k("xid31", "negative_control", "gpu", "no_action", "none", (1.0, 1.0), "busy_gpu", 2, 0.0,
           ("xid:31", "job_failure"), AppXid, "XID 31 (MMU fault) from an application fault"),
        _k("xid43", "negative_control", "gpu", "no_action", "none", (1.0, 1.0), "busy_gpu", 2, 0.0,
           ("xid:43",), AppXid, "XID 43 as an application is killed"),
        _k("xid63", "negative_control", "gpu", "no_action", "none", (1.0, 1.0), "gpu", 3, 0.0,
           ("xid:63", "up:correctable_remapped_rows"), Xid63Single),
        _k("partial_scrape", "negative_control", "gpu", "no_action", "none", (30 * M, 2 * H), "gpu", 0, 0.0,
           ("gpu_absent_briefly",), PartialScrape),
        _k("misaligned_scrape", "negative_control", "gpu", "no_action", "none", (30 * M, 2 * H), "gpu", 0, 0.0,
           ("scrape_split",), MisalignedScrape),
        _k("checkpoint_slowdown", "negative_control", "job", "no_action", "none", (30 * M, 30 * M), "job", 2, 0.0,
           ("job_idle",), CheckpointSlowdown),
        _k("dataloader_stall", "negative_control", "job", "no_action", "none", (10 * M, 30 * M), "job", 2, 0.0,
           ("step_slowdown",), DataloaderStall),
        _k("planned_restart", "negative_control", "job", "no_action", "none", (1.0, 1.0), "job", 2, 0.0,
           ("restart_event",), PlannedRestart),
        _k("planned_reboot", "negative_control", "node", "no_action", "none", (5 * M, 12 * M), "idle_node", 2, 0.0,
           ("node_missing", "boot_id_change", "port_up:link_downed_counter"), PlannedReboot),
    )
}


def kind_info(name: str) -> KindInfo:
    """The kind called ``name``; ``xid<N>`` for codes beyond the table picks a behaviour by bucket."""
    info = KINDS.get(name)
    if info is not None:
        return info
    if name.startswith("xid") and name[3:].isdigit():
        code = int(name[3:])
        xi = xidlib.info(code)
        if xidlib.isolating(code):
            remedy = "reboot" if xi.bucket == "RESTART_BM" else "reset_gpu"
            return _k(name, "hardware", "gpu", "isolate_node", remedy, _HARD, "gpu", 0, 0.95,
                      (f"xid:{code}", "job_failure"), GpuHardFault, f"XID {code} {xi.mnemonic} ({xi.bucket})")
        return _k(name, "negative_control", "gpu", "no_action", "none", (1.0, 1.0), "busy_gpu", 0, 0.0,
                  (f"xid:{code}",), AppXid, f"XID {code} {xi.mnemonic} ({xi.bucket or 'no bucket'})")
    raise ValueError(f"unknown fault kind {name!r} (known: {', '.join(KINDS)}, or xid<N>)")


def leaves_node_dead(name: str) -> bool:
    """Faults that leave a GPU or the node unusable at once (a fatal XID, the node crashed): what
    fleetmedic must isolate without waiting for any budget."""
    try:
        info = kind_info(name)
    except ValueError:
        return False
    return info.fault_class == "hardware" and info.factory in (GpuHardFault, NodeCrash)


def make_fault(name: str, fid: str, onset: float, duration: float, rng: np.random.Generator, *, node: int = -1,
               gpu: int = -1, nic: int = -1, leaf: int = -1, source: str = "spec",
               params: dict[str, Any] | None = None) -> Fault:
    info = kind_info(name)
    p = dict(params or {})
    if name.startswith("xid") and name[3:].isdigit():
        p.setdefault("xid", int(name[3:]))
    return info.factory(info, fid, onset, onset + duration, rng, node=node, gpu=gpu, nic=nic, leaf=leaf,
                        source=source, params=p)


@dataclass
class FaultSet:
    """The faults of one run, in onset order."""

    faults: list[Fault] = field(default_factory=list)

    def active(self) -> list[Fault]:
        return [f for f in self.faults if f.active]
