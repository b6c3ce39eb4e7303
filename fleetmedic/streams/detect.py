"""Stage 1, detection per node: a consumer-group loop that any number of workers share.

Consumer group ``<group>-detect`` over ``telemetry.gpu`` and ``telemetry.port`` (key: node; the
range assignor gives a worker the same partition numbers of both topics). Each poll returns up to
``streams.batch_size`` messages; GPU telemetry goes through
:class:`~fleetmedic.models.stages.NodeDetection` as one micro-batch, and findings go to
``findings`` (key: node). Each batch also yields one
:class:`~fleetmedic.models.stages.SummaryColumns` (per-node medians and load band, as columns) on
the fleet-inputs topic, which is all the decision stage's peer comparisons need: it never reads
raw telemetry. Host NICs of ``telemetry.port`` go through the node's port detector; switch ports
are forwarded unchanged to the fleet-inputs topic (key ``port:<device>``).

The multivariate model's refit (seconds for MinCovDet on its 20,000 windows) runs in a thread:
stage 1 plans it at the window an in-place refit would run, keeps judging with the current fit
until it is installed, and a checkpoint waits for it, so the state written is the same as that of
a worker refitting in place.

This loop is plain aiokafka, not a Faust agent: Faust's per-event machinery cost several times the
detectors themselves (docs/streams.md has the figures), and the loop controls its commits.

State and offsets, together: every ``streams.detect_snapshot_every_s`` (and when partitions are
revoked, and at a stop) the loop writes the state of every node changed since the last write
(:class:`~fleetmedic.streams.state.NodeStageState`, key: node: baselines, NIC counters, the
multivariate window) and, where the multivariate model changed, its part for each partition
(training rows and fit as plain arrays, key :data:`~fleetmedic.streams.state.MODEL_KEY`) to the
compacted ``<group>-detect-state`` topic, in the node's partition of ``telemetry.gpu``, waits for the
broker's acknowledgement of everything, and only then commits the input offsets. A worker that
is assigned a partition loads its nodes' states and the model parts (merged, see
:meth:`~fleetmedic.models.multivariate.MultivariateModel.load_parts`) and resumes at the committed
offset: the state is exactly that of the committed offset, and the telemetry after it is
processed again (a crash replays at most one snapshot interval; findings of that interval can
appear twice).

Hardening: a GPU sample or port record stamped more than ``streams.max_future_skew_s``
ahead of the clock (the wall clock, or the record's broker timestamp when earlier, so that a replay
judges it alike) is dead-lettered before the detectors see it: one sample stamped 2096 would
otherwise make every later sample of its node look late. A micro-batch whose handling raises is
judged again record by record, so that only the record that raises is dead-lettered (with the
exception's type, message and last frame; ``fleetmedic_record_errors_total``) and the stage goes
on. A node state that cannot be read at assignment starts fresh (logged, counted in
``fleetmedic_state_unreadable_total``); any other failure of the assignment listener (which
aiokafka would only log, leaving the loop waiting for good) stops the worker with the error.

Samples already taken: a node's state is written before the offsets are committed, so a worker
that loads it but resumes from an older commit (the commit of revoked partitions failed because the
group's coordinator stalled; a kill between the two) reads samples the state already holds. A GPU
sample stamped before the node's latest sample in its baselines is not taken again
(``fleetmedic_replayed_samples_total``); one stamped at the same time is (a scrape split in two
records). Without this the baselines counted up to ``streams.detect_snapshot_every_s`` of each
node's telemetry twice.

Bounded memory: :class:`~fleetmedic.models.stages.NodeDetection` forgets a node silent
for ``detection.evict_node_after_s`` of event time and, beyond ``detection.max_nodes_per_worker``,
the least recently seen node (``fleetmedic_stage1_nodes_evicted_total{reason}``; the nodes kept:
``fleetmedic_stage1_nodes_tracked``). The loop forgets the node's partition too, and the next
checkpoint deletes its saved state (a tombstone under its key, in its partition, before the offsets
are committed), so that no restore brings it back; a node that returns starts fresh. Each saved
state carries ``seen_at``, the stage's event-time clock when the node was last seen, so that a
worker that restores it goes on counting its silence.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import msgspec
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import CommitFailedError, KafkaError
from aiokafka.structs import ConsumerRecord

from fleetmedic import records as r
from fleetmedic.bus import TELEMETRY_READER, consumer_options, detect_group, detect_state_topic, summaries_topic
from fleetmedic.config import Settings
from fleetmedic.models.event_time import event_time, reference_clock
from fleetmedic.models.gpu_detector import metricless
from fleetmedic.models.multivariate_state import decode_part
from fleetmedic.models.stages import NodeDetection, stage1_batch, summary_columns
from fleetmedic.streams.metrics import PipelineMetrics
from fleetmedic.streams.outputs import Outputs, Source, describe
from fleetmedic.streams.state import MODEL_KEY, NodeStageState, load_detect_partition

log = logging.getLogger(__name__)

SUMMARY_KEY = b"summaries"
PORT_KEY_PREFIX = b"port:"


_encode = msgspec.msgpack.Encoder().encode


class DetectStage:
    def __init__(self, settings: Settings, outputs: Outputs, metrics: PipelineMetrics, batch_size: int,
                 batch_within_s: float, snapshot_every_s: float, session_timeout_s: float) -> None:
        self.settings = settings
        self.outputs = outputs
        self.metrics = metrics
        self.batch_size, self.batch_within_s = batch_size, batch_within_s
        self.snapshot_every_s, self.session_timeout_s = snapshot_every_s, session_timeout_s
        self.node_stage = NodeDetection(settings.detection)
        self.node_stage.on_evict = self._evicted
        self.tombstones: dict[str, int] = {}  # evicted node -> its partition: its saved state to delete
        # the multivariate model's refit (seconds for MinCovDet on 20k windows) runs in a thread: the
        # loop keeps consuming and judging with the current fit meanwhile
        self._refits = ThreadPoolExecutor(max_workers=1, thread_name_prefix="refit")
        self.node_stage.refit_runner = self._refits.submit
        # only the fields stage 1 reads: building the other columns' Python lists was ~25 % of decoding
        self.decode_gpu = r.decoder_for(r.DetectionTelemetry)
        self.partition_of: dict[str, int] = {}  # node -> its partition of telemetry.gpu
        self.dirty: set[str] = set()
        self.owned: set[int] = set()
        self.next_offsets: dict[TopicPartition, int] = {}  # processed, not yet committed
        self.committed: dict[TopicPartition, int] = {}
        self.gpu_topic = settings.topics.topic("telemetry.gpu")
        self.port_topic = settings.topics.topic("telemetry.port")
        self.kernel_topic = settings.topics.topic("kernel.events")
        self.state_topic = detect_state_topic(settings)
        self.summaries = summaries_topic(settings)
        self.consumer: AIOKafkaConsumer | None = None
        self._restored = asyncio.Event()
        self._model_written: dict[int, int] = {}  # partition -> model revision last written there
        self._model_sizes: dict[int, int] = {}  # partition -> bytes of the model part last written there
        self._failure: BaseException | None = None  # of the rebalance listener: the loop raises it

    # --- the loop ----------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set; then write the state, commit and leave the group."""
        timeout_ms = int(self.session_timeout_s * 1000)
        options = consumer_options(self.settings.kafka, TELEMETRY_READER,
                                   client_id=f"{self.settings.kafka.client_id}-detect")
        consumer = self.consumer = AIOKafkaConsumer(
            **options, group_id=detect_group(self.settings), enable_auto_commit=False,
            auto_offset_reset="earliest", partition_assignment_strategy=(RangePartitionAssignor,),
            session_timeout_ms=timeout_ms, heartbeat_interval_ms=max(1000, timeout_ms // 3))
        await consumer.start()
        consumer.subscribe([self.gpu_topic, self.port_topic, self.kernel_topic], listener=_Rebalance(self))
        log.info("detect: consumer group %s, waiting for partitions", detect_group(self.settings))
        last_write = last_lag = time.monotonic()
        try:
            while not stop.is_set():
                self._raise_failure()
                polled = await consumer.getmany(timeout_ms=int(self.batch_within_s * 1000),
                                                max_records=self.batch_size)
                # the fetcher can hand out records of a new assignment while the listener is still
                # loading its node states: process them only once the states are in
                if any(polled.values()):
                    await self._restored.wait()
                    self._raise_failure()
                owned = consumer.assignment()
                await self._process({tp: records for tp, records in polled.items() if records and tp in owned})
                if time.monotonic() - last_lag >= 1.0:
                    self._report_lag(consumer, owned)
                    last_lag = time.monotonic()
                if time.monotonic() - last_write >= self.snapshot_every_s:
                    await self.checkpoint()
                    last_write = time.monotonic()
            self._raise_failure()
            await self.checkpoint()
        finally:
            await consumer.stop()
            self.consumer = None
            self._refits.shutdown(wait=False, cancel_futures=True)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"stage 1: the rebalance listener failed ({type(self._failure).__name__}: "
                               f"{self._failure}); stopping rather than stalling") from self._failure

    def _report_lag(self, consumer: AIOKafkaConsumer, owned: set[TopicPartition]) -> None:
        for tp in owned:
            high = consumer.highwater(tp)
            done = self.next_offsets.get(tp) or self.committed.get(tp)
            if high is not None and done is not None:
                self.metrics.lag.labels(tp.topic, str(tp.partition), "detect").set(max(0, high - done))

    async def _process(self, polled: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]) -> None:
        """One poll: the GPU telemetry of all its partitions as one micro-batch (split by partition,
        a worker holding several would judge smaller batches, at a higher cost per message), then
        the port telemetry."""
        if not polled:
            return
        started = time.perf_counter()
        gpu: list[tuple[int, ConsumerRecord[bytes, bytes]]] = []
        for tp, records in polled.items():
            self.metrics.messages_in.labels(tp.topic, "detect").inc(len(records))
            if tp.topic == self.gpu_topic:
                gpu += [(tp.partition, rec) for rec in records]
        if gpu:
            await self._gpu(gpu)
        self.metrics.nodes_tracked.set(self.node_stage.tracked())
        for tp, records in polled.items():
            if tp.topic != self.gpu_topic:
                for rec in records:
                    try:
                        await (self._kernel(rec) if tp.topic == self.kernel_topic else self._port(rec))
                    except KafkaError:
                        raise
                    except Exception as exc:
                        await self.outputs.record_failed(Source.of_record(rec), "detect", exc)
            self.next_offsets[tp] = records[-1].offset + 1
        self.metrics.nodes_tracked.set(self.node_stage.tracked())
        self.metrics.latency.labels("detect").observe(time.perf_counter() - started)

    async def _gpu(self, records: list[tuple[int, ConsumerRecord[bytes, bytes]]]) -> None:
        msgs: list[r.DetectionTelemetry] = []
        taken: list[ConsumerRecord[bytes, bytes]] = []
        decode, partition_of = self.decode_gpu.decode, self.partition_of
        last_sample, replayed = self.node_stage.gpu.last_sample_ts, 0
        cluster, foreign = self.outputs.cluster, 0
        # the bound on event time: a record is judged against the wall clock, or its broker timestamp
        # when earlier (a replay judges it as the live run did)
        wall, bound = time.time(), self.settings.streams.max_future_skew_s
        for partition, rec in records:
            try:
                msg = decode(rec.value or b"")
            except r.InvalidRecord as exc:
                await self.outputs.dead_letter(Source.of_record(rec), "detect", f"{exc.path}: {exc.reason}")
                continue
            if msg.cluster and msg.cluster != cluster:  # another cluster's, on a shared topic (records.foreign)
                foreign += 1
                continue
            if (event_time(msg) > reference_clock(wall, rec.timestamp) + bound
                    and await self.outputs.ahead_of_clock(msg, Source.of_record(rec), "detect")):
                continue
            last = last_sample(msg.node)
            if last is not None and msg.ts < last and not metricless(msg):
                replayed += 1  # the node's state already holds it (see the module's docstring)
                continue
            msgs.append(msg)
            taken.append(rec)
            partition_of[msg.node] = partition
        if replayed:
            self.metrics.replayed.inc(replayed)
        if foreign:
            self.outputs.skipped(self.gpu_topic, "detect", "other_cluster", foreign)
        if not msgs:
            return
        self.dirty.update(m.node for m in msgs)
        await self._judge(msgs, taken)

    async def _judge(self, msgs: list[r.DetectionTelemetry], records: list[ConsumerRecord[bytes, bytes]]) -> None:
        """One micro-batch through the detectors, then its findings and summaries out. If judging
        it raises, each message is judged alone: only the one that raises is dead-lettered. (The
        failed batch may have stepped some nodes' baselines before it raised; those take their
        sample twice. Replays do the same, so the state stays that of the input.)"""
        try:
            batch = stage1_batch(msgs)  # the columns converted once for both
            findings = self.node_stage.on_gpu(msgs, batch)
            # a record without metrics (XIDs only) is judged, but it is no sample for the fleet stage
            sampled = [m for m in msgs if not metricless(m)] if any(map(metricless, msgs)) else msgs
            peers = self.settings.detection.peers
            summary = _encode(summary_columns(sampled, batch if sampled is msgs else None, peers)) if sampled else None
        except Exception as exc:
            if len(msgs) == 1:
                await self.outputs.record_failed(Source.of_record(records[0]), "detect", exc)
                return
            kind, message, frame = describe(exc)
            log.warning("detect: a micro-batch of %d messages raised %s: %s (at %s); judging them one by one",
                        len(msgs), kind, message, frame)
            for msg, rec in zip(msgs, records, strict=True):
                await self._judge([msg], [rec])
            return
        await self.outputs.findings(findings)
        if summary is not None:
            await self.outputs.send_raw(self.summaries, SUMMARY_KEY, summary)

    async def _finish_refit(self) -> None:
        """Wait for a running refit and install it (before a checkpoint: the state written is then
        that of a worker that refitted in place, which a successor continues exactly)."""
        running = self.node_stage.refit_running()
        if running is not None:
            await asyncio.wrap_future(running)
            self.node_stage.install_refit()

    async def _kernel(self, rec: ConsumerRecord[bytes, bytes]) -> None:
        """A kernel-log event (``kernel.events``, keyed by node like ``telemetry.gpu``)."""
        src = Source.of_record(rec)
        ev = await self.outputs.decode(r.KernelEvent, src, "detect")
        if ev is None or self.outputs.other_cluster(ev, src, "detect") or await self.outputs.ahead_of_clock(
                ev, src, "detect"):
            return
        self.partition_of.setdefault(ev.node, rec.partition)
        self.dirty.add(ev.node)
        await self.outputs.findings(self.node_stage.on_kernel(ev))

    async def _port(self, rec: ConsumerRecord[bytes, bytes]) -> None:
        src = Source.of_record(rec)
        msg = await self.outputs.decode(r.PortTelemetry, src, "detect")
        if msg is None or self.outputs.other_cluster(msg, src, "detect") or await self.outputs.ahead_of_clock(
                msg, src, "detect"):
            return
        if msg.device_kind == "host":
            self.partition_of.setdefault(msg.device, rec.partition)
            self.dirty.add(msg.device)
            await self.outputs.findings(self.node_stage.on_port(msg))
        else:
            await self.outputs.send_raw(self.summaries, PORT_KEY_PREFIX + msg.device.encode(), rec.value or b"")

    # --- state -------------------------------------------------------------------------------------

    def _evicted(self, node: str, reason: str) -> None:
        """The node stage forgot ``node``: forget its partition; the next checkpoint deletes its state."""
        partition = self.partition_of.pop(node, None)
        self.dirty.discard(node)
        if partition is not None:
            self.tombstones[node] = partition
        self.metrics.nodes_evicted.labels(reason).inc()

    async def checkpoint(self, partitions: Iterable[int] | None = None) -> int:
        """Write the changed nodes' state (of ``partitions``, default all), wait for every output,
        then commit the input offsets processed so far; return the state bytes written."""
        await self._finish_refit()
        only = None if partitions is None else set(partitions)
        nodes = {n for n in self.dirty if only is None or self.partition_of.get(n) in only}
        written, now = 0, time.time()
        for node in sorted(nodes):
            partition = self.partition_of.get(node)
            if partition is None:
                continue
            value = _encode(NodeStageState(gpu=self.node_stage.gpu.node_bytes(node),
                                           ports=self.node_stage.ports.node_bytes(node), written_at=now,
                                           multivariate=self.node_stage.multivariate_bytes(node),
                                           seen_at=self.node_stage.last_seen(node),
                                           kernel=self.node_stage.kernel.node_bytes(node)))
            await self.outputs.send_raw(self.state_topic, node.encode(), value, partition=partition)
            written += len(value) + len(node)
        self.dirty -= nodes
        written += await self._delete_evicted(only)
        written += await self._write_model(self.owned if only is None else self.owned & only)
        await self.outputs.flush()
        offsets = {tp: o for tp, o in self.next_offsets.items() if only is None or tp.partition in only}
        if offsets and self.consumer is not None:
            try:
                await self.consumer.commit(offsets)
            except CommitFailedError as exc:
                # the group rebalanced since these records were polled (this member's session ran
                # out): whoever owns the partitions now resumes from the last commit, with the
                # states just written, and samples a state already holds are not taken twice
                self.metrics.checkpoint_failures.labels("detect", "commit").inc()
                log.warning("detect: committing offsets failed, the group rebalanced: %s; the partitions resume "
                            "from the last commit", str(exc).split("\n")[0])
                for tp in offsets:
                    self.next_offsets.pop(tp, None)
            else:
                for tp in offsets:
                    self.committed[tp] = self.next_offsets.pop(tp)
        self.metrics.state_bytes.labels("detect").inc(written)
        return written

    async def _delete_evicted(self, only: set[int] | None) -> int:
        """Tombstones for the saved states of the nodes evicted since the last checkpoint (of
        ``only``'s partitions; a node back since then has its fresh state written instead)."""
        gone = sorted((n, p) for n, p in self.tombstones.items() if only is None or p in only)
        if not gone:
            return 0
        for node, partition in gone:
            del self.tombstones[node]
            if node not in self.partition_of:  # still gone
                await self.outputs.send_raw(self.state_topic, node.encode(), None, partition=partition)
        return sum(len(n) for n, _ in gone)

    async def _write_model(self, partitions: set[int]) -> int:
        """The multivariate model's rows of each partition's nodes, where it changed since the last write."""
        model, written = self.node_stage.model, 0
        for partition in sorted(partitions):
            if self._model_written.get(partition, 0) == model.revision:
                continue

            def here(node: str, p: int = partition) -> bool:
                return self.partition_of.get(node) == p

            value = model.state_bytes(here)
            await self.outputs.send_raw(self.state_topic, MODEL_KEY, value, partition=partition)
            self._model_written[partition] = model.revision
            self._model_sizes[partition] = len(value)
            written += len(value) + len(MODEL_KEY)
        self.metrics.model_bytes.set(sum(self._model_sizes.values()))
        return written

    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Checkpoint the partitions leaving. A checkpoint that fails (the group rebalanced without
        this member, whose session ran out while the machine was starved; a broker unreachable)
        is logged and counted, and the worker goes on: the partitions' next owner resumes from the
        last committed offset with the node states written so far, and a sample a state already
        holds is not taken twice. Stopping instead turns one slow poll into a crash loop."""
        self._restored.clear()
        gone = {tp.partition for tp in revoked}
        try:
            if gone:
                await self.checkpoint(gone)
        except Exception as exc:
            self.metrics.checkpoint_failures.labels("detect", "revoke").inc()
            log.warning("detect: checkpointing the revoked partitions %s failed: %s: %s; their next owner resumes "
                        "from the last committed offset", sorted(gone), type(exc).__name__, exc)

    async def on_assigned(self, assigned: set[TopicPartition]) -> None:
        """Load the new partitions' node states, then let the loop go on. A node state that cannot
        be read starts fresh (logged, counted); anything else stops the worker with the error
        (aiokafka only logs what a listener raises, and the loop would wait for good)."""
        try:
            await self._assign(assigned)
        except Exception as exc:
            self._failed("restoring the assigned partitions", exc)
        finally:
            self._restored.set()

    def _failed(self, what: str, exc: Exception) -> None:
        log.error("detect: %s failed: %s: %s; stopping the worker", what, type(exc).__name__, exc, exc_info=exc)
        if self._failure is None:
            self._failure = exc
        self._restored.set()  # the loop wakes up and raises it

    async def _assign(self, assigned: set[TopicPartition]) -> None:
        now_owned = {tp.partition for tp in assigned if tp.topic == self.gpu_topic}
        gone = [n for n, p in self.partition_of.items() if p not in now_owned]
        self.node_stage.forget(gone)  # another worker carries on with them
        for node in gone:
            self.partition_of.pop(node)
            self.dirty.discard(node)
        for node in [n for n, p in self.tombstones.items() if p not in now_owned]:
            del self.tombstones[node]  # written at the revocation's checkpoint, or the new owner's to evict
        for partition in set(self._model_written) - now_owned:
            del self._model_written[partition]
            self._model_sizes.pop(partition, None)
        started, restored, parts, seen = time.monotonic(), 0, [], {}
        for partition in sorted(now_owned - self.owned):
            read = await load_detect_partition(self.settings, self.state_topic, partition)
            if read.unreadable:
                self.metrics.state_unreadable.labels("detect", "node").inc(len(read.unreadable))
            if read.model is not None:
                parts.append((partition, read.model))
            for node, st in read.states.items():
                if node in self.partition_of:
                    continue  # already live here: newer than what was written
                if self._load_node(node, st, partition):
                    restored += 1
                    seen[node] = math.nan if st.seen_at is None else st.seen_at
        self.node_stage.restore_seen(seen)  # then forgets what is due at the next micro-batch
        loaded = time.monotonic()
        rows = self._restore_model(parts)
        self.owned = now_owned
        self.metrics.nodes_restored.inc(restored)
        log.info("detect: partitions %s of %s; restored %d node states in %.2fs, %d model rows (refitted: "
                 "version %d) in %.2fs", sorted(now_owned), self.gpu_topic, restored, loaded - started, rows,
                 self.node_stage.model.version, time.monotonic() - loaded)

    def _load_node(self, node: str, st: NodeStageState, partition: int) -> bool:
        """Load one node's saved state; one that cannot be read starts fresh (logged, counted)."""
        try:
            if st.gpu is not None:
                self.node_stage.gpu.load_node(node, st.gpu)
            self.node_stage.ports.load_node(node, st.ports)
            if st.multivariate is not None:
                self.node_stage.load_multivariate(node, st.multivariate)
            if st.kernel is not None:
                self.node_stage.kernel.load_node(node, st.kernel)
        except Exception as exc:  # undecodable or inconsistent bytes: the node's baselines relearn
            self.node_stage.forget([node])
            self.metrics.state_unreadable.labels("detect", "node").inc()
            log.error("detect: the saved state of node %s (partition %d) cannot be read (%s: %s); it starts fresh",
                      node, partition, type(exc).__name__, exc)
            return False
        self.partition_of[node] = partition
        return True

    def _restore_model(self, parts: list[tuple[int, bytes]]) -> int:
        """The multivariate model from its parts; a part that cannot be read is left out (logged,
        counted) and the model relearns its nodes' rows (``min_training_windows``)."""
        readable = []
        for partition, data in parts:
            try:
                decode_part(data)
            except Exception as exc:
                self.metrics.state_unreadable.labels("detect", "model").inc()
                log.error("detect: the multivariate model's part of partition %d cannot be read (%s: %s); its "
                          "rows relearn", partition, type(exc).__name__, exc)
                continue
            readable.append(data)
        try:
            return self.node_stage.model.load_parts(readable)
        except ValueError as exc:  # another version's model: it relearns (min_training_windows)
            self.metrics.state_unreadable.labels("detect", "model").inc()
            log.warning("detect: multivariate model not restored: %s", exc)
            return 0


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, stage: DetectStage) -> None:
        self.stage = stage

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.stage.on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.stage.on_assigned(assigned)
