"""Stage 1 on the kernel log: an XID from the kernel log and the same XID from NVML or
dcgm are one event (``detection.xid_dedup_window_s``); records without metrics never move a node's
metric clock or baselines; an SXid points at its NVSwitch, an AER error at the GPU or NIC at its PCI
address. The kernel events are made from lines of the corpus (tests/data/kmsg) by the exporter's
mapper."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np

from fleetmedic import records as r
from fleetmedic.config import parse_config
from fleetmedic.connectors.kernel.kmsg_map import KernelRecord, KmsgMapper, parse_pci_map
from fleetmedic.devenv.synth import gpu_message
from fleetmedic.models import event_dedup as dd
from fleetmedic.models.gpu_state import NodeGpuState
from fleetmedic.models.stages import NodeDetection
from fleetmedic.remediation.log_patterns import default_library
from fleetmedic.remediation.triage.records import finding_class, finding_isolation

DATA = Path(__file__).resolve().parents[1] / "data" / "kmsg"
T0 = 1_700_000_000.0
DBE = ("NVRM: Xid (PCI:0000:5e:00): 48, pid=1, name=python, An uncorrectable double bit error (DBE) has been "
       "detected on GPU in the framebuffer at partition 6")
#: lines of tests/data/kmsg/node-a.kmsg
SXID = "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error (First)"
AER_GPU = "pcieport 0000:00:03.1: AER: Uncorrected (Fatal) error received: 0000:5e:00.0"


def _events(*lines: str, ts: float = T0, gpus: int = 4) -> list[r.KernelEvent]:
    pci = parse_pci_map((DATA / "pci-map.csv").read_text())
    pci.update({f"0000:{0xc0 + g:02x}:00": g for g in range(4, gpus)})
    mapper = KmsgMapper("n0", default_library(), pci, {"0000:18:00.0": "mlx5_0/1"}, "boot-1")
    out = mapper.map([KernelRecord(message=line, seq=i, ts=ts + i) for i, line in enumerate(lines)], ts)
    return [rec for rec in out.records if isinstance(rec, r.KernelEvent)]


def _stage(yaml: str = "") -> NodeDetection:
    return NodeDetection(parse_config(yaml).detection)


def _samples(stage: NodeDetection, start: float, n: int, gpus: int = 4, **kw: object) -> list[r.Finding]:
    rng = np.random.default_rng(3)
    out: list[r.Finding] = []
    for k in range(n):
        out += stage.on_gpu([gpu_message("n0", start + 10.0 * k, rng, gpus=gpus, **kw)])  # type: ignore[arg-type]
    return out


def _xid_findings(findings: list[r.Finding]) -> list[tuple[str, int | None]]:
    return [(f.detector, f.gpu) for f in findings if f.detector.startswith("xid")]


def test_the_same_xid_from_two_sources_is_one_event_and_each_repeat_still_counts() -> None:
    seen: list[dd.Entry] = []
    assert dd.accept(seen, 1, 48, 100.0, dd.KERNEL, 60.0)
    assert not dd.accept(seen, 1, 48, 100.4, dd.TELEMETRY, 60.0)  # NVML's report of the same XID
    assert dd.accept(seen, 1, 48, 105.0, dd.KERNEL, 60.0)  # the kernel logged it again: a second event
    assert not dd.accept(seen, 1, 48, 105.2, dd.TELEMETRY, 60.0)  # ... which NVML reports too
    assert dd.accept(seen, 1, 48, 106.0, dd.TELEMETRY, 60.0)  # a third, NVML first this time
    assert dd.accept(seen, 2, 48, 106.0, dd.KERNEL, 60.0)  # another GPU
    assert dd.accept(seen, 1, 48, 300.0, dd.TELEMETRY, 60.0)  # beyond the window
    assert not dd.accept(seen, 1, 48, 250.0, dd.KERNEL, 60.0)  # a late kernel report of that one
    assert dd.accept([], 1, 48, 0.0, dd.KERNEL, 0.0) and all(e[0] >= 300.0 - 120.0 for e in seen)


def test_an_xid_in_the_kernel_log_and_from_nvml_gives_one_finding_in_either_order() -> None:
    stage = _stage()
    _samples(stage, T0 - 50, 5)
    (kern,) = _events(DBE, ts=T0)
    assert _xid_findings(stage.on_kernel(kern)) == [("xid_rules", 1)]
    nvml = r.XidEvent(gpu=1, xid=48, ts=T0 + 0.7, message="NVML")
    assert _xid_findings(_samples(stage, T0 + 10, 1, xids=[nvml])) == []  # the same event
    # NVML first, then the kernel's line: one finding again
    later = r.XidEvent(gpu=1, xid=48, ts=T0 + 400, message="NVML")
    assert _xid_findings(_samples(stage, T0 + 400, 1, xids=[later])) == [("xid_rules", 1)]
    assert _xid_findings(stage.on_kernel(_events(DBE, ts=T0 + 399.5)[0])) == []
    # a real second occurrence beyond the window counts
    assert _xid_findings(stage.on_kernel(_events(DBE, ts=T0 + 900)[0])) == [("xid_rules", 1)]


def test_a_zero_window_counts_every_report() -> None:
    stage = _stage("detection: {xid_dedup_window_s: 0}")
    _samples(stage, T0 - 50, 5)
    assert _xid_findings(stage.on_kernel(_events(DBE, ts=T0)[0])) == [("xid_rules", 1)]
    nvml = r.XidEvent(gpu=1, xid=48, ts=T0 + 0.7)
    assert _xid_findings(_samples(stage, T0 + 10, 1, xids=[nvml])) == [("xid_rules", 1)]


def test_records_without_metrics_never_move_the_metric_clock_or_the_baselines() -> None:
    stage = _stage()
    _samples(stage, T0, 40)
    before = msgspec.msgpack.decode(stage.gpu.node_bytes("n0") or b"", type=NodeGpuState)
    # a kernel XID and a telemetry record carrying only an XID, both far ahead of the last sample
    stage.on_kernel(_events(DBE, ts=T0 + 2000)[0])
    bare = r.GpuTelemetry(node="n0", ts=T0 + 2100, gpus=[0, 1, 2, 3], metrics=r.GpuMetrics(),
                          xids=[r.XidEvent(gpu=2, xid=13, ts=T0 + 2100)])
    found = stage.on_gpu([bare])
    assert _xid_findings(found) == [("xid_rules", 2)]
    after = msgspec.msgpack.decode(stage.gpu.node_bytes("n0") or b"", type=NodeGpuState)
    assert (after.prev_ts, after.samples, after.planes, after.prev) == (
        before.prev_ts, before.samples, before.planes, before.prev)
    # the next sample comes 10 s after the last one: no gap, no telemetry finding
    assert [f for f in _samples(stage, T0 + 400, 1) if f.kind == "telemetry"] == []


def test_a_node_known_from_its_kernel_log_first_takes_its_telemetrys_gpus_without_losing_one() -> None:
    stage = _stage()
    (kern,) = _events(DBE, ts=T0, gpus=8)  # the kernel's map lists 8 GPUs
    assert kern.gpus == list(range(8))
    assert _xid_findings(stage.on_kernel(kern)) == [("xid_rules", 1)]
    found = _samples(stage, T0 + 10, 10, gpus=4)  # the telemetry reports 4 of them
    assert [f.summary for f in found if f.kind == "hard_fault"] == []  # no GPU "stopped reporting"
    assert stage.gpu.signals("n0") is not None


def test_an_sxid_points_at_its_nvswitch_and_an_aer_error_at_the_device_at_its_address() -> None:
    stage = _stage()
    nic_aer = ("mlx5_core 0000:18:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer, "
               "(Requester ID)")
    sxid, aer_gpu, aer_nic, corrected = _events(SXID, AER_GPU, nic_aer,
                                                "pcieport 0000:00:03.1: AER: Corrected error received: 0000:00:03.1")
    (f,) = stage.on_kernel(sxid)
    assert "NVSwitch nvidia-nvswitch0 (0000:c3:00.0)" in f.summary and "SXid 24007" in f.summary
    assert (f.kind, f.severity, f.evidence[0].port, f.evidence[0].value) == (
        "hard_fault", "critical", "nvswitch:0000:c3:00.0", 24007.0)
    assert finding_class(f) == "hardware" and finding_isolation(f).kind == "uncertain"
    (g,) = stage.on_kernel(aer_gpu)
    assert (g.gpu, g.severity, g.kind) == (1, "critical", "hard_fault") and "GPU 1 (0000:5e:00.0)" in g.summary
    (n,) = stage.on_kernel(aer_nic)
    assert (n.gpu, n.port, n.severity) == (None, "mlx5_0/1", "warning") and "NIC port mlx5_0/1" in n.summary
    assert stage.on_kernel(corrected) == []  # info: on the topic for dashboards, no finding
    # an AER storm on that GPU is one finding until reassert_s has passed
    again = msgspec.structs.replace(aer_gpu, ts=aer_gpu.ts + 30)
    assert stage.on_kernel(again) == []
    assert len(stage.on_kernel(msgspec.structs.replace(aer_gpu, ts=aer_gpu.ts + 700))) == 1


def test_a_node_remembers_a_bounded_number_of_conditions_the_latest_kept() -> None:
    """A log naming ever new devices (a failing bridge, or hostile input) cannot grow the memory
    that is saved with the node's state; the newest conditions stay, so a storm still reports once."""
    from fleetmedic.models.kernel_events import MAX_CONDITIONS, KernelEventDetector

    settings = parse_config("detection: {reassert_s: 3600}", env={}).detection
    det = NodeDetection(settings).kernel
    for k in range(5 * MAX_CONDITIONS):
        pci = f"{k // 256:04x}:{k % 256:02x}:00.0"
        ev = r.KernelEvent(node="n", ts=1000.0 + k, signal="pcie", incident_class="hardware", severity="critical",
                           pci=pci, message=f"pcieport {pci}: AER: Uncorrected (Fatal) error received")
        assert det.observe(ev), "a new device is reported"
        assert len(det._reported["n"]) <= MAX_CONDITIONS
        assert det.observe(ev) == [], "the same device again at once is not"
    data = det.node_bytes("n")
    assert data is not None and len(data) < 64 * MAX_CONDITIONS
    again = KernelEventDetector(settings, det.gpu)
    again.load_node("n", data)
    assert again.node_bytes("n") == data
