"""Several clusters on one Kafka (``cluster.name``), in process (no broker):

- the decision stage of cluster A labels what it sends (incidents, audit, commands inside their
  signature, dead letters) and skips another cluster's findings, job events, node observations,
  results and operator commands: counted per topic and reason, never dead-lettered;
- a record that names no cluster is every cluster's (a producer without ``cluster.name``), except an
  operator command where the stage has a name: refused like the executor refuses one;
- stage 1 skips another cluster's GPU, port and kernel telemetry, counted, and labels its findings;
- the executor's consume loop refuses a command addressed to another cluster: dead-lettered with
  the reason and counted, and it never reaches the code that acts.
"""

from __future__ import annotations

import asyncio

import msgspec
import numpy as np
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from fleetmedic import records as r
from fleetmedic.config import Settings, parse_config
from fleetmedic.devenv.synth import gpu_message
from fleetmedic.executor.metrics import ExecutorMetrics
from fleetmedic.executor.service import ExecutorService
from fleetmedic.signing import sign, verify
from fleetmedic.streams.decide import DecideStage
from fleetmedic.streams.detect import DetectStage
from fleetmedic.streams.outputs import Source
from tests.streams.helpers_fakes import FakeOutputs, consumer_record, sample
from tests.streams.helpers_findings import NODES, T0, xid_finding

KEY = b"k" * 40
OPERATOR_KEY = b"o" * 40
EAST = parse_config("cluster: {name: gpu-east-1}", env={})


def _decide(settings: Settings = EAST) -> tuple[DecideStage, FakeOutputs]:
    out = FakeOutputs(settings)
    return DecideStage(settings, KEY, out, out.metrics, None, set()), out


def _src(settings: Settings, name: str, record: r.Record, offset: int = 0, key: bytes = b"k") -> Source:
    return Source(settings.topics.topic(name), 0, offset, key, r.encode(record))


async def _fleet(stage: DecideStage, cluster: str) -> None:
    for i, n in enumerate(NODES):
        obs = r.NodeObservation(node=n, ts=T0, labels={"fleetmedic.io/rack": f"r{i % 4}"}, cluster=cluster)
        await stage.handle_record(_src(stage.settings, "cluster.nodes", obs, offset=i, key=n.encode()))


def test_decide_labels_what_it_sends_and_signs_the_cluster_into_each_command() -> None:
    stage, out = _decide()
    finding = msgspec.structs.replace(xid_finding("n3", T0 + 60), cluster="gpu-east-1")

    async def go() -> None:
        await _fleet(stage, "gpu-east-1")
        await stage.handle_record(_src(EAST, "findings", finding, offset=1, key=b"n3"))

    asyncio.run(go())
    commands = out.records("remediation.commands", r.RemediationCommand)
    assert commands and {c.cluster for c in commands} == {"gpu-east-1"}
    for c in commands:
        verify(c, KEY, c.issued_at, max_future_skew_s=EAST.streams.max_future_skew_s)  # the body signature
        moved = msgspec.structs.replace(c, cluster="gpu-west-2")
        assert moved.signature == c.signature
        try:
            verify(moved, KEY, c.issued_at, max_future_skew_s=EAST.streams.max_future_skew_s)
        except ValueError as exc:
            assert "signature does not match" in str(exc)
        else:
            raise AssertionError("a command readdressed to another cluster still verified")
    assert {i.cluster for i in out.records("incidents", r.Incident)} == {"gpu-east-1"}
    assert {a.cluster for a in out.records("remediation.audit", r.AuditRecord)} == {"gpu-east-1"}
    assert not out.dead_letters()


def test_decide_skips_another_clusters_records_counted_and_not_dead_lettered() -> None:
    stage, out = _decide()
    west = "gpu-west-2"
    finding = msgspec.structs.replace(xid_finding("n3", T0 + 60), cluster=west)
    job = r.JobEvent(job="ml/train", event="failure", ts=T0 + 61, node="n3", cluster=west)
    result = r.RemediationResult(command_id="x/cordon/n3/1", action="cordon", outcome="applied", ts=T0 + 62,
                                 node="n3", cluster=west)
    operator = sign(r.OperatorCommand(id="op-1", action="clear_node", actor="ops", reason="repaired", node="n3",
                                      issued_at=T0 + 63, expires_at=T0 + 663, cluster=west), OPERATOR_KEY)

    async def go() -> None:
        await _fleet(stage, west)  # another cluster's node list: no topology here
        for name, rec in (("findings", finding), ("jobs.events", job), ("remediation.results", result),
                          ("remediation.operator", operator)):
            await stage.handle_record(_src(EAST, name, rec, offset=100))

    asyncio.run(go())
    assert not out.values("remediation.commands") and not out.values("incidents") and not out.dead_letters()
    assert stage.engine.fleet_size == 0  # the other cluster's nodes are not counted in this one's fleet
    for name, n in (("cluster.nodes", len(NODES)), ("findings", 1), ("jobs.events", 1), ("remediation.results", 1),
                    ("remediation.operator", 1)):
        assert sample(out.metrics, "fleetmedic_records_skipped_total", topic=EAST.topics.topic(name),
                      stage="decide", reason="other_cluster") == n, name


