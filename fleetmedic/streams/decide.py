"""The decision stage as one Faust agent: one active worker, global state, commands exactly once.

``decide`` reads ``findings``, ``jobs.events``, ``remediation.results``, ``remediation.operator``,
``cluster.nodes`` and the fleet-inputs topic (stage 1's node summaries and switch ports) and runs
:class:`~fleetmedic.models.stages.FleetDetection` (peers, stragglers, switch ports; its findings go
to ``findings`` and come back through that topic, like stage 1's) and the
:class:`~fleetmedic.remediation.engine.DecisionEngine`, whose decisions go to ``incidents``,
``remediation.commands`` (signed; key = node or job) and ``remediation.audit``. A timer ticks both
every ``sample_interval_s`` and refreshes the engine's gauges (:mod:`fleetmedic.streams.engine_metrics`).

``cluster.nodes`` (``watch-jobs``'s Node watch) feeds :meth:`DecisionEngine.node_observed`: the
topology (rack, leaf, pool, rails: also the fleet size the quarantine budget's fraction uses),
opt-out labels and cordons made by others; a deleted node goes to
:meth:`DecisionEngine.node_removed` (it leaves the topology, hence the fleet size; audited).
``remediation.operator`` (``fleetmedic ctl``) goes to
:func:`~fleetmedic.remediation.operator.apply_operator_command`; the signature and expiry are
checked before the command's ``issued_at`` may move the clock, and a rejected command (bad
signature, expired, invalid record) goes to ``deadletter`` with the reason, counted in
``fleetmedic_operator_commands_total{outcome}``; the stage goes on.

Exactly once, across a crash: each input message is handled under a lock, and the offsets it
moves are recorded with it. A snapshot (every ``snapshot_every_s``, and at a clean stop) takes
the engine's and fleet stage's state and those offsets together, waits until every output queued
before is acknowledged, then writes them with ``commands_from``, the offset on
``remediation.commands`` after the last command the snapshot's engine had issued. A restarted
worker first replays the inputs from the snapshot's offsets to their ends (:meth:`DecideStage.replay`,
merged by record time, before Faust starts; the runner then commits the offsets reached for the
group), so the decisions lost with the crash are made again from the same inputs in the same order; command
ids are deterministic (``<incident>/<action>/<node>/<attempt>``) and a command whose id is on the
topic since ``commands_from`` is not sent again. Audit ids are deterministic too (the engine's
sequence number): an audit record whose id is on ``remediation.audit`` since ``audit_from`` is not
sent again either (an operator command replayed after a crash does not repeat its audit record).

Time: records carry their own time; ``now`` is an :class:`EventClock`, the newest event time seen
(records' and ticks'). Only the tick advances it by the wall time that passed, and every tick is
logged before its decisions go out (:mod:`fleetmedic.streams.replay`): a replay fires each tick
at the same place among the inputs and with the same ``now``, so timeouts, retries and their
attempt numbers (in the command ids) come out as in the first run. A record stamped more than
``streams.max_future_skew_s`` ahead of the clock (the wall clock, or its broker timestamp when
earlier: a replay judges it alike) is dead-lettered before it can move ``now``
(:mod:`fleetmedic.models.event_time`).

Hardening: every record is handled under :meth:`DecideStage.handle_record`, which
dead-letters a record whose handling raises (the exception's type, message and last frame; counted
in ``fleetmedic_record_errors_total``) and goes on; a tick that raises is logged and counted alike.
Replay is deterministic, so anything else would crash the restarted stage on the same record again.
A snapshot that cannot be read (:func:`restore`) is passed over for the one before it, or the stage
starts fresh and replays its inputs from their beginning; either way the reset is logged, counted
(``fleetmedic_state_unreadable_total``) and audited.

Scale: a snapshot larger than one record of the state topic
(``streams.snapshot_part_bytes``) is written in parts and a manifest
(:mod:`~fleetmedic.streams.snapshot_parts`; ``fleetmedic_engine_snapshot_parts``), so the state
is never too large to save and the replay stays bounded by ``streams.engine_snapshot_every_s``. The
finding ids kept to drop stage 1's replays are those of ``streams.duplicate_findings_window_s`` of
event time. ``bench/bench_decide_scale.py`` measures the stage at 1,000 to 20,000 nodes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import faust
import msgspec
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import RecordMetadata
from prometheus_client import Counter

from fleetmedic import records as r
from fleetmedic.bus import partitions_of, state_topic, summaries_topic, ticks_topic
from fleetmedic.config import Settings
from fleetmedic.models.event_time import ahead_of_clock, reference_clock
from fleetmedic.models.stages import FleetDetection, SummaryColumns
from fleetmedic.remediation.engine import DecisionEngine, Decisions
from fleetmedic.remediation.operator import apply_operator_command, is_replay
from fleetmedic.signing import (
    CommandExpired,
    SignatureError,
    cluster_refusal,
    operator_keys,
    sign,
    verify_record,
)
from fleetmedic.streams.detect import PORT_KEY_PREFIX, SUMMARY_KEY
from fleetmedic.streams.engine_metrics import EngineMetrics
from fleetmedic.streams.metrics import PipelineMetrics
from fleetmedic.streams.outputs import Outputs, Source, describe
from fleetmedic.streams.replay import Tick, TickRecord, decode_tick, encode_tick, read_ranges, replay_order
from fleetmedic.streams.snapshot_parts import SnapshotUnreadable, part_key, split
from fleetmedic.streams.state import SNAPSHOT_KEY, SNAPSHOT_LIMIT, DecideSnapshot, decode_snapshot, encode_snapshot

log = logging.getLogger(__name__)

INPUTS = ("findings", "jobs.events", "remediation.results", "remediation.operator", "cluster.nodes")


def decide_inputs(settings: Settings) -> dict[str, int]:
    """The topics the decision agent reads, with their partition counts (their offsets are part of
    its snapshot)."""
    return {**{settings.topics.topic(n): partitions_of(settings, n) for n in INPUTS}, summaries_topic(settings): 1}


class EventClock:
    """The newest event time seen (records and ticks); never goes back. Only :meth:`wall_now`, the
    tick's time, adds the monotonic time elapsed since it was seen."""

    def __init__(self, start: float = 0.0) -> None:
        self._ts = start
        self._at = time.monotonic()

    def observe(self, ts: float) -> float:
        if ts > self._ts:
            self._ts, self._at = ts, time.monotonic()
        return self._ts

    def now(self) -> float:
        return self._ts

    def wall_now(self) -> float:
        """Event time advanced by the wall time since it last moved (0 before any record)."""
        return self._ts + (time.monotonic() - self._at) if self._ts else 0.0


