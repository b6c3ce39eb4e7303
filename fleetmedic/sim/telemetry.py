"""Telemetry models: the dcgm-exporter field set of every GPU and the counters of every port, one
exporter round at a time, vectorised over the whole fleet.

GPU model (per round, arrays ``(nodes, gpus)``):

- **load** comes from the workload: each node's mode (idle, starting/restoring, training,
  checkpointing, hung) and, while training, the fraction of wall time each rank computes,
  communicates, waits for slower peers or stalls on data. A sample sees one instant, so the phase at
  that instant is drawn from those fractions (GPUs of a node share the draw, so a straggler GPU is
  the one still computing while its neighbours wait): power and SM activity swing with the workload;
- **power** = idle + (TDP - idle) x phase level x the GPU's efficiency, capped at the power limit
  (``SW_POWER_CAP`` 0x4 and ``power_violation`` µs when capped); **SM clock** boosts to the SKU's
  maximum x the GPU's capability, lower when capped or throttled; **temperature** follows power
  with a 45 s thermal lag from the node's inlet temperature and the GPU's thermal resistance;
- **counters** are cumulative (ECC, PCIe replay, NVLink errors, violation time), restart from zero
  when the node reboots or the GPU is reset; remapped-row counts persist (they live in the InfoROM);
  ``xid_errors`` is dcgm-exporter's last-XID gauge (0 after an exporter restart);
- **faults** modify the arrays of their slice through two hooks: ``gpu_pre`` (load, power limit,
  extra heat, clock multiplier, throttle reasons — before the physics) and ``gpu_post`` (counters,
  link state, blanked GPUs, GPUs whose series are stamped apart and so split off into a record of
  their own, the XID gauge — after it).

Port model (per round, arrays over all ports): traffic counters (4-byte words, as IB counts them)
follow each node's communication load, ``port_xmit_wait`` grows with congestion, a few marginal ports
have background symbol errors, every port has a background effective BER; a port facing a node that
is down is ``down`` and counts one ``link_downed`` per transition. Faults use ``port_pre``/``port_post``.

The device plugin's health check is modelled too: a GPU that reports an XID other than the
application ones (13, 31, 43, 45, 68, 109) becomes Unhealthy and stays so until the node reboots;
the scheduler then cannot place a full-node rank set there (``GpuModel.unhealthy``).

Timestamps: GPU and port samples and XID events carry the node's (or switch's) clock; job events
carry the job controller's (true simulated time).

Delivery noise (:class:`NoiseSpec`): per node and round, samples go missing, arrive late (in a later
round) or twice; exporters have outages (after which the XID gauge reads 0); every node's clock has
its own offset (a few are badly skewed) and exporters sample at their own phase with jitter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from fleetmedic.sim.batch import (
    GPU_FIELD_INDEX,
    GPU_FIELDS,
    LINK_DOWN,
    LINK_UP,
    PORT_FIELD_INDEX,
    PORT_FIELDS,
    GpuBatch,
    Identity,
    PortBatch,
)
from fleetmedic.sim.fleet import Fleet

# workload modes of a node
MODE_IDLE, MODE_STARTING, MODE_TRAIN, MODE_CKPT, MODE_HUNG = 0, 1, 2, 3, 4
# phases a sample can see: compute, comm, stall (data), wait (NCCL spin for peers), checkpoint, idle, starting
PH_COMPUTE, PH_COMM, PH_STALL, PH_WAIT, PH_CKPT, PH_IDLE, PH_START = range(7)
#                      compute comm  stall wait  ckpt  idle  start
_POWER = np.array([0.93, 0.55, 0.06, 0.40, 0.12, 0.0, 0.08])
_SM = np.array([0.80, 0.30, 0.0, 0.12, 0.02, 0.0, 0.01])
_TENSOR = np.array([0.50, 0.03, 0.0, 0.0, 0.0, 0.0, 0.0])
_DRAM = np.array([0.42, 0.30, 0.0, 0.03, 0.05, 0.0, 0.02])
_UTIL = np.array([100.0, 100.0, 2.0, 100.0, 9.0, 0.0, 6.0])
_COPY = np.array([34.0, 16.0, 0.0, 2.0, 22.0, 0.0, 12.0])
_TABLE = np.stack([_POWER, _SM, _TENSOR, _DRAM, _UTIL, _COPY], axis=1)  # (phase, quantity)
# the phase a node's mode shows when it is not training (MODE_TRAIN draws per GPU)
_MODE_PHASE = np.array([PH_IDLE, PH_START, -1, PH_CKPT, PH_WAIT])

# clocks_event_reasons bits (nvml clocksEventReasons)
GPU_IDLE, SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x1, 0x4, 0x8, 0x20, 0x40, 0x80

#: how far apart a misaligned scrape stamps the series split from the rest of the node's (GpuTick.split)
SPLIT_OFFSET_S = 0.001

#: XIDs the NVIDIA k8s-device-plugin's health check treats as application errors (all others mark
#: the GPU Unhealthy, so a pod asking for all of a node's GPUs no longer fits there)
DEVICE_PLUGIN_APP_XIDS = frozenset({13, 31, 43, 45, 68, 109})

_F = GPU_FIELD_INDEX
_P = PORT_FIELD_INDEX
_NAN_FIELDS = [_F["retired_sbe"], _F["retired_dbe"], _F["retired_pending"]]  # row-remapping SKUs


@dataclass(frozen=True)
class NoiseSpec:
    """What goes wrong with delivery, per node (or switch) and exporter round."""

    missing: float = 0.003
    late: float = 0.003
    late_max_rounds: int = 6
    duplicate: float = 0.002
    outages_per_node_hour: float = 0.01
    outage_s: tuple[float, float] = (60.0, 600.0)
    skew_s: float = 0.25
    skewed_fraction: float = 0.02
    skewed_s: float = 20.0
    jitter_s: float = 0.3
    gauge_noise: float = 1.0

    @classmethod
    def named(cls, name: str) -> NoiseSpec:
        if name == "none":
            return cls(missing=0.0, late=0.0, duplicate=0.0, outages_per_node_hour=0.0, skew_s=0.0,
                       skewed_fraction=0.0, jitter_s=0.0, gauge_noise=1.0)
        if name == "default":
            return cls()
        if name == "heavy":
            return cls(missing=0.02, late=0.02, duplicate=0.01, outages_per_node_hour=0.05,
                       skewed_fraction=0.1, skewed_s=60.0, jitter_s=1.0, gauge_noise=2.0)
        raise ValueError(f"unknown noise level {name!r} (none, default, heavy)")


@dataclass
class Load:
    """What the workload asks of each node and GPU this round."""

    mode: np.ndarray  # (N,) int8 MODE_*
    compute: np.ndarray  # (N, G) fraction of wall time computing (training nodes)
    comm: np.ndarray  # (N,) fraction communicating
    stall: np.ndarray  # (N,) fraction stalled on data
    fb_mib: np.ndarray  # (N, G) framebuffer the job holds
    net_util: np.ndarray  # (N,) NIC utilisation 0..1

    @classmethod
    def idle(cls, n: int, g: int) -> Load:
        return cls(np.zeros(n, np.int8), np.zeros((n, g)), np.zeros(n), np.zeros(n), np.zeros((n, g)),
                   np.zeros(n))


@dataclass
class XidNote:
    node: int
    gpu: int
    code: int
    ts: float  # true time; the node's clock offset is added at delivery
    message: str


@dataclass
class GpuTick:
    """The arrays faults may modify for one round (``(N, G)`` unless noted)."""

    t: float
    dt: float
    demand_level: np.ndarray  # phase power level 0..1 (pre)
    util: np.ndarray  # GPU_UTIL % (pre)
    sm_active: np.ndarray
    tensor: np.ndarray
    dram: np.ndarray
    fb_used: np.ndarray
    power_limit: np.ndarray  # W (pre)
    power_add: np.ndarray  # W added to demand (pre)
    heat_c: np.ndarray  # extra degC on the temperature target (pre)
    mem_heat_c: np.ndarray
    clock_mul: np.ndarray  # SM clock multiplier (pre)
    reasons: np.ndarray  # int64 bits OR-ed into clocks_event_reasons (pre/post)
    blank: np.ndarray  # bool: GPU not reported (post)
    model: GpuModel
    # bool: the GPU's series stamped apart from the rest of its node's scrape (a misaligned scrape):
    # delivered as a record of its own, SPLIT_OFFSET_S later (post)
    split: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=bool))


class GpuEffect(Protocol):
    def gpu_pre(self, tick: GpuTick) -> None: ...
    def gpu_post(self, tick: GpuTick) -> None: ...


@dataclass
class PortTick:
    t: float
    dt: float
    link_down: np.ndarray  # (P,) bool, forced down
    speed_gbps: np.ndarray  # (P,) reported speed
    width: np.ndarray  # (P,) reported width
    ber: np.ndarray  # (P,) effective BER
    device_absent: np.ndarray  # (D,) bool: device sends nothing this round
    model: PortModel


class PortEffect(Protocol):
    def port_pre(self, tick: PortTick) -> None: ...
    def port_post(self, tick: PortTick) -> None: ...


@dataclass
class _Delivery:
    """Per-device clock and delivery state shared by the GPU and port streams."""

    skew: np.ndarray  # (D,) constant clock offset, s
    phase: np.ndarray  # (D,) sampling phase within a round, s
    outage_until: np.ndarray  # (D,) sim time
    # (release round, node index or port rows, timestamp, boot, field-major data)
    pending: list[tuple[int, Any, float, int, np.ndarray]] = field(default_factory=list)


def _delivery(rng: np.random.Generator, n: int, interval: float, noise: NoiseSpec) -> _Delivery:
    skew = rng.normal(0.0, noise.skew_s, n) if noise.skew_s > 0 else np.zeros(n)
    if noise.skewed_fraction > 0:
        bad = rng.random(n) < noise.skewed_fraction
        skew = np.where(bad, rng.normal(0.0, noise.skewed_s, n), skew)
    phase = rng.uniform(0.0, min(interval, 5.0) * 0.5, n) if noise.jitter_s > 0 else np.zeros(n)
    return _Delivery(skew=skew, phase=phase, outage_until=np.full(n, -1.0))


class GpuModel:
    """State and per-round generation of every GPU's dcgm field set."""

    def __init__(self, fleet: Fleet, identity: Identity, rng: np.random.Generator, interval_s: float,
                 noise: NoiseSpec) -> None:
        self.fleet = fleet
        self.identity = identity
        self.rng = rng
        self.interval = interval_s
        self.noise = noise
        n, g = fleet.n, fleet.g
        skus = fleet.sku_list
        sk = fleet.node_sku
        col = np.ones((n, g))

        def per_node(attr: str) -> np.ndarray:
            out: np.ndarray = np.array([getattr(s, attr) for s in skus], dtype=float)[sk][:, None] * col
            return out

        self.tdp = per_node("tdp_w")
        self.idle_w = per_node("idle_w")
        self.max_clock = per_node("max_sm_clock") * fleet.clock_cap
        self.idle_clock = per_node("idle_sm_clock")
        self.mem_clock = per_node("mem_clock")
        self.fb_total = per_node("fb_total_mib")
        self.slowdown_c = per_node("slowdown_temp_c")
        self.temp = fleet.inlet_c[:, None] + fleet.temp_offset_c + fleet.thermal_res * self.idle_w
        # cumulative counters and persistent state
        z = np.zeros((n, g))
        self.sbe, self.dbe, self.pcie_replay = z.copy(), z.copy(), z.copy()
        self.nvl_flit, self.nvl_data, self.nvl_replay, self.nvl_recovery = z.copy(), z.copy(), z.copy(), z.copy()
        self.power_viol, self.thermal_viol = z.copy(), z.copy()
        self.corr_rows, self.uncorr_rows = z.copy(), z.copy()
        self.remap_failure, self.remap_pending = z.copy(), z.copy()
        self.xid_last = z.copy()
        self.links_down = z.copy()
        self.pcie_gen = per_node("pcie_gen")
        self.pcie_width = per_node("pcie_width")
        self.boot = np.zeros(n, dtype=np.int32)
        self.node_up = np.ones(n, dtype=bool)
        # the NVIDIA device plugin's view: a GPU with a non-application XID is Unhealthy (not
        # allocatable) until the plugin restarts, i.e. until the node reboots
        self.unhealthy = np.zeros((n, g), dtype=bool)
        self.xid_pending: list[XidNote] = []
        self.delivery = _delivery(rng, n, interval_s, noise)
        self._round = 0
        self._bg = [(np.flatnonzero(r), r.ravel()[np.flatnonzero(r)]) for r in
                    (fleet.sbe_rate, fleet.pcie_replay_rate, fleet.nvlink_err_rate)]

    # --- lifecycle hooks used by the closed loop --------------------------------------------------

    def reset_gpu(self, node: int, gpu: int | None = None) -> None:
        """Driver reload on one GPU (or all of a node's): volatile counters restart from zero; a
        pending row remap is applied."""
        sl = (node, slice(None) if gpu is None else gpu)
        for arr in (self.sbe, self.dbe, self.pcie_replay, self.nvl_flit, self.nvl_data, self.nvl_replay,
                    self.nvl_recovery, self.power_viol, self.thermal_viol, self.xid_last, self.links_down):
            arr[sl] = 0.0
        self.remap_pending[sl] = 0.0
        sku = self.fleet.sku_of(node)
        self.pcie_gen[sl] = sku.pcie_gen
        self.pcie_width[sl] = sku.pcie_width

    def reboot(self, node: int) -> None:
        self.reset_gpu(node)
        self.boot[node] += 1
        self.unhealthy[node] = False  # the device plugin restarts with the node
        self.temp[node] = self.fleet.inlet_c[node] + self.fleet.temp_offset_c[node]
        self.xid_pending = [x for x in self.xid_pending if x.node != node]

    def emit_xid(self, node: int, gpu: int, code: int, t: float, message: str) -> None:
        self.xid_pending.append(XidNote(node, gpu, code, t, message))
        self.xid_last[node, gpu] = code
        if code not in DEVICE_PLUGIN_APP_XIDS:
            self.unhealthy[node, gpu] = True

    # --- one exporter round ------------------------------------------------------------------------

    def step(self, t: float, load: Load, effects: Sequence[GpuEffect]) -> GpuBatch:
        fleet, rng, dt = self.fleet, self.rng, self.interval
        n, g = fleet.n, fleet.g
        nz = self.noise.gauge_noise
        self._round += 1

        # phase at the sampling instant: one draw per node, fractions per GPU
        u = rng.random((n, 1))
        cf = load.compute
        c2 = cf + load.comm[:, None]
        c3 = c2 + load.stall[:, None]
        drawn = (u >= cf).view(np.int8) + (u >= c2).view(np.int8) + (u >= c3).view(np.int8)  # 0..3
        train = (load.mode == MODE_TRAIN)[:, None]
        phase = np.where(train, drawn, _MODE_PHASE[load.mode][:, None])
        active = phase != PH_IDLE
        tab = _TABLE[phase]  # (N, G, 6)
        noise = rng.standard_normal((3, n, g))
        if nz != 1.0:
            noise *= nz
        tick = GpuTick(
            t=t,
            dt=dt,
            demand_level=tab[..., 0] + 0.05 * noise[0] * active,
            util=tab[..., 4].copy(),
            sm_active=np.clip(tab[..., 1] + 0.02 * noise[1] * active, 0.0, 1.0),
            tensor=np.clip(tab[..., 2] * (1.0 + 0.05 * noise[2]), 0.0, 1.0),
            dram=np.clip(tab[..., 3] * (1.0 - 0.05 * noise[1]), 0.0, 1.0),
            fb_used=np.where(load.fb_mib > 0, load.fb_mib + 40.0 * noise[2], 1.0),
            power_limit=self.tdp.copy(),
            power_add=np.zeros((n, g)),
            heat_c=np.zeros((n, g)),
            mem_heat_c=np.zeros((n, g)),
            clock_mul=np.ones((n, g)),
            reasons=np.zeros((n, g), dtype=np.int64),
            blank=np.zeros((n, g), dtype=bool),
            model=self,
            split=np.zeros((n, g), dtype=bool),
        )
        for e in effects:
            e.gpu_pre(tick)

        # power and clocks
        demand = self.idle_w + (self.tdp - self.idle_w) * np.clip(tick.demand_level, 0.0, 1.2) * fleet.power_eff
        demand += tick.power_add
        capped = demand > tick.power_limit
        power = np.minimum(demand, tick.power_limit)
        cap_factor = np.where(capped, (tick.power_limit / demand) ** 0.7, 1.0)
        clock = np.where(active, self.max_clock * cap_factor * tick.clock_mul, self.idle_clock)
        reasons = tick.reasons | np.where(capped, SW_POWER_CAP, 0) | np.where(active, 0, GPU_IDLE)

        # temperature (first-order lag towards the power-driven target)
        target = fleet.inlet_c[:, None] + fleet.temp_offset_c + fleet.thermal_res * power + tick.heat_c
        self.temp += (target - self.temp) * (1.0 - np.exp(-dt / 45.0))
        hot = self.temp > self.slowdown_c
        if hot.any():
            reasons |= np.where(hot, HW_THERMAL | SW_THERMAL, 0)
            clock = np.where(hot, clock * 0.85, clock)
        mem_temp = self.temp + fleet.mem_temp_offset_c + 8.0 * tick.dram + tick.mem_heat_c

        # counters
        self.power_viol += np.where(capped, dt * 1e6 * 0.6, 0.0)
        throttled = (reasons & (SW_THERMAL | HW_THERMAL | HW_SLOWDOWN | HW_POWER_BRAKE)) != 0
        self.thermal_viol += np.where(throttled & ((reasons & (SW_THERMAL | HW_THERMAL)) != 0), dt * 1e6, 0.0)
        for (idx, rate), arr in zip(self._bg, (self.sbe, self.pcie_replay, self.nvl_flit), strict=True):
            if idx.size:
                arr.ravel()[idx] += rng.poisson(rate * dt)
        tick.reasons = reasons
        for e in effects:
            e.gpu_post(tick)

        # assemble the field-major buffer
        buf = np.empty((len(GPU_FIELDS), n, g))
        buf[_F["gpu_temp"]] = np.rint(self.temp + 0.3 * noise[1])
        buf[_F["memory_temp"]] = np.rint(mem_temp)
        buf[_F["power_usage"]] = np.round(power + 0.01 * self.tdp * noise[2] * active, 3)
        buf[_F["sm_clock"]] = np.rint(clock / 15.0) * 15.0
        buf[_F["mem_clock"]] = self.mem_clock
        buf[_F["gpu_util"]] = np.clip(np.rint(tick.util), 0, 100)
        buf[_F["mem_copy_util"]] = np.clip(np.rint(tab[..., 5] * (1.0 + 0.1 * noise[0])), 0, 100)
        fb_used = np.clip(np.rint(tick.fb_used), 0.0, self.fb_total - 512.0)
        buf[_F["fb_used"]] = fb_used
        buf[_F["fb_free"]] = self.fb_total - 512.0 - fb_used
        buf[_F["clocks_event_reasons"]] = tick.reasons
        buf[_F["power_violation"]] = np.floor(self.power_viol)
        buf[_F["thermal_violation"]] = np.floor(self.thermal_viol)
        buf[_F["ecc_sbe_vol_total"]] = self.sbe
        buf[_F["ecc_dbe_vol_total"]] = self.dbe
        buf[_NAN_FIELDS] = np.nan
        buf[_F["uncorrectable_remapped_rows"]] = self.uncorr_rows
        buf[_F["correctable_remapped_rows"]] = self.corr_rows
        buf[_F["row_remap_failure"]] = self.remap_failure
        buf[_F["row_remap_pending"]] = self.remap_pending
        buf[_F["pcie_replay_counter"]] = self.pcie_replay
        buf[_F["pcie_link_gen"]] = self.pcie_gen
        buf[_F["pcie_link_width"]] = self.pcie_width
        buf[_F["nvlink_crc_flit_error_count_total"]] = self.nvl_flit
        buf[_F["nvlink_crc_data_error_count_total"]] = self.nvl_data
        buf[_F["nvlink_replay_error_count_total"]] = self.nvl_replay
        buf[_F["nvlink_recovery_error_count_total"]] = self.nvl_recovery
        buf[_F["nvlink_links_down"]] = self.links_down
        buf[_F["xid_errors"]] = self.xid_last
        buf[_F["prof_sm_active"]] = np.round(tick.sm_active, 4)
        buf[_F["prof_pipe_tensor_active"]] = np.round(tick.tensor, 4)
        buf[_F["prof_dram_active"]] = np.round(tick.dram, 4)
        if tick.blank.any():
            buf[:, tick.blank] = np.nan
        return self._deliver(t, buf, tick.split if tick.split.any() else None)

    def _deliver(self, t: float, buf: np.ndarray, split: np.ndarray | None = None) -> GpuBatch:
        rng, noise, dv = self.rng, self.noise, self.delivery
        n = self.fleet.n
        up = self.node_up
        # exporter outages: start some, and the exporter restarts with a blank XID gauge
        if noise.outages_per_node_hour > 0:
            start = up & (dv.outage_until < t) & (rng.random(n) < noise.outages_per_node_hour * self.interval / 3600)
            for i in np.flatnonzero(start).tolist():
                dv.outage_until[i] = t + rng.uniform(*noise.outage_s)
                self.xid_last[i] = 0.0
        sending = up & (dv.outage_until < t)
        r = rng.random((3, n))
        keep = sending & (r[0] >= noise.missing)
        late = keep & (r[1] < noise.late)
        now = keep & ~late
        dup = now & (r[2] < noise.duplicate)
        ts = t - dv.phase + dv.skew + (rng.uniform(0.0, noise.jitter_s, n) if noise.jitter_s > 0 else 0.0)
        ts = np.round(ts, 3)

        rows = np.flatnonzero(now)
        parts_node = [rows]
        parts_ts = [ts[rows]]
        parts_boot = [self.boot[rows]]
        parts_data = [np.take(buf, rows, axis=1)]
        if split is not None:  # a misaligned scrape: those GPUs' series make a record of their own
            for pos, k in enumerate(rows.tolist()):
                alone = split[k]
                if alone.any():
                    col = np.full((buf.shape[0], 1, buf.shape[2]), np.nan)
                    col[:, 0, alone] = buf[:, k, alone]
                    parts_data[0][:, pos, alone] = np.nan
                    parts_node.append(np.array([k]))
                    parts_ts.append(np.array([round(float(ts[k]) + SPLIT_OFFSET_S, 3)]))
                    parts_boot.append(np.array([self.boot[k]], dtype=np.int32))
                    parts_data.append(col)
        if late.any():
            lrows = np.flatnonzero(late)
            delay = rng.integers(1, noise.late_max_rounds + 1, lrows.size)
            for k, d in zip(lrows.tolist(), delay.tolist(), strict=True):
                dv.pending.append((self._round + d, k, float(ts[k]), int(self.boot[k]), buf[:, k].copy()))
        if dv.pending:
            due = [p for p in dv.pending if p[0] <= self._round]
            if due:
                dv.pending = [p for p in dv.pending if p[0] > self._round]
                for _, k, lts, lboot, col in due:
                    parts_node.append(np.array([k]))
                    parts_ts.append(np.array([lts]))
                    parts_boot.append(np.array([lboot], dtype=np.int32))
                    parts_data.append(col[:, None, :])
        if dup.any():
            drows = np.flatnonzero(dup)
            parts_node.append(drows)
            parts_ts.append(ts[drows])
            parts_boot.append(self.boot[drows])
            parts_data.append(np.take(buf, drows, axis=1))
        node = np.concatenate(parts_node).astype(np.int32) if len(parts_node) > 1 else rows.astype(np.int32)
        data = np.concatenate(parts_data, axis=1) if len(parts_data) > 1 else parts_data[0]

        # XID events ride on the node's next delivered row (a live row of this round)
        xr: list[int] = []
        xg: list[int] = []
        xc: list[int] = []
        xt: list[float] = []
        xm: list[str] = []
        if self.xid_pending:
            row_of = {int(k): i for i, k in enumerate(rows.tolist())}
            still: list[XidNote] = []
            for x in self.xid_pending:
                at = row_of.get(x.node)
                if at is None:
                    still.append(x)
                    continue
                xr.append(at)
                xg.append(x.gpu)
                xc.append(x.code)
                xt.append(round(x.ts + float(dv.skew[x.node]), 3))
                xm.append(x.message)
            self.xid_pending = still
        return GpuBatch(
            emitted_at=t,
            node=node,
            ts=np.concatenate(parts_ts) if len(parts_ts) > 1 else parts_ts[0],
            boot=np.concatenate(parts_boot).astype(np.int32) if len(parts_boot) > 1 else parts_boot[0],
            data=data,
            xid_row=np.array(xr, dtype=np.int32),
            xid_gpu=np.array(xg, dtype=np.int32),
            xid_code=np.array(xc, dtype=np.int32),
            xid_ts=np.array(xt, dtype=np.float64),
            xid_msg=xm,
            identity=self.identity,
        )


