"""The pipeline's stages as Faust agents on Kafka (the embedded engine's wiring, over topics).

Agents (all values are raw bytes, decoded and validated by :mod:`fleetmedic.records`):

- ``detect_gpu`` (stage 1, partitioned by node) reads ``telemetry.gpu`` in micro-batches
  (``take_events(batch_size, within=batch_within_s)``) and runs
  :class:`~fleetmedic.models.stages.NodeDetection`; ``detect_port`` does the same for host ports of
  ``telemetry.port``. Their findings go to ``findings``, keyed by node.
- ``decide`` (one instance: global state) reads ``findings``, ``jobs.events``,
  ``remediation.results``, and also ``telemetry.gpu`` (node summaries for the peer comparisons of
  :class:`~fleetmedic.models.stages.FleetDetection`) and the switch ports of ``telemetry.port``.
  Findings of :class:`FleetDetection` are produced to ``findings`` and come back to the engine
  through that topic, like stage 1's, so every finding takes one path. The
  :class:`~fleetmedic.remediation.engine.DecisionEngine`'s decisions go to ``incidents``,
  ``remediation.commands`` (signed; key = node or job) and ``remediation.audit``.
- a timer calls ``FleetDetection.tick`` and ``DecisionEngine.tick`` every ``sample_interval_s``
  and writes an engine snapshot to the compacted topic ``<consumer_group>-engine-state`` every
  :data:`SNAPSHOT_EVERY_S`; the runner writes a last one (:func:`save_snapshot`) once the worker has
  stopped, and :func:`load_snapshot` reads the latest back at start. Between two snapshots the
  engine state is at most once: a worker that dies (not stopped) loses the decisions' memory
  since its last snapshot, while its consumer offsets may have moved on.

A message that does not decode goes to ``deadletter`` (key: source topic) with the field path and
reason, the original bytes, partition, offset and key; the worker keeps going. Invalid telemetry
is dead-lettered by stage 1 only (``decide`` reads the same messages and skips them).

Time: records carry their own time; the engine's ``now`` is an :class:`EventClock`, the newest
record time seen, advanced by the wall time that passed since it was seen. Replayed or simulated
telemetry keeps its own time line, and a quiet stream still lets timeouts expire.

All agents share one consumer group, so stage 1 and the decision stage see every partition only
when one worker runs. Scaling stage 1 out (its own group, several workers) is not done yet.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.models.stages import FleetDetection, NodeDetection
from fleetmedic.remediation.engine import DecisionEngine, Decisions
from fleetmedic.signing import sign
from fleetmedic.streams.app import MAX_STATE_BYTES, kafka_client_options, state_topic
from fleetmedic.streams.metrics import PipelineMetrics

log = logging.getLogger(__name__)

SNAPSHOT_EVERY_S = 30.0
SNAPSHOT_KEY = b"engine"
MAX_ERROR = 4096


@dataclass(frozen=True)
class WorkerOptions:
    batch_size: int = 256
    batch_within_s: float = 0.5
    tick_every_s: float | None = None  # default: detection.sample_interval_s
    snapshot_every_s: float = SNAPSHOT_EVERY_S


class EventClock:
    """Newest record time seen, advanced by the monotonic time elapsed since; never goes back."""

    def __init__(self, start: float = 0.0) -> None:
        self._ts = start
        self._at = time.monotonic()

    def observe(self, ts: float) -> float:
        now = self.now()
        if ts > now:
            self._ts, self._at = ts, time.monotonic()
            return ts
        return now

    def now(self) -> float:
        return self._ts + (time.monotonic() - self._at) if self._ts else 0.0


def _text(key: bytes | None) -> str | None:
    return key.decode("utf-8", "replace") if key is not None else None


class Pipeline:
    """Registers the agents and the timer on ``app``; holds the stages' state."""

    def __init__(self, app: faust.App, settings: Settings, key: bytes, metrics: PipelineMetrics,
                 engine: DecisionEngine | None = None, options: WorkerOptions | None = None) -> None:
        self.app = app
        self.settings = settings
        self.key = key
        self.metrics = metrics
        self.options = options or WorkerOptions()
        self.node_stage = NodeDetection(settings.detection)
        self.fleet_stage = FleetDetection(settings.detection)
        self.engine = engine or DecisionEngine(settings)
        self.clock = EventClock(self.engine.state.clock)
        self._last_snapshot = time.monotonic()
        t = settings.topics.topic
        self.names = {name: t(name) for name in ("telemetry.gpu", "telemetry.port", "jobs.events", "findings",
                                                   "incidents", "remediation.commands", "remediation.results",
                                                   "remediation.audit", "deadletter")}
        self.logical = {full: name for name, full in self.names.items()}
        raw: dict[str, Any] = dict(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
        self.out = {name: app.topic(self.names[name], **raw) for name in
                    ("findings", "incidents", "remediation.commands", "remediation.audit", "deadletter")}
        self.state_out = app.topic(state_topic(settings), **raw)
        gpu_in = app.topic(self.names["telemetry.gpu"], **raw)
        port_in = app.topic(self.names["telemetry.port"], **raw)
        # a second channel on the telemetry topics, with the decision stage's inputs
        decide_in = app.topic(*(self.names[n] for n in ("findings", "jobs.events", "remediation.results",
                                                        "telemetry.gpu", "telemetry.port")), **raw)
        app.agent(gpu_in, name="fleetmedic.detect_gpu")(self._detect_gpu)
        app.agent(port_in, name="fleetmedic.detect_port")(self._detect_port)
        app.agent(decide_in, name="fleetmedic.decide")(self._decide)
        tick_every = self.options.tick_every_s or settings.detection.sample_interval_s
        app.timer(tick_every, name="fleetmedic.tick")(self._tick)

    # --- stage 1 -----------------------------------------------------------------------------------

    async def _detect_gpu(self, stream: Any) -> None:
        topic = self.names["telemetry.gpu"]
        async for events in stream.take_events(self.options.batch_size, within=self.options.batch_within_s):
            started = time.perf_counter()
            self.metrics.messages_in.labels(topic, "detect").inc(len(events))
            msgs: list[r.GpuTelemetry] = []
            for event in events:
                msg = await self._decode(r.GpuTelemetry, event, "detect")
                if msg is not None:
                    msgs.append(msg)
            if msgs:
                await self._send_findings(self.node_stage.on_gpu(msgs))
            self.metrics.latency.labels("detect").observe(time.perf_counter() - started)

    async def _detect_port(self, stream: Any) -> None:
        topic = self.names["telemetry.port"]
        async for event in stream.events():
            started = time.perf_counter()
            self.metrics.messages_in.labels(topic, "detect").inc()
            msg = await self._decode(r.PortTelemetry, event, "detect")
            if msg is not None and msg.device_kind == "host":
                await self._send_findings(self.node_stage.on_port(msg))
            self.metrics.latency.labels("detect").observe(time.perf_counter() - started)

    # --- decision stage ----------------------------------------------------------------------------

    async def _decide(self, stream: Any) -> None:
        async for event in stream.events():
            started = time.perf_counter()
            name = self.logical.get(event.message.topic, "")
            self.metrics.messages_in.labels(event.message.topic, "decide").inc()
            if name == "telemetry.gpu":
                gpu = _quiet(r.GpuTelemetry, event.value)  # stage 1 dead-letters the invalid ones
                if gpu is not None:
                    self.clock.observe(gpu.ts)
                    self.fleet_stage.on_gpu(gpu)
            elif name == "telemetry.port":
                port = _quiet(r.PortTelemetry, event.value)
                if port is not None and port.device_kind != "host":
                    self.clock.observe(port.ts)
                    await self._send_findings(self.fleet_stage.on_port(port))
            elif name == "findings":
                finding = await self._decode(r.Finding, event, "decide")
                if finding is not None:
                    await self._send_decisions(self.engine.on_finding(finding, self.clock.observe(finding.ts)))
            elif name == "jobs.events":
                job = await self._decode(r.JobEvent, event, "decide")
                if job is not None:
                    now = self.clock.observe(job.ts)
                    await self._send_findings(self.fleet_stage.on_job(job))
                    await self._send_decisions(self.engine.on_job_event(job, now))
            elif name == "remediation.results":
                result = await self._decode(r.RemediationResult, event, "decide")
                if result is not None:
                    await self._send_decisions(self.engine.on_result(result, self.clock.observe(result.ts)))
            self.metrics.latency.labels("decide").observe(time.perf_counter() - started)

    async def _tick(self) -> None:
        now = self.clock.now()
        if now <= 0:
            return  # no record seen yet: no time line to tick on
        started = time.perf_counter()
        await self._send_findings(self.fleet_stage.tick(now))
        await self._send_decisions(self.engine.tick(now))
        self.metrics.latency.labels("tick").observe(time.perf_counter() - started)
        if time.monotonic() - self._last_snapshot >= self.options.snapshot_every_s:
            await self.snapshot()

    async def snapshot(self) -> None:
        await self.state_out.send(key=SNAPSHOT_KEY, value=self.engine.to_bytes())
        self._last_snapshot = time.monotonic()
        self.metrics.snapshots.inc()

    # --- plumbing ----------------------------------------------------------------------------------

    async def _decode(self, record_type: type[r.R], event: Any, stage: str) -> r.R | None:
        try:
            return r.decode(record_type, event.value)
        except r.InvalidRecord as exc:
            await self._dead_letter(event, stage, f"{exc.path}: {exc.reason}")
            return None

    async def _dead_letter(self, event: Any, stage: str, error: str) -> None:
        m = event.message
        value = event.value if isinstance(event.value, bytes) else bytes(event.value or b"")
        dl = r.DeadLetter(ts=time.time(), topic=m.topic, stage=stage, error=error[:MAX_ERROR], original=value,
                          partition=m.partition, offset=m.offset, key=_text(m.key))
        self.metrics.dead_letters.labels(m.topic, stage).inc()
        await self._send("deadletter", m.topic, dl)

    async def _send_findings(self, findings: Sequence[r.Finding]) -> None:
        for f in findings:
            self.metrics.findings.labels(f.detector, f.severity).inc()
            await self._send("findings", f.node, f)

    async def _send_decisions(self, d: Decisions) -> None:
        for inc in d.incidents:
            self.metrics.incidents.labels(inc.incident_class).inc()
            await self._send("incidents", inc.id, inc)
        for cmd in d.commands:
            self.metrics.commands.labels(cmd.action).inc()
            await self._send("remediation.commands", cmd.node or cmd.job, sign(cmd, self.key))
        for a in d.audit:
            await self._send("remediation.audit", a.node or a.job or "", a)

    async def _send(self, name: str, key: str, record: r.Record) -> None:
        await self.out[name].send(key=key.encode(), value=r.encode(record))
        self.metrics.messages_out.labels(self.names[name]).inc()


def _quiet(record_type: type[r.R], value: bytes) -> r.R | None:
    try:
        return r.decode(record_type, value)
    except r.InvalidRecord:
        return None


async def load_snapshot(settings: Settings, timeout: float = 30.0) -> bytes | None:
    """The latest engine snapshot in the state topic, or None when it is empty."""
    topic = state_topic(settings)
    consumer = AIOKafkaConsumer(**kafka_client_options(settings), enable_auto_commit=False,
                                auto_offset_reset="earliest", request_timeout_ms=int(timeout * 1000))
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        begin = (await consumer.beginning_offsets([tp]))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
        if end <= begin:
            return None
        # an explicit offset: seek_to_beginning() is lazy and can lose a race with the initial reset
        consumer.seek(tp, begin)
        latest: bytes | None = None
        position = await consumer.position(tp)
        while position < end:
            batch = await consumer.getmany(tp, timeout_ms=int(timeout * 1000))
            if not batch:
                raise TimeoutError(f"{topic}: no records within {timeout}s (offset {position} of {end})")
            for rec in batch.get(tp, []):
                if rec.key == SNAPSHOT_KEY and rec.value is not None:
                    latest = rec.value
            position = await consumer.position(tp)
        return latest
    finally:
        await consumer.stop()


async def save_snapshot(settings: Settings, state: bytes) -> None:
    """Write ``state`` to the state topic and wait for the broker's acknowledgement."""
    producer = AIOKafkaProducer(**kafka_client_options(settings), acks="all", max_request_size=MAX_STATE_BYTES)
    await producer.start()
    try:
        await producer.send_and_wait(state_topic(settings), key=SNAPSHOT_KEY, value=state)
    finally:
        await producer.stop()
