"""Running the pipeline's worker in this process (``fleetmedic worker``; see :mod:`fleetmedic.cli.worker`)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import threading
import time

import faust
from prometheus_client import CollectorRegistry

from fleetmedic import records as r
from fleetmedic.bus import ticks_topic
from fleetmedic.config import Settings
from fleetmedic.serving import DEFAULT_BEAT_EVERY_S, Health, serve
from fleetmedic.streams.app import build_app, ensure_topics
from fleetmedic.streams.decide import DecideStage, decide_inputs, restore
from fleetmedic.streams.metrics import PipelineMetrics
from fleetmedic.streams.outputs import Outputs
from fleetmedic.streams.state import end_offsets, ids_since, reset_group_offsets, scan_snapshots
from fleetmedic.streams.worker import Pipeline, Role, WorkerOptions

log = logging.getLogger("fleetmedic.worker")

GC_GEN0_THRESHOLD = 50_000


async def prepare_decide(settings: Settings, key: bytes, metrics: PipelineMetrics,
                         options: WorkerOptions) -> DecideStage:
    """The decision stage, restored and caught up: its snapshot, the command ids on the topic since,
    the inputs replayed from the snapshot's offsets to their ends; its group's offsets set there.
    A snapshot that cannot be read is passed over for the one before it, or the stage starts fresh
    (and replays from the beginning): logged, counted and audited, never a failed start."""
    group, inputs = settings.kafka.consumer_group, decide_inputs(settings)
    scan = await scan_snapshots(settings)
    candidates = scan.newest_first()
    restored = restore(settings, candidates)
    snapshot = restored.snapshot
    size = next((len(raw) for offset, raw in candidates if offset == restored.offset and isinstance(raw, bytes)), 0)
    # the next snapshot in parts goes to the slot the restored one does not use (0 if it was whole)
    next_slot = 1 - scan.manifest_slots[restored.offset] if restored.offset in scan.manifest_slots else 0
    del candidates
    wait_s = 3 * options.session_timeout_s + 10
    # first: the group must have no live member (a crashed predecessor's session must end)
    await reset_group_offsets(settings, group, inputs, snapshot.offsets if snapshot else {}, wait_s)
    already = await ids_since(settings, "remediation.commands", r.RemediationCommand,
                              snapshot.commands_from if snapshot else 0)
    audited = await ids_since(settings, "remediation.audit", r.AuditRecord, snapshot.audit_from if snapshot else 0)
    stage = DecideStage(settings, key, Outputs(settings, metrics), metrics, snapshot, already, audited,
                        engine=restored.engine, part_slots=scan.slots_in_use(), next_slot=next_slot)
    del scan
    started = time.monotonic()
    try:
        await stage.report_unreadable(restored)
        replayed = await stage.replay(await end_offsets(settings, {**inputs, ticks_topic(settings): 1}))
        await stage.outputs.flush()
    finally:
        await stage.outputs.stop()
    reset = await reset_group_offsets(settings, group, inputs, stage.offsets, wait_s)
    state = f"restored ({size} bytes, written at {snapshot.written_at:.3f})" if snapshot else "fresh state"
    log.info("decision engine: %s; %d command ids already on the topic, %d audit ids on theirs; replayed %d "
             "messages and ticks in %.2fs; inputs from %s", state, len(already), len(audited), replayed,
             time.monotonic() - started,
             ", ".join(f"{tp.topic}[{tp.partition}]@{off}" for tp, off in sorted(reset.items())))
    return stage


def run(settings: Settings, key: bytes, datadir: str, loglevel: str, role: Role = "all",
        options: WorkerOptions | None = None) -> int:
    """Prepare, serve metrics, run the worker of ``role`` until SIGINT/SIGTERM."""
    options = options or WorkerOptions.of(settings)
    registry = CollectorRegistry()
    metrics = PipelineMetrics(registry)

    async def prepare() -> DecideStage | None:
        created = await ensure_topics(settings)
        if created:
            log.info("created topics: %s", ", ".join(created))
        return None if role == "detect" else await prepare_decide(settings, key, metrics, options)

    health = Health(settings.metrics.stall_after_s)
    decide = asyncio.run(prepare())
    server = serve(registry, settings.metrics.port, settings.metrics.bind_address, health, settings.cluster.name)
    log.info("metrics on http://%s:%d/metrics", *server.server_address[:2])
    health.ready()  # restored and replayed: the stages start now
    # a micro-batch allocates tens of thousands of small objects (decoded records): with the default
    # gen-0 threshold (700) the collector runs dozens of times per batch over the long-lived state
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, 20, 50)
    try:
        if decide is None:
            return _run_detect_only(Pipeline(None, settings, metrics, None, True, options), health)
        return _run_faust(settings, datadir, loglevel, role, metrics, decide, options, health)
    finally:
        server.shutdown()


def _run_detect_only(pipeline: Pipeline, health: Health) -> int:
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        log.info("role detect: ready")
        beating = asyncio.create_task(health.beat_every("detect"))
        try:
            await pipeline.run_detect(stop)
        finally:
            beating.cancel()

    asyncio.run(main())
    log.info("role detect: stopped")
    return 0


def _run_faust(settings: Settings, datadir: str, loglevel: str, role: Role, metrics: PipelineMetrics,
               decide: DecideStage, options: WorkerOptions, health: Health) -> int:
    asyncio.set_event_loop(asyncio.new_event_loop())
    app = build_app(settings, datadir=datadir, broker_session_timeout=options.session_timeout_s)
    pipeline = Pipeline(app, settings, metrics, decide, role == "all", options)
    log.info("role %s, consumer group %s", role, settings.kafka.consumer_group)

    async def heartbeat() -> None:  # the decision stage's loop is alive
        health.beat("decide")

    app.timer(DEFAULT_BEAT_EVERY_S, name="fleetmedic.heartbeat")(heartbeat)

    detect = _DetectThread(pipeline, health) if role == "all" else None
    worker = faust.Worker(app, loglevel=loglevel, quiet=True)
    code = 0
    try:
        if detect is not None:
            detect.start()
        worker.execute_from_commandline()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        if detect is not None:
            detect.stop()
    return code if detect is None or detect.error is None else 1


class _DetectThread:
    """Stage 1 in a thread with its own event loop, beside the Faust worker (``--role all``). If
    stage 1 fails, the whole worker stops (SIGTERM to itself) and exits non-zero: a process whose
    stage 1 died while its decision stage runs on would look healthy and detect nothing."""

    def __init__(self, pipeline: Pipeline, health: Health) -> None:
        self.pipeline = pipeline
        self.health = health
        self.loop = asyncio.new_event_loop()
        self.stop_event = asyncio.Event()  # bound to the thread's loop at its first use there
        self.error: BaseException | None = None
        self.stopping = False
        self.thread = threading.Thread(target=self._main, name="fleetmedic-detect", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _main(self) -> None:
        try:
            self.loop.run_until_complete(self._run())
        except BaseException as exc:  # reported by stop(); the worker exits non-zero
            self.error = exc
            log.exception("stage 1 failed; stopping the worker")
            if not self.stopping:
                os.kill(os.getpid(), signal.SIGTERM)  # Faust stops (its last snapshot included)
        finally:
            self.loop.close()

    async def _run(self) -> None:
        beating = asyncio.create_task(self.health.beat_every("detect"))
        try:
            await self.pipeline.run_detect(self.stop_event)
        finally:
            beating.cancel()

    def stop(self, timeout: float = 30.0) -> None:
        self.stopping = True
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(timeout)
