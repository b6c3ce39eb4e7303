"""``fleetmedic exporter prometheus``: dcgm-exporter / node-exporter series -> telemetry records.

Two modes (``exporters.prometheus.mode``):

- ``scrape``: GET every target's text exposition each ``interval_s`` (dcgm-exporter on :9400,
  node-exporter on :9100) and map it with :class:`~fleetmedic.connectors.prometheus.text.ExpositionReader`;
  samples without a timestamp (the exporters write none) get the scrape time, and every sample gets
  the target's ``instance`` label (``host:port``) as Prometheus adds it, so node-exporter's samples
  (which name no node) and dcgm-exporter's from an exporter whose ``Hostname`` is its pod have a node.
  With ``discovery.enabled`` the targets also include the exporter pods the Kubernetes API lists
  (``label_selector`` in ``namespace``, listed again every ``refresh_s``): each running pod's IP at
  its ``metrics`` container port, with the pod's ``spec.nodeName`` as the target label
  ``discovery.node_label`` (``node``), which ``node_labels`` reads as for a relabelled Prometheus
  target. A failed listing is counted (``discovery_*`` errors) and the last list kept.
- ``api``: ask a Prometheus server (``/api/v1/query``) for the raw samples of ``api_selector`` over
  the last two intervals (a range selector, so every sample keeps its scrape timestamp), and map
  them the same way. A per-target watermark (``job``/``instance``) keeps samples already published
  from being published again.

Labels map to nodes as ``exporters.prometheus.node_labels`` says, to GPUs and ports as the
``ingest`` section says. Unknown series are ignored;
bad samples are counted per reason (``fleetmedic_connector_skipped_total``). An unreachable target
or server is counted as an error and retried on the next interval. Whatever a target answers, the
others go on: an answer over :data:`MAX_ANSWER_BYTES`, one that is not UTF-8 (read with
replacement characters, its bad lines skipped) or one whose reading raises is counted per target
and kind (``fleetmedic_connector_target_errors_total``) and logged with the target.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

from fleetmedic.config import PodDiscoverySettings, Settings
from fleetmedic.connectors.prometheus.api import (
    ApiAnswerError,
    ScrapeTarget,
    Watermarks,
    api_samples,
    map_samples,
    pod_targets,
)
from fleetmedic.connectors.prometheus.text import ExpositionReader, Sample, is_known_series
from fleetmedic.connectors.runtime import ConnectorMetrics, Outbox, sleep_or_stop, telemetry_outgoing
from fleetmedic.records import GpuTelemetry, PortTelemetry, json_limit_error

log = logging.getLogger("fleetmedic.connectors.prometheus")

#: the largest answer read from a target or from the Prometheus API (decompressed); dcgm-exporter's
#: for 8 GPUs is ~300 KB, node-exporter's a few MB. A larger one is counted as an error.
MAX_ANSWER_BYTES: Final = 64 << 20
_A = TypeVar("_A")


class AnswerTooLarge(Exception):
    """A target's answer over :data:`MAX_ANSWER_BYTES`."""


def target_label(url: str) -> str:
    """A target's URL without credentials or query (for logs and the metric label)."""
    try:
        u = urlsplit(url)
        host, port = u.hostname or "", u.port
    except ValueError:
        return "?"
    host = f"[{host}]" if ":" in host else host
    return f"{u.scheme}://{host}{f':{port}' if port else ''}{u.path}"


def instance_of(url: str) -> str:
    """The ``instance`` label Prometheus gives a target: its ``host:port`` (the scheme's default
    port when the URL has none)."""
    try:
        u = urlsplit(url)
        host, port = u.hostname or "", u.port
    except ValueError:
        return ""
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port or (443 if u.scheme == 'https' else 80)}"


def lines_of(text: str) -> Iterator[str]:
    """The lines of ``text`` one at a time (no list of them all: an answer of many tiny lines
    would cost ~50 bytes per line)."""
    start = 0
    while True:
        end = text.find("\n", start)
        if end < 0:
            yield text[start:]
            return
        yield text[start:end]
        start = end + 1


