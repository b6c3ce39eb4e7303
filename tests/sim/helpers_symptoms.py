"""Helpers that run a small simulation with one pinned fault and check the symptoms it claims."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fleetmedic.evaluation.truth import TruthRecord
from fleetmedic.records import JobEvent, PortTelemetry
from fleetmedic.sim.batch import GPU_FIELD_INDEX
from fleetmedic.sim.engine import SimConfig, Simulator
from fleetmedic.sim.fleet import FleetSpec
from fleetmedic.sim.telemetry import HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL, SW_THERMAL, NoiseSpec
from fleetmedic.sim.workload import WorkloadSpec

ONSET_S = 1200.0
NODE = 3
SUB = 2  # GPU or NIC


def small_config(faults: str, seed: int = 11, duration_s: float = 3600.0, noise: str = "default") -> SimConfig:
    return SimConfig(
        fleet=FleetSpec(nodes=8, nodes_per_su=4, spines=2),
        duration_s=duration_s,
        seed=seed,
        faults=faults,
        noise=NoiseSpec.named(noise),
        workload=WorkloadSpec(target_utilization=1.0, job_sizes=(4, 2), short_job_fraction=0.0),
    )


@dataclass
class Run:
    sim: Simulator
    gpu_node: list[np.ndarray] = field(default_factory=list)
    gpu_ts: list[np.ndarray] = field(default_factory=list)
    gpu_boot: list[np.ndarray] = field(default_factory=list)
    gpu_data: list[np.ndarray] = field(default_factory=list)
    xids: list[tuple[int, int, int, float]] = field(default_factory=list)  # node, gpu, code, ts
    ports: list[PortTelemetry] = field(default_factory=list)
    events: list[JobEvent] = field(default_factory=list)

    @property
    def start(self) -> float:
        return self.sim.start

    def gpu_series(self, node: int, field_name: str) -> tuple[np.ndarray, np.ndarray]:
        """(ts, values[G]) of one node, deduplicated and time-ordered."""
        ts = np.concatenate(self.gpu_ts)
        nd = np.concatenate(self.gpu_node)
        f = GPU_FIELD_INDEX[field_name]
        vals = np.concatenate([d[:, f] for d in self.gpu_data], axis=0)
        m = nd == node
        t, v = ts[m], vals[m]
        order = np.argsort(t, kind="stable")
        t, v = t[order], v[order]
        keep = np.concatenate([[True], np.diff(t) > 0]) if t.size else np.zeros(0, bool)
        return t[keep], v[keep]

    def node_rows(self, node: int) -> np.ndarray:
        ts = np.concatenate(self.gpu_ts)
        return np.sort(ts[np.concatenate(self.gpu_node) == node])

    def boots(self, node: int) -> set[int]:
        nd = np.concatenate(self.gpu_node)
        return set(np.concatenate(self.gpu_boot)[nd == node].tolist())


def run(config: SimConfig) -> Run:
    sim = Simulator(config)
    r = Run(sim)
    for out in sim.run():
        b = out.gpu
        if b is not None:
            r.gpu_node.append(b.node)
            r.gpu_ts.append(b.ts)
            r.gpu_boot.append(b.boot)
            r.gpu_data.append(b.data.transpose(1, 0, 2))  # (R, F, G)
            for row, g, code, ts in zip(b.xid_row.tolist(), b.xid_gpu.tolist(), b.xid_code.tolist(),
                                        b.xid_ts.tolist(), strict=True):
                r.xids.append((int(b.node[row]), g, code, ts))
        if out.ports is not None:
            r.ports.extend(out.ports.to_records())
        r.events.extend(out.job_events)
    return r


def pinned(kind: str) -> str:
    return f"{kind}@{int(ONSET_S)}s/{NODE}/{SUB}"


def _window(run: Run, truth: TruthRecord, lo: float = 60.0, hi: float = 900.0) -> tuple[float, float]:
    return truth.onset + lo, min(truth.end, truth.onset + hi, run.sim.end)


def _port_rows(run: Run, truth: TruthRecord) -> list[tuple[str, str]]:
    """(device, port) pairs of the fault's link(s)."""
    fleet = run.sim.fleet
    pi = fleet.ports
    out = []
    if truth.kind == "leaf_switch":
        leaf = fleet.leaf_index[truth.switch]
        for n in range(fleet.n):
            for k in range(fleet.spec.nics_per_node):
                if pi.leaf_of[n, k] == leaf:
                    out.append((fleet.node_names[n], f"mlx5_{k}"))
        return out
    n = fleet.node_index[truth.node]
    for k in range(fleet.spec.nics_per_node):
        leaf = fleet.leaf_names[int(pi.leaf_of[n, k])]
        if not truth.switch or truth.switch == leaf:
            out.append((truth.node, f"mlx5_{k}"))
            out.append((leaf, pi.name[int(pi.leaf_port[n, k])]))
    return out


