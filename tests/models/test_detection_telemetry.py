"""The detect worker decodes telemetry as :class:`~fleetmedic.records.DetectionTelemetry` (only the
metrics stage 1 reads): stage 1 must judge exactly as on the full :class:`GpuTelemetry`, and the
projection must still reject what stage 1 would read wrong, naming the field."""

from __future__ import annotations

import msgspec
import pytest

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.models.stages import STAGE1_METRICS, NodeDetection, stage1_batch, summarise_batch
from fleetmedic.sim.engine import SimConfig, Simulator
from fleetmedic.sim.fleet import FleetSpec


def test_stage1_decodes_exactly_the_metrics_it_reads() -> None:
    assert set(r.DETECTION_METRICS) == set(STAGE1_METRICS)
    assert r.GPU_METRICS[: len(r.DETECTION_METRICS)] == r.DETECTION_METRICS  # same column index in both
    assert set(r.DetectionTelemetry.__struct_fields__) < set(r.GpuTelemetry.__struct_fields__)


def _stage1(msgs: list[r.DetectionTelemetry]) -> tuple[list[r.Finding], list[object], dict[str, bytes]]:
    stage = NodeDetection(Settings().detection)
    findings, summaries = [], []
    for i in range(0, len(msgs), 64):
        chunk = msgs[i: i + 64]
        batch = stage1_batch(chunk)
        findings += stage.on_gpu(chunk, batch)
        summaries += summarise_batch(chunk, batch)
    states = {m.node: stage.gpu.node_bytes(m.node) + stage.multivariate_bytes(m.node) for m in msgs}
    return findings, summaries, states


def test_stage1_on_the_projection_equals_stage1_on_the_full_records() -> None:
    sim = Simulator(SimConfig(fleet=FleetSpec(nodes=12, nodes_per_su=4, spines=2), duration_s=2 * 3600, seed=5,
                              faults="xid79@20m/2/3,fan_failure@30m/4,nvlink_errors@40m/7/1,hbm_degradation@25m/9/5"))
    wire = [r.encode(m) for out in sim.run() if out.gpu is not None for m in out.gpu.to_records()]
    assert len(wire) > 8_000
    full = [r.decode(r.GpuTelemetry, b) for b in wire]
    lean = [r.decode(r.DetectionTelemetry, b) for b in wire]
    assert all(type(m) is r.DetectionTelemetry for m in lean)
    want, got = _stage1(full), _stage1(lean)  # type: ignore[arg-type]
    assert len(want[0]) >= 4, [f.detector for f in want[0]]  # the faults were found
    assert got == want


def test_the_projection_rejects_what_stage1_reads_and_ignores_the_rest() -> None:
    good = msgspec.json.decode(r.encode(r.GpuTelemetry(
        node="n1", ts=1000.0, gpus=[0, 1], uuids=["GPU-a", "GPU-b"],
        metrics=r.GpuMetrics(gpu_temp=[40.0, 41.0], fb_used=[1.0, 2.0]))))
    short = {**good, "metrics": {**good["metrics"], "gpu_temp": [40.0]}}
    with pytest.raises(r.InvalidRecord, match=r"`metrics.gpu_temp` has 1 values for 2 GPUs"):
        r.decode(r.DetectionTelemetry, msgspec.json.encode(short))
    hot = {**good, "metrics": {**good["metrics"], "gpu_temp": [40.0, 1e6]}}
    with pytest.raises(r.InvalidRecord, match=r"\$\.metrics\.gpu_temp\[1\]"):
        r.decode(r.DetectionTelemetry, msgspec.json.encode(hot))
    # a metric stage 1 does not read is skipped like an unknown field: the full record still rejects it
    odd = {**good, "metrics": {**good["metrics"], "fb_used": ["lots", 2.0]}, "uuids": ["GPU-a"]}
    assert r.decode(r.DetectionTelemetry, msgspec.json.encode(odd)).metrics.gpu_temp == [40.0, 41.0]
    with pytest.raises(r.InvalidRecord, match=r"fb_used"):
        r.decode(r.GpuTelemetry, msgspec.json.encode(odd))


@pytest.mark.parametrize("record", [r.DetectionTelemetry, r.GpuTelemetry])
def test_column_lengths_are_checked_for_every_case_of_the_fast_check(record: type[r.DetectionTelemetry]) -> None:
    def msg(gpus: list[int], **metrics: list[float]) -> bytes:
        return msgspec.json.encode({"type": "gpu_telemetry", "node": "n", "ts": 1.0, "gpus": gpus, "metrics": metrics})

    assert r.decode(record, msg([0, 1], gpu_temp=[40.0, 41.0], power_usage=[300.0, 310.0])).gpus == [0, 1]
    with pytest.raises(r.InvalidRecord, match=r"gpus.*length >= 1"):  # a GPU record names at least one GPU
        r.decode(record, msg([], gpu_temp=[]))
    for gpus, column, count in (([0, 1], [], 0), ([0], [40.0, 41.0], 2), ([0, 1], [40.0, 41.0, 42.0], 3)):
        with pytest.raises(r.InvalidRecord, match=rf"`metrics.power_usage` has {count} values for {len(gpus)} GPUs"):
            r.decode(record, msg(gpus, gpu_temp=[40.0] * len(gpus), power_usage=column))
