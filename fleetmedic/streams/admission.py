"""The bind-time check served by the decision worker (``admission.enabled``): an HTTPS endpoint
(aiohttp, on the worker's event loop) that answers the API server's validating webhook for pod
bindings with :func:`fleetmedic.remediation.admission.review` over the decision engine's live
:meth:`~fleetmedic.remediation.engine.DecisionEngine.cordons_in_flight`: the nodes fleetmedic
decided to take out of service whose cordon has not landed yet. The check reads the engine in the
same event loop that changes it, so a decision is refused at bind time from the moment it is made,
before its command has reached the executor.

The certificate and key are read again when their files change (a rotation needs no restart).
Answers are counted in ``fleetmedic_admission_reviews_total{outcome}`` (allowed, denied,
would_deny in dry run, unreadable, other: not a bind). A request that is not an AdmissionReview is
answered with an allowing review when it has a uid, 400 otherwise; the webhook configuration fails
open, so an unreachable or broken check never stops scheduling."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import Callable, Mapping

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from fleetmedic.config import AdmissionSettings
from fleetmedic.remediation.admission import review

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 3 * 1024 * 1024  # the API server's own request limit for an object, with room
CHECK_FILES_S = 30.0


class AdmissionServer:
    def __init__(self, settings: AdmissionSettings, refused: Callable[[], Mapping[str, str]],
                 dry_run: Callable[[], bool], registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        self.refused = refused
        self.dry_run = dry_run
        host, _, port = settings.listen.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.bound: tuple[str, int] | None = None  # the address listened on, once listening
        self.reviews = Counter("fleetmedic_admission_reviews", "Bind-time checks answered, by outcome",
                               ["outcome"], registry=registry)
        self._stamp: tuple[float, float] = (0.0, 0.0)
        self._context: ssl.SSLContext | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post(self.settings.path, self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        answer = review(body, self.refused(), self.dry_run())
        self.reviews.labels(answer.outcome).inc()
        if answer.outcome == "denied":
            log.info("admission: bind to %s refused (%s)", answer.node, answer.reason)
        if answer.outcome == "unreadable" and b'"uid"' not in body:
            return web.Response(status=400, text=f"not an AdmissionReview: {answer.reason}")
        return web.Response(body=answer.body, content_type="application/json")

    def context(self) -> ssl.SSLContext:
        """The TLS context, its certificate loaded again when the files changed."""
        stamp = (os.stat(self.settings.cert_file).st_mtime, os.stat(self.settings.key_file).st_mtime)
        if self._context is None or stamp != self._stamp:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.load_cert_chain(self.settings.cert_file, self.settings.key_file)
            self._context, self._stamp = ctx, stamp
        return self._context

    def _pick(self, conn: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext) -> None:
        try:
            conn.context = self.context()
        except (OSError, ssl.SSLError) as exc:  # keep serving with the certificate loaded last
            log.warning("admission: certificate files unreadable, keeping the loaded ones: %s", exc)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop``; a certificate that cannot be read at start raises."""
        ctx = self.context()
        ctx.sni_callback = self._pick
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port, reuse_address=True, ssl_context=ctx)
            await site.start()
            addresses = runner.addresses
            self.bound = (str(addresses[0][0]), int(addresses[0][1])) if addresses else (self.host, self.port)
            log.info("admission: bind-time check on https://%s:%d%s", *self.bound, self.settings.path)
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), CHECK_FILES_S)
        finally:
            await runner.cleanup()