class PortModel:
    """State and per-round generation of every port's counters."""

    def __init__(self, fleet: Fleet, identity: Identity, rng: np.random.Generator, interval_s: float,
                 noise: NoiseSpec) -> None:
        self.fleet = fleet
        self.identity = identity
        self.rng = rng
        self.interval = interval_s
        self.noise = noise
        pi = fleet.ports
        p = pi.size
        d = len(pi.device_names)
        self.ctr = np.zeros((len(PORT_FIELDS), p))
        self.link = np.full(p, LINK_UP, dtype=np.int8)
        gbps = np.array([fleet.sku_of(int(nd)).nic_gbps if nd >= 0 else 400.0 for nd in pi.node.tolist()])
        self.base_speed = gbps
        self.device_up = np.ones(d, dtype=bool)
        self.boot = np.zeros(d, dtype=np.int32)
        self.delivery = _delivery(rng, d, interval_s, noise)
        self._round = 0
        n_leaf = len(fleet.leaf_names)
        n = fleet.n
        self.leaf_dev0 = n
        self.uplinks = np.array(
            [[int(pi.device_start[n + li]) + int((pi.device == n + li).sum()) - fleet.spec.spines + s
              for s in range(fleet.spec.spines)] for li in range(n_leaf)], dtype=np.int64
        ).reshape(n_leaf, fleet.spec.spines)
        spine0 = n + n_leaf
        self.spine_rows = np.array(
            [[int(pi.device_start[spine0 + s]) + li for li in range(n_leaf)] for s in range(fleet.spec.spines)],
            dtype=np.int64,
        ).reshape(fleet.spec.spines, n_leaf)
        self._sym_idx = np.flatnonzero(fleet.port_symbol_rate)

    def reboot_device(self, device: int) -> None:
        """A host reboot restarts its NIC counters; the switch side keeps counting."""
        pi = self.fleet.ports
        a, b = int(pi.device_start[device]), int(pi.device_start[device + 1])
        self.ctr[:, a:b] = 0.0
        self.boot[device] += 1

    def step(self, t: float, load: Load, effects: Sequence[PortEffect], node_up: np.ndarray) -> PortBatch:
        fleet, rng, dt = self.fleet, self.rng, self.interval
        pi = fleet.ports
        p = pi.size
        tick = PortTick(
            t=t,
            dt=dt,
            link_down=np.zeros(p, dtype=bool),
            speed_gbps=self.base_speed.copy(),
            width=np.full(p, 4.0),
            ber=fleet.port_ber * np.exp(0.2 * rng.standard_normal(p)),
            device_absent=np.zeros(len(pi.device_names), dtype=bool),
            model=self,
        )
        # a port facing a node that is down is down; the node's own ports send nothing
        tick.device_absent[: fleet.n] = ~node_up
        down_nodes = ~node_up
        if down_nodes.any():
            tick.link_down[pi.leaf_port[down_nodes].ravel()] = True
        for e in effects:
            e.port_pre(tick)
        self._round += 1

        # traffic, in 4-byte words as IB counts them
        n, k = pi.host_port.shape
        rate_words = tick.speed_gbps[pi.host_port] * 1e9 / 8 / 4  # (N, K)
        util = load.net_util[:, None] * (1.0 + 0.05 * rng.standard_normal((n, k)))
        util = np.clip(util, 0.0, 1.0)
        tx = rate_words * util * dt
        rx = rate_words * util * dt * (1.0 + 0.01 * rng.standard_normal((n, k)))
        rx = np.maximum(rx, 0.0)
        hp, lp = pi.host_port.ravel(), pi.leaf_port.ravel()
        live = ~(tick.link_down[hp] | tick.link_down[lp])
        tx, rx = tx.ravel() * live, rx.ravel() * live
        c = self.ctr
        xd, rd, wait = _P["port_xmit_data"], _P["port_rcv_data"], _P["port_xmit_wait"]
        c[xd, hp] += np.floor(tx)
        c[rd, hp] += np.floor(rx)
        c[xd, lp] += np.floor(rx)
        c[rd, lp] += np.floor(tx)
        # congestion: a few hundred wait ticks per round under load, now and then an incast burst
        cong = (util.ravel() ** 2) * live
        burst = np.where(rng.random(cong.size) < 0.005, 30.0, 1.0)
        c[wait, hp] += np.floor(cong * rng.exponential(15.0, cong.size) * burst * dt)
        # leaf uplinks carry half of the leaf's traffic, spread over the spines
        leaf_tx = np.bincount(pi.leaf_of.ravel(), weights=tx, minlength=self.uplinks.shape[0])
        up_share = np.floor(leaf_tx[:, None] * 0.5 / max(1, self.uplinks.shape[1])) * np.ones(self.uplinks.shape)
        c[xd, self.uplinks] += up_share
        c[rd, self.uplinks] += up_share
        c[xd, self.spine_rows] += up_share.T
        c[rd, self.spine_rows] += up_share.T
        if self._sym_idx.size:
            c[_P["symbol_error_counter"], self._sym_idx] += rng.poisson(fleet.port_symbol_rate[self._sym_idx] * dt)

        # link state transitions
        new_link = np.where(tick.link_down, LINK_DOWN, LINK_UP).astype(np.int8)
        went_down = (self.link == LINK_UP) & (new_link == LINK_DOWN)
        if went_down.any():
            c[_P["link_downed_counter"], went_down] += 1
            c[_P["link_error_recovery_counter"], went_down] += 1
        self.link = new_link
        for e in effects:
            e.port_post(tick)

        out = np.empty((len(PORT_FIELDS), p))
        out[:] = c
        out[_P["link_state"]] = self.link
        out[_P["speed_gbps"]] = np.where(self.link == LINK_UP, tick.speed_gbps, 0.0)
        out[_P["width"]] = np.where(self.link == LINK_UP, tick.width, 0.0)
        out[_P["effective_ber"]] = np.where(self.link == LINK_UP, np.clip(tick.ber, 0.0, 1.0), 0.0)
        return self._deliver(t, out, tick.device_absent)

    def _deliver(self, t: float, out: np.ndarray, absent: np.ndarray) -> PortBatch:
        rng, noise, dv = self.rng, self.noise, self.delivery
        pi = self.fleet.ports
        d = len(pi.device_names)
        r = rng.random((3, d))
        keep = ~absent & (r[0] >= noise.missing)
        late = keep & (r[1] < noise.late)
        now = keep & ~late
        dup = now & (r[2] < noise.duplicate)
        ts = np.round(t - dv.phase + dv.skew + (rng.uniform(0.0, noise.jitter_s, d) if noise.jitter_s > 0 else 0.0), 3)
        starts = pi.device_start

        def rows_of(devs: np.ndarray) -> np.ndarray:
            if devs.size == 0:
                return np.zeros(0, dtype=np.int64)
            return np.concatenate([np.arange(starts[i], starts[i + 1]) for i in devs.tolist()])

        port_mask = now[pi.device]
        rows = np.flatnonzero(port_mask)
        parts_rows = [rows]
        parts_ts = [ts[pi.device[rows]]]
        parts_boot = [self.boot[pi.device[rows]]]
        parts_data = [np.take(out, rows, axis=1)]
        for i in np.flatnonzero(late).tolist():
            rr = rows_of(np.array([i]))
            delay = int(rng.integers(1, noise.late_max_rounds + 1))
            dv.pending.append((self._round + delay, rr, float(ts[i]), int(self.boot[i]), out[:, rr].copy()))
        if dv.pending:
            due = [q for q in dv.pending if q[0] <= self._round]
            if due:
                dv.pending = [q for q in dv.pending if q[0] > self._round]
                for _, rr, lts, lboot, cols in due:
                    parts_rows.append(rr)
                    parts_ts.append(np.full(rr.size, lts))
                    parts_boot.append(np.full(rr.size, lboot, dtype=np.int32))
                    parts_data.append(cols)
        if dup.any():
            dr = rows_of(np.flatnonzero(dup))
            parts_rows.append(dr)
            parts_ts.append(ts[pi.device[dr]])
            parts_boot.append(self.boot[pi.device[dr]])
            parts_data.append(out[:, dr])
        return PortBatch(
            emitted_at=t,
            port=np.concatenate(parts_rows).astype(np.int32),
            ts=np.concatenate(parts_ts),
            boot=np.concatenate(parts_boot).astype(np.int32),
            data=np.concatenate(parts_data, axis=1),
            identity=self.identity,
        )
