"""The connector runtime: a bounded outbox that drops the oldest telemetry (counted) instead of
growing, consumers that wait for room, sends retried with backoff while the broker is unreachable,
metrics on the injected registry, and a CLI exporter that drains and exits 0 on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry

from fleetmedic import records as r
from fleetmedic.config import parse_config
from fleetmedic.connectors.runtime import (
    Backoff,
    ConnectorMetrics,
    JsonlSink,
    KafkaSink,
    Outbox,
    Outgoing,
    PumpSettings,
    pump,
    reason_label,
)
from fleetmedic.devenv import proc
from tests.connectors.prometheus.helpers_exposition import dcgm_text

ROOT = Path(__file__).resolve().parents[2]


def _item(i: int) -> Outgoing:
    rec = r.GpuTelemetry(node=f"n{i}", ts=float(i), gpus=[0], metrics=r.GpuMetrics(gpu_temp=[40.0]))
    return Outgoing("t", rec.node, rec)


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_a_full_outbox_drops_the_oldest_telemetry_and_counts_it() -> None:
    registry = CollectorRegistry()
    outbox = Outbox(3, ConnectorMetrics(registry, "x"))
    for i in range(5):
        outbox.offer(_item(i))
    assert [o.key for o in outbox.peek(10)] == ["n2", "n3", "n4"]
    assert _value(registry, "fleetmedic_connector_dropped_total", connector="x") == 2
    assert _value(registry, "fleetmedic_connector_queue_depth", connector="x") == 3


def test_a_consumer_waits_for_room_instead_of_dropping() -> None:
    async def main() -> list[str]:
        outbox = Outbox(2, ConnectorMetrics(CollectorRegistry(), "x"))
        await outbox.put(_item(0))
        await outbox.put(_item(1))
        third = asyncio.create_task(outbox.put(_item(2)))
        await asyncio.sleep(0.05)
        assert not third.done(), "no room: the consumer waits (and stops reading its topic)"
        outbox.remove(outbox.peek(1))
        await asyncio.wait_for(third, 5)
        return [o.key for o in outbox.peek(10)]

    assert asyncio.run(main()) == ["n1", "n2"]


def test_backoff_doubles_to_the_cap_and_resets() -> None:
    b = Backoff(0.5, 3.0)
    assert [b.next_delay() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    b.reset()
    assert b.next_delay() == 0.5
    assert reason_label("unparsable line 1234") == "unparsable line N"


def test_an_unreachable_broker_is_retried_with_backoff_while_memory_stays_bounded() -> None:
    (port,) = proc.free_ports(1)  # nothing listens there
    settings = parse_config(f"kafka: {{bootstrap_servers: '127.0.0.1:{port}', request_timeout_s: 1}}")
    registry = CollectorRegistry()
    metrics = ConnectorMetrics(registry, "x")
    outbox = Outbox(10, metrics)

    async def main() -> None:
        stop = asyncio.Event()
        pumping = asyncio.create_task(pump(outbox, KafkaSink(settings), metrics, stop,
                                           PumpSettings(drain_timeout_s=0.5, backoff=Backoff(0.05, 0.2))))
        for i in range(50):  # sampling goes on at its pace while Kafka is away
            outbox.offer(_item(i))
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(pumping, 30)

    asyncio.run(main())
    errors = sum(s.value for m in registry.collect() if m.name == "fleetmedic_connector_errors"
                 for s in m.samples if s.name.endswith("_total"))
    assert errors >= 2, "each failed attempt is counted, then retried"
    assert len(outbox) == 10 and _value(registry, "fleetmedic_connector_dropped_total", connector="x") == 40
    assert [o.key for o in outbox.peek(10)][-1] == "n49", "the newest telemetry is kept"


def test_sends_resume_after_failures_and_the_last_success_time_is_set(tmp_path: Path) -> None:
    class FlakySink(JsonlSink):
        failures = 3

        async def send_batch(self, items: list[Outgoing]) -> None:
            if self.failures:
                self.failures -= 1
                raise ConnectionError("broker went away")
            await super().send_batch(items)

    registry = CollectorRegistry()
    metrics = ConnectorMetrics(registry, "x")
    outbox = Outbox(100, metrics)
    out = tmp_path / "out.jsonl"
    for i in range(5):
        outbox.offer(_item(i))

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(pump(outbox, FlakySink(str(out)), metrics, stop,
                                        PumpSettings(backoff=Backoff(0.01, 0.05)), clock=lambda: 1234.0))
        deadline = time.monotonic() + 10
        while len(outbox) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        stop.set()
        await task

    asyncio.run(main())
    assert [json.loads(x)["key"] for x in out.read_text().splitlines()] == [f"n{i}" for i in range(5)]
    assert _value(registry, "fleetmedic_connector_errors_total", connector="x", kind="ConnectionError") == 3
    assert _value(registry, "fleetmedic_connector_records_out_total", connector="x", topic="t") == 5
    assert _value(registry, "fleetmedic_connector_last_success_timestamp_seconds", connector="x") == 1234.0


def test_the_cli_exporter_serves_metrics_and_drains_on_sigterm(
    tmp_path: Path, fixture_exporter: Callable[[Callable[[int], str]], str]
) -> None:
    target = fixture_exporter(dcgm_text)
    (metrics_port,) = proc.free_ports(1)
    config = tmp_path / "c.yaml"
    config.write_text(f"exporters: {{prometheus: {{targets: ['{target}'], interval_s: 0.2}}}}\n"
                      "cluster: {name: gpu-east-1}\n")
    out = tmp_path / "records.jsonl"
    p = subprocess.Popen([sys.executable, "-m", "fleetmedic.cli", "exporter", "prometheus", "--config", str(config),
                          "--output", str(out), "--metrics-port", str(metrics_port)], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 2):
            time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        assert ('fleetmedic_connector_records_out_total{cluster="gpu-east-1",connector="prometheus",'
                'topic="fleetmedic.telemetry.gpu"}') in text
        p.send_signal(signal.SIGTERM)
        log = p.communicate(timeout=30)[0].decode()
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, log
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(records) >= 2 and records[0]["record"]["node"] == "gpu-node-7"
    assert {x["record"]["cluster"] for x in records} == {"gpu-east-1"}


def test_the_sinks_label_every_record_with_the_cluster(tmp_path: Path) -> None:
    class Producer:
        def __init__(self) -> None:
            self.values: list[bytes] = []

        async def send(self, topic: str, value: bytes, key: bytes) -> asyncio.Future[None]:
            self.values.append(value)
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done

    named = parse_config("cluster: {name: gpu-east-1}", env={})
    kafka, producer = KafkaSink(named), Producer()
    kafka._producer = producer
    files = {name: JsonlSink(str(tmp_path / f"{name}.jsonl"), cluster) for name, cluster in
             (("named", "gpu-east-1"), ("unnamed", ""))}

    async def go() -> None:
        for sink in (kafka, *files.values()):
            await sink.send_batch([_item(1), _item(2)])
        for sink in files.values():
            await sink.stop()

    asyncio.run(go())
    assert [r.decode(r.GpuTelemetry, v).cluster for v in producer.values] == ["gpu-east-1"] * 2
    for name, cluster in (("named", "gpu-east-1"), ("unnamed", "")):
        lines = (tmp_path / f"{name}.jsonl").read_text().splitlines()
        assert [json.loads(x)["record"]["cluster"] for x in lines] == [cluster] * 2


def test_a_consumer_that_cannot_reach_its_broker_retries_and_stops_cleanly() -> None:
    from fleetmedic.connectors.runtime import run_consumer

    (port,) = proc.free_ports(1)
    settings = parse_config(f"kafka: {{bootstrap_servers: '127.0.0.1:{port}', request_timeout_s: 1}}\n"
                            "exporters: {reconnect_min_s: 0.05, reconnect_max_s: 0.1}")
    registry = CollectorRegistry()
    metrics = ConnectorMetrics(registry, "x")

    async def nothing(*_: object) -> None:
        return None

    async def main() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(2.0, stop.set)
        await asyncio.wait_for(run_consumer(settings, ["t"], "g", stop, metrics, nothing, nothing), 60)

    asyncio.run(main())
    errors = sum(s.value for m in registry.collect() if m.name == "fleetmedic_connector_errors"
                 for s in m.samples if s.name.endswith("_total") and s.labels["kind"].startswith("consumer_"))
    assert errors >= 2, "every failed connection is counted and retried"
