"""Pieces of the Faust worker that need no broker: metrics registry, event clock, CLI checks."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from fleetmedic.bus import partitions_of, state_topic
from fleetmedic.cli.main import main
from fleetmedic.config import parse_config
from fleetmedic.streams.metrics import PipelineMetrics
from fleetmedic.streams.replay import Tick, TickRecord, decode_tick, encode_tick, replay_order
from fleetmedic.streams.worker import EventClock


def test_metrics_live_on_the_injected_registry_only() -> None:
    before = {m.name for m in REGISTRY.collect()}
    a, b = PipelineMetrics(CollectorRegistry()), PipelineMetrics(CollectorRegistry())  # no duplicate clash
    a.commands.labels("cordon").inc()
    a.incidents.labels("hardware").inc(2)
    assert b'fleetmedic_commands_total{action="cordon"} 1.0' in generate_latest(a.registry)
    assert b'fleetmedic_incidents_total{incident_class="hardware"} 2.0' in generate_latest(a.registry)
    assert b"cordon" not in generate_latest(b.registry)
    assert {m.name for m in REGISTRY.collect()} == before


def test_event_clock_follows_record_time_and_never_goes_back() -> None:
    clock = EventClock()
    assert clock.now() == 0.0 and clock.wall_now() == 0.0  # no record yet: no time line
    assert clock.observe(1000.0) == 1000.0
    assert clock.observe(500.0) == 1000.0  # an older record does not move time back
    time.sleep(0.05)
    assert clock.now() == 1000.0  # records see event time only: a replay sees the same times
    assert clock.wall_now() >= 1000.05  # the tick's time passes while the stream is quiet
    assert clock.observe(clock.wall_now()) >= 1000.05


def _rec(topic: str, partition: int, offset: int, timestamp: int) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(topic, partition, offset, timestamp, 0, b"k", b"v", None, 1, 1, ())


def test_replay_puts_each_logged_tick_after_exactly_the_records_it_had_seen() -> None:
    a, b = TopicPartition("a", 0), TopicPartition("b", 0)
    records = {a: [_rec("a", 0, o, ts) for o, ts in ((5, 100), (6, 300), (7, 400))],
               b: [_rec("b", 0, o, ts) for o, ts in ((0, 200), (1, 250))]}
    # live, the tick ran after a@5 and b@0 only (a@6, older than b@1 by timestamp, came later)
    ticks = [Tick(TickRecord(now=1234.5, offsets={"a": {0: 6}, "b": {0: 1}}), offset=40),
             Tick(TickRecord(now=1240.0, offsets={"a": {0: 6}, "b": {0: 1}}), offset=41)]
    order = [(x.topic, x.offset) if isinstance(x, ConsumerRecord) else ("tick", x.offset)
             for x in replay_order(records, ticks)]
    assert order == [("a", 5), ("b", 0), ("tick", 40), ("tick", 41), ("b", 1), ("a", 6), ("a", 7)]
    assert [type(x).__name__ for x in replay_order(records, [])] == ["ConsumerRecord"] * 5  # no ticks logged
    assert decode_tick(encode_tick(ticks[0].record)) == ticks[0].record


def test_partitions_follow_the_topic_table_and_config() -> None:
    s = parse_config("topics: {default_partitions: 6, partitions: {findings: 3, incidents: 9}}\n"
                     "kafka: {consumer_group: g1}\n", env={})
    assert partitions_of(s, "telemetry.gpu") == 6 and partitions_of(s, "findings") == 3
    assert [partitions_of(s, n) for n in ("incidents", "remediation.commands", "remediation.results",
                                          "remediation.audit")] == [1, 1, 1, 1]
    assert state_topic(s) == "g1-engine-state"


def test_worker_refuses_to_start_without_a_signing_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("signing: {key_env: FM_TEST_NO_SUCH_KEY}\n")
    monkeypatch.delenv("FM_TEST_NO_SUCH_KEY", raising=False)
    assert main(["worker", "--config", str(cfg)]) == 2
    assert "FM_TEST_NO_SUCH_KEY" in capsys.readouterr().err
    monkeypatch.setenv("FM_TEST_NO_SUCH_KEY", "short")
    assert main(["worker", "--config", str(cfg)]) == 2
    assert "at least 32 bytes" in capsys.readouterr().err


def test_the_fleet_stage_fed_node_summaries_decides_as_one_fed_raw_telemetry_and_restores_from_bytes() -> None:
    import msgspec
    import numpy as np

    from fleetmedic import records as r
    from fleetmedic.config import Settings
    from fleetmedic.devenv.synth import gpu_message
    from fleetmedic.models.stages import FleetDetection, SummaryColumns, summary_columns

    detection = Settings().detection
    nodes = [f"n{i}" for i in range(6)]
    ranks = [r.RankPlacement(rank=i, node=n, gpus=list(range(8))) for i, n in enumerate(nodes)]
    placement = r.JobEvent(job="j", event="placement", ts=0.0, world_size=6, placement=ranks)
    raw, summarised = FleetDetection(detection), FleetDetection(detection)
    for stage in (raw, summarised):
        stage.on_job(placement)
    rng = np.random.default_rng(4)
    found: tuple[list[str], list[str]] = ([], [])
    for k in range(1, 40):
        msgs = [gpu_message(n, 10.0 * k, rng, hot={g: 12.0 for g in range(8)} if n == "n3" and k > 5 else None)
                for n in nodes]
        for m in msgs:
            raw.on_gpu(m)
        wire = msgspec.msgpack.encode(summary_columns(msgs))
        for s in msgspec.msgpack.decode(wire, type=SummaryColumns).summaries():
            summarised.on_summary(s)
        found[0].extend(f.id for f in raw.tick(10.0 * k))
        found[1].extend(f.id for f in summarised.tick(10.0 * k))
    assert found[0] == found[1] and any(":job_peers:" in f or "n3" in f for f in found[0])

    restored = FleetDetection(detection)
    restored.load_state(summarised.state_bytes())
    assert restored.state_bytes() == summarised.state_bytes()
    assert [f.id for f in restored.tick(400.0)] == [f.id for f in summarised.tick(400.0)]


def test_a_deleted_node_leaves_the_engines_topology_and_an_observation_brings_it_back() -> None:
    from fleetmedic.config import Settings
    from fleetmedic.remediation.engine import DecisionEngine

    engine = DecisionEngine(Settings())
    for i in range(4):
        engine.node_observed(f"n{i}", cordoned=False, cordoned_by_fleetmedic=False,
                             labels={"fleetmedic.io/rack": "r1"}, now=100.0 + i)
    assert len(engine.topology) == 4 and engine.triage.topology is engine.topology
    out = engine.node_removed("n2", now=110.0)
    assert len(engine.topology) == 3 and "n2" not in engine.topology and engine.triage.topology is engine.topology
    (audit,) = out.audit
    assert audit.decision == "state_change" and audit.node == "n2" and "deleted" in audit.explanation
    assert engine.node_removed("n2", now=111.0).audit == []  # twice: nothing more
    restored = DecisionEngine.from_bytes(engine.to_bytes(), Settings())
    assert len(restored.topology) == 3  # the snapshot keeps the removal
    engine.node_observed("n2", cordoned=False, cordoned_by_fleetmedic=False, labels={}, now=120.0)
    assert len(engine.topology) == 4
