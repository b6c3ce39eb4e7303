"""Job logs: Fluent Bit JSON lines parsed (job from pod labels, node, time), classified with the
pattern library, gathered per job and published as rate-limited failure JobEvents carrying the
strongest lines; bad messages counted. The last test runs the connector on a real broker."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from fleetmedic import records as r
from fleetmedic.config import LogExporterSettings, Settings
from fleetmedic.connectors.logs.events import LogSource
from fleetmedic.connectors.logs.failures import BadLogLine, FailureLogGate, LogLine, parse_log_message
from fleetmedic.connectors.runtime import ConnectorMetrics, KafkaSink, Outbox, PumpSettings, run_until_stopped
from fleetmedic.devenv.kafka import produce
from fleetmedic.remediation.log_patterns import default_library
from tests.streams.helpers_harness import collect_sync

ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"
NCCL = ("[rank3]:[E ProcessGroupNCCL.cpp:563] [Rank 3] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600054 "
        "milliseconds before timing out.")
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def fluent_bit(line: str, node: str = "gpu-node-7", pod: str = "llama-worker-3", ts: float = 1_700_000_000.25,
               labels: dict[str, str] | None = None, namespace: str = "ml") -> bytes:
    """A line as Fluent Bit's kubernetes filter and Kafka output (format json) ship it."""
    return json.dumps({
        "@timestamp": ts, "log": line + "\n", "stream": "stderr", "time": "2023-11-14T22:13:20.250000000Z",
        "kubernetes": {"pod_name": pod, "namespace_name": namespace, "pod_id": "3c7b8a0e-0000-4000-8000-000000000001",
                       "labels": labels if labels is not None else {
                           "training.kubeflow.org/job-name": "llama", "training.kubeflow.org/replica-type": "worker",
                           "training.kubeflow.org/replica-index": "3"},
                       "host": node, "container_name": "pytorch", "docker_id": "4f2a", "container_image": "x:1"},
    }).encode()


def test_a_fluent_bit_line_names_the_job_node_attempt_and_time() -> None:
    line = parse_log_message(fluent_bit(ECC), LogExporterSettings(), now=0)
    assert line == LogLine(job="ml/llama", attempt=0, node="gpu-node-7", pod="llama-worker-3", ts=1_700_000_000.25,
                           text=ECC)
    jobset = {"jobset.sigs.k8s.io/jobset-name": "gpt", "job-name": "gpt-workers-0",
              "jobset.sigs.k8s.io/restart-attempt": "2"}
    line = parse_log_message(fluent_bit(OOM, labels=jobset), LogExporterSettings(), now=0)
    assert (line.job, line.attempt) == ("ml/gpt", 2), "the JobSet, not its child Job, is the job"


@pytest.mark.parametrize(("message", "reason"), [
    (b"\x00not json", "not valid JSON"),
    (b'{"kubernetes": {}}', "log: missing or not a string"),
    (b'{"log": "x"}', "kubernetes: missing or not an object"),
    (fluent_bit("x", labels={"app": "web"}), "kubernetes.labels: no job label"),
    (fluent_bit("x", namespace="Bad_NS"), "kubernetes.namespace_name: missing or not a namespace name"),
])
def test_messages_that_are_not_job_log_lines_say_why(message: bytes, reason: str) -> None:
    with pytest.raises(BadLogLine, match=reason):
        parse_log_message(message, LogExporterSettings(), now=0)


def _line(text: str, node: str = "gpu-node-7", ts: float = 100.0, job: str = "ml/llama") -> LogLine:
    return LogLine(job=job, attempt=0, node=node, pod="p", ts=ts, text=text)


def test_the_gate_settles_keeps_the_strongest_lines_and_rate_limits_per_job() -> None:
    lib = default_library()
    gate = FailureLogGate(excerpt_lines=2, settle_s=5, per_job_interval_s=60)
    gate.add(_line(NCCL, ts=100), lib.classify(NCCL), now=100)
    gate.add(_line(OOM, ts=101), lib.classify(OOM), now=101)
    gate.add(_line(ECC, ts=102), lib.classify(ECC), now=102)
    assert gate.due(104.9) == [], "still gathering the job's lines"
    (event,) = gate.due(105)
    assert (event.job, event.event, event.node, event.ts) == ("ml/llama", "failure", "gpu-node-7", 102)
    assert event.log_excerpt == [OOM, ECC], "the two strongest, in log order; the NCCL symptom dropped"
    assert event.reason.startswith("log: cuda_uncorrectable_ecc (hardware)")
    assert gate.dropped == {"log line beyond excerpt_lines": 1}
    gate.add(_line(OOM, ts=110), lib.classify(OOM), now=110)
    assert gate.due(120) == [], "one event per job per interval"
    (later,) = gate.due(165)
    assert later.log_excerpt == [OOM]


def test_lines_from_two_nodes_make_one_event_per_node_with_the_rank() -> None:
    lib = default_library()
    gate = FailureLogGate(excerpt_lines=5, settle_s=0, per_job_interval_s=60)
    gate.add(_line(ECC, node="gpu-node-1"), lib.classify(ECC), now=100)
    gate.add(_line(NCCL, node="gpu-node-2"), lib.classify(NCCL), now=100)
    one, two = gate.due(100)
    assert (one.node, one.log_excerpt, one.rank) == ("gpu-node-1", [ECC], None)
    assert (two.node, two.rank) == ("gpu-node-2", 3)


def test_the_connector_turns_a_log_topic_into_failure_events(connector_settings: Callable[..., Settings]) -> None:
    probe = connector_settings()
    topic = f"{probe.topics.prefix}logs"
    settings = connector_settings(f"exporters: {{logs: {{topics: ['{topic}'], settle_s: 0.5, "
                                  f"group_id: '{probe.topics.prefix}logs'}}}}")
    now = time.time()
    lines = [fluent_bit("step 100 loss 2.31", ts=now), fluent_bit(NCCL, ts=now + 1), b"garbage",
             fluent_bit(ECC, ts=now + 2), fluent_bit("step 101 loss 2.30", ts=now + 3)]
    asyncio.run(produce(settings.kafka.bootstrap_servers, [(topic, b"llama-worker-3", m) for m in lines]))
    registry = CollectorRegistry()
    metrics = ConnectorMetrics(registry, "logs")
    outbox = Outbox(100, metrics)
    src = LogSource(settings, outbox, metrics)
    jobs_topic = settings.topics.topic("jobs.events")

    async def main() -> None:
        stop = asyncio.Event()

        async def watch() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not registry.get_sample_value(
                    "fleetmedic_connector_records_out_total", {"connector": "logs", "topic": jobs_topic}):
                await asyncio.sleep(0.1)
            stop.set()

        watching = asyncio.create_task(watch())
        await run_until_stopped(src.run, outbox, KafkaSink(settings), metrics, PumpSettings(), stop,
                                handle_signals=False)
        await watching

    asyncio.run(main())
    got = collect_sync(settings.kafka.bootstrap_servers, [jobs_topic], lambda c: len(c.values(jobs_topic)) >= 1, 30)
    (event,) = [r.decode(r.JobEvent, v) for v in got.values(jobs_topic)]
    assert (event.job, event.event, event.node, event.attempt) == ("ml/llama", "failure", "gpu-node-7", 0)
    assert event.log_excerpt == [NCCL, ECC] and event.rank == 3
    assert "cuda_uncorrectable_ecc" in event.reason
    assert registry.get_sample_value("fleetmedic_connector_skipped_total",
                                     {"connector": "logs", "reason": "not valid JSON"}) == 1
