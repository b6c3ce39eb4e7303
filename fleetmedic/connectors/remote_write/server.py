"""``fleetmedic exporter remote-write --listen HOST:PORT``: a Prometheus remote-write 1.0 receiver
(aiohttp) that publishes telemetry records to Kafka like the other connectors.

Prometheus (or any remote-write 1.0 sender) posts to ``exporters.remote_write.path``
(``/api/v1/write``). The answer tells the sender what to do with the request:

- **204**: taken, and kept until Kafka has it. Its samples are held until their scrape is complete
  (:class:`~fleetmedic.connectors.remote_write.assembler.Assembler`, ``assemble_s``), then mapped to records
  and queued for Kafka; the queue is sent and retried with backoff as for every connector
  (:mod:`fleetmedic.connectors.runtime`), and drained on SIGTERM. A record of a 204 is never
  dropped to make room (:meth:`Outbox.keep <fleetmedic.connectors.runtime.Outbox.keep>`): the
  receiver answers 503 instead of taking more.
- **400** (415 for a remote-write 2.0 message): the request can never be read (wrong
  Content-Type or Content-Encoding, a body over ``max_body_bytes`` or announcing more than
  ``max_decompressed_bytes``, bad snappy, bad protobuf); the sender drops it. The body of the
  answer says why. A request whose reading raises (a bug) is also answered 400, counted as
  ``internal_<exception>`` and logged: retried, it would fail again and stall the sender's queue.
- **401**: the request carries no accepted credentials (:mod:`fleetmedic.connectors.remote_write.auth`).
- **503** (with ``Retry-After: retry_after_s``): try again later. Publishing to Kafka is failing
  (the last send failed and records are waiting), the outbox holds ``exporters.queue_max`` records,
  ``max_pending_samples`` are held already, the bodies being received would pass
  ``max_inflight_bytes``, or the body did not arrive within ``body_timeout_s`` (the connection is
  then closed). Prometheus keeps the data in its write-ahead log and retries with backoff.

A connection whose request headers are not complete ``header_timeout_s`` after it opened or after
its last answer is closed (aiohttp's keep-alive timer, which runs until a request's headers are
in). A sender that goes away mid-body is counted (``client_disconnect``, and code 499 in
``requests_total``) and logged at most once a minute.

Metrics (besides the ``fleetmedic_connector_*`` ones, whose ``records_out`` counts the records
Kafka took): ``fleetmedic_remote_write_requests_total{code}``,
``fleetmedic_remote_write_rejected_total{reason}`` (every request not taken, by cause),
``fleetmedic_remote_write_samples_total{outcome}`` (read, ignored, stale, skipped, late),
``fleetmedic_remote_write_records_total`` (records queued for Kafka),
``fleetmedic_remote_write_pending_samples`` and ``fleetmedic_remote_write_inflight_bytes``.
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
from fleetmedic.connectors.prometheus.text import ExpositionReader
from fleetmedic.connectors.remote_write.assembler import (
    Assembler,
    LabelCache,
    SampleCounts,
    parse_listen,
)
from fleetmedic.connectors.remote_write.auth import Credentials, check_exposure, tls_files
from fleetmedic.connectors.remote_write.codec import (
    BadRequest,
    decode_request,
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
        self.rejected = Counter(f"{p}rejected", "Requests not taken, per cause (unreadable: 4xx; unauthorized: "
                                "401; busy: 503; client_disconnect: the sender went away mid-body)", ["reason"],
                                registry=registry)
        self.samples = Counter(f"{p}samples", "Samples received, per outcome (read, ignored: a series fleetmedic "
                               "does not read, stale: staleness markers, skipped: bad, late: their scrape was "
                               "already published)", ["outcome"], registry=registry)
        self.records = Counter(f"{p}records", "Records made from the samples and queued for Kafka", registry=registry)
        self.pending = Gauge(f"{p}pending_samples", "Samples held until their scrape is complete", registry=registry)
        self.inflight = Gauge(f"{p}inflight_bytes", "Bytes of request bodies being received", registry=registry)


#: the status counted for a request whose sender went away before its body was in (nginx's "client
#: closed request"; never received by anyone)
CLIENT_CLOSED = 499


class Busy(Exception):
    """A request to answer 503 (retry later): ``reason`` is a metric label, the message says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class InflightBytes:
    """The bytes of the bodies being received, all requests together, kept under ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


class RemoteWriteReceiver:
    """The HTTP server and the release loop; ``run(stop)`` is the connector's source."""

    def __init__(self, settings: Settings, outbox: Outbox, metrics: ConnectorMetrics, registry: CollectorRegistry,
                 health: HealthSink | None = None, listen: str | None = None,
                 shutdown: asyncio.Event | None = None) -> None:
        self.settings = settings
        self.rw = rw = settings.exporters.remote_write
        self.outbox = outbox
        self.metrics = metrics
        self.rw_metrics = RemoteWriteMetrics(registry)
        self.health = health
        self.host, self.port = parse_listen(listen if listen else rw.listen)
        check_exposure(self.host, rw)
        self.credentials = Credentials(rw.auth, rw.files_check_s)
        self.tls = tls_files(rw.tls, rw.files_check_s) if rw.tls.cert_file else None
        self.inflight = InflightBytes(rw.max_inflight_bytes)
        self.reader = ExpositionReader.for_settings(settings, source="prometheus-remote-write", ignore_unknown=True)
        self.assembler = Assembler(self.reader, rw.assemble_s, rw.max_pending_samples, rw.max_nodes_tracked)
        self.label_cache = LabelCache(rw.label_cache_max_series, rw.label_cache_max_bytes)
        self._cache_clears = 0
        #: set to stop (SIGTERM): the server closes, what is held is released into the outbox, and
        #: only then does :meth:`run` return, so the pump's drain (which starts when the source
        #: has returned) sends it. Without it, ``stop`` plays that part.
        self.shutdown = shutdown
        self.bound: tuple[str, int] | None = None  # the address actually listened on (port 0: ephemeral)
        self._warned: dict[str, float] = {}
        self._file_errors: dict[str, str] = {}  # the last error of the TLS files, of the credential files
        self._retry_after = {"Retry-After": str(rw.retry_after_s)} if rw.retry_after_s else {}

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
        # aiohttp's keep-alive timer runs from a connection's start and from each answer until
        # the next request's headers are in: the header timeout
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False,
                               keepalive_timeout=self.rw.header_timeout_s)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port, reuse_address=True,
                               ssl_context=self.tls.server_context() if self.tls else None)
            await site.start()
            addresses = runner.addresses
            self.bound = (str(addresses[0][0]), int(addresses[0][1])) if addresses else (self.host, self.port)
            log.info("remote-write: listening on %s://%s:%d%s", "https" if self.tls else "http", self.bound[0],
                     self.bound[1], self.rw.path)
            tick = min(1.0, self.rw.assemble_s / 4)
            while not (until.is_set() or stop.is_set()):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(until.wait(), tick)
                self._release(everything=False)
                self._check_files()
        finally:
            await runner.cleanup()  # no new requests (those being read are answered); then what is held goes out
            self._release(everything=True)
            log.info("remote-write: stopped; %d records queued for Kafka", len(self.outbox))

    def _check_files(self) -> None:
        """TLS files that changed take effect at the next handshake; one that cannot be read or
        used leaves the last good context (counted, logged at most once a minute)."""
        if self.tls is not None:
            self.tls.refresh()
        self.credentials.refresh()
        for kind, error in (("tls_files", self.tls.error if self.tls else ""), ("auth_files", self.credentials.error)):
            if error and error != self._file_errors.get(kind):
                self.metrics.error(kind)
                self._warn(kind, f"remote-write: {error}; the last good ones stay in use")
            self._file_errors[kind] = error

    def _release(self, everything: bool) -> None:
        if self.label_cache.clears != self._cache_clears:
            self._cache_clears = self.label_cache.clears
            self.metrics.error("label_cache_full")
            self._warn("label_cache", "remote-write: the label cache reached a limit (exporters.remote_write."
                       f"label_cache_max_series {self.rw.label_cache_max_series:,}, label_cache_max_bytes "
                       f"{self.rw.label_cache_max_bytes:,}) and was emptied ({self._cache_clears} times so far): "
                       "samples are decoded whole until it fills again; raise the limits, or spread the senders "
                       "over more receivers")
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
        for rec in records:  # answered 204: kept, never dropped for room (_busy refuses more meanwhile)
            self.outbox.keep(telemetry_outgoing(rec, self.settings))
        if records:
            self.rw_metrics.records.inc(len(records))
        self.rw_metrics.pending.set(self.assembler.pending)

    def _busy(self) -> None:
        """Raises :class:`Busy` when a request must be retried later."""
        if self.health is not None and self.health.failing and len(self.outbox):
            raise Busy("kafka_failing", "publishing to Kafka is failing; retry later")
        if len(self.outbox) >= self.outbox.maxlen:
            raise Busy("outbox_full", "the outbox is full; retry later")
        if not self.assembler.room_for(1):
            raise Busy("pending_full", "too many samples waiting for their scrape to complete; retry later")

    async def handle(self, request: web.Request) -> web.Response:
        rw = self.rw
        why = self.credentials.check(request.headers.get("Authorization"))
        if why:
            self._refuse(f"unauthorized_{why}", f"remote-write: refused a request from {request.remote} (401): "
                                                f"{'no' if why == 'missing' else 'wrong'} credentials ({why})")
            return web.Response(status=401, text="credentials required\n",
                                headers={"WWW-Authenticate": self.credentials.challenge()})
        try:
            self._busy()
            if request.content_length is not None and request.content_length > rw.max_body_bytes:
                raise BadRequest("too_large", f"body of {request.content_length} bytes, over the limit of "
                                              f"{rw.max_body_bytes}")
            body = await self._body(request)
            message = decode_request(body, request.headers, rw.max_body_bytes, rw.max_decompressed_bytes)
            del body
            self._busy()  # the outbox may have filled while the body arrived
            counts = SampleCounts()
            late = self.assembler.late
            taken = self.assembler.take(message, self.reader.skipped, counts, self.label_cache)
        except Busy as exc:
            self._refuse(exc.reason)
            if exc.reason != "body_timeout":
                return self._retry_later(str(exc))
            resp = self._retry_later(str(exc))  # sent now, then the connection is closed, not read to its end
            await resp.prepare(request)
            await resp.write_eof()
            request.protocol.force_close()
            return resp
        except ConnectionError:  # the sender went away mid-body: nobody reads the answer
            self._refuse("client_disconnect", f"remote-write: {request.remote} closed the connection before its "
                                              "body was in (counted as client_disconnect)")
            return web.Response(status=CLIENT_CLOSED)
        except BadRequest as exc:
            self._refuse(exc.kind, f"remote-write: refused a request from {request.remote} ({exc.status}): {exc}")
            return web.Response(status=exc.status, text=f"{exc}\n")
        except Exception as exc:  # a reader bug: answered 400, since a request retried forever would stall the sender
            kind = f"internal_{type(exc).__name__}"
            self.rw_metrics.rejected.labels(kind).inc()
            self.metrics.error(kind)
            log.exception("remote-write: reading a request failed; answered 400 so that it is not retried")
            return web.Response(status=400, text=f"the request could not be read ({type(exc).__name__})\n")
        if taken is None:
            self._refuse("pending_full")
            return self._retry_later("too many samples waiting for their scrape to complete; retry later")
        late = self.assembler.late - late
        unmapped = counts.read - taken - late  # of series the reader cannot map (no node label...): skipped
        m = self.rw_metrics.samples
        for outcome, n in (("read", taken), ("late", late), ("ignored", counts.ignored),
                           ("stale", counts.stale), ("skipped", counts.skipped + unmapped)):
            if n:
                m.labels(outcome).inc(n)
        self.rw_metrics.pending.set(self.assembler.pending)
        return web.Response(status=204)

    async def _body(self, request: web.Request) -> bytes:
        """The body, within ``body_timeout_s`` (else :class:`Busy`), its bytes counted in
        :attr:`inflight` while it arrives (:class:`Busy` when they would pass the limit)."""
        rw, inflight = self.rw, self.inflight
        held = request.content_length or 0  # reserved whole when announced, else chunk by chunk
        if not inflight.take(held):
            raise Busy("inflight_full", f"request bodies being received would pass max_inflight_bytes "
                                        f"({rw.max_inflight_bytes}); retry later")
        self.rw_metrics.inflight.set(inflight.used)
        body = bytearray()
        try:
            async with asyncio.timeout(rw.body_timeout_s):
                async for chunk in request.content.iter_chunked(1 << 16):
                    body += chunk
                    if len(body) > rw.max_body_bytes:
                        raise BadRequest("too_large", f"body over the limit of {rw.max_body_bytes} bytes")
                    if len(body) > held:
                        if not inflight.take(len(body) - held):
                            raise Busy("inflight_full", f"request bodies being received would pass "
                                                        f"max_inflight_bytes ({rw.max_inflight_bytes}); retry later")
                        held = len(body)
                    self.rw_metrics.inflight.set(inflight.used)
        except TimeoutError:
            raise Busy("body_timeout", f"the body did not arrive within body_timeout_s ({rw.body_timeout_s:g}); "
                                       "retry later") from None
        finally:
            inflight.give(held)
            self.rw_metrics.inflight.set(inflight.used)
        return bytes(body)

    def _retry_later(self, text: str) -> web.Response:
        return web.Response(status=503, text=text + "\n", headers=self._retry_after)

    def _refuse(self, reason: str, message: str = "") -> None:
        self.rw_metrics.rejected.labels(reason).inc()
        if message:
            self._warn(reason, message)

    def _warn(self, kind: str, message: str) -> None:
        """Log a kind of refusal at most once a minute."""
        now = time.monotonic()
        if now - self._warned.get(kind, -1e9) >= 60.0:
            self._warned[kind] = now
            log.warning("%s", message)
