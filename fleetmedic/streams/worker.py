"""The pipeline's stages on Kafka (stage 1 a plain consumer group, the decision stage a Faust agent):
topology, roles and what survives a restart.

Two stages, each its own consumer group, so that detection scales out and decisions stay single:

- stage 1, detection per node (:mod:`fleetmedic.streams.detect`), group ``<group>-detect``:
  a consumer-group loop (plain aiokafka) over ``telemetry.gpu``/``telemetry.port``, partitioned by
  node; run up to as many ``--role detect`` workers as there are partitions. It writes ``findings``
  and, on a one-partition fleet-inputs topic, per-batch node summaries and the switch ports.
- the decision stage (:mod:`fleetmedic.streams.decide`), group ``<group>``: ``decide`` over
  ``findings``, ``jobs.events``, ``remediation.results`` and the fleet inputs, with the global
  state (peers, budgets, breaker, node lifecycle). Exactly one ``--role decide`` worker: a second
  one cannot start while the first is in the group (:func:`~fleetmedic.streams.state.reset_group_offsets`).

``--role all`` (the default) runs both in one process (stage 1 in a thread with its own event
loop, still in its own group), for a single-process deployment. Every value is raw bytes, decoded and validated by
:mod:`fleetmedic.records`; what does not decode is dead-lettered (:mod:`fleetmedic.streams.outputs`).

Restarts: stage 1 writes the changed nodes' state (baselines, NIC counters, multivariate windows;
the multivariate model's rows per partition) to a compacted topic every
``streams.detect_snapshot_every_s`` (and when it loses a partition), then commits its offsets, and
loads them when it is assigned a partition: a restarted stage 1 has exactly the state of its
committed offsets. The decision stage snapshots its state with its input offsets to another
compacted topic and replays from there, sending no command twice (docs/streams.md has the
guarantees and the measured costs).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Literal

import faust

from fleetmedic.config import Settings
from fleetmedic.streams.admission import AdmissionServer
from fleetmedic.streams.decide import DecideStage, EventClock
from fleetmedic.streams.detect import DetectStage
from fleetmedic.streams.metrics import PipelineMetrics
from fleetmedic.streams.outputs import Outputs

__all__ = ["EventClock", "Pipeline", "Role", "WorkerOptions"]

log = logging.getLogger(__name__)

Role = Literal["detect", "decide", "all"]


@dataclass(frozen=True)
class WorkerOptions:
    batch_size: int = 256
    batch_within_s: float = 0.5
    tick_every_s: float | None = None  # default: detection.sample_interval_s
    snapshot_every_s: float = 30.0  # decision stage
    detect_snapshot_every_s: float = 60.0  # stage 1, per node
    session_timeout_s: float = 10.0

    @classmethod
    def of(cls, settings: Settings) -> WorkerOptions:
        """The ``streams`` section of the config."""
        s = settings.streams
        return cls(batch_size=s.batch_size, batch_within_s=s.batch_within_s, snapshot_every_s=s.engine_snapshot_every_s,
                   detect_snapshot_every_s=s.detect_snapshot_every_s, session_timeout_s=s.session_timeout_s)


class Pipeline:
    """The stages of one worker: ``decide`` (prepared, and replayed, by the runner) is attached to
    ``app``; stage 1 runs in :meth:`run_detect` when ``detect``."""

    def __init__(self, app: faust.App | None, settings: Settings, metrics: PipelineMetrics,
                 decide: DecideStage | None, detect: bool, options: WorkerOptions | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.options = o = options or WorkerOptions.of(settings)
        self.decide = decide
        self.detect: DetectStage | None = None
        self.admission: AdmissionServer | None = None
        if decide is not None:
            assert app is not None
            decide.outputs = Outputs(settings, metrics)  # a producer of the Faust worker's event loop
            decide.attach(app, o.tick_every_s or settings.detection.sample_interval_s, o.snapshot_every_s)
            app.on_before_shutdown.connect(self._on_shutdown)  # type: ignore[arg-type]
            if settings.admission.enabled:
                stage = decide
                self.admission = AdmissionServer(settings.admission, lambda: stage.engine.cordons_in_flight(),
                                                 lambda: settings.safety.dry_run, metrics.registry)
                app.task(self._serve_admission)
        if detect:
            self.detect = DetectStage(settings, Outputs(settings, metrics), metrics, o.batch_size, o.batch_within_s,
                                      o.detect_snapshot_every_s, o.session_timeout_s)

    async def _serve_admission(self) -> None:
        """The bind-time check on the decision stage's event loop, until the worker stops."""
        assert self.admission is not None
        await self.admission.run(asyncio.Event())

    async def run_detect(self, stop: asyncio.Event) -> None:
        """Stage 1 until ``stop`` (in its own event loop: a thread beside Faust's, or the main one)."""
        assert self.detect is not None
        try:
            await self.detect.run(stop)
        finally:
            await self.detect.outputs.stop()

    async def _on_shutdown(self, sender: Any, *_: Any, signal: Any = None, **__: Any) -> None:
        """Faust has stopped consuming: write the decision stage's last snapshot, close its producer."""
        assert self.decide is not None
        try:
            size = await self.decide.snapshot()
            log.info("engine state written (%d bytes)", size)
        finally:
            await self.decide.outputs.stop()
