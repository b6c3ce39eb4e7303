"""The decision stage as one Faust agent: one active worker, global state, commands exactly once.

``decide`` reads ``findings``, ``jobs.events``, ``remediation.results`` and the fleet-inputs topic
(stage 1's node summaries and switch ports) and runs
:class:`~fleetmedic.models.stages.FleetDetection` (peers, stragglers, switch ports; its findings go
to ``findings`` and come back through that topic, like stage 1's) and the
:class:`~fleetmedic.remediation.engine.DecisionEngine`, whose decisions go to ``incidents``,
``remediation.commands`` (signed; key = node or job) and ``remediation.audit``. A timer ticks both
every ``sample_interval_s``.

Exactly once, across a crash: each input message is handled under a lock, and the offsets it
moves are recorded with it. A snapshot (every ``snapshot_every_s``, and at a clean stop) takes
the engine's and fleet stage's state and those offsets together, waits until every output queued
before is acknowledged, then writes them with ``commands_from``, the offset on
``remediation.commands`` after the last command the snapshot's engine had issued. A restarted
worker resumes the inputs at the snapshot's offsets (the runner commits them for the group before
Faust starts), so the decisions lost with the crash are made again from the same inputs; command
ids are deterministic (``<incident>/<action>/<node>/<attempt>``) and a command whose id is on the
topic since ``commands_from`` is not sent again (nor its audit record).

Time: records carry their own time; ``now`` is an :class:`EventClock`, the newest record time
seen, advanced by the wall time that passed since it was seen.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import faust
import msgspec
from aiokafka.structs import RecordMetadata

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.models.stages import FleetDetection
from fleetmedic.remediation.engine import DecisionEngine, Decisions
from fleetmedic.signing import sign
from fleetmedic.streams.app import state_topic, summaries_topic
from fleetmedic.streams.detect import PORT_KEY_PREFIX, SUMMARY_KEY, SummaryBatch
from fleetmedic.streams.metrics import PipelineMetrics
from fleetmedic.streams.outputs import Outputs
from fleetmedic.streams.state import SNAPSHOT_KEY, DecideSnapshot

log = logging.getLogger(__name__)

INPUTS = ("findings", "jobs.events", "remediation.results")


def decide_inputs(settings: Settings) -> list[str]:
    """The topics the decision agent reads (their offsets are part of its snapshot)."""
    return [settings.topics.topic(n) for n in INPUTS] + [summaries_topic(settings)]


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


class DecideStage:
    def __init__(self, app: faust.App, settings: Settings, key: bytes, outputs: Outputs, metrics: PipelineMetrics,
                 snapshot: DecideSnapshot | None, already_sent: set[str], tick_every_s: float,
                 snapshot_every_s: float) -> None:
        self.settings = settings
        self.key = key
        self.outputs = outputs
        self.metrics = metrics
        self.fleet_stage = FleetDetection(settings.detection)
        if snapshot is not None:
            self.engine = DecisionEngine.from_bytes(snapshot.engine, settings)
            self.fleet_stage.restore(snapshot.fleet)
        else:
            self.engine = DecisionEngine(settings)
        offsets = snapshot.offsets if snapshot else {}
        self.offsets: dict[str, dict[int, int]] = {t: dict(p) for t, p in offsets.items()}
        self.commands_from = snapshot.commands_from if snapshot else 0
        self.already_sent = set(already_sent)
        self.clock = EventClock(self.engine.state.clock)
        self._lock = asyncio.Lock()
        self._command_acks: list[asyncio.Future[RecordMetadata]] = []
        self._decode_batch = msgspec.msgpack.Decoder(SummaryBatch).decode
        t = settings.topics.topic
        self.logical = {t(n): n for n in INPUTS}
        self.summaries = summaries_topic(settings)
        raw: dict[str, Any] = dict(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
        app.agent(app.topic(*decide_inputs(settings), **raw), name="fleetmedic.decide")(self._decide)
        app.timer(tick_every_s, name="fleetmedic.tick")(self._tick)
        app.timer(snapshot_every_s, name="fleetmedic.engine_snapshot")(self._periodic_snapshot)

    # --- agent -------------------------------------------------------------------------------------

    async def _decide(self, stream: Any) -> None:
        async for event in stream.events():
            started = time.perf_counter()
            m = event.message
            self.metrics.messages_in.labels(m.topic, "decide").inc()
            async with self._lock:
                await self._handle(event)
                self.offsets.setdefault(m.topic, {})[m.partition] = m.offset + 1
            self.metrics.latency.labels("decide").observe(time.perf_counter() - started)

    async def _handle(self, event: Any) -> None:
        topic = event.message.topic
        if topic == self.summaries:
            await self._fleet_input(event)
            return
        name = self.logical.get(topic, "")
        if name == "findings":
            finding = await self.outputs.decode(r.Finding, event, "decide")
            if finding is not None:
                await self._send_decisions(self.engine.on_finding(finding, self.clock.observe(finding.ts)))
        elif name == "jobs.events":
            job = await self.outputs.decode(r.JobEvent, event, "decide")
            if job is not None:
                now = self.clock.observe(job.ts)
                await self.outputs.findings(self.fleet_stage.on_job(job))
                await self._send_decisions(self.engine.on_job_event(job, now))
        elif name == "remediation.results":
            result = await self.outputs.decode(r.RemediationResult, event, "decide")
            if result is not None:
                await self._send_decisions(self.engine.on_result(result, self.clock.observe(result.ts)))

    async def _fleet_input(self, event: Any) -> None:
        key = event.message.key or b""
        if key == SUMMARY_KEY:
            try:
                batch = self._decode_batch(event.value)
            except msgspec.DecodeError as exc:
                await self.outputs.dead_letter(event, "decide", f"$: {exc}")
                return
            for s in batch.summaries:
                self.fleet_stage.on_summary(s)
            if batch.summaries:
                self.clock.observe(max(s.ts for s in batch.summaries))
        elif key.startswith(PORT_KEY_PREFIX):
            port = await self.outputs.decode(r.PortTelemetry, event, "decide")
            if port is not None:
                self.clock.observe(port.ts)
                await self.outputs.findings(self.fleet_stage.on_port(port))

    async def _tick(self) -> None:
        now = self.clock.now()
        if now <= 0:
            return  # no record seen yet: no time line to tick on
        started = time.perf_counter()
        async with self._lock:
            await self.outputs.findings(self.fleet_stage.tick(now))
            await self._send_decisions(self.engine.tick(now))
        self.metrics.latency.labels("tick").observe(time.perf_counter() - started)

    # --- output ------------------------------------------------------------------------------------

    async def _send_decisions(self, d: Decisions) -> None:
        for inc in d.incidents:
            self.metrics.incidents.labels(inc.incident_class).inc()
            await self.outputs.send("incidents", inc.id, inc)
        for cmd in d.commands:
            if cmd.id in self.already_sent:
                self.metrics.suppressed.inc()
                log.info("decide: %s is already on the commands topic; not sent again", cmd.id)
                continue
            self.metrics.commands.labels(cmd.action).inc()
            self._command_acks.append(await self.outputs.send("remediation.commands", cmd.node or cmd.job,
                                                              sign(cmd, self.key)))
        for a in d.audit:
            if a.command_ids and set(a.command_ids) <= self.already_sent:
                continue
            await self.outputs.send("remediation.audit", a.node or a.job or "", a)

    # --- state -------------------------------------------------------------------------------------

    async def _periodic_snapshot(self) -> None:
        await self.snapshot()

    async def snapshot(self) -> int:
        """Write the state with the offsets it reflects, once everything before it is on the broker."""
        async with self._lock:
            snap = DecideSnapshot(engine=self.engine.to_bytes(), fleet=self.fleet_stage.to_bytes(),
                                  offsets={t: dict(p) for t, p in self.offsets.items()}, commands_from=0,
                                  written_at=time.time())
            acks, self._command_acks = self._command_acks, []
        await self.outputs.flush()
        if acks:
            self.commands_from = max(self.commands_from, 1 + max(a.result().offset for a in acks))
        snap.commands_from = self.commands_from
        value = msgspec.msgpack.encode(snap)
        await (await self.outputs.send_raw(state_topic(self.settings), SNAPSHOT_KEY, value))
        self.metrics.snapshots.inc()
        self.metrics.state_bytes.labels("decide").inc(len(value))
        return len(value)