@dataclass(frozen=True)
class Unreadable:
    """A part of the saved state that could not be read, and why (it started fresh)."""

    part: str  # snapshot (the whole of it, or its engine), fleet
    detail: str  # where: the snapshot's offset and size
    reason: str  # the exception: type and message

    def __str__(self) -> str:
        return f"{self.part} ({self.detail}): {self.reason}"


@dataclass
class Restored:
    """What :func:`restore` made of the snapshots on the state topic."""

    snapshot: DecideSnapshot | None
    engine: DecisionEngine
    offset: int | None  # of the snapshot restored, on the state topic
    unreadable: list[Unreadable] = field(default_factory=list)
    newest: int | None = None  # offset of the newest snapshot looked at


def restore(settings: Settings, candidates: Sequence[tuple[int, bytes | SnapshotUnreadable]]) -> Restored:
    """The newest snapshot of ``candidates`` (``(offset, bytes)``, newest first) whose envelope and
    engine decode, with its engine; each one passed over is listed in ``unreadable``. None readable:
    a fresh engine and no snapshot (the stage replays its inputs from their beginning, and the
    command and audit ids on their topics keep it from sending anything twice)."""
    unreadable: list[Unreadable] = []
    newest = candidates[0][0] if candidates else None
    for offset, raw in candidates:
        if isinstance(raw, SnapshotUnreadable):
            unreadable.append(Unreadable("snapshot", f"offset {offset}, written in parts", str(raw)))
            continue
        try:
            snap = decode_snapshot(raw)
            engine = DecisionEngine.from_bytes(snap.engine, settings)
        except Exception as exc:  # corrupt, truncated, another version's: not this stage's to read
            kind, message, _ = describe(exc)
            unreadable.append(Unreadable("snapshot", f"offset {offset}, {len(raw)} bytes", f"{kind}: {message}"))
            continue
        return Restored(snap, engine, offset, unreadable, newest)
    return Restored(None, DecisionEngine(settings), None, unreadable, newest)


