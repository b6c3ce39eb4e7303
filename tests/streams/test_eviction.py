"""Stage 1's memory is bounded whatever node names arrive (without eviction 250k
distinct names would grow it to about 951 MB): a node silent for ``detection.evict_node_after_s`` of event time is
forgotten, beyond ``detection.max_nodes_per_worker`` the least recently seen one is, a node seen
regularly never is, and a forgotten node's saved state is deleted (a tombstone) so that a restore on
the real broker does not bring it back."""

from __future__ import annotations

import asyncio
import uuid
from collections import OrderedDict

import numpy as np
from aiokafka import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from fleetmedic import records as r
from fleetmedic.config import Settings, parse_config
from fleetmedic.devenv.synth import gpu_message
from fleetmedic.models.stages import FleetDetection, NodeDetection, summarise_batch
from fleetmedic.streams.app import ensure_topics
from fleetmedic.streams.detect import DetectStage
from fleetmedic.streams.metrics import PipelineMetrics
from fleetmedic.streams.outputs import Outputs
from fleetmedic.streams.state import decode_node_state
from tests.streams.helpers_fakes import FakeOutputs, consumer_record, sample

T0 = 1_790_000_000.0
GPUS = 2  # small messages: the point is the number of names


def _config(cap: int = 50, after_s: float = 600.0, extra: str = "") -> Settings:
    return parse_config(f"detection: {{max_nodes_per_worker: {cap}, evict_node_after_s: {after_s}}}\n{extra}",
                        env={})


def _port(device: str, ts: float) -> r.PortTelemetry:
    return r.PortTelemetry(ts=ts, device=device, device_kind="host",
                           ports=[r.PortSample(port="mlx5_0/1", node=device, link_state="up", speed_gbps=400.0,
                                               symbol_error_counter=0)])


def _kept(stage: NodeDetection) -> dict[str, int]:
    """Per-node entries of every structure stage 1 keeps."""
    return {"seen": stage.tracked(), "gpu": len(stage.gpu.nodes()), "ports": stage.ports.devices(),
            "windows": len(stage.windows._slot), "streak": len(stage._outlier_streak),
            "flagged": len(stage._flagged_since)}


@settings(max_examples=15, deadline=None)
@given(cap=st.integers(1, 40), names=st.integers(1, 300), batch=st.integers(1, 64), ports_every=st.integers(1, 7))
def test_whatever_names_arrive_no_structure_keeps_more_nodes_than_the_cap(cap: int, names: int, batch: int,
                                                                         ports_every: int) -> None:
    stage, rng = NodeDetection(_config(cap=cap).detection), np.random.default_rng(cap)
    evicted: list[tuple[str, str]] = []
    stage.on_evict = lambda node, reason: evicted.append((node, reason))
    stream = [f"name-{uuid.uuid4().hex[:6]}-{i}" for i in range(names)]
    lru: OrderedDict[str, None] = OrderedDict()  # the oracle: least recently seen first
    expected = 0

    def saw(nodes: list[str]) -> None:
        nonlocal expected
        for n in nodes:
            lru[n] = None
            lru.move_to_end(n)
        while len(lru) > cap:
            lru.popitem(last=False)
            expected += 1

    for start in range(0, names, batch):
        ts = T0 + start
        chunk = stream[start:start + batch]
        stage.on_gpu([gpu_message(n, ts, rng, gpus=GPUS) for n in chunk])
        saw(chunk)
        for n in chunk[::ports_every]:  # a NIC's ports bring its node back (the most recently seen)
            stage.on_port(_port(n, ts))
            saw([n])
        assert max(_kept(stage).values()) <= cap, _kept(stage)
    assert len(evicted) == expected and {reason for _, reason in evicted} <= {"capacity"}
    assert [n for n in stream if stage.last_seen(n) is not None] == [n for n in stream if n in lru]
    assert set(stage.gpu.nodes()) <= set(lru)  # (a node brought back by its NIC alone has no GPU state)


def test_a_silent_node_is_forgotten_after_the_window_and_a_regular_one_never_is() -> None:
    stage, rng = NodeDetection(_config(cap=1000, after_s=600.0).detection), np.random.default_rng(1)
    evicted: list[tuple[str, str]] = []
    stage.on_evict = lambda node, reason: evicted.append((node, reason))
    stage.on_gpu([gpu_message("quiet", T0, rng, gpus=GPUS)])
    stage.on_port(_port("quiet", T0))
    samples = 0
    for k in range(1, 100):  # 10 s apart: 990 s of event time
        ts = T0 + 10 * k
        stage.on_gpu([gpu_message("steady", ts, rng, gpus=GPUS), gpu_message(f"passer-{k}", ts, rng, gpus=GPUS)])
        samples += 1
        signals = stage.gpu.signals("steady")
        assert signals is not None and stage.last_seen("steady") == ts
        if ts - T0 <= 600:
            assert stage.last_seen("quiet") == T0, f"forgotten {ts - T0:.0f}s after its last record, before the window"
        # swept every 600/20 = 30 s of event time: forgotten at most that long after the window
        if ts - T0 >= 600 + 30:
            assert stage.last_seen("quiet") is None and stage.gpu.node_bytes("quiet") is None
            assert stage.ports.node_bytes("quiet") == stage.ports.node_bytes("never-seen")
    assert ("quiet", "silence") in evicted
    assert "steady" not in {n for n, _ in evicted}, "a node seen regularly is never forgotten"
    # the passers-by, each seen once, go too once silent; the steady node's state was never reset
    assert {n for n, why in evicted if why == "silence"} >= {f"passer-{k}" for k in range(1, 30)}
    assert int(stage.gpu.states.live["steady"].samples) == samples

    # a forgotten node that returns starts fresh: a new baseline, warming up again
    stage.on_gpu([gpu_message("quiet", T0 + 1000, rng, gpus=GPUS)])
    assert int(stage.gpu.states.live["quiet"].samples) == 1


