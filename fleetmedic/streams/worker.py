"""The pipeline's stages as Faust workers on Kafka: topology, roles and what survives a restart.

Two stages, each its own consumer group, so that detection scales out and decisions stay single:

- stage 1, detection per node (:mod:`fleetmedic.streams.detect`), group ``<group>-detect``:
  ``detect_gpu``/``detect_port`` over ``telemetry.gpu``/``telemetry.port``, partitioned by node;
  run as many ``--role detect`` workers as there are partitions. It writes ``findings`` and, on a
  one-partition fleet-inputs topic, per-batch node summaries and the switch ports.
- the decision stage (:mod:`fleetmedic.streams.decide`), group ``<group>``: ``decide`` over
  ``findings``, ``jobs.events``, ``remediation.results`` and the fleet inputs, with the global
  state (peers, budgets, breaker, node lifecycle). Exactly one ``--role decide`` worker: a second
  one cannot start while the first is in the group (:func:`~fleetmedic.streams.state.reset_group_offsets`).

``--role all`` (the default) runs both stages in one worker and one group ``<group>``, for a
single-process deployment. Every value is raw bytes, decoded and validated by
:mod:`fleetmedic.records`; what does not decode is dead-lettered (:mod:`fleetmedic.streams.outputs`).

Restarts: stage 1 writes each node's baselines to a compacted topic every
``streams.detect_snapshot_every_s`` and when it loses a partition, and loads them when it is
assigned one; the decision stage snapshots its state with its input offsets and replays from there,
sending no command twice (docs/streams.md has the guarantees and the measured costs).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

import faust

from fleetmedic.config import Settings
from fleetmedic.streams.decide import DecideStage, EventClock
from fleetmedic.streams.detect import DetectStage
from fleetmedic.streams.metrics import PipelineMetrics
from fleetmedic.streams.outputs import Outputs
from fleetmedic.streams.state import DecideSnapshot

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
    """Registers the agents of ``role`` on ``app``; holds the stages."""

    def __init__(self, app: faust.App, settings: Settings, key: bytes, metrics: PipelineMetrics, role: Role = "all",
                 snapshot: DecideSnapshot | None = None, already_sent: set[str] | None = None,
                 options: WorkerOptions | None = None) -> None:
        self.app = app
        self.options = o = options or WorkerOptions.of(settings)
        self.outputs = Outputs(settings, metrics)
        self.detect: DetectStage | None = None
        self.decide: DecideStage | None = None
        if role in ("detect", "all"):
            self.detect = DetectStage(app, settings, self.outputs, metrics, o.batch_size, o.batch_within_s,
                                      o.detect_snapshot_every_s)
        if role in ("decide", "all"):
            self.decide = DecideStage(app, settings, key, self.outputs, metrics, snapshot, already_sent or set(),
                                      o.tick_every_s or settings.detection.sample_interval_s, o.snapshot_every_s)
        app.on_before_shutdown.connect(self._on_shutdown)  # type: ignore[arg-type]

    async def _on_shutdown(self, sender: Any, *_: Any, signal: Any = None, **__: Any) -> None:
        """Faust has stopped consuming: write the last state, then close the producer."""
        try:
            if self.detect is not None:
                await self.detect.snapshot()
            if self.decide is not None:
                size = await self.decide.snapshot()
                log.info("engine state written (%d bytes)", size)
        finally:
            await self.outputs.stop()
