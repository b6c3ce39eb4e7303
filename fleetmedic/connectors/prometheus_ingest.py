"""``fleetmedic exporter prometheus``: dcgm-exporter / node-exporter series -> telemetry records.

Two modes (``exporters.prometheus.mode``):

- ``scrape``: GET every target's text exposition each ``interval_s`` (dcgm-exporter on :9400,
  node-exporter on :9100) and map it with :class:`~fleetmedic.connectors.prometheus_text.ExpositionReader`;
  samples without a timestamp (the exporters write none) get the scrape time.
- ``api``: ask a Prometheus server (``/api/v1/query``) for the raw samples of ``api_selector`` over
  the last two intervals (a range selector, so every sample keeps its scrape timestamp), and map
  them the same way. A per-target watermark (``job``/``instance``) keeps samples already published
  from being published again.

Labels map to nodes, GPUs and ports as the ``ingest`` section says. Unknown series are ignored;
bad samples are counted per reason (``fleetmedic_connector_skipped_total``). An unreachable target
or server is counted as an error and retried on the next interval.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

from fleetmedic.config import Settings
from fleetmedic.connectors.prometheus_api import ApiAnswerError, Watermarks, api_samples, map_samples
from fleetmedic.connectors.prometheus_text import ExpositionReader, is_known_series
from fleetmedic.connectors.runtime import ConnectorMetrics, Outbox, sleep_or_stop, telemetry_outgoing
from fleetmedic.records import GpuTelemetry, PortTelemetry


class PrometheusSource:
    """The scrape/poll loop; ``session`` is an ``aiohttp.ClientSession``."""

    def __init__(self, settings: Settings, outbox: Outbox, metrics: ConnectorMetrics,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.p = settings.exporters.prometheus
        self.outbox = outbox
        self.metrics = metrics
        self.clock = clock
        self.watermarks = Watermarks()
        self.reader = ExpositionReader(settings.ingest, source=f"prometheus-{self.p.mode}", ignore_unknown=True)
        if self.p.mode == "scrape" and not self.p.targets:
            raise ValueError("exporters.prometheus.targets: scrape mode needs at least one target URL")
        if self.p.mode == "api" and not self.p.api_url:
            raise ValueError("exporters.prometheus.api_url: api mode needs the Prometheus server's URL")

    def _headers(self) -> dict[str, str]:
        if not self.p.bearer_token_file:
            return {}
        with open(self.p.bearer_token_file, encoding="utf-8") as fh:
            return {"Authorization": f"Bearer {fh.read().strip()}"}

    async def run(self, stop: asyncio.Event) -> None:
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=self.p.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not stop.is_set():
                started = time.monotonic()
                await self.tick(session)
                if await sleep_or_stop(stop, self.p.interval_s - (time.monotonic() - started)):
                    return

    async def tick(self, session: Any) -> int:
        """One scrape or poll; returns the number of records queued."""
        reader = self.reader  # kept across ticks: it caches the exporters' label sets
        reader.skipped.clear()
        records: list[GpuTelemetry | PortTelemetry] = []
        if self.p.mode == "scrape":
            texts = await asyncio.gather(*(self._get_text(session, url) for url in self.p.targets))
            for text in texts:
                if text is not None:
                    records += map_samples(reader, reader.parse(text.splitlines(), default_ts=self.clock()))
        else:
            doc = await self._query(session)
            if doc is not None:
                try:
                    samples = list(api_samples(doc, reader.skipped))
                except ApiAnswerError as exc:
                    self.metrics.error("api_answer")
                    self.metrics.skipped(f"api answer: {exc}")
                    return 0
                records = map_samples(reader, self.watermarks.fresh(s for s in samples if is_known_series(s[0])))
        for reason, n in reader.skipped.items():
            self.metrics.skipped(reason, n)
        for rec in records:
            self.outbox.offer(telemetry_outgoing(rec, self.settings))
        return len(records)

    async def _get_text(self, session: Any, url: str) -> str | None:
        try:
            async with session.get(url, headers=self._headers()) as resp:
                if resp.status != 200:
                    self.metrics.error(f"http_{resp.status}")
                    return None
                text: str = await resp.text()
                return text
        except Exception as exc:  # connection refused, timeout, aiohttp.ClientError: try next interval
            self.metrics.error(type(exc).__name__)
            return None

    async def _query(self, session: Any) -> Any:
        window = max(1, math.ceil(2 * self.p.interval_s))
        query = f"{self.p.api_selector}[{window}s]"
        url = self.p.api_url.rstrip("/") + "/api/v1/query"
        try:
            async with session.get(url, params={"query": query}, headers=self._headers()) as resp:
                if resp.status != 200:
                    self.metrics.error(f"http_{resp.status}")
                    return None
                return await resp.json(content_type=None)
        except Exception as exc:  # connection refused, timeout, bad JSON: count and try next interval
            self.metrics.error(type(exc).__name__)
            return None