async def read_capped(resp: Any, limit: int | None = None) -> bytes:
    """The body of an aiohttp response, refused past ``limit`` bytes (default
    :data:`MAX_ANSWER_BYTES`; counted while reading, so a compressed answer cannot expand past it)."""
    limit = MAX_ANSWER_BYTES if limit is None else limit
    if resp.content_length is not None and resp.content_length > limit:
        raise AnswerTooLarge(f"answer of {resp.content_length} bytes, over {limit}")
    body = bytearray()
    async for chunk in resp.content.iter_chunked(1 << 16):
        body += chunk
        if len(body) > limit:
            raise AnswerTooLarge(f"answer over {limit} bytes")
    return bytes(body)


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
        self._failing: dict[str, str] = {}  # target -> the kind of its last failure (to log changes only)
        self.reader = ExpositionReader.for_settings(settings, source=f"prometheus-{self.p.mode}", ignore_unknown=True)
        if self.p.mode == "scrape" and not self.p.targets and not self.p.discovery.enabled:
            raise ValueError("exporters.prometheus.targets: scrape mode needs at least one target URL "
                             "(or discovery.enabled)")
        self.static_targets = [ScrapeTarget(url, {"instance": instance_of(url)}) for url in self.p.targets]
        self.discovered: list[ScrapeTarget] = []
        self.pods = PodLister(self.p.discovery) if self.p.mode == "scrape" and self.p.discovery.enabled else None
        self._discovery_failing = ""
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
        try:
            await self._loop(aiohttp.ClientSession(timeout=timeout), stop)
        finally:
            if self.pods is not None:
                self.pods.close()

    async def _loop(self, client_session: Any, stop: asyncio.Event) -> None:
        async with client_session as session:
            next_discovery = 0.0
            while not stop.is_set():
                started = time.monotonic()
                if self.pods is not None and started >= next_discovery:
                    next_discovery = started + self.p.discovery.refresh_s
                    await self.discover()
                try:
                    await self.tick(session)
                except Exception as exc:  # not expected (each target is guarded): try again next interval
                    self.metrics.error(f"tick_{type(exc).__name__}")
                    log.exception("prometheus: a %s round failed; trying again next interval", self.p.mode)
                if await sleep_or_stop(stop, self.p.interval_s - (time.monotonic() - started)):
                    return

    def targets(self) -> list[ScrapeTarget]:
        """What scrape mode scrapes: the configured URLs, then the discovered pods."""
        return self.static_targets + self.discovered

    async def discover(self) -> list[ScrapeTarget]:
        """List the exporter pods again (in a thread: the client blocks); on failure the last list
        is kept. Returns the discovered targets."""
        assert self.pods is not None
        try:
            pods = await asyncio.to_thread(self.pods.list)
        except Exception as exc:  # API server unreachable, 403 without RBAC, a bad kubeconfig: try next refresh
            kind = f"discovery_{type(exc).__name__}"
            self.metrics.error(kind)
            if self._discovery_failing != kind:
                self._discovery_failing = kind
                log.warning("prometheus: listing exporter pods failed (%s: %s); keeping the %d known",
                            kind, str(exc)[:300], len(self.discovered))
            return self.discovered
        if self._discovery_failing:
            self._discovery_failing = ""
            log.info("prometheus: listing exporter pods works again")
        skipped: Counter[str] = Counter()
        found = pod_targets(pods, self.p.discovery, skipped)
        for reason, n in skipped.items():
            self.metrics.skipped(reason, n)
        if [t.url for t in found] != [t.url for t in self.discovered]:
            log.info("prometheus: %d exporter pods to scrape (%s)", len(found),
                     ", ".join(f"{t.pod} on {t.labels.get(self.p.discovery.node_label)}" for t in found[:5])
                     + (", ..." if len(found) > 5 else ""))
        self.discovered = found
        live = {t.url for t in self.targets()}
        for url in [u for u in self._failing if u not in live]:  # pods gone: forget their failures
            del self._failing[url]
        return found

    async def tick(self, session: Any) -> int:
        """One scrape or poll; returns the number of records queued."""
        reader = self.reader  # kept across ticks: it caches the exporters' label sets
        reader.skipped.clear()
        records: list[GpuTelemetry | PortTelemetry] = []
        if self.p.mode == "scrape":
            targets = self.targets()
            texts = await asyncio.gather(*(self._get_text(session, t.url) for t in targets))
            for target, text in zip(targets, texts, strict=True):
                if text is not None:
                    records += self._guarded(target.url, self._from_text, (text, target.labels))
        else:
            doc = await self._query(session)
            if doc is not None:
                try:
                    samples = list(api_samples(doc, reader.skipped))
                except ApiAnswerError as exc:
                    self.metrics.error("api_answer")
                    self.metrics.skipped(f"api answer: {exc}")
                    return 0
                except Exception as exc:  # an answer nothing foresaw: counted and logged, next interval
                    self._failed(self.p.api_url, f"answer_{type(exc).__name__}", exc)
                    return 0
                records = self._guarded(self.p.api_url, self._from_samples, samples)
        for reason, n in reader.skipped.items():
            self.metrics.skipped(reason, n)
        for rec in records:
            self.outbox.offer(telemetry_outgoing(rec, self.settings))
        return len(records)

    def _from_text(self, answer: tuple[str, dict[str, str]]) -> list[GpuTelemetry | PortTelemetry]:
        text, target = answer
        return map_samples(self.reader, self.reader.parse(lines_of(text), default_ts=self.clock(), extra_labels=target))

    def _from_samples(self, samples: list[Sample]) -> list[GpuTelemetry | PortTelemetry]:
        return map_samples(self.reader, self.watermarks.fresh(s for s in samples if is_known_series(s[0])))

    def _guarded(self, url: str, read: Callable[[_A], list[GpuTelemetry | PortTelemetry]], answer: _A
                 ) -> list[GpuTelemetry | PortTelemetry]:
        """``read(answer)``'s records, or none when it raises: that target's answer is lost for this
        round (counted and logged with the target), the other targets' are not."""
        try:
            got = read(answer)
        except Exception as exc:  # a reader bug, or an answer nothing foresaw
            self._failed(url, f"answer_{type(exc).__name__}", exc)
            return []
        self._recovered(url)
        return got

    def _failed(self, url: str, kind: str, exc: BaseException | None = None) -> None:
        target = target_label(url)
        self.metrics.error(kind)
        self.metrics.target_error(target, kind)
        if self._failing.get(url) != kind:  # logged when it starts failing this way, not every interval
            self._failing[url] = kind
            log.warning("prometheus: target %s failed (%s%s); the other targets go on", target, kind,
                        f": {str(exc)[:300]}" if exc is not None else "")

    def _recovered(self, url: str) -> None:
        if self._failing.pop(url, None) is not None:
            log.info("prometheus: target %s answers again", target_label(url))

    async def _get_text(self, session: Any, url: str) -> str | None:
        try:
            async with session.get(url, headers=self._headers()) as resp:
                if resp.status != 200:
                    self._failed(url, f"http_{resp.status}")
                    return None
                return (await read_capped(resp)).decode("utf-8", "replace")
        except Exception as exc:  # connection refused, timeout, aiohttp.ClientError, too large: next interval
            self._failed(url, type(exc).__name__, exc)
            return None

    async def _query(self, session: Any) -> Any:
        window = max(1, math.ceil(2 * self.p.interval_s))
        query = f"{self.p.api_selector}[{window}s]"
        url = self.p.api_url.rstrip("/") + "/api/v1/query"
        try:
            async with session.get(url, params={"query": query}, headers=self._headers()) as resp:
                if resp.status != 200:
                    self._failed(self.p.api_url, f"http_{resp.status}")
                    return None
                body = await read_capped(resp)
                refused = json_limit_error(body, MAX_ANSWER_BYTES)
                if refused is not None:
                    raise ValueError(f"the answer is refused: {refused}")
                return json.loads(body)
        except Exception as exc:  # connection refused, timeout, bad JSON, too large: try next interval
            self._failed(self.p.api_url, type(exc).__name__, exc)
            return None


class PodLister:
    """Lists the exporter pods of ``discovery`` through the Kubernetes API (raw JSON, no model
    decoding); the client is made on first use (in-cluster, or from a kubeconfig)."""

    def __init__(self, d: PodDiscoverySettings, api: Any = None) -> None:
        self.d = d
        self._api = api

    def client(self) -> Any:
        if self._api is None:
            from kubernetes import client, config

            if self.d.in_cluster:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
                self._api = client.ApiClient()
            else:
                path = self.d.kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or os.path.expanduser(
                    "~/.kube/config")
                self._api = config.new_client_from_config(config_file=path)  # type: ignore[no-untyped-call]
        return self._api

    def close(self) -> None:
        if self._api is not None:
            api, self._api = self._api, None
            api.close()

    def list(self) -> list[dict[str, Any]]:
        from fleetmedic.connectors.kube.jobs import resource_path
        from fleetmedic.kube_watch import list_objects

        items, _ = list_objects(self.client(), resource_path("Pod", self.d.namespace), self.d.label_selector)
        return items
