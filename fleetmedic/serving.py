"""The one HTTP port every long-running fleetmedic process serves: ``/metrics``, ``/healthz`` and
``/readyz``.

``/metrics`` alone cannot tell a kubelet that a process is stuck: prometheus_client answers it from
its own thread, so a worker whose event loop stalled (a deadlock, a call that never returns) keeps
answering it. So each process's event loop *beats* (:meth:`Health.beat_every`, one task per loop;
``--role all`` has two, the decision stage's and stage 1's) and:

- ``/healthz`` (liveness) is 200 while every loop that beats has beaten within
  ``metrics.stall_after_s``, 503 naming the loop that stopped otherwise (restart me). Before the
  first beat it is 200 ``starting``: a long restore is the startup probe's to wait for.
- ``/readyz`` (readiness) is 200 once the process says it is ready (the decision stage restored and
  replayed, the executor holding its consumer, an exporter publishing) and is alive, 503 with the
  reason otherwise.
- Any other path serves the metrics (Prometheus scrapes ``/metrics``).

With ``cluster.name`` set, every sample served carries the label ``cluster=<name>``
(:class:`ClusterLabelled`), whatever registered it: one Prometheus, or one Grafana over several,
then tells the clusters apart without a relabelling rule of its own. The metric objects themselves
stay unlabelled (tests and code read them by their own labels).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import RestrictedRegistry

DEFAULT_BEAT_EVERY_S = 5.0


class Health:
    """What ``/healthz`` and ``/readyz`` answer. Thread-safe: loops beat, the server thread reads."""

    def __init__(self, stall_after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_after_s = stall_after_s
        self.clock = clock
        self._beats: dict[str, float] = {}
        self._ready = False
        self._why_not = "starting"
        self._lock = threading.Lock()

    def beat(self, loop: str = "main") -> None:
        with self._lock:
            self._beats[loop] = self.clock()

    def ready(self) -> None:
        with self._lock:
            self._ready, self._why_not = True, ""

    def not_ready(self, why: str) -> None:
        with self._lock:
            self._ready, self._why_not = False, why

    def liveness(self) -> tuple[int, str]:
        now = self.clock()
        with self._lock:
            if not self._beats:
                return 200, "starting"
            stalled = sorted((now - t, loop) for loop, t in self._beats.items() if now - t > self.stall_after_s)
        if stalled:
            age, loop = stalled[-1]
            return 503, (f"event loop {loop!r} has not run for {age:.0f}s "
                         f"(metrics.stall_after_s: {self.stall_after_s:g})")
        return 200, "ok"

    def readiness(self) -> tuple[int, str]:
        code, why = self.liveness()
        if code != 200:
            return code, why
        with self._lock:
            return (200, "ready") if self._ready else (503, self._why_not or "not ready")

    async def beat_every(self, loop: str = "main", every_s: float = DEFAULT_BEAT_EVERY_S) -> None:
        """Beat for ``loop`` until cancelled: run it as a task on the loop it vouches for."""
        while True:
            self.beat(loop)
            await asyncio.sleep(every_s)


#: the label every metric gets from ``cluster.name`` (the dashboard's variable and the alerts' grouping)
CLUSTER_LABEL = "cluster"


def _with_cluster(families: Iterable[Metric], cluster: str) -> Iterator[Metric]:
    """Each family with ``cluster=<cluster>`` on every sample (one with a ``cluster`` label keeps its own)."""
    for family in families:
        labelled = Metric(family.name, family.documentation, family.type, family.unit)
        labelled.samples = [s._replace(labels={CLUSTER_LABEL: cluster, **s.labels}) for s in family.samples]
        yield labelled


class ClusterLabelled(CollectorRegistry):
    """What ``source`` collects, with ``cluster=<cluster>`` on every sample. Served in place of ``source``."""

    def __init__(self, source: CollectorRegistry, cluster: str) -> None:
        super().__init__(auto_describe=False)
        self.source = source
        self.cluster = cluster

    def collect(self) -> Iterator[Metric]:
        return _with_cluster(self.source.collect(), self.cluster)

    def restricted_registry(self, names: Iterable[str]) -> RestrictedRegistry:
        """The ``name[]`` query of ``/metrics``: only those families, labelled the same."""
        return _RestrictedLabelled(names, self)


class _RestrictedLabelled(RestrictedRegistry):
    def __init__(self, names: Iterable[str], labelled: ClusterLabelled) -> None:
        super().__init__(names, labelled)
        self._inner = labelled.source.restricted_registry(names)
        self._cluster = labelled.cluster

    def collect(self) -> Iterator[Metric]:
        return _with_cluster(self._inner.collect(), self._cluster)


def exposed(registry: CollectorRegistry, cluster: str) -> CollectorRegistry:
    """What ``/metrics`` serves of ``registry``: labelled with ``cluster`` when it is set."""
    return ClusterLabelled(registry, cluster) if cluster else registry


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def health_app(registry: CollectorRegistry, health: Health, cluster: str = "") -> Callable[..., Iterable[bytes]]:
    """The WSGI app: the two probes, and the metrics on every other path (labelled with ``cluster``
    when it is set: :func:`exposed`)."""
    metrics = make_wsgi_app(exposed(registry, cluster))

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/readyz"):
            code, text = health.liveness() if path == "/healthz" else health.readiness()
            status = "200 OK" if code == 200 else "503 Service Unavailable"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [text.encode() + b"\n"]
        return metrics(environ, start_response)  # type: ignore[no-any-return]

    return app


def serve(registry: CollectorRegistry, port: int, addr: str, health: Health, cluster: str = "") -> WSGIServer:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``addr:port`` (0: a free port) from a
    daemon thread; every metric labelled ``cluster=<cluster>`` when it is set (``cluster.name``).
    ``server.server_address`` says where; ``server.shutdown()`` stops it."""
    server = make_server(addr, port, health_app(registry, health, cluster), _Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="fleetmedic-http", daemon=True).start()
    return server
