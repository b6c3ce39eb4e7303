"""Saved state that would mislead a stage is refused, not loaded: a node state whose baselines,
counts or times are NaN or infinite starts that node fresh (counted), and a decision snapshot whose
bytes changed since it was written (a flipped bit) fails its checksum and is passed over like an
unreadable one, however plausible the values it would decode to."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import msgspec
import numpy as np
import pytest
from aiokafka import TopicPartition

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.devenv.synth import gpu_message
from fleetmedic.models.baseline import EwmaBaseline
from fleetmedic.models.gpu_detector import GpuDetector
from fleetmedic.models.gpu_state import NodeGpuState
from fleetmedic.models.port_detector import PortDetector
from fleetmedic.models.stages import NodeDetection
from fleetmedic.streams import detect as detect_module
from fleetmedic.streams.decide import DecideStage, restore
from fleetmedic.streams.detect import DetectStage
from fleetmedic.streams.outputs import Source
from fleetmedic.streams.state import DetectPartition, NodeStageState, SnapshotCorrupt, decode_snapshot
from tests.streams.helpers_fakes import FakeOutputs, sample

T0 = 1_790_000_000.0


def _warm(node: str = "n0", samples: int = 40) -> GpuDetector:
    d = GpuDetector(Settings().detection)
    rng = np.random.default_rng(3)
    for k in range(samples):
        d.observe(gpu_message(node, T0 + 10 * k, rng))
    return d


def _with(data: bytes, **parts: Any) -> bytes:
    st = msgspec.msgpack.decode(data, type=NodeGpuState)
    return msgspec.msgpack.encode(msgspec.structs.replace(st, **parts))


@pytest.mark.parametrize(("part", "value", "why"), [
    ("planes", np.nan, "planes: 288 of 288 values are NaN or infinite"),
    ("planes", np.inf, "planes: 1 of 288 values are NaN or infinite"),
    ("throttle", -np.inf, "throttle: 1 of 8 values"),
    ("prev", np.inf, "prev: 1 of 120 values are infinite"),
])
def test_a_gpu_node_state_with_non_finite_baselines_is_refused_naming_the_part(part: str, value: float,
                                                                               why: str) -> None:
    d = _warm()
    clean = d.node_bytes("n0")
    assert clean is not None
    arr = np.frombuffer(getattr(msgspec.msgpack.decode(clean, type=NodeGpuState), part)).copy()
    if part == "planes" and np.isnan(value):
        arr[:] = value  # every baseline NaN: the probe's state, which gave 0 findings where clean gave 90
    else:
        arr[0] = value
    fresh = GpuDetector(Settings().detection)
    with pytest.raises(ValueError, match=why.replace("(", r"\(")):
        fresh.load_node("n0", _with(clean, **{part: arr.tobytes()}))
    assert fresh.node_bytes("n0") is None  # nothing of it loaded
    fresh.load_node("n0", clean)  # the clean state loads
    assert fresh.node_bytes("n0") == clean


def test_nan_in_a_previous_sample_is_no_value_and_loads() -> None:
    d = _warm()
    clean = d.node_bytes("n0")
    assert clean is not None
    prev = np.frombuffer(msgspec.msgpack.decode(clean, type=NodeGpuState).prev).copy()
    prev[:3] = np.nan
    GpuDetector(Settings().detection).load_node("n0", _with(clean, prev=prev.tobytes()))


def test_infinite_times_and_values_in_the_other_detectors_states_are_refused() -> None:
    with pytest.raises(ValueError, match="prev_ts"):
        GpuDetector(Settings().detection).load_node("n0", _with(_warm().node_bytes("n0") or b"", prev_ts=float("inf")))
    with pytest.raises(ValueError, match="kernel conditions"):
        NodeDetection(Settings().detection).kernel.load_node("n0", msgspec.msgpack.encode({"xid:79": float("nan")}))
    ports = {"n0/mlx5_0": {"ts": float("inf"), "boot_id": "", "link_state": "up", "counters": {}}}
    with pytest.raises(ValueError, match=r"ports\[n0/mlx5_0\]"):
        PortDetector(Settings().detection).load_node("n0", msgspec.msgpack.encode(ports))
    b = EwmaBaseline.empty((2,))
    b.mean[0] = np.nan
    with pytest.raises(ValueError, match="baseline"):
        EwmaBaseline.empty((2,)).load_state(b.state_bytes())


def test_stage1_starts_a_node_whose_saved_baselines_are_nan_fresh_and_counts_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings()
    out = FakeOutputs(s)
    stage = DetectStage(s, out, out.metrics, 256, 0.5, 60.0, 10.0)
    donor = NodeDetection(s.detection)
    rng = np.random.default_rng(2)
    for k in range(5):
        donor.on_gpu([gpu_message("good", T0 + 10 * k, rng), gpu_message("blind", T0 + 10 * k, rng)])
    states = {n: NodeStageState(gpu=donor.gpu.node_bytes(n), ports=donor.ports.node_bytes(n), written_at=T0)
              for n in ("good", "blind")}
    planes = np.frombuffer(msgspec.msgpack.decode(states["blind"].gpu or b"", type=NodeGpuState).planes).copy()
    planes[:] = np.nan
    states["blind"].gpu = _with(states["blind"].gpu or b"", planes=planes.tobytes())

    async def load(*_: Any, **__: Any) -> DetectPartition:
        return DetectPartition(states=states, model=None, unreadable={})

    monkeypatch.setattr(detect_module, "load_detect_partition", load)
    try:
        asyncio.run(stage.on_assigned({TopicPartition(stage.gpu_topic, 0), TopicPartition(stage.port_topic, 0)}))
    finally:
        stage._refits.shutdown(wait=False, cancel_futures=True)
    assert stage.node_stage.gpu.node_bytes("good") == donor.gpu.node_bytes("good")
    assert stage.node_stage.gpu.node_bytes("blind") is None  # starts fresh: its baselines relearn
    assert sample(out.metrics, "fleetmedic_state_unreadable_total", stage="detect", part="node") == 1


# --- the decision snapshot ---------------------------------------------------------------------------


def _snapshot_bytes() -> tuple[DecideStage, bytes]:
    s = Settings()
    out = FakeOutputs(s)
    stage = DecideStage(s, b"k" * 40, out, out.metrics, None, set())

    async def fill() -> None:
        for i in range(16):
            obs = r.NodeObservation(node=f"n{i}", ts=T0, labels={"fleetmedic.io/rack": f"r{i % 4}"})
            await stage.handle_record(Source(s.topics.topic("cluster.nodes"), 0, i, obs.node.encode(), r.encode(obs),
                                             int(T0 * 1000)))
        await stage.snapshot()

    asyncio.run(fill())
    (raw,) = out.values(s.kafka.consumer_group + "-engine-state")
    return stage, raw


def test_300_single_bit_flips_in_a_snapshot_are_all_refused_and_the_previous_one_is_restored() -> None:
    stage, raw = _snapshot_bytes()
    assert restore(stage.settings, [(0, raw)]).offset == 0  # the snapshot as written restores
    rng = random.Random(7)
    for bit in rng.sample(range(len(raw) * 8), 300):
        flipped = bytearray(raw)
        flipped[bit // 8] ^= 1 << (bit % 8)
        restored = restore(stage.settings, [(9, bytes(flipped)), (4, raw)])
        assert restored.offset == 4, f"bit {bit} of {len(raw) * 8} loaded"
        (bad,) = restored.unreadable
        assert "offset 9" in bad.detail


def test_a_flipped_bit_in_the_body_names_the_checksum() -> None:
    _, raw = _snapshot_bytes()
    flipped = bytearray(raw)
    flipped[-5] ^= 0x10
    with pytest.raises(SnapshotCorrupt, match="do not match the SHA-256 they were written with"):
        decode_snapshot(bytes(flipped))


def test_the_fleet_stages_states_with_non_finite_times_or_baselines_are_refused() -> None:
    from fleetmedic.models.peers import PeerComparison
    from fleetmedic.models.straggler import StragglerDetector

    jobs = {"ml/a": {"mean": float("nan"), "times": {0: 1.0}}}
    with pytest.raises(ValueError, match="straggler step times"):
        StragglerDetector(Settings().detection.straggler).load_state(msgspec.msgpack.encode(jobs))
    peers = [{"n0": {"ts": float("inf"), "values": {"gpu_temp": 50.0}}}, {}, {}, {}]
    with pytest.raises(ValueError, match="peer comparison times"):
        PeerComparison(Settings().detection.peers).load_state(msgspec.msgpack.encode(peers))
    peers = [{"n0": {"ts": 1.0, "values": {"gpu_temp": float("nan")}}}, {}, {}, {}]
    # a value not reported: NaN stands for none
    PeerComparison(Settings().detection.peers).load_state(msgspec.msgpack.encode(peers))
