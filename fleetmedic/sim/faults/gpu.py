"""GPU faults: hard faults (a fatal XID) and degradations (HBM, clocks, NVLink, PCIe)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fleetmedic.sim import logs
from fleetmedic.sim.faults.base import Fault, FaultHost
from fleetmedic.sim.logs import FailureReport
from fleetmedic.sim.telemetry import (
    HW_POWER_BRAKE,
    HW_SLOWDOWN,
    SW_POWER_CAP,
    SW_THERMAL,
    GpuTick,
)

if TYPE_CHECKING:
    from fleetmedic.sim.workload import Job


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

    def on_stop(self, host: FaultHost, t: float) -> None:
        if self.code == 64:  # what ends a failed row remap is a new GPU: its telemetry must say so too
            _new_hbm(host, self.node, self.gpu)

    def gpu_post(self, tick: GpuTick) -> None:
        n, g = self.node, self.gpu
        if self.code == 79:
            tick.blank[n, g] = True
        elif self.code == 64:
            tick.model.remap_failure[n, g] = 1
        elif self.code == 74:
            tick.model.links_down[n, g] = 2


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

    def on_stop(self, host: FaultHost, t: float) -> None:
        # worn HBM ends with the GPU replaced (its end is a technician's repair): the new GPU has no
        # remapped rows and no failed remap, or detectors would find the old one's on a healthy node
        _new_hbm(host, self.node, self.gpu)

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


def _new_hbm(host: FaultHost, node: int, gpu: int) -> None:
    """The GPU's memory rows as a new GPU's: none remapped, none pending, no failed remap."""
    m = host.gpu
    m.corr_rows[node, gpu] = m.uncorr_rows[node, gpu] = 0.0
    m.remap_failure[node, gpu] = m.remap_pending[node, gpu] = 0.0
