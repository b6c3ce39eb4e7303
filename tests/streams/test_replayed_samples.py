"""Stage 1 takes no sample twice (stalled coordinator, and a kill between the write of
the node states and the commit of the offsets): a worker that loads a node's state and resumes from
an older offset replays samples the state already holds; they are counted, not taken again."""

from __future__ import annotations

import asyncio

import numpy as np
from aiokafka import TopicPartition

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.devenv.synth import gpu_message
from fleetmedic.streams.detect import DetectStage
from tests.streams.helpers_fakes import FakeOutputs, consumer_record, sample

T0 = 1_700_000_000.0


def _stage() -> tuple[DetectStage, FakeOutputs]:
    s = Settings()
    out = FakeOutputs(s)
    return DetectStage(s, out, out.metrics, 256, 0.5, 60.0, 10.0), out


def _feed(stage: DetectStage, msgs: list[r.GpuTelemetry], first: int) -> None:
    tp = TopicPartition(stage.gpu_topic, 0)
    asyncio.run(stage._process({tp: [consumer_record(stage.gpu_topic, r.encode(m), offset=first + i, key=b"n0",
                                                     timestamp_ms=int(m.ts * 1000)) for i, m in enumerate(msgs)]}))


def test_a_replayed_sample_is_counted_not_taken_twice() -> None:
    rng = np.random.default_rng(3)
    msgs = [gpu_message("n0", T0 + 10 * k, rng, gpus=4) for k in range(12)]
    once, _ = _stage()
    for k, m in enumerate(msgs):
        _feed(once, [m], k)
    replayed, out = _stage()
    for k, m in enumerate(msgs):
        _feed(replayed, [m], k)
    _feed(replayed, msgs[6:9], 6)  # resumed from an older offset: samples 6-8 again
    _feed(replayed, [msgs[11]], 11)  # the latest one again: same time, taken (a scrape split in two records)
    assert sample(out.metrics, "fleetmedic_replayed_samples_total") == 3
    assert replayed.node_stage.gpu.node_bytes("n0") != once.node_stage.gpu.node_bytes("n0")  # the 11th twice
    again, _ = _stage()
    for k, m in enumerate(msgs):
        _feed(again, [m], k)
    _feed(again, msgs[6:9], 6)
    assert again.node_stage.gpu.node_bytes("n0") == once.node_stage.gpu.node_bytes("n0")
