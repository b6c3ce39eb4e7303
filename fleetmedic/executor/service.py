"""The executor process: lead (Lease), consume commands, act, publish results, commit offsets.

- Only the Lease holder consumes ``remediation.commands`` (consumer group
  ``<kafka.consumer_group>-executor``, auto-commit off). A standby polls the Lease every
  ``lease_duration_s / 3`` and, once it leads, resumes from the group's committed offset.
- Commands for one target (node, or job) run in order, one at a time; different targets run in
  parallel (worker threads: the ``kubernetes`` client is synchronous). A long action (drain,
  diagnostics) does not hold up other nodes. Between the tracks of one incident:
  :class:`IsolationOrder`.
- A result is published (key: command id) before its offset may be committed, and the committed
  offset is the lowest one whose result is not yet out, so a crash re-delivers every command that has
  no result; the ids recorded on the objects turn re-deliveries of applied commands into ``skipped``
  duplicates, and an in-flight drain or diagnostics into a resume.
- A broker restart is ridden out: a result is sent again, with backoff, until the broker
  acknowledges it (for as long as this executor leads), so a drain that finishes while the broker is
  down still gets its one result; an offset commit that fails or does not answer soon is retried at
  the next round (``fleetmedic_executor_commit_failures_total``), so the loop keeps renewing the
  Lease meanwhile (aiokafka's commit would wait for the broker for good, and a leader that cannot
  renew would go on acting next to the one that took the Lease over).
- Losing the Lease stops everything at once: long actions are interrupted without a result (the next
  leader resumes them), nothing more is committed.
- A message that does not decode is dead-lettered with the reason and counted; it never stops the loop.
  Nor does one whose handling in the loop raises: it is dead-lettered with the exception's type,
  message and last frame (``fleetmedic_record_errors_total{stage="executor"}``) and its offset
  moves on. A dead letter keeps at most 64 KiB of the original (with its hash and length), and a
  dead letter the broker refuses is logged and counted, never raised, so an undecodable command of
  any size cannot stop the executor.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError

from fleetmedic import records as r
from fleetmedic.actions import JOB_ACTIONS, NODE_QUICK, targets_node
from fleetmedic.bus import DECISIONS, client_options, producer_options
from fleetmedic.config import Settings
from fleetmedic.executor.cache import ClusterCache
from fleetmedic.executor.kube import Cluster
from fleetmedic.executor.leader import LeaseElector
from fleetmedic.executor.metrics import ExecutorMetrics
from fleetmedic.executor.node.apply import CommandExecutor
from fleetmedic.executor.node.long_apply import Interrupted
from fleetmedic.signing import SIGNATURE_HEADER, KeySet, SignatureError, as_command_keys, header, verify_bytes

log = logging.getLogger("fleetmedic.executor")
MAX_THREADS = 64
ORDER_WAIT_S = 30.0
ANSWERED_KEPT = 100_000  # command ids remembered as answered (see ExecutorService.answered)
_Item = tuple[TopicPartition, int, r.RemediationCommand, list["asyncio.Future[None]"], "asyncio.Future[None] | None"]


def consumer_group(settings: Settings) -> str:
    return f"{settings.kafka.consumer_group}-executor"


@dataclass
class _Offsets:
    """Offsets handed out and finished; ``committable`` is the lowest unfinished one."""

    pending: set[int] = field(default_factory=set)
    high: int = -1

    def start(self, offset: int) -> None:
        self.pending.add(offset)
        self.high = max(self.high, offset)

    def finish(self, offset: int) -> None:
        self.pending.discard(offset)

    def committable(self) -> int:
        return min(self.pending) if self.pending else self.high + 1


class IsolationOrder:
    """Ordering between the two tracks of one incident, which the decision stage publishes together
    (``restart_job`` first, then ``cordon``, ``taint``, ``drain`` of the suspect node):

    - a job command that excludes a node waits for the quick commands (cordon, taint) for that node
      received in the same fetch or earlier: the replacement pods must not meet a node that is about
      to be tainted but is not yet;
    - a drain waits for the job commands re-placing workloads off its node: evicting a pod the
      re-placement is about to delete anyway would count as a pod failure and hold the replacement
      back by the Job controller's failure backoff.

    Waits are bounded (:data:`ORDER_WAIT_S`), so no cycle can block a command for good."""

    def __init__(self) -> None:
        self._quick: dict[str, list[asyncio.Future[None]]] = {}
        self._replacing: dict[str, list[asyncio.Future[None]]] = {}

    @staticmethod
    def _add(table: dict[str, list[asyncio.Future[None]]], keys: Sequence[str]) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for key in keys:
            table[key] = [*(f for f in table.get(key, []) if not f.done()), done]
        return done

    def register(self, cmd: r.RemediationCommand) -> asyncio.Future[None] | None:
        """The future to resolve when ``cmd`` is done, for commands others may wait for."""
        if cmd.action in JOB_ACTIONS and cmd.exclude_nodes:
            return self._add(self._replacing, cmd.exclude_nodes)
        if cmd.node and cmd.action in NODE_QUICK:
            return self._add(self._quick, [cmd.node])
        return None

    def waits_for(self, cmd: r.RemediationCommand) -> list[asyncio.Future[None]]:
        """What ``cmd`` waits for (call after registering every command of the fetch)."""
        if cmd.action in JOB_ACTIONS:
            return [f for n in cmd.exclude_nodes for f in self._quick.get(n, []) if not f.done()]
        if cmd.action == "drain" and cmd.node:
            return [f for f in self._replacing.get(cmd.node, []) if not f.done()]
        return []


class ExecutorService:
    def __init__(self, settings: Settings, keys: KeySet | bytes, cluster: Cluster, identity: str,
                 metrics: ExecutorMetrics | None = None) -> None:
        """``keys``: the command keys by id (:func:`~fleetmedic.signing.command_keys`); one bare key
        is the key of the default id."""
        self.settings = settings
        self.keys = as_command_keys(keys)
        self.cluster = cluster
        self.identity = identity
        self.metrics = metrics
        e = settings.executor
        self.elector = LeaseElector(cluster.api, e.lease_namespace, e.lease_name, identity, e.lease_duration_s)
        self.pool = ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="executor")
        self.lease_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lease")  # never behind actions
        self.results_published = 0
        # ids of the commands whose result the broker acknowledged, in this process, latest last: a
        # command delivered again (its offset's commit was lost, e.g. the broker restarted) is not
        # handled or answered twice (a second "skipped: duplicate" result would follow the first)
        self.answered: dict[str, None] = {}
        # nodes and pods by list + watch for the topology-aware restart; started with run(), so a
        # standby is warm when it takes over
        self.cache = ClusterCache(cluster.api, settings.placement.gpu_resource) if e.cluster_cache else None

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop``: campaign for the Lease, and lead while holding it."""
        loop = asyncio.get_running_loop()
        if self.cache is not None:
            self.cache.start()
        try:
            while not stop.is_set():
                leading = await loop.run_in_executor(self.lease_pool, self.elector.try_acquire_or_renew)
                if self.metrics:
                    self.metrics.leader.set(1 if leading else 0)
                if leading:
                    await self._lead(stop)
                else:
                    await _wait(stop, self.elector.renew_every_s)
        finally:
            await loop.run_in_executor(self.lease_pool, self.elector.release)
            if self.metrics:
                self.metrics.leader.set(0)
            if self.cache is not None:
                self.cache.close()
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.lease_pool.shutdown(wait=False)

    async def _lead(self, stop: asyncio.Event) -> None:
        """Consume and act until ``stop`` or the Lease is lost."""
        loop = asyncio.get_running_loop()
        halt = threading.Event()
        executor = CommandExecutor(self.cluster, self.settings, self.keys, identity=self.identity,
                                   metrics=self.metrics, stop=halt, cache=self.cache)
        topic = self.settings.topics.topic("remediation.commands")
        k, client_id = self.settings.kafka, f"{self.settings.kafka.client_id}-executor"
        # a new commands leader is found within 5 s (or kafka.metadata_max_age_ms, if shorter)
        consumer = AIOKafkaConsumer(topic, group_id=consumer_group(self.settings), enable_auto_commit=False,
                                    auto_offset_reset="earliest", **client_options(
                                        k, client_id=client_id, metadata_max_age_ms=min(5000, k.metadata_max_age_ms)))
        producer = AIOKafkaProducer(**producer_options(k, DECISIONS, client_id=client_id,
                                                       request_timeout_ms=int(k.request_timeout_s * 1000)))
        await consumer.start()
        await producer.start()
        offsets: dict[TopicPartition, _Offsets] = {}
        queues: dict[str, asyncio.Queue[_Item | None]] = {}
        by_header: set[tuple[TopicPartition, int]] = set()  # records whose signature header verified
        workers: list[asyncio.Task[None]] = []
        order = IsolationOrder()
        results = self.settings.topics.topic("remediation.results")

        async def target_worker(q: asyncio.Queue[_Item | None]) -> None:
            while (item := await q.get()) is not None:
                tp, offset, cmd, after, done = item
                try:
                    if after:  # see IsolationOrder
                        await asyncio.wait(after, timeout=ORDER_WAIT_S)
                    result = await loop.run_in_executor(self.pool, functools.partial(
                        executor.handle, cmd, verified_by_header=(tp, offset) in by_header))
                except Interrupted:
                    return  # leadership lost: no result, no commit; the next leader resumes it
                except Exception as exc:  # a bug or an unexpected API failure: report, keep going
                    log.exception("command %s failed unexpectedly", cmd.id)
                    result = r.RemediationResult(command_id=cmd.id, action=cmd.action, outcome="failed",
                                                 ts=time.time(), reason=f"executor error: {exc}"[:4096],
                                                 node=cmd.node, job=cmd.job, executor=self.identity,
                                                 dry_run=cmd.dry_run)
                finally:
                    by_header.discard((tp, offset))
                    if done is not None and not done.done():
                        done.set_result(None)
                if not await self._publish(producer, results, cmd, result, halt):
                    continue  # the offset stays uncommitted: the next leader handles it again
                self.results_published += 1
                self.answered[cmd.id] = None
                while len(self.answered) > ANSWERED_KEPT:
                    del self.answered[next(iter(self.answered))]
                offsets[tp].finish(offset)

        async def commit() -> None:
            """Commit what is finished; a broker away is logged and retried at the next round, never
            waited for: the loop must go on renewing the Lease (aiokafka's commit waits for the
            coordinator for good, and a leader that cannot renew would keep acting next to the new one)."""
            upto = {tp: o.committable() for tp, o in offsets.items() if o.high >= 0}
            if not upto:
                return
            try:
                await asyncio.wait_for(consumer.commit(upto), timeout=max(0.5, self.elector.renew_every_s / 2))
            except (TimeoutError, KafkaError) as exc:
                if self.metrics:
                    self.metrics.commit_failures.labels(reason=type(exc).__name__).inc()
                log.warning("committing offsets %s failed (%s: %s); retrying next round",
                            {f"{tp.topic}[{tp.partition}]": o for tp, o in upto.items()}, type(exc).__name__, exc)

        renew_at = time.monotonic() + self.elector.renew_every_s
        try:
            while not stop.is_set():
                if time.monotonic() >= renew_at:
                    if not await loop.run_in_executor(self.lease_pool, self.elector.try_acquire_or_renew):
                        break
                    renew_at = time.monotonic() + self.elector.renew_every_s
                batches = await consumer.getmany(timeout_ms=200, max_records=100)
                fetched: list[tuple[TopicPartition, int, r.RemediationCommand, asyncio.Future[None] | None]] = []
                for tp, recs in batches.items():
                    for rec in recs:
                        offsets.setdefault(tp, _Offsets()).start(rec.offset)
                        try:  # one record's failure is that record's: dead-lettered, the loop goes on
                            cmd = await self._decode(producer, tp, rec.offset, rec.key, rec.value)
                            if cmd is not None and cmd.id in self.answered:
                                if self.metrics:
                                    self.metrics.redelivered.inc()
                                log.info("command %s delivered again; its result is on the broker already", cmd.id)
                                cmd = None
                            if cmd is not None and (signed := await self._header(producer, tp, rec)) is not None:
                                if signed:
                                    by_header.add((tp, rec.offset))
                                fetched.append((tp, rec.offset, cmd, order.register(cmd)))
                                continue
                        except Exception as exc:
                            await self._record_failed(producer, tp, rec.offset, rec.key, rec.value, exc)
                        offsets[tp].finish(rec.offset)
                for tp, offset, cmd, done in fetched:
                    try:
                        on_node = targets_node(cmd.action, cmd.node)
                        target = f"node:{cmd.node}" if on_node else f"job:{cmd.job}"
                        if target not in queues:
                            queues[target] = asyncio.Queue()
                            workers.append(asyncio.create_task(target_worker(queues[target])))
                        queues[target].put_nowait((tp, offset, cmd, order.waits_for(cmd), done))
                    except Exception as exc:
                        if done is not None and not done.done():
                            done.set_result(None)
                        await self._record_failed(producer, tp, offset, cmd.id.encode(), r.encode(cmd), exc)
                        offsets[tp].finish(offset)
                await commit()
        finally:
            halt.set()
            for q in queues.values():
                q.put_nowait(None)
            for w in workers:  # quick actions finish; long ones see `halt` and stop
                try:
                    await asyncio.wait_for(asyncio.shield(w), timeout=10.0)
                except (TimeoutError, asyncio.CancelledError):
                    w.cancel()
            if self.elector.leading:
                await commit()
            await consumer.stop()
            await producer.stop()
            if self.metrics:
                self.metrics.leader.set(1 if self.elector.leading else 0)

    async def _publish(self, producer: AIOKafkaProducer, topic: str, cmd: r.RemediationCommand,
                       result: r.RemediationResult, halt: threading.Event) -> bool:
        """Publish ``result`` (key: the command id); True once the broker acknowledged it. While the
        broker is away (a timeout, a lost connection, any retriable error) it is sent again, backing
        off from 0.5 s to 10 s, for as long as this executor leads: a drain that finished while the
        broker restarted still gets its one result, and its offset is committed after it. False when
        leadership ends first or the broker refuses it for good (logged and counted): the offset
        stays uncommitted, and the next leader handles the command again."""
        value, delay, failed = r.encode(result), 0.5, False
        while True:
            try:
                await producer.send_and_wait(topic, key=cmd.id.encode(), value=value)
                if failed:
                    log.info("result of %s published after the broker came back", cmd.id)
                return True
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not failed and self.metrics:
                    self.metrics.failures.labels(action=cmd.action).inc()
                failed = True
                transient = isinstance(exc, KafkaTimeoutError | KafkaConnectionError) or (
                    isinstance(exc, KafkaError) and exc.retriable)
                if not transient or halt.is_set():
                    log.error("result of %s not published (%s: %s)%s", cmd.id, type(exc).__name__, exc,
                              "" if transient else "; the broker refuses it")
                    return False
                log.warning("result of %s not published yet (%s: %s); sending it again in %.1fs", cmd.id,
                            type(exc).__name__, exc, delay)
                await asyncio.sleep(delay)
                delay = min(10.0, 2 * delay)

    async def _header(self, producer: AIOKafkaProducer, tp: TopicPartition, rec: Any) -> bool | None:
        """True if ``rec`` carries a signature header that verifies over its value bytes with the
        command key its ``fleetmedic-key-id`` names, False if it has none (the in-body signature is
        checked then: the migration in :mod:`fleetmedic.signing`), None if its header does not verify
        or names a key not held (retired, or never configured): then it is counted and dead-lettered
        with the reason."""
        if header(rec.headers, SIGNATURE_HEADER) is None:
            return False
        try:
            verify_bytes(rec.value or b"", rec.headers, self.keys)
        except SignatureError as exc:
            log.warning("command at %s:%d rejected: %s", tp.topic, rec.offset, exc)
            if self.metrics:
                self.metrics.rejected.labels(reason="signature").inc()
            await self._dead_letter(producer, tp, rec.offset, rec.key, rec.value, f"signature rejected: {exc}")
            return None
        return True

    async def _decode(self, producer: AIOKafkaProducer, tp: TopicPartition, offset: int, key: bytes | None,
                      value: bytes | None) -> r.RemediationCommand | None:
        try:
            return r.decode(r.RemediationCommand, value or b"")
        except r.InvalidRecord as exc:
            log.warning("undecodable command at %s:%d: %s", tp.topic, offset, exc)
            if self.metrics:
                self.metrics.rejected.labels(reason="invalid").inc()
            await self._dead_letter(producer, tp, offset, key, value, str(exc))
            return None

    async def _record_failed(self, producer: AIOKafkaProducer, tp: TopicPartition, offset: int, key: bytes | None,
                             value: bytes | None, exc: Exception) -> None:
        """Handling the record at ``offset`` raised ``exc``: log, count, dead-letter it."""
        kind, message, frame = r.DeadLetter.describe(exc)
        log.error("record at %s:%d raised %s: %s (at %s); dead-lettered, going on", tp.topic, offset, kind, message,
                  frame, exc_info=exc)
        if self.metrics:
            self.metrics.record_errors.labels(stage="executor", exception=kind).inc()
        await self._dead_letter(producer, tp, offset, key, value, f"{kind}: {message}", kind, frame)

    async def _dead_letter(self, producer: AIOKafkaProducer, tp: TopicPartition, offset: int, key: bytes | None,
                           value: bytes | None, error: str, exception: str = "", frame: str = "") -> None:
        """Send the record to ``deadletter`` (its original truncated, hash and length kept); never
        raises: a refused dead letter is logged, with the record's place and hash, and counted."""
        dead = r.DeadLetter(ts=time.time(), topic=tp.topic, stage="executor", error=error[:4096],
                            original=value or b"", partition=tp.partition, offset=offset,
                            key=key.decode(errors="replace") if key else None, exception=exception, frame=frame)
        try:
            await producer.send_and_wait(self.settings.topics.topic("deadletter"), key=tp.topic.encode(),
                                         value=r.encode(dead))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("dead letter for %s:%d (%d bytes, sha256 %s) not sent: %r; its error: %s", tp.topic, offset,
                      dead.original_length, dead.original_sha256, exc, error)
            if self.metrics:
                self.metrics.dead_letters_failed.inc()


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)

