"""What every connector shares: a bounded outbox, the produce loop, backoff, metrics, sinks, SIGTERM.

A connector is a *source* (sampling on an interval, or consuming a Kafka topic) that puts
:class:`Outgoing` records into an :class:`Outbox`; :func:`pump` sends them to a :class:`Sink`
(Kafka, or a JSONL file for debugging and the device checks).

- **Backpressure.** The outbox is bounded (``exporters.queue_max``). Telemetry sources *offer*: when
  it is full the oldest record is dropped and counted (``fleetmedic_connector_dropped_total``), so
  a slow broker never grows memory and never blocks sampling. Consuming sources *put*, which waits
  for room: they simply stop reading their topic until Kafka catches up. A source that has already
  acknowledged its records to their sender (the remote-write receiver) *keeps* them: they are
  never dropped, and the source bounds the outbox itself by refusing new input while it is full.
- **Reconnects.** A failed send is retried after :class:`Backoff` delays (doubling, capped); the
  record stays at the head of the outbox meanwhile.
- **Metrics** (``fleetmedic_connector_*``, label ``connector``) on an injected ``CollectorRegistry``:
  records out per topic, bad input skipped per reason, errors per kind, failures per scrape target
  and kind (a target whose answer could not be fetched or read; the others go on), dropped
  records, queue depth, the time of the last successful send.
- **Stopping.** :func:`run_until_stopped` sets the stop event on SIGTERM/SIGINT; the pump then
  sends what is queued for up to ``drain_timeout_s`` and the sink is closed.
- **The cluster.** The sinks label every record with ``cluster.name`` (``cluster``), so several
  clusters' exporters can share one Kafka.
- **Dead letters** (a connector's own, for input it could not read) are best effort: the pump sends
  them apart from the other records, one at a time, after those went out. One that cannot be
  sent (refused by the broker as too large, a topic error, a value that does not encode) is dropped
  and counted (``fleetmedic_connector_dead_letter_failures_total{reason}``, logged once per
  reason); it never holds up, duplicates or loses the other records, nor stops the connector.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import signal
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from fleetmedic.config import Settings
from fleetmedic.connectors.errors import SourceUnavailable
from fleetmedic.records import DeadLetter, GpuTelemetry, JobEvent, PortTelemetry, Record, encode, labelled

log = logging.getLogger("fleetmedic.connectors")

__all__ = ["SourceUnavailable"]  # re-exported: the CLI and scripts catch it from here


@dataclass(frozen=True)
class Outgoing:
    """One record bound for a topic, with its partition key."""

    topic: str
    key: str
    record: Record


def telemetry_outgoing(record: Record, settings: Settings) -> Outgoing:
    """GpuTelemetry -> ``telemetry.gpu`` keyed by node; PortTelemetry -> ``telemetry.port`` by device;
    JobEvent -> ``jobs.events`` by job."""
    if isinstance(record, GpuTelemetry):
        return Outgoing(settings.topics.topic("telemetry.gpu"), record.node, record)
    if isinstance(record, PortTelemetry):
        return Outgoing(settings.topics.topic("telemetry.port"), record.device, record)
    if isinstance(record, JobEvent):
        return Outgoing(settings.topics.topic("jobs.events"), record.job, record)
    raise TypeError(f"no topic for {type(record).__name__}")


@dataclass
class Backoff:
    """Delays between retries: ``min_s``, doubling per failure up to ``max_s``; :meth:`reset` on success."""

    min_s: float
    max_s: float
    failures: int = 0

    def next_delay(self) -> float:
        delay = min(self.max_s, self.min_s * 2.0**self.failures)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0


_DIGITS = re.compile(r"\d+")


def reason_label(reason: str) -> str:
    """A bounded metric label from a skip reason: numbers become N, at most 80 characters."""
    return _DIGITS.sub("N", reason)[:80]


class ConnectorMetrics:
    def __init__(self, registry: CollectorRegistry, connector: str) -> None:
        self.connector = connector
        self._out = Counter("fleetmedic_connector_records_out", "Records produced, per topic",
                            ["connector", "topic"], registry=registry)
        self._skipped = Counter("fleetmedic_connector_skipped", "Bad input skipped, per reason",
                                ["connector", "reason"], registry=registry)
        self._errors = Counter("fleetmedic_connector_errors", "Errors talking to the source or the sink, per kind",
                               ["connector", "kind"], registry=registry)
        self._target_errors = Counter("fleetmedic_connector_target_errors",
                                      "Targets whose answer could not be fetched or read, per target and kind",
                                      ["connector", "target", "kind"], registry=registry)
        self._dropped = Counter("fleetmedic_connector_dropped", "Records dropped because the outbox was full",
                                ["connector"], registry=registry)
        self._depth = Gauge("fleetmedic_connector_queue_depth", "Records waiting in the outbox",
                            ["connector"], registry=registry)
        self._last = Gauge("fleetmedic_connector_last_success_timestamp_seconds",
                           "Unix time of the last record sent", ["connector"], registry=registry)
        self._dead_letter_failures = Counter("fleetmedic_connector_dead_letter_failures",
                                             "Dead letters that could not be made or sent (dropped; the other "
                                             "records go on), per reason", ["connector", "reason"], registry=registry)
        self._logged: set[str] = set()  # dead-letter failure reasons already logged

    def out(self, topic: str, n: int = 1) -> None:
        self._out.labels(self.connector, topic).inc(n)

    def skipped(self, reason: str, n: int = 1) -> None:
        self._skipped.labels(self.connector, reason_label(reason)).inc(n)

    def error(self, kind: str) -> None:
        self._errors.labels(self.connector, kind).inc()

    def target_error(self, target: str, kind: str) -> None:
        """A target (a configured URL, so a bounded label) failed this round: counted per kind."""
        self._target_errors.labels(self.connector, target, kind).inc()

    def dropped(self, n: int = 1) -> None:
        self._dropped.labels(self.connector).inc(n)

    def depth(self, n: int) -> None:
        self._depth.labels(self.connector).set(n)

    def success(self, now: float) -> None:
        self._last.labels(self.connector).set(now)

    def dead_letter_failed(self, exc: BaseException, what: str = "") -> None:
        """A dead letter could not be made or sent: counted per reason (the exception's type), logged
        once per reason (``what`` names the record)."""
        reason = reason_label(type(exc).__name__)
        self._dead_letter_failures.labels(self.connector, reason).inc()
        if reason not in self._logged:
            self._logged.add(reason)
            log.error("%s: a dead letter%s could not be sent (%s: %s); dropped and counted in "
                      "fleetmedic_connector_dead_letter_failures_total{reason=%r} (logged once per reason)",
                      self.connector, f" ({what})" if what else "", type(exc).__name__, str(exc)[:500], reason)


class Outbox:
    """A bounded FIFO of outgoing records (see the module docstring for offer vs put)."""

    def __init__(self, maxlen: int, metrics: ConnectorMetrics) -> None:
        self.maxlen = maxlen
        self.metrics = metrics
        self._items: deque[Outgoing] = deque()
        self._readable = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()

    def __len__(self) -> int:
        return len(self._items)

    def offer(self, item: Outgoing) -> None:
        """Add without waiting; when full, drop the oldest record (counted)."""
        if len(self._items) >= self.maxlen:
            self._items.popleft()
            self.metrics.dropped()
        self._append(item)

    def keep(self, item: Outgoing) -> None:
        """Add without waiting and without dropping anything, past ``maxlen`` if need be: for records
        whose sender was told they are taken. The caller refuses new input while the outbox is full."""
        self._append(item)

    async def put(self, item: Outgoing) -> None:
        """Add, waiting for room first (for sources that can pause, like a Kafka consumer)."""
        while len(self._items) >= self.maxlen:
            self._room.clear()
            await self._room.wait()
        self._append(item)

    def _append(self, item: Outgoing) -> None:
        self._items.append(item)
        self._readable.set()
        self.metrics.depth(len(self._items))

    def peek(self, n: int) -> list[Outgoing]:
        return [self._items[i] for i in range(min(n, len(self._items)))]

    def remove(self, items: list[Outgoing]) -> None:
        """Drop sent items from the head (those that ``offer`` already dropped are skipped)."""
        sent = {id(i) for i in items}
        while self._items and id(self._items[0]) in sent:
            self._items.popleft()
        if len(self._items) < self.maxlen:
            self._room.set()
        if not self._items:
            self._readable.clear()
        self.metrics.depth(len(self._items))

    async def wait_readable(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._readable.wait(), timeout)


class Sink(Protocol):
    async def start(self) -> None: ...

    async def send_batch(self, items: list[Outgoing]) -> None: ...

    async def stop(self) -> None: ...


class KafkaSink:
    """Sends to Kafka with aiokafka (acks and security from the ``kafka`` section)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.cluster = settings.cluster.name  # on every record it sends
        self._producer: Any = None

    async def start(self) -> None:
        from aiokafka import AIOKafkaProducer

        from fleetmedic.bus import TELEMETRY, producer_options

        k = self.settings.kafka
        timeout_ms = int(k.request_timeout_s * 1000)
        producer = AIOKafkaProducer(**producer_options(k, TELEMETRY, request_timeout_ms=timeout_ms))
        try:
            await producer.start()
        except BaseException:
            await producer.stop()
            raise
        self._producer = producer

    async def send_batch(self, items: list[Outgoing]) -> None:
        if self._producer is None:
            await self.start()
        cluster = self.cluster
        futures = [await self._producer.send(i.topic, value=encode(labelled(i.record, cluster)), key=i.key.encode())
                   for i in items]
        await asyncio.gather(*futures)

    async def stop(self) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await producer.stop()


class JsonlSink:
    """Writes ``{"topic", "key", "record"}`` per line to a file (``--output FILE``; ``-`` = stdout)."""

    def __init__(self, path: str, cluster: str = "") -> None:
        self.path = path
        self.cluster = cluster  # on every record it writes
        self._fh: IO[str] | None = None

    async def start(self) -> None:
        if self._fh is None:
            self._fh = open(self.path, "a", encoding="utf-8") if self.path != "-" else None  # noqa: SIM115

    async def send_batch(self, items: list[Outgoing]) -> None:
        lines = "".join(
            json.dumps({"topic": i.topic, "key": i.key, "record": json.loads(encode(labelled(i.record, self.cluster)))})
            + "\n" for i in items
        )
        if self.path == "-":
            print(lines, end="", flush=True)
            return
        if self._fh is None:
            await self.start()
        assert self._fh is not None
        self._fh.write(lines)
        self._fh.flush()

    async def stop(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


@dataclass
class PumpSettings:
    batch: int = 500
    drain_timeout_s: float = 10.0
    backoff: Backoff = field(default_factory=lambda: Backoff(0.5, 30.0))


async def pump(outbox: Outbox, sink: Sink, metrics: ConnectorMetrics, stop: asyncio.Event,
               settings: PumpSettings, clock: Callable[[], float] = time.time) -> None:
    """Send the outbox to the sink until ``stop`` is set, then drain for ``drain_timeout_s``."""
    drain_deadline: float | None = None
    while True:
        if stop.is_set():
            if drain_deadline is None:
                drain_deadline = time.monotonic() + settings.drain_timeout_s
            if not len(outbox) or time.monotonic() >= drain_deadline:
                break
        else:
            await outbox.wait_readable(0.2)
        items = outbox.peek(settings.batch)
        if not items:
            continue
        dead = [i for i in items if isinstance(i.record, DeadLetter)]
        plain = [i for i in items if not isinstance(i.record, DeadLetter)] if dead else items
        try:
            if plain:
                await sink.send_batch(plain)
        except Exception as exc:  # a broker down or slow: keep the records, retry later
            metrics.error(type(exc).__name__)
            delay = settings.backoff.next_delay()
            log.warning("%s: sending failed (%s), retrying in %.1fs", metrics.connector, exc, delay)
            with contextlib.suppress(Exception):
                await sink.stop()
            if drain_deadline is not None:
                delay = min(delay, max(0.0, drain_deadline - time.monotonic()))
            if drain_deadline is None:
                await sleep_or_stop(stop, delay)
            else:
                await asyncio.sleep(delay)
            continue
        settings.backoff.reset()
        sent = [*plain, *[d for d in dead if await _send_dead_letter(sink, d, metrics)]]
        outbox.remove(items)
        for item in sent:
            metrics.out(item.topic)
        metrics.success(clock())
    if len(outbox):
        log.warning("%s: stopped with %d records unsent", metrics.connector, len(outbox))


async def _send_dead_letter(sink: Sink, item: Outgoing, metrics: ConnectorMetrics) -> bool:
    """Send one dead letter; a failure is counted and logged (once per reason), never raised."""
    try:
        await sink.send_batch([item])
        return True
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        dl = item.record
        what = (f"for {dl.topic}[{dl.partition}]@{dl.offset}, {dl.original_length} bytes, sha256 "
                f"{dl.original_sha256[:16]}" if isinstance(dl, DeadLetter) else "")
        metrics.dead_letter_failed(exc, what)
        return False


def pump_settings(settings: Settings) -> PumpSettings:
    e = settings.exporters
    return PumpSettings(drain_timeout_s=e.drain_timeout_s, backoff=Backoff(e.reconnect_min_s, e.reconnect_max_s))


async def run_until_stopped(source: Callable[[asyncio.Event], Awaitable[None]], outbox: Outbox, sink: Sink,
                            metrics: ConnectorMetrics, settings: PumpSettings,
                            stop: asyncio.Event | None = None, handle_signals: bool = True) -> None:
    """Run ``source(stop)`` and the pump together until SIGTERM/SIGINT (or ``stop``), then drain."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    if handle_signals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    pumping = asyncio.create_task(pump(outbox, sink, metrics, stop, settings))
    try:
        await source(stop)
    finally:
        stop.set()
        await pumping
        await sink.stop()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to ``seconds``; True when ``stop`` was set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), max(0.0, seconds))
    return stop.is_set()



async def run_consumer(settings: Settings, topics: list[str], group_id: str, stop: asyncio.Event,
                       metrics: ConnectorMetrics, handle: Callable[[str, bytes | None, int, int], Awaitable[None]],
                       tick: Callable[[], Awaitable[None]], max_records: int = 2000) -> None:
    """Consume ``topics`` (from the earliest offset for a new group) until ``stop``: ``handle`` each
    message, then ``tick`` after every poll. A broker that cannot be reached at start or fails
    later is counted and retried with backoff; the offsets are committed automatically."""
    from aiokafka import AIOKafkaConsumer

    from fleetmedic.bus import client_options

    e = settings.exporters
    backoff = Backoff(e.reconnect_min_s, e.reconnect_max_s)
    while not stop.is_set():
        consumer = AIOKafkaConsumer(*topics, group_id=group_id, auto_offset_reset="earliest",
                                    enable_auto_commit=True, **client_options(settings.kafka))
        try:
            await consumer.start()
            backoff.reset()
            while not stop.is_set():
                batches = await consumer.getmany(timeout_ms=500, max_records=max_records)
                for tp, messages in batches.items():
                    for msg in messages:
                        await handle(tp.topic, msg.value, msg.partition, msg.offset)
                await tick()
        except Exception as exc:  # broker unreachable or gone: count, back off, reconnect
            metrics.error(f"consumer_{type(exc).__name__}")
            delay = backoff.next_delay()
            log.warning("%s: consuming %s failed (%s), retrying in %.1fs", metrics.connector, topics, exc, delay)
            await sleep_or_stop(stop, delay)
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()
