"""Hardening of the pipeline's stages, in process (no broker):

- a record whose handling raises is dead-lettered with the exception's type, message and last
  frame, counted, and the next record is handled (decision stage, stage 1's micro-batches, ticks);
- a record stamped beyond ``streams.max_future_skew_s`` ahead of the clock is dead-lettered and
  moves nothing: the decision clock, command expiry, stage 1's node state; the embedded engine
  does the same on simulated time;
- a snapshot that cannot be read is passed over (fresh start when none can be), logged, counted and
  audited; a snapshot over the state topic's limit is not written and the previous one stays;
- stage 1 starts an unreadable node state fresh and fails loudly on anything else at assignment;
- a dead letter keeps 64 KiB of its original (hash and length of the whole), and its send never
  raises, in the stages and in the executor.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import msgspec
import numpy as np
import pytest
from aiokafka import TopicPartition
from aiokafka.errors import MessageSizeTooLargeError
from prometheus_client import CollectorRegistry

from fleetmedic import records as r
from fleetmedic.config import Settings, parse_config
from fleetmedic.devenv.synth import gpu_message
from fleetmedic.executor.metrics import ExecutorMetrics
from fleetmedic.executor.service import ExecutorService
from fleetmedic.models.event_time import ahead_of_clock, event_time, reference_clock, refuse_future
from fleetmedic.models.stages import NodeDetection
from fleetmedic.sim.embedded import EmbeddedPipeline
from fleetmedic.streams import detect as detect_module
from fleetmedic.streams.decide import DecideStage, restore
from fleetmedic.streams.detect import DetectStage
from fleetmedic.streams.outputs import Source
from fleetmedic.streams.snapshot_parts import SnapshotScan, SnapshotUnreadable, part_key
from fleetmedic.streams.state import DecideSnapshot, DetectPartition, NodeStageState
from tests.streams.helpers_fakes import BROKER_LIMIT, FakeOutputs, consumer_record, sample
from tests.streams.helpers_findings import NODES, T0, xid_finding

KEY = b"k" * 40


def _settings(extra: str = "") -> Settings:
    from fleetmedic.config import parse_config

    return parse_config(extra, env={}) if extra else Settings()


def _decide(settings: Settings | None = None, snapshot: DecideSnapshot | None = None,
            **kw: Any) -> tuple[DecideStage, FakeOutputs]:
    s = settings or Settings()
    out = FakeOutputs(s)
    return DecideStage(s, KEY, out, out.metrics, snapshot, set(), **kw), out


def _src(settings: Settings, name: str, record: r.Record, offset: int = 0, key: bytes = b"k",
         timestamp_ms: int | None = None) -> Source:
    return Source(settings.topics.topic(name), 0, offset, key, r.encode(record), timestamp_ms)


async def _observe_fleet(stage: DecideStage, ts: float) -> None:
    for i, n in enumerate(NODES):
        obs = r.NodeObservation(node=n, ts=ts, labels={"fleetmedic.io/rack": f"r{i % 4}"})
        await stage.handle_record(_src(stage.settings, "cluster.nodes", obs, offset=i, key=n.encode()))


# --- the rule itself --------------------------------------------------------------------------------


def test_the_future_rule_is_pure_and_takes_the_latest_time_a_record_carries() -> None:
    assert ahead_of_clock(1300.0, 1000.0, 300.0) is None  # at the bound: accepted
    why = ahead_of_clock(1300.5, 1000.0, 300.0)
    assert why is not None and "300s ahead" in why and "max_future_skew_s" in why
    msg = gpu_message("n1", 1000.0, np.random.default_rng(0), xids=[r.XidEvent(gpu=0, xid=79, ts=4.0e9)])
    assert event_time(msg) == 4.0e9 and refuse_future(msg, 1000.0, 300.0) is not None  # an XID's time counts
    cmd = r.OperatorCommand(id="c", action="resume_breaker", actor="a", reason="x", issued_at=5000.0,
                            expires_at=5600.0)
    assert event_time(cmd) == 5000.0
    # the clock a consumed record is judged against: the wall clock, or its broker timestamp if earlier
    assert reference_clock(2000.0, None) == 2000.0 and reference_clock(2000.0, -1) == 2000.0
    assert reference_clock(2000.0, 1_500_000) == 1500.0 and reference_clock(2000.0, 9_000_000) == 2000.0


# --- dead letters ---------------------------------------------------------------------------------------


def test_a_dead_letter_keeps_64_kib_of_its_original_with_the_hash_and_length_of_all_of_it() -> None:
    import hashlib

    original = bytes(range(256)) * 3000  # 768,000 bytes: an undecodable command of the size once seen
    dl = r.DeadLetter(ts=1.0, topic="t", stage="executor", error="x" * 10_000, original=original,
                      key="k" * 100_000)
    wire = r.encode(dl)
    assert len(wire) < 200_000 < BROKER_LIMIT  # was 1.03 MB: over the broker's limit
    assert dl.original == original[: r.MAX_DEAD_LETTER_ORIGINAL]
    assert dl.original_length == len(original) and dl.original_sha256 == hashlib.sha256(original).hexdigest()
    assert len(dl.error) == 4096 and dl.key is not None and len(dl.key) == r.MAX_DEAD_LETTER_KEY
    assert r.decode(r.DeadLetter, wire) == dl  # read back as written: the hash is not made again
    small = r.DeadLetter(ts=1.0, topic="t", stage="s", error="e", original=b"abc")
    assert small.original == b"abc" and small.original_length == 3


def test_the_stages_dead_letters_stay_under_the_broker_limit_and_a_refused_one_never_raises() -> None:
    settings = Settings()
    out = FakeOutputs(settings)
    big = Source(settings.topics.topic("findings"), 0, 7, b"n1", b"{" * 900_000)

    async def go() -> None:
        assert await out.decode(r.Finding, big, "decide") is None
        out.refuse.add(out.names["deadletter"])
        await out.dead_letter(big, "decide", "refused this time")  # logged and counted, not raised

    asyncio.run(go())
    (dl,) = out.dead_letters()
    assert dl.original_length == 900_000 and len(dl.original) == r.MAX_DEAD_LETTER_ORIGINAL and dl.offset == 7
    assert sample(out.metrics, "fleetmedic_dead_letters_failed_total", topic=big.topic, stage="decide") == 1


class _Producer:
    """An aiokafka producer's ``send_and_wait`` with the broker's 1 MiB limit."""

    def __init__(self, fail: bool = False) -> None:
        self.sent: list[bytes] = []
        self.fail = fail

    async def send_and_wait(self, topic: str, key: bytes | None = None, value: bytes = b"") -> None:
        if self.fail or len(value) > BROKER_LIMIT:
            raise MessageSizeTooLargeError(f"{len(value)} bytes")
        self.sent.append(value)


def _executor() -> tuple[ExecutorService, CollectorRegistry]:
    service = ExecutorService.__new__(ExecutorService)  # the consume loop's helpers need no cluster
    registry = CollectorRegistry()
    service.settings, service.metrics = Settings(), ExecutorMetrics(registry)
    return service, registry


def test_the_executor_dead_letters_a_770kb_undecodable_command_and_its_loop_survives_any_record() -> None:
    (service, reg), producer = _executor(), _Producer()
    tp = TopicPartition("fleetmedic.remediation.commands", 0)
    value = b'{"type": "remediation_command", "reason": "' + b"x" * 770_000 + b'"'

    async def go() -> None:
        # was: a 1.03 MB dead letter, refused by the broker, raised out of the consume loop (a crash loop)
        assert await service._decode(producer, tp, 41, b"key", value) is None  # type: ignore[arg-type]
        try:
            raise KeyError("a bug in the loop")
        except KeyError as exc:
            await service._record_failed(producer, tp, 42, b"key", b"{}", exc)  # type: ignore[arg-type]
        await service._decode(_Producer(fail=True), tp, 43, None, b"nope")  # type: ignore[arg-type]

    asyncio.run(go())
    first, second = (r.decode(r.DeadLetter, v) for v in producer.sent)
    assert len(producer.sent[0]) < BROKER_LIMIT and first.original_length == len(value) and first.offset == 41
    assert second.exception == "KeyError" and "a bug in the loop" in second.error
    assert "test_hardening.py" in second.frame and " in go" in second.frame
    assert reg.get_sample_value("fleetmedic_record_errors_total", {"stage": "executor", "exception": "KeyError"}) == 1
    assert reg.get_sample_value("fleetmedic_executor_dead_letters_failed_total", {}) == 1


# --- a record that raises -------------------------------------------------------------------------------


def test_decide_dead_letters_a_record_whose_handling_raises_and_handles_the_next() -> None:
    stage, out = _decide()
    poison, good = xid_finding("n3", T0 + 60), xid_finding("n5", T0 + 70)
    real = stage.engine.on_finding

    def on_finding(finding: r.Finding, now: float) -> Any:
        if finding.node == "n3":
            raise IndexError("list index out of range")  # a bug that this one record triggers
        return real(finding, now)

    stage.engine.on_finding = on_finding  # type: ignore[method-assign]

    async def go() -> None:
        await _observe_fleet(stage, T0)
        await stage.handle_record(_src(stage.settings, "findings", poison, offset=3, key=b"n3"))
        await stage.handle_record(_src(stage.settings, "findings", good, offset=4, key=b"n5"))

    asyncio.run(go())
    (dl,) = out.dead_letters()
    assert (dl.stage, dl.offset, dl.exception, dl.error) == ("decide", 3, "IndexError",
                                                              "IndexError: list index out of range")
    assert dl.frame.startswith("test_hardening.py:") and dl.frame.endswith(" in on_finding")
    assert r.decode(r.Finding, dl.original) == poison
    assert sample(out.metrics, "fleetmedic_record_errors_total", stage="decide", exception="IndexError") == 1
    commands = out.records("remediation.commands", r.RemediationCommand)
    assert commands and {c.node for c in commands} == {"n5"}  # the next record went through


def test_a_tick_that_raises_is_counted_and_the_stage_goes_on() -> None:
    stage, out = _decide()
    calls = []

    def tick(now: float) -> Any:
        calls.append(now)
        raise ZeroDivisionError("division by zero")

    stage.engine.tick = tick  # type: ignore[method-assign]
    asyncio.run(stage._apply_tick(T0))
    asyncio.run(stage._apply_tick(T0 + 10))
    assert calls == [T0, T0 + 10]
    assert sample(out.metrics, "fleetmedic_record_errors_total", stage="tick", exception="ZeroDivisionError") == 2


def _detect(settings: Settings | None = None) -> tuple[DetectStage, FakeOutputs]:
    s = settings or Settings()
    out = FakeOutputs(s)
    return DetectStage(s, out, out.metrics, 256, 0.5, 60.0, 10.0), out


def _gpu_records(stage: DetectStage, msgs: list[r.GpuTelemetry], first: int = 0) -> dict[TopicPartition, Any]:
    tp = TopicPartition(stage.gpu_topic, 0)
    return {tp: [consumer_record(stage.gpu_topic, r.encode(m), offset=first + i, key=m.node.encode(),
                                 timestamp_ms=int(m.ts * 1000)) for i, m in enumerate(msgs)]}


def test_stage1_judges_a_batch_that_raised_one_by_one_and_dead_letters_only_the_bad_record() -> None:
    stage, out = _detect()
    real = stage.node_stage.on_gpu

    def on_gpu(msgs: Any, batch: Any = None) -> list[r.Finding]:
        if any(m.node == "poison" for m in msgs):
            raise ValueError("cannot judge this one")
        return real(msgs, batch)

    stage.node_stage.on_gpu = on_gpu  # type: ignore[method-assign]
    rng = np.random.default_rng(1)
    msgs = [gpu_message("a", T0, rng), gpu_message("poison", T0, rng),
            gpu_message("b", T0, rng, xids=[r.XidEvent(gpu=2, xid=79, ts=T0)])]
    asyncio.run(stage._process(_gpu_records(stage, msgs)))
    (dl,) = out.dead_letters()
    assert (dl.stage, dl.offset, dl.exception, dl.key) == ("detect", 1, "ValueError", "poison")
    assert "test_hardening.py" in dl.frame
    assert {f.node for f in out.records("findings", r.Finding)} == {"b"}  # the XID after the bad record
    assert len(out.values(stage.summaries)) == 2  # one per message judged alone
    assert sample(out.metrics, "fleetmedic_record_errors_total", stage="detect", exception="ValueError") == 1
    assert stage.next_offsets[TopicPartition(stage.gpu_topic, 0)] == 3  # the batch is done: offsets move on


# --- event time with a bound ---------------------------------------------------------------------------


def test_decide_refuses_a_record_stamped_far_ahead_and_keeps_its_clock_and_command_expiry() -> None:
    stage, out = _decide()
    future = xid_finding("n2", 3_980_000_000.0)  # 2096
    good = xid_finding("n5", T0 + 60)

    async def go() -> None:
        await _observe_fleet(stage, T0)
        await stage.handle_record(_src(stage.settings, "findings", future, offset=1, key=b"n2"))
        assert stage.clock.now() == T0  # the clock did not move
        late_job = r.JobEvent(job="team/j", event="start", ts=3_980_000_000.0)
        await stage.handle_record(_src(stage.settings, "jobs.events", late_job, offset=2))
        await stage.handle_record(_src(stage.settings, "findings", good, offset=3, key=b"n5"))

    asyncio.run(go())
    dead = out.dead_letters()
    assert [d.offset for d in dead] == [1, 2] and all("ahead of the clock" in d.error for d in dead)
    assert stage.clock.now() == T0 + 60
    commands = out.records("remediation.commands", r.RemediationCommand)
    ttl = stage.settings.signing.command_ttl_s
    assert commands and all(c.node == "n5" and c.expires_at == T0 + 60 + ttl for c in commands)
    assert sample(out.metrics, "fleetmedic_records_ahead_of_clock_total",
                  topic=stage.settings.topics.topic("findings"), stage="decide") == 1


def test_a_record_is_judged_against_its_broker_timestamp_so_a_replay_judges_it_alike() -> None:
    settings = _settings("streams: {max_future_skew_s: 60}\n")
    produced = time.time()
    ahead = r.NodeObservation(node="n1", ts=produced + 600)  # 10 minutes ahead when it was produced
    ms = int(produced * 1000)
    # live: the wall clock ~ its broker timestamp; a replay a day later: the broker timestamp is the same
    for wall in (produced, produced + 86_400):
        stage, out = _decide(settings)
        asyncio.run(stage.handle_record(_src(settings, "cluster.nodes", ahead, timestamp_ms=ms)))
        assert len(out.dead_letters()) == 1 and stage.clock.now() == 0.0, wall
        assert refuse_future(ahead, reference_clock(wall, ms), 60) is not None


def test_stage1_refuses_a_future_sample_and_later_samples_count_as_without_it() -> None:
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    runs = []
    for with_future in (False, True):
        stage, out = _detect()
        rng = rng_a if with_future else rng_b
        msgs = [gpu_message("n1", T0 + 10 * k, rng) for k in range(1, 6)]
        later = [gpu_message("n1", T0 + 10 * k, rng, xids=[r.XidEvent(gpu=1, xid=79, ts=T0 + 10 * k)] if k == 8
                             else None) for k in range(6, 10)]
        asyncio.run(stage._process(_gpu_records(stage, msgs)))
        if with_future:  # stamped 2096: it would make every later sample look late
            odd = gpu_message("n1", 3_980_000_000.0, np.random.default_rng(9))
            asyncio.run(stage._process(_gpu_records(stage, [odd], first=5)))
        asyncio.run(stage._process(_gpu_records(stage, later, first=6)))
        runs.append((stage.node_stage.gpu.node_bytes("n1"), stage.node_stage.multivariate_bytes("n1"),
                     [f.id for f in out.records("findings", r.Finding)], out.dead_letters()))
    (gpu, windows, found, dead), (gpu_f, windows_f, found_f, dead_f) = runs
    assert not dead and len(dead_f) == 1 and dead_f[0].offset == 5 and "ahead of the clock" in dead_f[0].error
    assert gpu_f == gpu and windows_f == windows  # the node's state as if it had never come
    assert found_f == found and any(":xid:" in f for f in found)  # the later XID is found


def test_the_embedded_engine_refuses_a_future_record_on_simulated_time() -> None:
    pipeline = EmbeddedPipeline(Settings())
    rng = np.random.default_rng(3)
    now = 1_000_000.0  # simulated time: the engine's clock, not the machine's
    pipeline.gpu([gpu_message("n1", now, rng)], now)
    pipeline.gpu([gpu_message("n1", now + 301, rng), gpu_message("n2", now, rng)], now)
    pipeline.job(r.JobEvent(job="team/j", event="start", ts=now + 10_000), now)
    pipeline.gpu([gpu_message("n1", now + 10, rng, xids=[r.XidEvent(gpu=0, xid=79, ts=now + 10)])], now + 10)
    assert [(d.topic, d.stage) for d in pipeline.out.dead_letters] == [("telemetry.gpu", "embedded"),
                                                                       ("jobs.events", "embedded")]
    assert r.decode(r.GpuTelemetry, pipeline.out.dead_letters[0].original).ts == now + 301
    assert any(f.node == "n1" and ":xid:" in f.id for f in pipeline.out.findings)
    assert pipeline.engine.state.clock <= now + 10


# --- state ----------------------------------------------------------------------------------------------


def _snapshot(stage: DecideStage) -> bytes:
    return msgspec.msgpack.encode(DecideSnapshot(engine=stage.engine.to_bytes(), fleet=stage.fleet_stage.state_bytes(),
                                                 offsets={"x": {0: 5}}, commands_from=3, audit_from=2))


def test_an_unreadable_snapshot_is_passed_over_audited_and_counted() -> None:
    settings = Settings()
    donor, _ = _decide(settings)
    asyncio.run(_observe_fleet(donor, T0))
    good = _snapshot(donor)
    corrupt = good[: len(good) // 2]  # a truncated write
    wrong = msgspec.msgpack.encode({"engine": "not bytes", "fleet": 1})  # decodes, does not validate

    older = restore(settings, [(9, corrupt), (8, wrong), (4, good)])
    assert older.offset == 4 and older.snapshot is not None and older.snapshot.offsets == {"x": {0: 5}}
    assert [u.part for u in older.unreadable] == ["snapshot", "snapshot"] and older.newest == 9
    assert "ValidationError" in older.unreadable[1].reason
    fresh = restore(settings, [(9, corrupt)])
    assert fresh.snapshot is None and fresh.offset is None and len(fresh.engine.topology) == 0

    for restored, words in ((older, "restored the earlier snapshot at offset 4"), (fresh, "started from a fresh")):
        out = FakeOutputs(settings)
        stage = DecideStage(settings, KEY, out, out.metrics, restored.snapshot, set(), engine=restored.engine)
        asyncio.run(stage.report_unreadable(restored))
        (audit,) = out.records("remediation.audit", r.AuditRecord)
        assert audit.decision == "escalated" and audit.rule == "state_reset" and words in audit.explanation
        assert "offset 9" in audit.explanation and audit.id.endswith("/9")
        assert sample(out.metrics, "fleetmedic_state_unreadable_total", stage="decide",
                      part="snapshot") == len(restored.unreadable)
        asyncio.run(stage.report_unreadable(restored))  # a restart that finds it again: audited once
        assert len(out.records("remediation.audit", r.AuditRecord)) == 1
    assert len(DecideStage(settings, KEY, FakeOutputs(settings), FakeOutputs(settings).metrics, older.snapshot,
                           set(), engine=older.engine).engine.topology) == len(NODES)


def test_an_unreadable_fleet_part_starts_fresh_and_the_rest_is_restored() -> None:
    settings = Settings()
    donor, _ = _decide(settings)
    asyncio.run(_observe_fleet(donor, T0))
    snap = msgspec.msgpack.decode(_snapshot(donor), type=DecideSnapshot)
    snap.fleet = b"\xc1garbage"
    stage, out = _decide(settings, snap)
    assert len(stage.engine.topology) == len(NODES) and stage.offsets == {"x": {0: 5}}
    asyncio.run(stage.report_unreadable())
    (audit,) = out.records("remediation.audit", r.AuditRecord)
    assert "fleet" in audit.explanation and sample(out.metrics, "fleetmedic_state_unreadable_total",
                                                   stage="decide", part="fleet") == 1


def _scan(out: FakeOutputs, topic: str, keep: int = 3) -> SnapshotScan:
    scan = SnapshotScan(keep)
    for offset, (t, key, value) in enumerate(out.sent):
        if t == topic:
            scan.take(offset, key, value)
    return scan


def test_a_snapshot_larger_than_a_record_is_written_in_parts_and_restored_whole() -> None:
    """A snapshot over the state
    topic's record limit goes out in parts and a manifest; restoring it gives the same engine, and
    shrinking back under the limit tombstones the parts."""
    stage, out = _decide()
    state = stage.settings.kafka.consumer_group + "-engine-state"
    asyncio.run(_observe_fleet(stage, T0))
    first = asyncio.run(stage.snapshot())
    assert first > 0 and len(out.values(state)) == 1
    assert sample(out.metrics, "fleetmedic_engine_snapshot_bytes") == first
    assert sample(out.metrics, "fleetmedic_engine_snapshot_parts") == 1
    out.limits[state] = stage.max_snapshot_bytes = first // 3  # the topic's max.message.bytes
    for i in range(40):  # the state grows past it
        obs = r.NodeObservation(node=f"extra-{i}", ts=T0 + 2, labels={"fleetmedic.io/rack": "r9"})
        asyncio.run(stage.handle_record(_src(stage.settings, "cluster.nodes", obs)))
    size = asyncio.run(stage.snapshot())  # was: MessageSizeTooLargeError inside the timer, then skipped
    parts = sample(out.metrics, "fleetmedic_engine_snapshot_parts")
    assert size > first and parts == -(-size // (first // 3)) >= 4
    assert all(v is None or len(v) <= first // 3 for t, _, v in [x for x in out.sent if x[0] == state][1:])
    (offset, raw), *_ = _scan(out, state).newest_first()
    assert isinstance(raw, bytes) and len(raw) == size
    restored = restore(stage.settings, [(offset, raw)])
    assert restored.engine.to_bytes() == stage.engine.to_bytes() and len(restored.engine.topology) == len(NODES) + 40
    # a second one takes the other slot: the first stays whole until the manifest names the new parts
    asyncio.run(stage.snapshot())
    scan = _scan(out, state)
    assert sorted(scan.manifest_slots.values()) == [0, 1]
    assert all(isinstance(raw, bytes) for _, raw in scan.newest_first()[:2])
    # the state shrinks under the limit again: written whole, every part key tombstoned
    out.limits[state] = stage.max_snapshot_bytes = 10 * size
    asyncio.run(stage.snapshot())
    assert sample(out.metrics, "fleetmedic_engine_snapshot_parts") == 1
    assert _scan(out, state).parts == {}


def test_a_snapshot_whose_parts_are_missing_or_damaged_is_passed_over() -> None:
    stage, out = _decide()
    state = stage.settings.kafka.consumer_group + "-engine-state"
    asyncio.run(_observe_fleet(stage, T0))
    whole = asyncio.run(stage.snapshot())
    stage.max_snapshot_bytes = whole // 2
    asyncio.run(stage.snapshot())
    sent = list(out.sent)
    damaged = [(t, k, (v[:-1] + bytes([v[-1] ^ 1])) if k == part_key(0, 1) and v else v) for t, k, v in sent]
    missing = [rec for rec in sent if rec[1] != part_key(0, 0)]
    for records, why in ((damaged, "do not match"), (missing, "are not on the topic")):
        out.sent = records
        candidates = _scan(out, state).newest_first()
        assert isinstance(candidates[0][1], SnapshotUnreadable) and why in str(candidates[0][1])
        restored = restore(stage.settings, candidates)
        assert restored.offset == candidates[1][0] and len(restored.engine.topology) == len(NODES)
        assert why in str(restored.unreadable[0])


def test_finding_ids_are_remembered_for_a_window_of_event_time_not_a_fixed_count() -> None:
    settings = parse_config("streams: {duplicate_findings_window_s: 600, duplicate_findings_max: 1000}")
    stage, _ = _decide(settings)
    for k in range(3000):  # 3,000 findings over 3,000 s: only the last 600 s are kept
        assert stage._first_time(f"f{k}", T0 + k)
    assert 590 <= len(stage._seen_findings) <= 601
    assert not stage._first_time("f2999", T0 + 2999) and stage._first_time("f10", T0 + 2999)
    for k in range(5000):  # a storm within the window: the count bound holds
        stage._first_time(f"g{k}", T0 + 3000)
    assert len(stage._seen_findings) == 1000
    snap = msgspec.msgpack.decode(msgspec.msgpack.encode(DecideSnapshot(
        engine=b"", fleet=b"", offsets={}, commands_from=0, seen_findings=list(stage._seen_findings),
        seen_finding_times=list(stage._seen_findings.values()))), type=DecideSnapshot)
    again, _ = _decide(settings, snap, engine=stage.engine)
    assert again._seen_findings == stage._seen_findings


def test_stage1_starts_an_unreadable_node_state_fresh_and_fails_loudly_on_anything_else(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stage, out = _detect()
    donor = NodeDetection(Settings().detection)
    rng = np.random.default_rng(2)
    for k in range(3):
        donor.on_gpu([gpu_message("good", T0 + 10 * k, rng), gpu_message("bad", T0 + 10 * k, rng)])
    states = {n: NodeStageState(gpu=donor.gpu.node_bytes(n), ports=donor.ports.node_bytes(n), written_at=T0,
                                multivariate=donor.multivariate_bytes(n)) for n in ("good", "bad")}
    states["bad"].gpu = b"\x93\x01\x02"  # msgpack of the wrong shape
    read = DetectPartition(states=states, model=b"not a model", unreadable={"worse": "offset 3: DecodeError"})

    async def load(*_: Any, **__: Any) -> DetectPartition:
        return read

    monkeypatch.setattr(detect_module, "load_detect_partition", load)
    assigned = {TopicPartition(stage.gpu_topic, 0), TopicPartition(stage.port_topic, 0)}
    asyncio.run(stage.on_assigned(assigned))
    assert stage._restored.is_set() and stage._failure is None
    assert stage.node_stage.gpu.node_bytes("good") == donor.gpu.node_bytes("good")
    assert stage.node_stage.gpu.node_bytes("bad") is None and "bad" not in stage.partition_of  # starts fresh
    assert sample(out.metrics, "fleetmedic_state_unreadable_total", stage="detect", part="node") == 2
    assert sample(out.metrics, "fleetmedic_state_unreadable_total", stage="detect", part="model") == 1
    assert sample(out.metrics, "fleetmedic_nodes_restored_total") == 1

    async def broken(*_: Any, **__: Any) -> DetectPartition:
        raise TimeoutError("no records within 30s")

    monkeypatch.setattr(detect_module, "load_detect_partition", broken)
    again, _ = _detect()
    asyncio.run(again.on_assigned(assigned))  # was: raised into aiokafka, which logs it; the loop waited for good
    assert again._restored.is_set() and isinstance(again._failure, TimeoutError)
    with pytest.raises(RuntimeError, match="rebalance listener failed"):
        again._raise_failure()


def test_the_stop_snapshot_still_reads_back() -> None:
    """What a snapshot writes, :func:`restore` reads (the round trip the worker relies on)."""
    stage, out = _decide()
    asyncio.run(_observe_fleet(stage, T0))
    asyncio.run(stage.snapshot())
    (raw,) = out.values(stage.settings.kafka.consumer_group + "-engine-state")
    restored = restore(stage.settings, [(0, raw)])
    assert not restored.unreadable and restored.engine.to_bytes() == stage.engine.to_bytes()
    assert SimpleNamespace(offset=restored.offset).offset == 0


def test_a_checkpoint_of_revoked_partitions_that_fails_is_counted_and_the_worker_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The group rebalanced without this member (its session ran out on a starved machine): the commit
    of the revoked partitions fails. Stopping there made every restart on the same machine stop again;
    the next owner resumes from the last commit with the states written, so the worker carries on."""
    from aiokafka.errors import CommitFailedError

    stage, out = _detect()

    async def refused(*_: Any, **__: Any) -> None:
        raise CommitFailedError("the group has already rebalanced")

    monkeypatch.setattr(stage, "checkpoint", refused)
    asyncio.run(stage.on_revoked({TopicPartition(stage.gpu_topic, 0)}))
    assert stage._failure is None
    stage._raise_failure()  # nothing to raise: the loop goes on
    assert sample(out.metrics, "fleetmedic_checkpoint_failures_total", stage="detect", when="revoke") == 1


def test_a_commit_refused_because_the_group_rebalanced_is_counted_and_not_raised() -> None:
    """Stage 1's periodic checkpoint: a commit refused because the group rebalanced meanwhile must not
    end the worker (under a starved machine it did, at every restart)."""
    from aiokafka.errors import CommitFailedError

    stage, out = _detect()

    class Refusing:
        async def commit(self, offsets: Any) -> None:
            raise CommitFailedError("the group has already rebalanced")

    tp = TopicPartition(stage.gpu_topic, 0)
    stage.consumer = Refusing()  # type: ignore[assignment]
    stage.next_offsets[tp] = 42
    asyncio.run(stage.checkpoint())
    assert tp not in stage.next_offsets and tp not in stage.committed
    assert sample(out.metrics, "fleetmedic_checkpoint_failures_total", stage="detect", when="commit") == 1
