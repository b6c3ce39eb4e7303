"""Running the pipeline's worker in this process (``fleetmedic worker``; see :mod:`fleetmedic.worker_cli`)."""

from __future__ import annotations

import asyncio
import logging

import faust
from prometheus_client import CollectorRegistry, start_http_server

from fleetmedic.config import Settings
from fleetmedic.streams.app import build_app, detect_group, ensure_topics
from fleetmedic.streams.decide import decide_inputs
from fleetmedic.streams.metrics import PipelineMetrics
from fleetmedic.streams.state import (
    DecideSnapshot,
    command_ids_since,
    decode_snapshot,
    load_snapshot,
    reset_group_offsets,
)
from fleetmedic.streams.worker import Pipeline, Role, WorkerOptions

log = logging.getLogger("fleetmedic.worker")


async def prepare(settings: Settings, role: Role, options: WorkerOptions) -> tuple[DecideSnapshot | None, set[str]]:
    """Create topics; for the decision stage, restore its snapshot and point its group at its offsets."""
    created = await ensure_topics(settings)
    if created:
        log.info("created topics: %s", ", ".join(created))
    if role == "detect":
        return None, set()
    raw = await load_snapshot(settings)
    snapshot = decode_snapshot(raw) if raw else None
    reset = await reset_group_offsets(settings, settings.kafka.consumer_group, decide_inputs(settings),
                                      snapshot.offsets if snapshot else {}, wait_s=3 * options.session_timeout_s + 10)
    already = await command_ids_since(settings, snapshot.commands_from if snapshot else 0)
    log.info("decision engine: %s; inputs from %s; %d command ids already on the topic",
             f"restored ({len(raw or b'')} bytes, clock {snapshot.written_at:.3f})" if snapshot else "fresh state",
             ", ".join(f"{tp.topic}[{tp.partition}]@{off}" for tp, off in sorted(reset.items())), len(already))
    return snapshot, already


def run(settings: Settings, key: bytes, datadir: str, loglevel: str, role: Role = "all",
        options: WorkerOptions | None = None) -> int:
    """Prepare, serve metrics, run the Faust worker of ``role`` until a signal."""
    options = options or WorkerOptions.of(settings)
    snapshot, already = asyncio.run(prepare(settings, role, options))
    registry = CollectorRegistry()
    server, _ = start_http_server(settings.metrics.port, addr=settings.metrics.bind_address, registry=registry)
    log.info("metrics on http://%s:%d/metrics", *server.server_address[:2])
    asyncio.set_event_loop(asyncio.new_event_loop())
    app_id = detect_group(settings) if role == "detect" else settings.kafka.consumer_group
    app = build_app(settings, datadir=datadir, app_id=app_id, broker_session_timeout=options.session_timeout_s)
    Pipeline(app, settings, key, PipelineMetrics(registry), role, snapshot, already, options)
    log.info("role %s, consumer group %s", role, app_id)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True)
    code = 0
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        server.shutdown()
    return code