def _port_values(run: Run, pairs: list[tuple[str, str]], name: str, t0: float, t1: float) -> list[float | str]:
    want = set(pairs)
    out: list[float | str] = []
    for rec in run.ports:
        if not t0 <= rec.ts <= t1:
            continue
        for p in rec.ports:
            if (rec.device, p.port) in want:
                v = getattr(p, name)
                if v is not None:
                    out.append(v)
    return out


def _job_events(run: Run, truth: TruthRecord, kind: str, after: float) -> list[JobEvent]:
    jobs = set(truth.affected_jobs)
    return [e for e in run.events if e.event == kind and e.job in jobs and e.ts >= after]


def check(run: Run, truth: TruthRecord, tag: str) -> str | None:
    """None if the symptom is there, else why not."""
    fleet = run.sim.fleet
    node = fleet.node_index.get(truth.node, -1)
    gpu = truth.gpu if truth.gpu is not None else -1
    w0, w1 = _window(run, truth)
    name, _, arg = tag.partition(":")
    if name == "xid":
        code = int(arg)
        nodes = {fleet.node_index[n] for n in truth.nodes}
        hits = [x for x in run.xids if x[2] == code and x[0] in nodes and x[3] >= truth.onset - 60]
        return None if hits else f"no XID {code} on {sorted(nodes)}"
    if name == "gpu_missing":
        t, v = run.gpu_series(node, "gpu_temp")
        after = v[(t > truth.onset + 30) & (t < w1), gpu]
        before = v[t < truth.onset - 30, gpu]
        if after.size and np.isnan(after).all() and not np.isnan(before).all():
            return None
        return "GPU still reported"
    if name == "gpu_absent_briefly":  # a partial scrape: rows without the GPU (others there), never two in a row
        t, v = run.gpu_series(node, "gpu_temp")
        sel = v[(t > truth.onset - 1) & (t < truth.end)]
        miss = np.isnan(sel[:, gpu]) & ~np.isnan(np.delete(sel, gpu, axis=1)).all(axis=1)
        if not miss.any():
            return "the GPU was never absent"
        return "absent from two rows in a row" if (miss[1:] & miss[:-1]).any() else None
    if name == "scrape_split":  # a misaligned scrape: the node's GPUs, then that GPU alone, 1 ms later
        t, v = run.gpu_series(node, "gpu_temp")
        sel = (t > truth.onset - 1) & (t < truth.end)
        t, v = t[sel], v[sel]
        splits = [i for i in np.flatnonzero(np.diff(t) < 0.01)
                  if np.isnan(v[i, gpu]) and not np.isnan(np.delete(v[i], gpu)).any()
                  and not np.isnan(v[i + 1, gpu]) and np.isnan(np.delete(v[i + 1], gpu)).all()]
        return None if splits else "no round split in two records"
    if name == "nvlink_siblings_flat":  # the GPU's NVLink errors rise, its siblings' hardly
        t, v = run.gpu_series(node, "nvlink_crc_flit_error_count_total")
        sel = v[(t > truth.onset) & (t < w1 + 600)]
        rise = np.nanmax(sel, axis=0) - np.nanmin(sel, axis=0)
        others = float(np.delete(rise, gpu).max())
        return None if rise[gpu] > 10 * max(1.0, others) else f"GPU {gpu} rose {rise[gpu]}, a sibling {others}"
    if name == "node_missing":
        rows = run.node_rows(node)
        gap = rows[(rows > truth.onset + 30) & (rows < min(truth.end, truth.onset + 240))]
        return None if gap.size == 0 else f"{gap.size} rows during the outage"
    if name == "job_failure":
        return None if _job_events(run, truth, "failure", truth.onset - 1) else "no failure event"
    if name == "repeat_failure":
        return None if len(_job_events(run, truth, "failure", truth.onset - 1)) >= 2 else "fewer than 2 failures"
    if name == "job_hang":
        fails = [e for e in _job_events(run, truth, "failure", truth.onset)
                 if any("Watchdog" in x for x in e.log_excerpt)]
        if not fails:
            return "no watchdog failure"
        f = fails[0]
        prog = [e for e in run.events if e.event == "progress" and e.job == f.job and truth.onset + 30 < e.ts < f.ts]
        return None if not prog and f.ts - truth.onset >= 500 else f"progress during hang ({len(prog)}) or short"
    if name == "log":
        fails = _job_events(run, truth, "failure", truth.onset - 1)
        return None if any(arg in "\n".join(e.log_excerpt) for e in fails) else f"no failure log with {arg!r}"
    if name in ("up", "down"):
        t, v = run.gpu_series(node, arg)
        if name == "up":
            before = np.nan_to_num(v[t < truth.onset - 5, gpu], nan=0.0)
            after = np.nan_to_num(v[(t > truth.onset) & (t < w1 + 600), gpu], nan=0.0)
            b = before[-1] if before.size else 0.0
            top = after.max() if after.size else None
            return None if top is not None and top > b else f"{arg} did not rise ({b} -> {top})"
        sel = (t > w0) & (t < w1)
        mine = np.nanmedian(v[sel, gpu])
        others = np.nanmedian(np.delete(v[sel], gpu, axis=1))
        return None if mine < 0.97 * others else f"{arg}: {mine} vs peers {others}"
    if name == "gauge_up":
        t, v = run.gpu_series(node, arg)
        sel = (t > w0) & (t < w1)
        mine = np.nanmedian(v[sel])
        peers = []
        for other in range(fleet.n):
            if other != node:
                to, vo = run.gpu_series(other, arg)
                peers.append(np.nanmedian(vo[(to > w0) & (to < w1)]))
        return None if mine > np.median(peers) + 3 else f"{arg}: {mine} vs fleet {np.median(peers)}"
    if name == "reason":
        bits = {"throttle": HW_SLOWDOWN | SW_THERMAL | HW_THERMAL | HW_POWER_BRAKE, "power_brake": HW_POWER_BRAKE}[arg]
        t, v = run.gpu_series(node, "clocks_event_reasons")
        sel = v[(t > truth.onset) & (t < w1)]
        if gpu >= 0:
            sel = sel[:, gpu]
        ints = np.nan_to_num(sel, nan=0).astype(np.int64)
        return None if ((ints & bits) != 0).any() else f"no {arg} bits"
    if name in ("rank_slowdown", "step_slowdown"):
        w0, w1 = _window(run, truth, 300.0, 1500.0)
        jobs = list(truth.affected_jobs)
        for job in jobs:
            prog = [e for e in run.events if e.event == "progress" and e.job == job]
            if name == "rank_slowdown":
                mine = [e.step_time_s for e in prog if e.rank is not None and e.node == truth.node and w0 < e.ts < w1]
                other = [e.step_time_s for e in prog if e.rank is not None and e.node != truth.node and w0 < e.ts < w1]
                if mine and other and np.median(mine) > 1.02 * np.median(other):
                    return None
            else:
                before = [e.step_time_s for e in prog if e.rank is None and e.ts < truth.onset]
                after = [e.step_time_s for e in prog if e.rank is None and w0 < e.ts < w1]
                if before and after and np.median(after) > 1.03 * np.median(before):
                    return None
        return f"no {name} in {jobs}"
    if name == "link_down":
        states = _port_values(run, _port_rows(run, truth), "link_state", truth.onset, w1 + 1800)
        return None if "down" in states else "no down port"
    if name == "port_up":
        pairs = _port_rows(run, truth)
        before = _port_values(run, pairs, arg, truth.onset - 150, truth.onset - 35)
        after = _port_values(run, pairs, arg, truth.onset, w1 + 1800)
        b = max(before) if before else 0
        return None if after and max(after) > b else f"{arg} did not rise"
    if name == "ber_up":
        vals = _port_values(run, _port_rows(run, truth), "effective_ber", w0, w1 + 1800)
        return None if vals and max(vals) > 1e-12 else "BER stayed low"
    if name == "port_speed_low":
        vals = _port_values(run, _port_rows(run, truth), "speed_gbps", w0, w1)
        return None if vals and min(vals) < 400 else "speed not low"
    if name == "device_missing":
        seen = [r for r in run.ports if r.device == truth.switch and w0 < r.ts < w1]
        return None if not seen else f"{len(seen)} samples from {truth.switch}"
    if name == "fb_high":
        t, v = run.gpu_series(node, "fb_used")
        total = fleet.sku_of(node).fb_total_mib
        sel = v[(t > truth.onset) & (t <= truth.end + 5), gpu]
        return None if sel.size and np.nanmax(sel) > 0.95 * total else "fb did not fill"
    if name == "restart_event":
        ev = [e for e in run.events if e.event == "restart" and e.job in truth.affected_jobs and "user" in e.reason]
        return None if ev else "no user restart"
    if name == "job_idle":
        for nname in truth.nodes:
            t, v = run.gpu_series(fleet.node_index[nname], "gpu_util")
            sel = (t > truth.onset) & (t < truth.end)
            low = np.nanmax(v[sel], axis=1) <= 10 if sel.any() else np.zeros(0, bool)
            if low.sum() * run.sim.config.gpu_interval_s >= 180:
                return None
        return "job never idled"
    if name == "boot_id_change":
        return None if len(run.boots(node)) >= 2 else "boot id unchanged"
    raise AssertionError(f"unknown symptom tag {tag}")