def _records(stage: DetectStage, msgs: list[r.GpuTelemetry], first: int = 0,
             partition: int = 0) -> dict[TopicPartition, list[object]]:
    tp = TopicPartition(stage.gpu_topic, partition)
    return {tp: [consumer_record(stage.gpu_topic, r.encode(m), offset=first + i, key=m.node.encode(),
                                 partition=partition, timestamp_ms=int(m.ts * 1000)) for i, m in enumerate(msgs)]}


def test_stage1_counts_evictions_and_deletes_the_saved_state_at_the_next_checkpoint() -> None:
    s = _config(cap=3, after_s=600.0)
    out = FakeOutputs(s)
    stage, rng = DetectStage(s, out, out.metrics, 256, 0.5, 60.0, 10.0), np.random.default_rng(3)
    asyncio.run(stage._process(_records(stage, [gpu_message(n, T0, rng, gpus=GPUS) for n in "abc"])))  # type: ignore[arg-type]
    asyncio.run(stage.checkpoint())
    asyncio.run(stage._process(_records(stage, [gpu_message(n, T0 + 10, rng, gpus=GPUS) for n in "de"], 3)))  # type: ignore[arg-type]
    assert stage.node_stage.tracked() == 3 and set(stage.partition_of) == {"c", "d", "e"}
    assert sample(out.metrics, "fleetmedic_stage1_nodes_evicted_total", reason="capacity") == 2
    assert sample(out.metrics, "fleetmedic_stage1_nodes_tracked") == 3
    out.sent.clear()
    asyncio.run(stage.checkpoint())
    state = stage.state_topic
    written = {k.decode(): v for t, k, v in out.sent if t == state and k != b"__multivariate_model__"}
    assert written["a"] is None and written["b"] is None, "tombstones for the evicted nodes"
    assert decode_node_state(written["d"]).seen_at == T0 + 10  # type: ignore[arg-type]
    assert "c" not in written  # unchanged since the last checkpoint
    # after the silence: c goes (not seen since T0), d and e stay
    asyncio.run(stage._process(_records(stage, [gpu_message(n, T0 + 640, rng, gpus=GPUS) for n in "de"], 5)))  # type: ignore[arg-type]
    assert set(stage.partition_of) == {"d", "e"}
    assert sample(out.metrics, "fleetmedic_stage1_nodes_evicted_total", reason="silence") == 1


def test_an_evicted_node_stays_gone_after_a_restore_from_the_real_broker(kafka_bootstrap: str) -> None:
    u = uuid.uuid4().hex[:8]
    s = _config(cap=1000, after_s=600.0, extra=f"kafka: {{bootstrap_servers: '{kafka_bootstrap}'}}\n"
                                               f"topics: {{prefix: ev{u}., default_partitions: 1}}")
    rng = np.random.default_rng(4)

    async def main() -> tuple[DetectStage, PipelineMetrics]:
        await ensure_topics(s)
        metrics = PipelineMetrics(CollectorRegistry())
        first = DetectStage(s, Outputs(s, metrics), metrics, 256, 0.5, 60.0, 10.0)
        try:
            await first._process(_records(first, [gpu_message(n, T0, rng, gpus=GPUS)  # type: ignore[arg-type]
                                                  for n in ("quiet", "steady")]))
            await first.checkpoint()  # both saved
            for k in range(1, 70):  # quiet is silent for 690 s of event time
                await first._process(_records(first, [gpu_message("steady", T0 + 10 * k, rng, gpus=GPUS)], k))  # type: ignore[arg-type]
            assert first.node_stage.last_seen("quiet") is None
            await first.checkpoint()  # steady's state, and quiet's tombstone
        finally:
            await first.outputs.stop()
        again_metrics = PipelineMetrics(CollectorRegistry())
        again = DetectStage(s, Outputs(s, again_metrics), again_metrics, 256, 0.5, 60.0, 10.0)
        await again._assign({TopicPartition(again.gpu_topic, 0)})
        return again, again_metrics

    again, metrics = asyncio.run(main())
    assert set(again.partition_of) == {"steady"}, "the evicted node was brought back by the restore"
    assert again.node_stage.gpu.node_bytes("quiet") is None
    assert again.node_stage.last_seen("steady") == T0 + 690  # its silence goes on being counted
    assert again.node_stage.clock == T0 + 690
    assert sample(metrics, "fleetmedic_nodes_restored_total") == 1


def test_the_fleet_stage_forgets_the_peer_summaries_of_silent_nodes_on_its_tick() -> None:
    fleet, rng = FleetDetection(_config(after_s=600.0).detection), np.random.default_rng(5)
    for k in range(100):
        ts = T0 + 10 * k
        nodes = ["steady-0", "steady-1", *(["quiet"] if k == 0 else [])]
        for s in summarise_batch([gpu_message(n, ts, rng, gpus=GPUS) for n in nodes]):
            fleet.on_summary(s)
        fleet.tick(ts)
        if ts - T0 <= 600:
            assert "quiet" in fleet.peers._latest and "quiet" in fleet.sku_peers._latest
    assert set(fleet.peers._latest) == set(fleet.sku_peers._latest) == {"steady-0", "steady-1"}
    assert all("quiet" not in nodes for nodes in fleet._skus.values())
    restored = FleetDetection(_config(after_s=600.0).detection)
    restored.load_state(fleet.state_bytes())
    assert set(restored.peers._latest) == {"steady-0", "steady-1"}
