"""Stage 1 reads ``kernel.events`` beside ``telemetry.gpu``: in one poll, NVML's report
of an XID and the kernel log's line of the same XID (a line of the corpus, through the exporter's
mapper) make one finding; an SXid makes a finding naming its NVSwitch; a kernel event that does not
decode is dead-lettered and the stage goes on; the kernel topic's offsets move with the rest."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from aiokafka import TopicPartition

from fleetmedic import records as r
from fleetmedic.bus import partitions_of
from fleetmedic.config import Settings, parse_config
from fleetmedic.connectors.kernel.kmsg_map import KernelRecord, KmsgMapper, parse_pci_map
from fleetmedic.devenv.synth import gpu_message
from fleetmedic.models.stages import SummaryColumns
from fleetmedic.remediation.log_patterns import default_library
from fleetmedic.streams.detect import DetectStage
from tests.streams.helpers_fakes import FakeOutputs, consumer_record

DATA = Path(__file__).resolve().parents[1] / "data" / "kmsg"
T0 = 1_700_000_000.0


def _kernel(*lines: str) -> list[r.KernelEvent]:
    mapper = KmsgMapper("n0", default_library(), parse_pci_map((DATA / "pci-map.csv").read_text()), {}, "boot-1")
    out = mapper.map([KernelRecord(message=line, seq=100 + i, ts=T0 + i) for i, line in enumerate(lines)], T0)
    return [rec for rec in out.records if isinstance(rec, r.KernelEvent)]


def test_stage1_joins_the_kernel_logs_xid_with_nvmls_and_names_the_nvswitch_of_an_sxid() -> None:
    s = Settings()
    out = FakeOutputs(s)
    stage = DetectStage(s, out, out.metrics, 256, 0.5, 60.0, 10.0)
    rng = np.random.default_rng(1)
    warm = [gpu_message("n0", T0 - 100 + 10 * k, rng, gpus=4) for k in range(5)]
    nvml = gpu_message("n0", T0 + 5, rng, gpus=4, xids=[r.XidEvent(gpu=1, xid=48, ts=T0 + 0.3, message="NVML")])
    xid, sxid = _kernel(
        "NVRM: Xid (PCI:0000:5e:00): 48, pid=2024380, name=python, An uncorrectable double bit error (DBE) has been "
        "detected on GPU in the framebuffer at partition 6, subpartition 0.",
        "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error (First)")
    gpu_tp, kern_tp = TopicPartition(stage.gpu_topic, 0), TopicPartition(stage.kernel_topic, 0)

    def polled(gpu: list[r.GpuTelemetry], kern: list[bytes], first: int) -> dict[TopicPartition, Any]:
        return {gpu_tp: [consumer_record(stage.gpu_topic, r.encode(m), offset=first + i, key=b"n0",
                                         timestamp_ms=int(m.ts * 1000)) for i, m in enumerate(gpu)],
                kern_tp: [consumer_record(stage.kernel_topic, v, offset=first + i, key=b"n0",
                                          timestamp_ms=int(T0 * 1000)) for i, v in enumerate(kern)]}

    asyncio.run(stage._process({gpu_tp: polled(warm, [], 0)[gpu_tp]}))
    asyncio.run(stage._process(polled([nvml], [r.encode(xid), b'{"type": "kernel_event", "node": ""}',
                                               r.encode(sxid)], 5)))
    findings = out.records("findings", r.Finding)
    assert [(f.detector, f.gpu) for f in findings if f.detector == "xid_rules"] == [("xid_rules", 1)]  # one, not two
    (switch,) = [f for f in findings if f.detector == "kernel_log"]
    assert "NVSwitch nvidia-nvswitch0 (0000:c3:00.0)" in switch.summary and switch.severity == "critical"
    (dl,) = out.dead_letters()
    assert (dl.topic, dl.offset) == (stage.kernel_topic, 6)
    assert stage.next_offsets[kern_tp] == 8 and stage.next_offsets[gpu_tp] == 6
    assert "n0" in stage.dirty


def test_a_telemetry_record_without_metrics_is_judged_but_sends_no_summary() -> None:
    s = Settings()
    out = FakeOutputs(s)
    stage = DetectStage(s, out, out.metrics, 256, 0.5, 60.0, 10.0)
    tp = TopicPartition(stage.gpu_topic, 0)
    bare = r.GpuTelemetry(node="n1", ts=T0, gpus=[0, 1], metrics=r.GpuMetrics(),
                          xids=[r.XidEvent(gpu=1, xid=79, ts=T0)])
    full = gpu_message("n2", T0, np.random.default_rng(2), gpus=4)
    def poll(msgs: list[r.GpuTelemetry], first: int) -> dict[TopicPartition, Any]:
        return {tp: [consumer_record(stage.gpu_topic, r.encode(m), offset=first + i, key=m.node.encode(),
                                     timestamp_ms=int(T0 * 1000)) for i, m in enumerate(msgs)]}

    asyncio.run(stage._process(poll([bare], 0)))
    assert [(f.node, f.detector) for f in out.records("findings", r.Finding)] == [("n1", "xid_rules")]
    assert out.values(stage.summaries) == []  # XIDs alone are no sample of the node
    asyncio.run(stage._process(poll([bare, full], 1)))
    (summary,) = out.values(stage.summaries)
    assert msgspec.msgpack.decode(summary, type=SummaryColumns).nodes == ["n2"]


def test_kernel_events_get_as_many_partitions_as_telemetry_gpu_unless_named() -> None:
    assert partitions_of(parse_config("topics: {partitions: {telemetry.gpu: 48}}"), "kernel.events") == 48
    assert partitions_of(parse_config("topics: {default_partitions: 6}"), "kernel.events") == 6
    both = parse_config("topics: {partitions: {telemetry.gpu: 48, kernel.events: 24}}")
    assert partitions_of(both, "kernel.events") == 24