def test_unlabeled_records_are_every_clusters_but_an_unlabeled_operator_command_is_refused() -> None:
    stage, out = _decide()
    finding = xid_finding("n3", T0 + 60)
    assert finding.cluster == ""
    operator = sign(r.OperatorCommand(id="op-1", action="resume_breaker", actor="ops", reason="storm over",
                                      issued_at=T0 + 70, expires_at=T0 + 670), OPERATOR_KEY)

    async def go() -> None:
        await _fleet(stage, "")  # a watch-jobs without cluster.name
        await stage.handle_record(_src(EAST, "findings", finding, offset=1, key=b"n3"))
        await stage.handle_record(_src(EAST, "remediation.operator", operator, offset=2))

    asyncio.run(go())
    assert stage.engine.fleet_size == len(NODES)
    assert {c.cluster for c in out.records("remediation.commands", r.RemediationCommand)} == {"gpu-east-1"}
    (dead,) = out.dead_letters()
    assert "op-1" in dead.error and "names no cluster" in dead.error and dead.cluster == "gpu-east-1"
    assert stage.operator_commands.labels("rejected")._value.get() == 1


def test_stage1_skips_another_clusters_telemetry_and_labels_its_findings() -> None:
    out = FakeOutputs(EAST)
    stage = DetectStage(EAST, out, out.metrics, 256, 0.5, 60.0, 10.0)
    rng = np.random.default_rng(1)
    tp = TopicPartition(stage.gpu_topic, 0)
    xid = [r.XidEvent(gpu=2, xid=79, ts=T0 + 50)]

    def batch(node: str, cluster: str, first: int) -> list[object]:
        msgs = [gpu_message(node, T0 + 10 * k, rng, xids=xid if k == 5 else None) for k in range(6)]
        return [consumer_record(stage.gpu_topic, r.encode(msgspec.structs.replace(m, cluster=cluster)),
                                offset=first + i, key=node.encode()) for i, m in enumerate(msgs)]

    port = r.PortTelemetry(device="n9", device_kind="host", ts=T0, ports=[], cluster="gpu-west-2")
    kernel = r.KernelEvent(node="n9", ts=T0, signal="xid", incident_class="hardware", severity="critical",
                           message="NVRM: Xid (PCI:0000:3b:00): 79", xid=79, cluster="gpu-west-2")

    async def go() -> None:
        await stage._process({tp: batch("n9", "gpu-west-2", 0)})  # type: ignore[dict-item]
        await stage._process({tp: batch("n1", "gpu-east-1", 10)})  # type: ignore[dict-item]
        await stage._process({TopicPartition(stage.kernel_topic, 0): [consumer_record(stage.kernel_topic,
                                                                                      r.encode(kernel))],
                              TopicPartition(EAST.topics.topic("telemetry.port"), 0): [
                                  consumer_record(EAST.topics.topic("telemetry.port"), r.encode(port))]})

    asyncio.run(go())
    findings = out.records("findings", r.Finding)
    assert findings and {f.node for f in findings} == {"n1"} and {f.cluster for f in findings} == {"gpu-east-1"}
    assert not out.dead_letters()
    skipped = {topic: sample(out.metrics, "fleetmedic_records_skipped_total", topic=topic, stage="detect",
                             reason="other_cluster")
               for topic in (stage.gpu_topic, stage.kernel_topic, EAST.topics.topic("telemetry.port"))}
    assert list(skipped.values()) == [6, 1, 1]


class _Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def send_and_wait(self, topic: str, key: bytes | None = None, value: bytes = b"") -> None:
        self.sent.append((topic, value))


def _service(settings: Settings) -> tuple[ExecutorService, CollectorRegistry]:
    service = ExecutorService.__new__(ExecutorService)  # the consume loop's helpers need no cluster
    registry = CollectorRegistry()
    service.settings, service.metrics = settings, ExecutorMetrics(registry)
    return service, registry


def _record(cmd: r.RemediationCommand, offset: int) -> object:
    return consumer_record(EAST.topics.topic("remediation.commands"), r.encode(cmd), offset=offset,
                           key=cmd.node.encode())


def test_the_executor_loop_refuses_a_command_for_another_cluster_dead_lettered_and_counted() -> None:
    service, registry = _service(EAST)
    producer, tp = _Producer(), TopicPartition(EAST.topics.topic("remediation.commands"), 0)
    base = r.RemediationCommand(id="inc-1/drain/n3/1", action="drain", incident_id="inc-1", reason="xid 79",
                                issued_at=T0, expires_at=T0 + 300, node="n3")
    west = sign(msgspec.structs.replace(base, cluster="gpu-west-2"), KEY)
    east = sign(msgspec.structs.replace(base, cluster="gpu-east-1"), KEY)
    unlabeled = sign(base, KEY)

    async def go() -> list[bool]:
        return [await service._foreign(producer, tp, _record(c, i), c)  # type: ignore[arg-type]
                for i, c in enumerate((west, east, unlabeled))]

    assert asyncio.run(go()) == [True, False, True]
    letters = [r.decode(r.DeadLetter, v) for _, v in producer.sent]
    assert [d.offset for d in letters] == [0, 2] and {d.stage for d in letters} == {"executor"}
    assert "addressed to cluster 'gpu-west-2'" in letters[0].error and "names no cluster" in letters[1].error
    assert {d.cluster for d in letters} == {"gpu-east-1"}
    assert registry.get_sample_value("fleetmedic_executor_rejected_total", {"reason": "cluster"}) == 2

    allowing = parse_config("cluster: {name: gpu-east-1, accept_unlabeled_commands: true}", env={})
    service, _ = _service(allowing)
    assert asyncio.run(service._foreign(producer, tp, _record(unlabeled, 3), unlabeled)) is False  # type: ignore[arg-type]
    unnamed, _ = _service(Settings())
    assert asyncio.run(unnamed._foreign(producer, tp, _record(unlabeled, 4), unlabeled)) is False  # type: ignore[arg-type]
    assert asyncio.run(unnamed._foreign(producer, tp, _record(east, 5), east)) is True  # type: ignore[arg-type]
