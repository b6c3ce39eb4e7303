"""Stage 1, detection per node, as Faust agents: any number of workers share the telemetry partitions.

- ``detect_gpu`` reads ``telemetry.gpu`` in micro-batches and runs
  :class:`~fleetmedic.models.stages.NodeDetection`; findings go to ``findings`` (key: node). Each
  batch also yields one :class:`SummaryBatch` (per-node medians and load band,
  :func:`~fleetmedic.models.stages.summarise`) on the fleet-inputs topic, which is all the decision
  stage's peer comparisons need: it never reads raw telemetry.
- ``detect_port`` runs the host NICs of ``telemetry.port`` through the node's port detector and
  forwards the switch ports, unchanged, to the fleet-inputs topic (key ``port:<device>``).
- State: every ``detect_snapshot_every_s`` the nodes that received telemetry since the last write
  are written (:class:`~fleetmedic.streams.state.NodeStageState`, key: node) to the compacted
  ``<group>-detect-state`` topic, in the partition their telemetry comes from. When partitions are
  revoked (a rebalance, a stop) their nodes are written at once; when partitions are assigned,
  their nodes are loaded before the first message is processed. A worker that dies loses the
  baseline updates since its last write (at most ``detect_snapshot_every_s`` of them): the
  telemetry after Faust's last commit is processed again on the older baselines.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import faust
import msgspec
from aiokafka import TopicPartition

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.models.stages import NodeDetection, NodeSummary, summarise
from fleetmedic.streams.app import detect_state_topic, summaries_topic
from fleetmedic.streams.metrics import PipelineMetrics
from fleetmedic.streams.outputs import Outputs
from fleetmedic.streams.state import NodeStageState, load_node_states

log = logging.getLogger(__name__)

SUMMARY_KEY = b"summaries"
PORT_KEY_PREFIX = b"port:"


class SummaryBatch(msgspec.Struct, array_like=True):
    summaries: list[NodeSummary]


_encode_batch = msgspec.msgpack.Encoder().encode


class DetectStage:
    def __init__(self, app: faust.App, settings: Settings, outputs: Outputs, metrics: PipelineMetrics,
                 batch_size: int, batch_within_s: float, snapshot_every_s: float) -> None:
        self.settings = settings
        self.outputs = outputs
        self.metrics = metrics
        self.batch_size, self.batch_within_s = batch_size, batch_within_s
        self.node_stage = NodeDetection(settings.detection)
        self.partition_of: dict[str, int] = {}  # node -> its partition of telemetry.gpu
        self.dirty: set[str] = set()
        self.owned: set[int] = set()
        self.gpu_topic = settings.topics.topic("telemetry.gpu")
        self.port_topic = settings.topics.topic("telemetry.port")
        self.state_topic = detect_state_topic(settings)
        self.summaries = summaries_topic(settings)
        raw: dict[str, Any] = dict(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
        app.agent(app.topic(self.gpu_topic, **raw), name="fleetmedic.detect_gpu")(self._detect_gpu)
        app.agent(app.topic(self.port_topic, **raw), name="fleetmedic.detect_port")(self._detect_port)
        app.timer(snapshot_every_s, name="fleetmedic.detect_snapshot")(self._periodic_snapshot)
        app.on_partitions_assigned.connect(self._on_assigned)  # type: ignore[arg-type]  # mode's stub
        app.on_partitions_revoked.connect(self._on_revoked)  # type: ignore[arg-type]

    # --- agents ------------------------------------------------------------------------------------

    async def _detect_gpu(self, stream: Any) -> None:
        async for events in stream.take_events(self.batch_size, within=self.batch_within_s):
            started = time.perf_counter()
            self.metrics.messages_in.labels(self.gpu_topic, "detect").inc(len(events))
            msgs: list[r.GpuTelemetry] = []
            for event in events:
                msg = await self.outputs.decode(r.GpuTelemetry, event, "detect")
                if msg is not None:
                    msgs.append(msg)
                    self.partition_of[msg.node] = event.message.partition
            if msgs:
                self.dirty.update(m.node for m in msgs)
                await self.outputs.findings(self.node_stage.on_gpu(msgs))
                batch = SummaryBatch([summarise(m) for m in msgs])
                await self.outputs.send_raw(self.summaries, SUMMARY_KEY, _encode_batch(batch))
            self.metrics.latency.labels("detect").observe(time.perf_counter() - started)

    async def _detect_port(self, stream: Any) -> None:
        async for event in stream.events():
            started = time.perf_counter()
            self.metrics.messages_in.labels(self.port_topic, "detect").inc()
            msg = await self.outputs.decode(r.PortTelemetry, event, "detect")
            if msg is not None and msg.device_kind == "host":
                self.partition_of.setdefault(msg.device, event.message.partition)
                self.dirty.add(msg.device)
                await self.outputs.findings(self.node_stage.on_port(msg))
            elif msg is not None:
                await self.outputs.send_raw(self.summaries, PORT_KEY_PREFIX + msg.device.encode(), event.value)
            self.metrics.latency.labels("detect").observe(time.perf_counter() - started)

    # --- state -------------------------------------------------------------------------------------

    async def _periodic_snapshot(self) -> None:
        await self.snapshot()

    async def snapshot(self, nodes: set[str] | None = None) -> int:
        """Write the state of ``nodes`` (default: those changed since the last write); return bytes."""
        todo = self.dirty if nodes is None else nodes
        if not todo:
            return 0
        written, now = 0, time.time()
        for node in sorted(todo):
            partition = self.partition_of.get(node)
            if partition is None:
                continue
            value = msgspec.msgpack.encode(NodeStageState(gpu=self.node_stage.gpu.export_state(node),
                                                          ports=self.node_stage.ports.export_device(node),
                                                          written_at=now))
            await self.outputs.send_raw(self.state_topic, node.encode(), value, partition=partition)
            written += len(value) + len(node)
        self.dirty -= todo
        await self.outputs.flush()
        self.metrics.state_bytes.labels("detect").inc(written)
        return written

    async def _on_revoked(self, sender: Any, *args: Any, signal: Any = None, **_: Any) -> None:
        revoked: set[TopicPartition] = args[0]
        gone = {tp.partition for tp in revoked if tp.topic == self.gpu_topic}
        if gone:
            await self.snapshot({n for n, p in self.partition_of.items() if p in gone} & self.dirty)

    async def _on_assigned(self, sender: Any, *args: Any, signal: Any = None, **_: Any) -> None:
        assigned: set[TopicPartition] = args[0]
        now_owned = {tp.partition for tp in assigned if tp.topic == self.gpu_topic}
        for node in [n for n, p in self.partition_of.items() if p not in now_owned]:
            self.node_stage.gpu.forget(node)  # another worker carries on with it
            self.partition_of.pop(node)
            self.dirty.discard(node)
        started, restored = time.monotonic(), 0
        for partition in sorted(now_owned - self.owned):
            for node, st in (await load_node_states(self.settings, self.state_topic, partition)).items():
                if node in self.partition_of:
                    continue  # already live here: newer than what was written
                if st.gpu is not None:
                    self.node_stage.gpu.import_state(node, st.gpu)
                self.node_stage.ports.import_device(st.ports)
                self.partition_of[node] = partition
                restored += 1
        self.owned = now_owned
        self.metrics.nodes_restored.inc(restored)
        log.info("detect: partitions %s of %s; restored %d node states in %.2fs", sorted(now_owned),
                 self.gpu_topic, restored, time.monotonic() - started)
