"""``fleetmedic exporter logs``: job log lines from Kafka -> JobEvent failures with classified excerpts.

Reads ``exporters.logs.topics`` where a log shipper puts container log lines as JSON — Fluent Bit's
Kubernetes filter shape: ``log`` (the line), ``kubernetes.namespace_name``, ``kubernetes.pod_name``,
``kubernetes.host`` (the node), ``kubernetes.labels`` (the job from the first of
``job_labels``, the attempt from ``attempt_label``), and a time in ``@timestamp`` / ``date``
(epoch seconds) or ``time`` (RFC 3339). Each line is classified with the log pattern library
(:mod:`fleetmedic.remediation.log_patterns`); lines that match no pattern are ignored.

:class:`FailureLogGate` (pure, clock passed in) turns classified lines into events: a job's lines
are gathered for ``settle_s`` after its first, then published as ``failure`` JobEvents — one per
node the lines came from, carrying the ``excerpt_lines`` strongest lines in log order — and the
job then stays quiet for ``per_job_interval_s`` (lines meanwhile are gathered for the next event;
beyond ``excerpt_lines`` the weakest are dropped and counted). Messages that are not such JSON are
counted as skipped with the reason.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from fleetmedic.config import Settings
from fleetmedic.connectors.logs.failures import BadLogLine, FailureLogGate, parse_log_message
from fleetmedic.connectors.runtime import ConnectorMetrics, Outbox, run_consumer, telemetry_outgoing
from fleetmedic.remediation.log_patterns import default_library, load_library


class LogSource:
    def __init__(self, settings: Settings, outbox: Outbox, metrics: ConnectorMetrics,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.cfg = settings.exporters.logs
        if not self.cfg.topics:
            raise ValueError("exporters.logs.topics: name at least one topic to read")
        self.outbox = outbox
        self.metrics = metrics
        self.clock = clock
        self.library = load_library(self.cfg.patterns_file) if self.cfg.patterns_file else default_library()
        self.gate = FailureLogGate(self.cfg.excerpt_lines, self.cfg.settle_s, self.cfg.per_job_interval_s)

    async def run(self, stop: asyncio.Event) -> None:
        await run_consumer(self.settings, self.cfg.topics, self.cfg.group_id, stop, self.metrics, self._handle,
                           lambda: self.emit(self.clock()), max_records=5000)

    async def _handle(self, topic: str, value: bytes | None, partition: int, offset: int) -> None:
        self.handle(value or b"")

    def handle(self, message: bytes) -> None:
        now = self.clock()
        try:
            line = parse_log_message(message, self.cfg, now)
        except BadLogLine as exc:
            self.metrics.skipped(str(exc))
            return
        match = self.library.classify(line.text)
        if match.pattern is not None:
            self.gate.add(line, match, now)

    async def emit(self, now: float) -> None:
        for event in self.gate.due(now):
            await self.outbox.put(telemetry_outgoing(event, self.settings))
        for reason, n in self.gate.dropped.items():
            self.metrics.skipped(reason, n)
        self.gate.dropped.clear()
