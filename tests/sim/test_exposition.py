"""Prometheus exposition of simulated telemetry reads back, through the project's exposition reader
(``fleetmedic backtest``'s), into the same GPU metrics and port counters as the JSONL records; series
names, labels, types and millisecond timestamps are dcgm-exporter's and node-exporter's."""

from __future__ import annotations

import re
from pathlib import Path

from fleetmedic.config import IngestSettings
from fleetmedic.connectors.prometheus.text import ExpositionReader
from fleetmedic.records import GpuTelemetry, PortTelemetry
from fleetmedic.sim.engine import SimConfig, Simulator
from fleetmedic.sim.exposition import ExpositionWriter, gpu_exposition, port_exposition
from fleetmedic.sim.fleet import FleetSpec
from fleetmedic.sim.telemetry import NoiseSpec


def _outputs() -> list:  # type: ignore[type-arg]
    sim = Simulator(SimConfig(fleet=FleetSpec(nodes=4, nodes_per_su=4, spines=2), duration_s=240, seed=2,
                              faults="xid79@1m/1/2", noise=NoiseSpec.named("none")))
    return list(sim.run())


def test_gpu_exposition_reads_back_into_the_same_records() -> None:
    outs = _outputs()
    batch = outs[-1].gpu
    text = gpu_exposition(batch)
    assert "# TYPE DCGM_FI_DEV_ECC_SBE_VOL_TOTAL counter" in text and "# TYPE DCGM_FI_DEV_GPU_TEMP gauge" in text
    line = next(x for x in text.splitlines() if x.startswith("DCGM_FI_DEV_GPU_TEMP{"))
    assert re.fullmatch(r'DCGM_FI_DEV_GPU_TEMP\{gpu="\d",UUID="GPU-[0-9a-f-]{36}",'
                        r'pci_bus_id="00000000:[0-9a-f]{2}:00\.0",'
                        r'device="nvidia\d",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-\d{4}",'
                        r'DCGM_FI_DRIVER_VERSION="[\d.]+"\} \d+ \d{13}', line)
    got = {(r.node, r.ts): r for r in ExpositionReader(IngestSettings()).read(text.splitlines())
           if isinstance(r, GpuTelemetry)}
    want = batch.to_records()
    assert len(got) == len(want)
    for rec in want:
        back = got[(rec.node, rec.ts)]
        assert back.gpus == rec.gpus and back.metrics == rec.metrics
        assert back.sku == rec.sku and back.uuids == rec.uuids
    assert any(len(r.gpus) == 7 for r in want)  # the GPU that fell off the bus is not exported


def test_port_exposition_reads_back_host_ports() -> None:
    outs = _outputs()
    batch = next(o.ports for o in reversed(outs) if o.ports is not None)
    text = port_exposition(batch)
    got = {r.device: r for r in ExpositionReader(IngestSettings()).read(text.splitlines())
           if isinstance(r, PortTelemetry)}
    want = {r.device: r for r in batch.to_records() if r.device_kind == "host"}
    assert set(got) == set(want)
    for dev, rec in want.items():
        back = {p.port: p for p in got[dev].ports}
        for p in rec.ports:
            b = back[f"{p.port}/1"]
            assert b.link_state == p.link_state and b.speed_gbps == p.speed_gbps
            assert b.symbol_error_counter == p.symbol_error_counter
            assert b.link_downed_counter == p.link_downed_counter
            assert b.port_xmit_data == p.port_xmit_data  # node-exporter bytes / 4 = IB 4-byte words


def test_writer_appends_rounds_with_meta_once(tmp_path: Path) -> None:
    w = ExpositionWriter(tmp_path, every_s=60.0)
    for o in _outputs():
        w.gpu(o.gpu)
        if o.ports is not None:
            w.ports(o.ports)
    w.close()
    text = (tmp_path / "gpu.prom").read_text()
    assert text.count("# TYPE DCGM_FI_DEV_GPU_TEMP gauge") == 1
    stamps = {int(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("DCGM_FI_DEV_GPU_TEMP{")}
    assert len(stamps) == 4  # one round a minute over 4 minutes, all nodes in step (no noise)
    recs = list(ExpositionReader(IngestSettings()).read(text.splitlines()))
    assert len(recs) == 16
