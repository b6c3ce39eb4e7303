"""Telemetry is realistic and valid: records decode against the wire schemas and agree with the
columnar batches; delivery noise (missing, late, duplicate samples, clock skew) is there by default
and gone with ``none``; cumulative counters only grow within a boot and restart after a reboot,
while remapped-row counts persist; power swings with the workload; switch ports map to node NICs."""

from __future__ import annotations

import itertools

import numpy as np

from fleetmedic.records import GpuTelemetry, JobEvent, PortTelemetry, RemediationCommand, decode, encode
from fleetmedic.sim.batch import GPU_FIELDS, GPU_INT_MASK
from fleetmedic.sim.engine import SimConfig, Simulator
from fleetmedic.sim.fleet import FleetSpec
from fleetmedic.sim.telemetry import NoiseSpec

START = SimConfig().start


def _sim(noise: str = "default", faults: str = "none", nodes: int = 8, minutes: float = 30, seed: int = 3) -> Simulator:
    return Simulator(SimConfig(fleet=FleetSpec(nodes=nodes, nodes_per_su=4, spines=2), duration_s=minutes * 60,
                               seed=seed, faults=faults, noise=NoiseSpec.named(noise)))


def test_records_decode_against_the_wire_schemas_and_match_the_columns() -> None:
    sim = _sim(faults="xid79@5m/2/3,nic_flap@5m/1/0", minutes=15)
    seen_missing_gpu = False
    for out in sim.run():
        assert out.gpu is not None
        recs = out.gpu.to_records()
        assert len(recs) == out.gpu.rows
        for r, rec in enumerate(recs):
            back = decode(GpuTelemetry, encode(rec))
            assert back == rec
            assert rec.metrics.retired_sbe is None  # H100 remaps rows, it does not retire pages
            col = out.gpu.column("gpu_temp")[r]
            present = [g for g in range(8) if not np.isnan(col[g])]
            assert rec.gpus == present and rec.metrics.gpu_temp == [col[g] for g in present]
            seen_missing_gpu |= len(rec.gpus) < 8
        if out.ports is not None:
            for prec in out.ports.to_records():
                assert decode(PortTelemetry, encode(prec)) == prec
        for e in out.job_events:
            assert decode(JobEvent, encode(e)) == e
    assert seen_missing_gpu


def test_integer_fields_are_integral_in_the_columns() -> None:
    sim = _sim(minutes=3)
    out = next(o for o in sim.run() if o.gpu is not None and o.gpu.rows)
    ints = out.gpu.data[GPU_INT_MASK]
    ints = ints[~np.isnan(ints)]
    assert np.array_equal(ints, np.round(ints))
    assert len(GPU_FIELDS) == out.gpu.data.shape[0]


def _rows(sim: Simulator) -> list[tuple[float, np.ndarray, np.ndarray]]:
    return [(o.t, o.gpu.node.copy(), o.gpu.ts.copy()) for o in sim.run() if o.gpu is not None]


def test_default_noise_loses_delays_duplicates_and_skews_samples() -> None:
    rows = _rows(_sim(noise="heavy", nodes=16, minutes=60))
    n_nodes = 16
    missing = sum(n_nodes - len(set(nodes.tolist())) for _, nodes, _ in rows)
    dups = sum(len(nodes) - len(set(nodes.tolist())) for _, nodes, _ in rows)
    late = sum(int((t - ts > 15).sum()) for t, _, ts in rows)
    assert missing > 0 and dups > 0 and late > 0
    offsets = np.concatenate([ts - t for t, _, ts in rows])
    assert np.abs(offsets).max() > 5  # a few badly skewed node clocks


def test_no_noise_means_one_punctual_row_per_node_per_round() -> None:
    for t, nodes, ts in _rows(_sim(noise="none", minutes=10)):
        assert sorted(nodes.tolist()) == list(range(8))
        assert np.allclose(ts, t)


def test_counters_grow_within_a_boot_and_restart_after_a_reboot_but_remapped_rows_persist() -> None:
    cfg = SimConfig(fleet=FleetSpec(nodes=4, nodes_per_su=4, spines=2), duration_s=3600, seed=2,
                    noise=NoiseSpec.named("none"),
                    faults="nvlink_errors@5m/1/2,xid48@6m/1/5")
    sim = Simulator(cfg)
    cmds = [
        RemediationCommand(id="c0", action="drain", incident_id="i", reason="t", issued_at=START + 1500,
                           expires_at=START + 9999, node="gpu-node-0001"),
        RemediationCommand(id="c1", action="reboot_node", incident_id="i", reason="t", issued_at=START + 1600,
                           expires_at=START + 9999, node="gpu-node-0001"),
    ]
    series: list[tuple[float, int, float, float]] = []
    for out in sim.run():
        for c in [c for c in cmds if c.issued_at <= sim.now]:
            sim.submit(c)
            cmds.remove(c)
        b = out.gpu
        assert b is not None
        for r in np.flatnonzero(b.node == 1).tolist():
            series.append((float(b.ts[r]), int(b.boot[r]), float(b.column("nvlink_crc_flit_error_count_total")[r, 2]),
                           float(b.column("uncorrectable_remapped_rows")[r, 5])))
    boots = sorted({s[1] for s in series})
    assert boots == [0, 1]
    for boot in boots:
        vals = [s[2] for s in series if s[1] == boot]
        assert all(b >= a for a, b in itertools.pairwise(vals))
    before = max(s[2] for s in series if s[1] == 0)
    first_after = next(s[2] for s in series if s[1] == 1)
    assert before > 100 and first_after < before
    assert min(s[3] for s in series if s[1] == 1) >= 1  # the InfoROM keeps the remapped row


def test_power_swings_with_the_workload_and_idles_low() -> None:
    sim = _sim(noise="none", nodes=8, minutes=40)
    power: dict[int, list[float]] = {}
    modes: dict[int, list[int]] = {}
    for out in sim.run():
        b = out.gpu
        assert b is not None
        p = b.column("power_usage")
        u = b.column("gpu_util")
        if out.t - START < 600:
            continue
        for r, n in enumerate(b.node.tolist()):
            power.setdefault(n, []).append(float(p[r, 0]))
            modes.setdefault(n, []).append(int(u[r, 0] > 50))
    training = [n for n in power if np.mean(modes[n]) > 0.5]
    assert training
    for n in training:
        assert np.std(power[n]) > 30.0  # compute vs communication vs waiting
        assert 250.0 < np.mean(power[n]) < 700.0


def test_switch_ports_map_to_node_nics_and_uplinks() -> None:
    sim = _sim(minutes=1)
    out = next(o for o in sim.run() if o.ports is not None)
    assert out.ports is not None
    recs = {r.device: r for r in out.ports.to_records()}
    leaf = recs["leaf-su0-r3"]
    assert leaf.device_kind == "switch"
    down = [p for p in leaf.ports if p.node]
    assert {p.node for p in down} == {f"gpu-node-000{i}" for i in range(4)}
    assert all(p.peer.endswith(":mlx5_3") for p in down)
    assert sum(1 for p in leaf.ports if p.peer.startswith("spine-")) == 2
    host = recs["gpu-node-0002"]
    assert host.device_kind == "host" and len(host.ports) == 8
    assert host.ports[3].peer == f"leaf-su0-r3:{3}"
