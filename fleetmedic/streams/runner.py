"""Running the pipeline's worker in this process (``fleetmedic worker``; see :mod:`fleetmedic.worker_cli`)."""

from __future__ import annotations

import asyncio
import logging

import faust
from prometheus_client import CollectorRegistry, start_http_server

from fleetmedic.config import Settings
from fleetmedic.remediation.engine import DecisionEngine
from fleetmedic.streams.app import build_app, ensure_topics
from fleetmedic.streams.metrics import PipelineMetrics
from fleetmedic.streams.worker import Pipeline, load_snapshot, save_snapshot

log = logging.getLogger("fleetmedic.worker")


def run(settings: Settings, key: bytes, datadir: str, loglevel: str) -> int:
    """Create topics, restore the engine, serve metrics, run the Faust worker until a signal."""
    async def prepare() -> bytes | None:
        created = await ensure_topics(settings)
        if created:
            log.info("created topics: %s", ", ".join(created))
        return await load_snapshot(settings)

    snapshot = asyncio.run(prepare())
    engine = DecisionEngine.from_bytes(snapshot, settings) if snapshot else DecisionEngine(settings)
    log.info("decision engine: %s", f"restored ({len(snapshot)} bytes, clock {engine.state.clock:.3f})"
             if snapshot else "fresh state")

    registry = CollectorRegistry()
    server, _ = start_http_server(settings.metrics.port, addr=settings.metrics.bind_address, registry=registry)
    log.info("metrics on http://%s:%d/metrics", *server.server_address[:2])
    asyncio.set_event_loop(asyncio.new_event_loop())
    app = build_app(settings, datadir=datadir)
    pipeline = Pipeline(app, settings, key, PipelineMetrics(registry), engine)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True)
    code = 0
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        server.shutdown()
    # the agents have stopped: the engine no longer changes, and its last state is written here,
    # outside faust's shutdown sequence (its producer may already be gone there)
    state = pipeline.engine.to_bytes()
    asyncio.run(save_snapshot(settings, state))
    log.info("engine state written (%d bytes)", len(state))
    return code
