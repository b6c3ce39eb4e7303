"""Network faults: a NIC that flaps, goes down or links slow, a link's bit error rate, a leaf switch that fails."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fleetmedic.sim import logs
from fleetmedic.sim.batch import PORT_FIELD_INDEX
from fleetmedic.sim.faults.base import Fault, FaultHost
from fleetmedic.sim.logs import FailureReport
from fleetmedic.sim.telemetry import PortTick

if TYPE_CHECKING:
    from fleetmedic.sim.workload import Job

_P = PORT_FIELD_INDEX


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

