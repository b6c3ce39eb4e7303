"""``fleetmedic exporter remote-write --listen HOST:PORT``: a Prometheus remote-write 1.0 receiver
(aiohttp) that publishes telemetry records to Kafka like the other connectors.

Prometheus (or any remote-write 1.0 sender) posts to ``exporters.remote_write.path``
(``/api/v1/write``). The answer tells the sender what to do with the request:

- **204**: taken. Its samples are held until their scrape is complete
  (:class:`~fleetmedic.connectors.remote_write.Assembler`, ``assemble_s``), then mapped to records
  and queued for Kafka; the queue is sent and retried with backoff as for every connector
  (:mod:`fleetmedic.connectors.runtime`), and drained on SIGTERM.
- **400** (415 for a remote-write 2.0 message): the request can never be read (wrong
  Content-Type or Content-Encoding, a body over ``max_body_bytes`` or announcing more than
  ``max_decompressed_bytes``, bad snappy, bad protobuf); the sender drops it. The body of the
  answer says why. A request whose reading raises (a bug) is also answered 400, counted as
  ``internal_<exception>`` and logged: retried, it would fail again and stall the sender's queue.
- **503**: try again later. Publishing to Kafka is failing (the last send failed and records are
  waiting), the outbox is full, or ``max_pending_samples`` are held already. Prometheus keeps the
  data in its write-ahead log and retries with backoff, so nothing is lost while Kafka is down.

Metrics (besides the ``fleetmedic_connector_*`` ones, whose ``records_out`` counts the records
Kafka took): ``fleetmedic_remote_write_requests_total{code}``,
``fleetmedic_remote_write_rejected_total{reason}`` (the 4xx by cause),
``fleetmedic_remote_write_samples_total{outcome}`` (read, ignored, stale, skipped, late),
``fleetmedic_remote_write_records_total`` (records queued for Kafka) and
``fleetmedic_remote_write_pending_samples``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from fleetmedic.config import Settings
from fleetmedic.connectors.prometheus_text import ExpositionReader
from fleetmedic.connectors.remote_write import (
    Assembler,
    BadRequest,
    LabelCache,
    SampleCounts,
    decode_request,
    parse_listen,
)
from fleetmedic.connectors.runtime import ConnectorMetrics, Outbox, Outgoing, Sink, telemetry_outgoing

log = logging.getLogger("fleetmedic.connectors.remote_write")


class HealthSink:
    """A sink that remembers whether its last send failed (the receiver answers 503 meanwhile)."""

    def __init__(self, inner: Sink) -> None:
        self.inner = inner
        self.failing = False

    async def start(self) -> None:
        await self.inner.start()

    async def send_batch(self, items: list[Outgoing]) -> None:
        try:
            await self.inner.send_batch(items)
        except BaseException:
            self.failing = True
            raise
        self.failing = False

    async def stop(self) -> None:
        await self.inner.stop()


class RemoteWriteMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p = "fleetmedic_remote_write_"
        self.requests = Counter(f"{p}requests", "Remote-write requests answered, per HTTP status", ["code"],
                                registry=registry)
        self.rejected = Counter(f"{p}rejected", "Requests refused as unreadable (4xx), per cause", ["reason"],
                                registry=registry)
        self.samples = Counter(f"{p}samples", "Samples received, per outcome (read, ignored: a series fleetmedic "
                               "does not read, stale: staleness markers, skipped: bad, late: their scrape was "
                               "already published)", ["outcome"], registry=registry)
        self.records = Counter(f"{p}records", "Records made from the samples and queued for Kafka", registry=registry)
        self.pending = Gauge(f"{p}pending_samples", "Samples held until their scrape is complete", registry=registry)


class RemoteWriteReceiver:
    """The HTTP server and the release loop; ``run(stop)`` is the connector's source."""

    def __init__(self, settings: Settings, outbox: Outbox, metrics: ConnectorMetrics, registry: CollectorRegistry,
                 health: HealthSink | None = None, listen: str | None = None,
                 shutdown: asyncio.Event | None = None) -> None:
        self.settings = settings
        self.rw = settings.exporters.remote_write
        self.outbox = outbox
        self.metrics = metrics
        self.rw_metrics = RemoteWriteMetrics(registry)
        self.health = health
        self.host, self.port = parse_listen(listen if listen else self.rw.listen)
        self.reader = ExpositionReader.for_settings(settings, source="prometheus-remote-write", ignore_unknown=True)
        self.assembler = Assembler(self.reader, self.rw.assemble_s, self.rw.max_pending_samples,
                                   self.rw.max_nodes_tracked)
        self.label_cache = LabelCache()
        #: set to stop (SIGTERM): the server closes, what is held is released into the outbox, and
        #: only then does :meth:`run` return, so the pump's drain (which starts when the source
        #: has returned) sends it. Without it, ``stop`` plays that part.
        self.shutdown = shutdown
        self.bound: tuple[str, int] | None = None  # the address actually listened on (port 0: ephemeral)
        self._warned: dict[str, float] = {}

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._count])
        app.router.add_post(self.rw.path, self.handle)
        return app

    @web.middleware
    async def _count(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            resp: web.StreamResponse = await handler(request)
        except web.HTTPException as exc:  # 404, 405 from the router
            self.rw_metrics.requests.labels(str(exc.status)).inc()
            raise
        self.rw_metrics.requests.labels(str(resp.status)).inc()
        return resp

    async def run(self, stop: asyncio.Event) -> None:
        until = self.shutdown or stop
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
            await site.start()
            addresses = runner.addresses
            self.bound = (str(addresses[0][0]), int(addresses[0][1])) if addresses else (self.host, self.port)
            log.info("remote-write: listening on http://%s:%d%s", self.bound[0], self.bound[1], self.rw.path)
            tick = min(1.0, self.rw.assemble_s / 4)
            while not (until.is_set() or stop.is_set()):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(until.wait(), tick)
                self._release(everything=False)
        finally:
            await runner.cleanup()  # no new requests (those being read are answered); then what is held goes out
            self._release(everything=True)
            log.info("remote-write: stopped; %d records queued for Kafka", len(self.outbox))

    def _release(self, everything: bool) -> None:
        try:
            records = self.assembler.records(everything)
        except Exception:  # a reader bug: that batch is lost, the receiver goes on
            self.metrics.error("release_failed")
            log.exception("remote-write: mapping released samples failed")
            records = []
        reader = self.reader
        for reason, n in reader.skipped.items():
            self.metrics.skipped(reason, n)
        reader.skipped.clear()
        for rec in records:
            self.outbox.offer(telemetry_outgoing(rec, self.settings))
        if records:
            self.rw_metrics.records.inc(len(records))
        self.rw_metrics.pending.set(self.assembler.pending)

    def _busy(self) -> str:
        """Why a request must be retried later ("" when it can be taken)."""
        if self.health is not None and self.health.failing and len(self.outbox):
            return "publishing to Kafka is failing; retry later"
        if len(self.outbox) >= self.outbox.maxlen:
            return "the outbox is full; retry later"
        if not self.assembler.room_for(1):
            return "too many samples waiting for their scrape to complete; retry later"
        return ""

    async def handle(self, request: web.Request) -> web.Response:
        busy = self._busy()
        if busy:
            return web.Response(status=503, text=busy + "\n")
        rw = self.rw
        try:
            if request.content_length is not None and request.content_length > rw.max_body_bytes:
                raise BadRequest("too_large", f"body of {request.content_length} bytes, over the limit of "
                                              f"{rw.max_body_bytes}")
            body = await _read_capped(request, rw.max_body_bytes)
            message = decode_request(body, request.headers, rw.max_body_bytes, rw.max_decompressed_bytes)
            counts = SampleCounts()
            late = self.assembler.late
            taken = self.assembler.take(message, self.reader.skipped, counts, self.label_cache)
        except BadRequest as exc:
            self.rw_metrics.rejected.labels(exc.kind).inc()
            self._warn(exc.kind, f"remote-write: refused a request from {request.remote} ({exc.status}): {exc}")
            return web.Response(status=exc.status, text=f"{exc}\n")
        except Exception as exc:  # a reader bug: answered 400, since a request retried forever would stall the sender
            kind = f"internal_{type(exc).__name__}"
            self.rw_metrics.rejected.labels(kind).inc()
            self.metrics.error(kind)
            log.exception("remote-write: reading a request failed; answered 400 so that it is not retried")
            return web.Response(status=400, text=f"the request could not be read ({type(exc).__name__})\n")
        if taken is None:
            return web.Response(status=503, text="too many samples waiting for their scrape to complete; "
                                                 "retry later\n")
        late = self.assembler.late - late
        unmapped = counts.read - taken - late  # of series the reader cannot map (no node label...): skipped
        m = self.rw_metrics.samples
        for outcome, n in (("read", taken), ("late", late), ("ignored", counts.ignored),
                           ("stale", counts.stale), ("skipped", counts.skipped + unmapped)):
            if n:
                m.labels(outcome).inc(n)
        self.rw_metrics.pending.set(self.assembler.pending)
        return web.Response(status=204)

    def _warn(self, kind: str, message: str) -> None:
        """Log a kind of refusal at most once a minute."""
        now = time.monotonic()
        if now - self._warned.get(kind, -1e9) >= 60.0:
            self._warned[kind] = now
            log.warning("%s", message)


async def _read_capped(request: web.Request, limit: int) -> bytes:
    body = bytearray()
    async for chunk in request.content.iter_chunked(1 << 16):
        body += chunk
        if len(body) > limit:
            raise BadRequest("too_large", f"body over the limit of {limit} bytes")
    return bytes(body)
