"""Node-level hardware faults: a fan, a power supply, a node that crashes."""

from __future__ import annotations

import numpy as np

from fleetmedic.sim.faults.base import Fault, FaultHost
from fleetmedic.sim.logs import FailureReport
from fleetmedic.sim.telemetry import HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL, SW_THERMAL, GpuTick


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

