"""Stage 1's memory of the kernel-log conditions a node reported is saved with the node's state on
the real broker: a worker restarted (or the one a partition moves to) does not report the same
device's AER storm again within ``detection.reassert_s``, and still reports another device at once."""

from __future__ import annotations

import asyncio
import uuid

from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from fleetmedic import records as r
from fleetmedic.config import parse_config
from fleetmedic.streams.app import ensure_topics
from fleetmedic.streams.detect import DetectStage
from fleetmedic.streams.metrics import PipelineMetrics
from fleetmedic.streams.outputs import Outputs
from fleetmedic.streams.state import decode_node_state
from tests.streams.helpers_fakes import FakeOutputs, consumer_record

T0 = 1_790_000_000.0


def _aer(pci: str, ts: float) -> r.KernelEvent:
    return r.KernelEvent(node="gpu-7", ts=ts, signal="pcie", incident_class="hardware", severity="critical",
                         pci=pci, message=f"pcieport {pci}: AER: Uncorrected (Fatal) error received")


def _kernel_records(stage: DetectStage, events: list[r.KernelEvent], first: int = 0
                    ) -> dict[TopicPartition, list[object]]:
    tp = TopicPartition(stage.kernel_topic, 0)
    return {tp: [consumer_record(stage.kernel_topic, r.encode(ev), offset=first + i, key=ev.node.encode(),
                                 timestamp_ms=int(ev.ts * 1000)) for i, ev in enumerate(events)]}


def test_the_checkpoint_writes_the_kernel_memory_and_an_older_state_without_it_still_loads() -> None:
    s = parse_config("detection: {reassert_s: 3600}", env={})
    out = FakeOutputs(s)
    stage = DetectStage(s, out, out.metrics, 256, 0.5, 60.0, 10.0)
    asyncio.run(stage._process(_kernel_records(stage, [_aer("0000:18:00.0", T0)])))  # type: ignore[arg-type]
    asyncio.run(stage.checkpoint())
    (value,) = [v for t, k, v in out.sent if t == stage.state_topic and k == b"gpu-7"]
    state = decode_node_state(value)
    assert state is not None and state.kernel == stage.node_stage.kernel.node_bytes("gpu-7") is not None
    state.kernel = None  # what a worker before this field wrote
    assert stage._load_node("gpu-7", state, 0)


def test_a_restarted_worker_does_not_report_a_devices_aer_storm_again(kafka_bootstrap: str) -> None:
    u = uuid.uuid4().hex[:8]
    s = parse_config(f"kafka: {{bootstrap_servers: '{kafka_bootstrap}'}}\n"
                     f"topics: {{prefix: kr{u}., default_partitions: 1}}\ndetection: {{reassert_s: 3600}}", env={})

    async def main() -> DetectStage:
        await ensure_topics(s)
        metrics = PipelineMetrics(CollectorRegistry())
        first = DetectStage(s, Outputs(s, metrics), metrics, 256, 0.5, 60.0, 10.0)
        try:
            assert first.node_stage.on_kernel(_aer("0000:18:00.0", T0 - 1))  # the storm's first line: reported
            await first._process(_kernel_records(first, [_aer("0000:18:00.0", T0)]))  # type: ignore[arg-type]
            await first.checkpoint()
        finally:
            await first.outputs.stop()
        again_metrics = PipelineMetrics(CollectorRegistry())
        again = DetectStage(s, Outputs(s, again_metrics), again_metrics, 256, 0.5, 60.0, 10.0)
        await again._assign({TopicPartition(again.kernel_topic, 0), TopicPartition(again.gpu_topic, 0)})
        await again.outputs.stop()
        return again

    again = asyncio.run(main())
    assert "gpu-7" in again.partition_of
    assert again.node_stage.on_kernel(_aer("0000:18:00.0", T0 + 600)) == []  # the same storm, 10 min on
    assert again.node_stage.on_kernel(_aer("0000:3b:00.0", T0 + 600))  # another device: reported at once
    assert again.node_stage.on_kernel(_aer("0000:18:00.0", T0 + 3600))  # past reassert_s: reported again
