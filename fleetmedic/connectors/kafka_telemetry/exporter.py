"""``fleetmedic exporter kafka``: a user's telemetry topics -> GpuTelemetry / PortTelemetry.

Reads ``exporters.kafka.topics`` in one of two common JSON formats:

- ``telegraf`` (Telegraf's JSON serializer, one metric per message or ``{"metrics": [...]}``):
  ``{"name", "tags", "fields", "timestamp"}``; a field is looked up as ``<name>.<field>``, then
  ``<field>``, then — for Telegraf's prometheus input (fields ``gauge``/``counter``/``value``) —
  ``<name>``. The timestamp may be in s, ms, µs or ns.
- ``prometheus_kafka_adapter``: ``{"timestamp": RFC 3339, "value": "45", "name", "labels"}``.

A metric maps to a GPU metric (``gpu_temp``) or a port field (``port.symbol_error_counter``)
through :data:`BUILTIN_MAP` (every dcgm-exporter series, node-exporter's infiniband series,
Telegraf's ``nvidia_smi`` and ``infiniband`` plugins) plus ``exporters.kafka.metric_map``. Tags
(``node_tags``, ``gpu_tags``, ``port_device_tag``, ``port_tag``) say which node, GPU or port a value
belongs to. Samples of one node within a ``window_s`` window make one record, emitted ``grace_s``
after the window ends. Messages that cannot be read are counted per reason and, with
``dead_letter``, sent to the deadletter topic (best effort: one that cannot be sent is dropped and
counted, the other records go on; see :mod:`fleetmedic.connectors.runtime`); values of metrics not
in the map are ignored.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.connectors.kafka_telemetry.exporter_map import BadMessage, PointMapper, Windows
from fleetmedic.connectors.runtime import ConnectorMetrics, Outbox, Outgoing, run_consumer, telemetry_outgoing


class KafkaTelemetrySource:
    def __init__(self, settings: Settings, outbox: Outbox, metrics: ConnectorMetrics,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.cfg = settings.exporters.kafka
        if not self.cfg.topics:
            raise ValueError("exporters.kafka.topics: name at least one topic to read")
        self.outbox = outbox
        self.metrics = metrics
        self.clock = clock
        self.mapper = PointMapper(self.cfg)
        self.windows = Windows(self.cfg.window_s, self.cfg.grace_s, settings.ingest, f"kafka-{self.cfg.format}")

    async def run(self, stop: asyncio.Event) -> None:
        await run_consumer(self.settings, self.cfg.topics, self.cfg.group_id, stop, self.metrics, self.handle,
                           lambda: self.emit(self.clock()))
        await self.emit(math.inf)  # stopping: what is gathered goes out with the drain

    async def handle(self, topic: str, value: bytes | None, partition: int | None = None,
                     offset: int | None = None) -> None:
        try:
            points = self.mapper.points(value or b"")
        except BadMessage as exc:
            self.metrics.skipped(exc.label)
            if self.cfg.dead_letter:
                try:
                    dead = r.DeadLetter(ts=self.clock(), topic=topic, stage="exporter-kafka", error=str(exc)[:4096],
                                        original=value or b"", partition=partition, offset=offset, key=topic)
                except Exception as failed:  # never the connector's end: counted, logged once per reason
                    self.metrics.dead_letter_failed(failed, f"for {topic}[{partition}]@{offset}")
                    return
                # sent apart from the telemetry: one the broker refuses is dropped and counted (runtime.pump)
                await self.outbox.put(Outgoing(self.settings.topics.topic("deadletter"), topic, dead))
            return
        for p in points:
            self.windows.add(p)

    async def emit(self, now: float) -> None:
        for rec in self.windows.due(now):
            await self.outbox.put(telemetry_outgoing(rec, self.settings))
        for reason, n in self.windows.skipped.items():
            self.metrics.skipped(reason, n)
        self.windows.skipped.clear()