class DecideStage:
    def __init__(self, settings: Settings, key: bytes, outputs: Outputs, metrics: PipelineMetrics,
                 snapshot: DecideSnapshot | None, already_sent: set[str],
                 already_audited: set[str] | None = None, engine: DecisionEngine | None = None,
                 part_slots: dict[int, int] | None = None, next_slot: int = 0) -> None:
        """``engine``: the snapshot's, already decoded (:func:`restore`). A fleet part that cannot be
        read starts fresh (listed in :attr:`unreadable`; :meth:`report_unreadable` audits it).
        ``part_slots``: the part keys on the state topic (slot -> count), ``next_slot``: the slot
        the next snapshot written in parts takes (not the one of the snapshot restored)."""
        self.settings = settings
        self.key = key
        self.outputs = outputs
        self.metrics = metrics
        self.engine_metrics = EngineMetrics(metrics.registry)
        self.operator_commands = Counter("fleetmedic_operator_commands", "Operator commands (fleetmedic ctl) read, "
                                         "by outcome: applied, replayed (refused), rejected", ["outcome"],
                                         registry=metrics.registry)
        self.fleet_stage = FleetDetection(settings.detection)
        self.unreadable: list[Unreadable] = []
        self.max_snapshot_bytes = SNAPSHOT_LIMIT
        metrics.snapshot_limit.set(self.max_snapshot_bytes)
        if snapshot is not None:
            self.engine = engine if engine is not None else DecisionEngine.from_bytes(snapshot.engine, settings)
            try:
                self.fleet_stage.load_state(snapshot.fleet)
            except Exception as exc:  # the peers' baselines relearn from the summaries; the rest stands
                kind, message, _ = describe(exc)
                self.fleet_stage = FleetDetection(settings.detection)
                self.unreadable.append(Unreadable("fleet", f"{len(snapshot.fleet)} bytes", f"{kind}: {message}"))
        else:
            self.engine = engine if engine is not None else DecisionEngine(settings)
        offsets = snapshot.offsets if snapshot else {}
        self.offsets: dict[str, dict[int, int]] = {t: dict(p) for t, p in offsets.items()}
        self.commands_from = snapshot.commands_from if snapshot else 0
        self.already_sent = set(already_sent)
        self.audit_from = snapshot.audit_from if snapshot else 0
        self.already_audited = set(already_audited or ())
        self.clock = EventClock(self.engine.state.clock)
        # finding id -> its event time: the ids handled within streams.duplicate_findings_window_s
        self._seen_findings: dict[str, float] = {}
        if snapshot is not None:
            times = snapshot.seen_finding_times
            fallback = snapshot.written_at  # a snapshot from before the times were kept
            self._seen_findings = {fid: times[k] if k < len(times) else fallback
                                   for k, fid in enumerate(snapshot.seen_findings)}
        self._seen_clock = max(self._seen_findings.values(), default=0.0)
        self._part_slots = dict(part_slots or {})
        self._next_slot = next_slot
        self._app: faust.App | None = None
        self._lock = asyncio.Lock()
        self._command_acks: list[asyncio.Future[RecordMetadata]] = []
        self._audit_acks: list[asyncio.Future[RecordMetadata]] = []
        self._decode_batch = msgspec.msgpack.Decoder(SummaryColumns).decode
        t = settings.topics.topic
        self.logical = {t(n): n for n in INPUTS}
        self.summaries = summaries_topic(settings)
        self.ticks = ticks_topic(settings)

    def attach(self, app: faust.App, tick_every_s: float, snapshot_every_s: float) -> None:
        """Register the agent and the timers on ``app`` (after :meth:`replay`)."""
        self._app = app
        raw: dict[str, Any] = dict(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
        app.agent(app.topic(*decide_inputs(self.settings), **raw), name="fleetmedic.decide")(self._decide)
        app.timer(tick_every_s, name="fleetmedic.tick")(self._tick)
        app.timer(snapshot_every_s, name="fleetmedic.engine_snapshot")(self._periodic_snapshot)

    # --- inputs ------------------------------------------------------------------------------------

    async def replay(self, ends: dict[TopicPartition, int], timeout: float = 60.0) -> int:
        """Handle the inputs and the logged ticks from the snapshot's offsets (the beginning without
        one) up to ``ends`` (the ticks topic's among them), in :func:`replay_order`: each tick after
        the records it had seen, with its logged time; records between two ticks merged in record-
        timestamp order, as they arrived (a finding before the job event that preceded it would make
        other decisions). Returns the number of records and ticks handled."""
        todo = {tp: (self.offsets.get(tp.topic, {}).get(tp.partition, 0), end) for tp, end in ends.items()}
        got = await read_ranges(self.settings, {tp: (a, b) for tp, (a, b) in todo.items() if b > a}, timeout)
        ticks: list[Tick] = []
        for tp in [tp for tp in got if tp.topic == self.ticks]:
            ticks += [Tick(decode_tick(rec.value or b""), rec.offset) for rec in got.pop(tp)]
        count = 0
        for item in replay_order(got, ticks):
            if isinstance(item, Tick):
                await self._apply_tick(self.clock.observe(item.record.now))
                self.offsets[self.ticks] = {0: item.offset + 1}
            else:
                self.metrics.messages_in.labels(item.topic, "decide").inc()
                await self.handle_record(Source.of_record(item))
                self.offsets.setdefault(item.topic, {})[item.partition] = item.offset + 1
            count += 1
        return count

    async def _decide(self, stream: Any) -> None:
        async for event in stream.events():
            started = time.perf_counter()
            m = event.message
            self.metrics.messages_in.labels(m.topic, "decide").inc()
            async with self._lock:
                await self.handle_record(Source.of_event(event))
                self.offsets.setdefault(m.topic, {})[m.partition] = m.offset + 1
            self.metrics.latency.labels("decide").observe(time.perf_counter() - started)

    async def handle_record(self, src: Source) -> None:
        """One input record; if handling it raises, it is dead-lettered with the exception and the
        stage goes on (a broker error is no fault of the record's: it propagates)."""
        try:
            await self._handle(src)
        except KafkaError:
            raise
        except Exception as exc:
            await self.outputs.record_failed(src, "decide", exc)

    async def _ahead(self, record: object, src: Source) -> bool:
        return await self.outputs.ahead_of_clock(record, src, "decide")

    def _foreign(self, record: r.Record, src: Source) -> bool:
        """Another cluster's record (on a topic clusters share): skipped and counted."""
        return self.outputs.other_cluster(record, src, "decide")

    async def _handle(self, src: Source) -> None:
        if src.topic == self.summaries:
            await self._fleet_input(src)
            return
        name = self.logical.get(src.topic, "")
        if name == "findings":
            finding = await self.outputs.decode(r.Finding, src, "decide")
            if (finding is not None and not self._foreign(finding, src) and not await self._ahead(finding, src)
                    and self._first_time(finding.id, finding.ts)):
                await self._send_decisions(self.engine.on_finding(finding, self.clock.observe(finding.ts)))
        elif name == "jobs.events":
            job = await self.outputs.decode(r.JobEvent, src, "decide")
            if job is not None and not self._foreign(job, src) and not await self._ahead(job, src):
                now = self.clock.observe(job.ts)
                await self.outputs.findings(self.fleet_stage.on_job(job))
                await self._send_decisions(self.engine.on_job_event(job, now))
        elif name == "remediation.results":
            result = await self.outputs.decode(r.RemediationResult, src, "decide")
            if result is not None and not self._foreign(result, src) and not await self._ahead(result, src):
                await self._send_decisions(self.engine.on_result(result, self.clock.observe(result.ts)))
        elif name == "cluster.nodes":
            await self._node_observation(src)
        elif name == "remediation.operator":
            await self._operator_command(src)

    async def _node_observation(self, src: Source) -> None:
        obs = await self.outputs.decode(r.NodeObservation, src, "decide")
        if obs is None or self._foreign(obs, src) or await self._ahead(obs, src):
            return
        now = self.clock.observe(obs.ts)
        if obs.deleted:
            log.info("decide: node %s was deleted: out of the topology", obs.node)
            await self._send_decisions(self.engine.node_removed(obs.node, now))
            return
        await self._send_decisions(self.engine.node_observed(
            obs.node, cordoned=obs.cordoned, cordoned_by_fleetmedic=obs.cordoned_by_fleetmedic, labels=obs.labels,
            now=now))

    async def _operator_command(self, src: Source) -> None:
        cmd = await self.outputs.decode(r.OperatorCommand, src, "decide")
        if cmd is not None and self._foreign(cmd, src):  # another cluster's operator's: not ours to judge
            return
        if cmd is None or await self._ahead(cmd, src):  # issued in the future: refused before it moves time
            self.operator_commands.labels("rejected").inc()
            return
        c = self.settings.cluster
        unaddressed = cluster_refusal(cmd, c.name, accept_unlabeled=c.accept_unlabeled_commands)
        if unaddressed:  # it names no cluster, and this one has a name: refused as the executor would
            self.operator_commands.labels("rejected").inc()
            log.warning("decide: operator command %s rejected: %s", cmd.id, unaddressed)
            await self.outputs.dead_letter(src, "decide", f"operator command {cmd.id} rejected: {unaddressed}")
            return
        try:  # operator keys only, never the command key; re-read each time (a rotated Secret is picked up)
            keys = operator_keys(self.settings.signing, os.environ, command_key=self.key)
            # first: a forged command must not move time. Over the bytes received (the header), or
            # the in-body signature for a record without one (fleetmedic.signing: the migration)
            kid = verify_record(cmd, src.value, src.headers, keys, max(self.clock.now(), cmd.issued_at),
                                max_future_skew_s=self.settings.streams.max_future_skew_s)
            outcome = "replayed" if is_replay(self.engine, cmd) else "applied"  # a replay is refused and audited
            decisions = apply_operator_command(self.engine, cmd, keys, self.clock.observe(cmd.issued_at),
                                               verified_key_id=kid)
        except (SignatureError, CommandExpired) as exc:
            self.operator_commands.labels("rejected").inc()
            log.warning("decide: operator command %s rejected: %s", cmd.id, exc)
            await self.outputs.dead_letter(src, "decide", f"operator command {cmd.id} rejected: {exc}")
            return
        self.operator_commands.labels(outcome).inc()
        log.info("decide: operator command %s (%s %s) from %s: %s", cmd.id, cmd.action, cmd.node, cmd.actor, outcome)
        await self._send_decisions(decisions)

    def _first_time(self, finding_id: str, ts: float) -> bool:
        """False for a finding id handled before: stage 1 replays the telemetry after its last
        checkpoint when it restarts, and a repeated warning must not count twice in triage. The ids
        of ``streams.duplicate_findings_window_s`` of event time are kept (at most
        ``duplicate_findings_max``): memory and the snapshot follow the finding rate, not a constant."""
        if finding_id in self._seen_findings:
            self.metrics.duplicate_findings.inc()
            return False
        st = self.settings.streams
        seen = self._seen_findings
        seen[finding_id] = ts
        self._seen_clock = max(self._seen_clock, ts)
        horizon = self._seen_clock - st.duplicate_findings_window_s
        while seen:  # oldest first (ids arrive in about event-time order; a late one leaves with its elders)
            oldest = next(iter(seen))
            if seen[oldest] >= horizon and len(seen) <= st.duplicate_findings_max:
                break
            del seen[oldest]
        return True

    async def _fleet_input(self, src: Source) -> None:
        key = src.key or b""
        if key == SUMMARY_KEY:
            try:
                batch = self._decode_batch(src.value)
            except msgspec.DecodeError as exc:
                await self.outputs.dead_letter(src, "decide", f"$: {exc}")
                return
            clock, ahead = reference_clock(time.time(), src.timestamp_ms), 0
            skew = self.settings.streams.max_future_skew_s
            seen: list[str] = []
            for s in batch.summaries():
                if ahead_of_clock(s.ts, clock, skew) is not None:  # stage 1 refuses these already
                    ahead += 1
                    continue
                self.fleet_stage.on_summary(s)
                self.clock.observe(s.ts)
                seen.append(s.node)
            if seen:  # the fleet size when no topology is given (as the embedded engine counts it)
                self.engine.nodes_seen(seen, self.clock.now())
            if ahead:
                self.metrics.ahead_of_clock.labels(src.topic, "decide").inc(ahead)
                log.warning("decide: %d node summaries of %s[%d]@%d ahead of the clock; left out", ahead, src.topic,
                            src.partition, src.offset)
        elif key.startswith(PORT_KEY_PREFIX):
            port = await self.outputs.decode(r.PortTelemetry, src, "decide")
            if port is not None and not self._foreign(port, src) and not await self._ahead(port, src):
                self.clock.observe(port.ts)
                await self.outputs.findings(self.fleet_stage.on_port(port))

    async def _tick(self) -> None:
        started = time.perf_counter()
        async with self._lock:
            now = self.clock.wall_now()
            if now <= 0:
                return  # no record seen yet: no time line to tick on
            # logged (and acknowledged) before any of its decisions leaves: a replay fires it here again
            inputs = {t: dict(p) for t, p in self.offsets.items() if t != self.ticks}
            try:
                sent = await self.outputs.send_raw(self.ticks, b"tick", encode_tick(TickRecord(now, inputs)))
                self.offsets[self.ticks] = {0: (await sent).offset + 1}
            except KafkaError as exc:  # a tick a replay would not know must not act: the next one will
                log.warning("decide: tick at %.3f not logged (%r); skipped", now, exc)
                return
            await self._apply_tick(self.clock.observe(now))
        self._report_lag()
        self.metrics.latency.labels("tick").observe(time.perf_counter() - started)

    async def _apply_tick(self, now: float) -> None:
        """The tick's work; if it raises, that is logged and counted and the stage goes on (a
        replay fires the same tick again: re-raising would stop the restarted stage there too)."""
        try:
            await self.outputs.findings(self.fleet_stage.tick(now))
            await self._send_decisions(self.engine.tick(now))
            self.engine_metrics.update(self.engine.report(now), ((rec.name, rec.state, rec.since) for rec in
                                                                 self.engine.state.nodes.values()),
                                       self.engine.accounting.recoveries())
        except KafkaError:
            raise
        except Exception as exc:
            kind, message, frame = describe(exc)
            self.metrics.record_errors.labels("tick", kind).inc()
            log.error("decide: the tick at %.3f raised %s: %s (at %s); going on", now, kind, message, frame,
                      exc_info=exc)

    def _report_lag(self) -> None:
        if self._app is None:
            return
        for topic, parts in self.offsets.items():
            for partition, done in parts.items():
                try:
                    high = self._app.consumer.highwater(TopicPartition(topic, partition))
                except Exception:  # not assigned (yet), consumer not started: no figure this time
                    continue
                if high is not None:
                    self.metrics.lag.labels(topic, str(partition), "decide").set(max(0, high - done))

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
            self._command_acks.append(await self.outputs.send_signed("remediation.commands", cmd.node or cmd.job,
                                                                     sign(cmd, self.key), self.settings.signing.key_id,
                                                                     self.key))  # the active command key, by its id
        for a in d.audit:
            if a.id in self.already_audited or (a.command_ids and set(a.command_ids) <= self.already_sent):
                self.metrics.audit_suppressed.inc()
                continue
            self._audit_acks.append(await self.outputs.send("remediation.audit", a.node or a.job or "", a))

    # --- state -------------------------------------------------------------------------------------

    async def _periodic_snapshot(self) -> None:
        try:
            await self.snapshot()
        except KafkaError as exc:  # never fail inside the timer: the previous snapshot stays, the replay covers it
            self.metrics.snapshots_skipped.labels("broker").inc()
            log.error("decide: snapshot not written (%r); the previous one stays", exc)

    async def report_unreadable(self, restored: Restored | None = None) -> None:
        """Log, count and audit the saved state that could not be read and started fresh (the
        snapshots :func:`restore` passed over and this stage's own :attr:`unreadable`). The audit
        record's id names the newest snapshot looked at: a restart that finds it again does not
        audit it twice."""
        found = [*(restored.unreadable if restored else []), *self.unreadable]
        if not found:
            return
        for u in found:
            self.metrics.state_unreadable.labels("decide", u.part).inc()
            log.error("decision state cannot be read: %s", u)
        if restored is not None and restored.snapshot is not None and restored.unreadable:
            outcome = f"restored the earlier snapshot at offset {restored.offset} and replayed the inputs since it"
        elif restored is not None and restored.unreadable:
            outcome = "started from a fresh state and replayed the inputs from the beginning of their retention"
        else:
            outcome = "that part started fresh; the rest of the snapshot was restored"
        newest = restored.newest if restored is not None and restored.newest is not None else "none"
        audit = r.AuditRecord(id=f"state-reset/{state_topic(self.settings)}/{newest}", ts=time.time(),
                              decision="escalated", rule="state_reset",
                              explanation=(f"decision state reset: {'; '.join(map(str, found))}; {outcome} "
                                           "(inputs past their retention, and a part started fresh, are lost: "
                                           "check the state topic and the broker)")[:4096])
        log.error("decision state reset: %s", outcome)
        if audit.id in self.already_audited:
            return
        self.already_audited.add(audit.id)
        self._audit_acks.append(await self.outputs.send("remediation.audit", "", audit))

    async def snapshot(self) -> int:
        """Write the state with the offsets it reflects, once everything before it is on the broker.
        A snapshot larger than one record of the state topic is written in parts, then its manifest
        (:mod:`~fleetmedic.streams.snapshot_parts`). Returns the snapshot's size in bytes."""
        async with self._lock:
            snap = DecideSnapshot(engine=self.engine.to_bytes(), fleet=self.fleet_stage.state_bytes(),
                                  offsets={t: dict(p) for t, p in self.offsets.items()}, commands_from=0,
                                  written_at=time.time(), seen_findings=list(self._seen_findings),
                                  seen_finding_times=list(self._seen_findings.values()))
            acks, self._command_acks = self._command_acks, []
            audit_acks, self._audit_acks = self._audit_acks, []
        await self.outputs.flush()
        if acks:
            self.commands_from = max(self.commands_from, 1 + max(a.result().offset for a in acks))
        if audit_acks:
            self.audit_from = max(self.audit_from, 1 + max(a.result().offset for a in audit_acks))
        snap.commands_from, snap.audit_from = self.commands_from, self.audit_from
        value = encode_snapshot(snap)
        part_bytes = min(self.settings.streams.snapshot_part_bytes, self.max_snapshot_bytes)
        self.metrics.snapshot_size.set(len(value))
        self.metrics.snapshot_limit.set(part_bytes)
        topic = state_topic(self.settings)
        if len(value) <= part_bytes:
            await (await self.outputs.send_raw(topic, SNAPSHOT_KEY, value))
            await self._clear_parts(keep={})  # a whole snapshot after parts: they are not needed any more
            self.metrics.snapshot_parts.set(1)
        else:
            slot = self._next_slot
            parts, manifest = split(value, part_bytes, slot)
            sent = [await self.outputs.send_raw(topic, key, part) for key, part in parts]
            for future in sent:  # every part on the broker before the manifest that names them
                await future
            await (await self.outputs.send_raw(topic, SNAPSHOT_KEY, manifest))
            await self._clear_parts(keep={slot: len(parts), 1 - slot: self._part_slots.get(1 - slot, 0)})
            self._next_slot = 1 - slot
            self.metrics.snapshot_parts.set(len(parts))
            log.info("decide: snapshot of %d bytes written in %d parts (slot %d)", len(value), len(parts), slot)
        self.metrics.snapshots.inc()
        self.metrics.state_bytes.labels("decide").inc(len(value))
        return len(value)

    async def _clear_parts(self, keep: dict[int, int]) -> None:
        """Tombstone the part keys beyond ``keep`` (slot -> parts still needed): compaction then
        drops them, and a snapshot that shrank leaves no stale part behind."""
        topic = state_topic(self.settings)
        for slot, count in sorted(self._part_slots.items()):
            for index in range(keep.get(slot, 0), count):
                await self.outputs.send_raw(topic, part_key(slot, index), None)
        self._part_slots = {slot: n for slot, n in keep.items() if n}
