"""The bind-time check served by the decision worker (``admission.enabled``): an HTTPS endpoint
(aiohttp, on the worker's event loop) that answers the API server's validating webhook for pod
bindings with :func:`fleetmedic.remediation.admission.review` over the decision engine's live
:meth:`~fleetmedic.remediation.engine.DecisionEngine.cordons_in_flight`: the nodes fleetmedic
decided to take out of service whose cordon has not landed yet. The check reads the engine in the
same event loop that changes it, so a decision is refused at bind time from the moment it is made,
before its command has reached the executor.

The certificate and key are read again when their files change (:class:`~fleetmedic.tls_files.TlsFiles`,
looked at every ``CHECK_FILES_S`` at most): a rotation needs no restart.
Answers are counted in ``fleetmedic_admission_reviews_total{outcome}`` (allowed, denied,
would_deny in dry run, unreadable, other: not a bind). A request that is not an AdmissionReview is
answered 400 (it has no request uid to answer); the webhook configuration fails
open, so an unreachable or broken check never stops scheduling."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from fleetmedic.config import AdmissionSettings
from fleetmedic.remediation.admission import review
from fleetmedic.tls_files import TlsFiles

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 3 * 1024 * 1024  # the API server's own request limit for an object, with room
CHECK_FILES_S = 30.0  # how often the certificate files are looked at, at most


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
        if answer.outcome == "unreadable":  # no request uid to answer
            return web.Response(status=400, text=f"not an AdmissionReview: {answer.reason}")
        return web.Response(body=answer.body, content_type="application/json")

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop``; a certificate that cannot be read at start raises ValueError."""
        tls = TlsFiles(self.settings.cert_file, self.settings.key_file, CHECK_FILES_S, field="admission.")
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port, reuse_address=True, ssl_context=tls.server_context())
            await site.start()
            addresses = runner.addresses
            self.bound = (str(addresses[0][0]), int(addresses[0][1])) if addresses else (self.host, self.port)
            log.info("admission: bind-time check on https://%s:%d%s", *self.bound, self.settings.path)
            await stop.wait()
        finally:
            await runner.cleanup()
