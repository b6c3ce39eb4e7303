"""Kafka telemetry import: Telegraf JSON and prometheus-kafka-adapter JSON mapped through the
built-in and configured metric maps, grouped per node per window into GpuTelemetry/PortTelemetry;
bad messages counted and dead-lettered. The last test runs the connector on a real broker."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from fleetmedic import records as r
from fleetmedic.config import IngestSettings, KafkaTelemetrySettings, Settings, parse_config
from fleetmedic.connectors.kafka_telemetry.exporter import KafkaTelemetrySource
from fleetmedic.connectors.kafka_telemetry.exporter_map import BadMessage, PointMapper, Windows
from fleetmedic.connectors.runtime import ConnectorMetrics, KafkaSink, Outbox, PumpSettings, run_until_stopped
from fleetmedic.devenv.kafka import produce
from tests.streams.helpers_harness import collect_sync

T0 = 1_700_000_000  # a window boundary for window_s 10


def telegraf_nvidia_smi(index: int, temp: float, ts: float, host: str = "gpu-node-1") -> bytes:
    return json.dumps({
        "name": "nvidia_smi",
        "tags": {"host": host, "index": str(index), "name": "NVIDIA A100-SXM4-80GB", "pstate": "P0",
                 "uuid": f"GPU-a1b2c3d4-0000-0000-0000-00000000000{index}"},
        "fields": {"temperature_gpu": temp, "power_draw": 250.5, "utilization_gpu": 99, "memory_used": 70000,
                   "fan_speed": 0, "clocks_current_sm": 1410},
        "timestamp": ts,
    }).encode()


def telegraf_prometheus_v1(series: str, value: float, ts_ms: int, gpu: str = "0") -> bytes:
    return json.dumps({"name": series, "tags": {"Hostname": "gpu-node-2", "gpu": gpu, "url": "http://x:9400/metrics"},
                       "fields": {"gauge": value}, "timestamp": ts_ms}).encode()


def adapter(name: str, value: str, when: str, **labels: str) -> bytes:
    return json.dumps({"timestamp": when, "value": value, "name": name,
                       "labels": {"__name__": name, **labels}}).encode()


def test_telegraf_nvidia_smi_and_prometheus_input_map_to_gpu_metrics() -> None:
    mapper = PointMapper(KafkaTelemetrySettings())
    points = mapper.points(telegraf_nvidia_smi(1, 61.0, T0))
    got = {(p.node, p.gpu, p.target, p.value) for p in points}
    assert got == {("gpu-node-1", 1, "gpu_temp", 61.0), ("gpu-node-1", 1, "power_usage", 250.5),
                   ("gpu-node-1", 1, "gpu_util", 99.0), ("gpu-node-1", 1, "fb_used", 70000.0),
                   ("gpu-node-1", 1, "sm_clock", 1410.0)}, "fan_speed is not in the map: ignored"
    (p,) = mapper.points(telegraf_prometheus_v1("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 2, T0 * 1000))
    assert (p.node, p.gpu, p.target, p.value, p.ts) == ("gpu-node-2", 0, "ecc_dbe_vol_total", 2.0, float(T0))
    v2 = {"name": "prometheus", "tags": {"host": "n3", "gpu": "5"}, "fields": {"DCGM_FI_DEV_SM_CLOCK": 1200},
          "timestamp": T0 * 10**9}
    (p,) = mapper.points(json.dumps({"metrics": [v2]}).encode())
    assert (p.node, p.gpu, p.target, p.ts) == ("n3", 5, "sm_clock", float(T0))


def test_adapter_json_and_port_counters_with_node_exporter_units() -> None:
    mapper = PointMapper(KafkaTelemetrySettings(format="prometheus_kafka_adapter"))
    (p,) = mapper.points(adapter("node_infiniband_port_data_received_bytes_total", "4096", "2023-11-14T22:13:20Z",
                                 instance="10.0.0.9:9100", device="mlx5_1", port="1"))
    assert (p.node, p.port, p.target, p.value, p.ts) == ("10.0.0.9", "mlx5_1/1", "port_rcv_data", 1024.0, float(T0))
    (p,) = mapper.points(adapter("node_infiniband_state_id", "1", "2023-11-14T22:13:20Z", node="n1", device="mlx5_0",
                                 port="1"))
    assert (p.target, p.value) == ("_state", 1.0), "the raw id: the window decides the link state"
    assert mapper.points(adapter("node_load1", "3", "2023-11-14T22:13:20Z", node="n1")) == []


@pytest.mark.parametrize(("state", "phys", "link"), [
    ("4", "5", "up"),  # ACTIVE, LinkUp
    ("4", "3", "down"),  # logically ACTIVE but no physical link (3 = Disabled): down, as the exposition reader says
    ("1", "5", "down"),  # DOWN
    ("2", None, "init"),
    (None, "5", "up"),  # only the physical state: LinkUp
    (None, "2", "down"),  # only the physical state: Polling
])
def test_ib_port_state_comes_from_both_state_series_as_in_the_exposition_reader(
        state: str | None, phys: str | None, link: str) -> None:
    """node-exporter's ``node_infiniband_physical_state_id`` counts on the Kafka path as in the
    exposition reader: the same port read both ways gets the same link state."""
    from fleetmedic.connectors.prometheus.text import ExpositionReader

    mapper = PointMapper(KafkaTelemetrySettings(format="prometheus_kafka_adapter"))
    windows = Windows(10.0, 5.0, IngestSettings(), "kafka-adapter")
    lines = []
    for series, value in (("node_infiniband_state_id", state), ("node_infiniband_physical_state_id", phys),
                          ("node_infiniband_port_errors_received_total", "3")):
        if value is None:
            continue
        for point in mapper.points(adapter(series, value, "2023-11-14T22:13:21Z", instance="n1:9100",
                                           device="mlx5_0", port="1")):
            windows.add(point)
        lines.append(f'{series}{{device="mlx5_0",port="1",instance="n1:9100"}} {value} {(T0 + 1) * 1000}')
    (via_kafka,) = windows.due(float("inf"))
    assert isinstance(via_kafka, r.PortTelemetry)
    (port,) = via_kafka.ports
    assert (port.port, port.link_state, port.port_rcv_errors) == ("mlx5_0/1", link, 3)
    (via_text,) = list(ExpositionReader(IngestSettings()).read(lines))
    assert isinstance(via_text, r.PortTelemetry) and via_text.ports[0].link_state == link


def test_legacy_ib_data_counters_count_only_where_the_64_bit_ones_are_missing() -> None:
    mapper = PointMapper(KafkaTelemetrySettings(format="prometheus_kafka_adapter"))
    windows = Windows(10.0, 5.0, IngestSettings(), "kafka-adapter")
    for series, value, device in (("node_infiniband_legacy_data_received_bytes_total", "400", "mlx5_0"),
                                  ("node_infiniband_port_data_received_bytes_total", "800", "mlx5_0"),
                                  ("node_infiniband_legacy_data_received_bytes_total", "40", "mlx5_1")):
        for point in mapper.points(adapter(series, value, "2023-11-14T22:13:21Z", node="n1", device=device,
                                           port="1")):
            windows.add(point)
    (rec,) = windows.due(float("inf"))
    assert isinstance(rec, r.PortTelemetry)
    assert [(p.port, p.port_rcv_data) for p in rec.ports] == [("mlx5_0/1", 200), ("mlx5_1/1", 10)]


def test_the_configured_map_adds_and_overrides_entries() -> None:
    cfg = parse_config("exporters: {kafka: {metric_map: {gpu_temperature_celsius: gpu_temp, "
                       "'nvidia_smi.temperature_gpu': memory_temp}}}").exporters.kafka
    mapper = PointMapper(cfg)
    msg = {"name": "custom", "tags": {"node": "n", "gpu": "0"}, "fields": {"gpu_temperature_celsius": 50},
           "timestamp": T0}
    assert [p.target for p in mapper.points(json.dumps(msg).encode())] == ["gpu_temp"]
    assert {p.target for p in mapper.points(telegraf_nvidia_smi(0, 40, T0))} >= {"memory_temp"}
    with pytest.raises(ValueError, match=r"metric_map\.x: `gpu_tmp` is not a GPU metric"):
        parse_config("exporters: {kafka: {metric_map: {x: gpu_tmp}}}")


@pytest.mark.parametrize(("message", "reason"), [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "the message is not a JSON object"),
    (b'{"tags": {}, "fields": {}, "timestamp": 1}', "name: missing or not a string"),
    (b'{"name": "nvidia_smi", "tags": {"host": "n", "index": "0"}, "fields": {"temperature_gpu": 1}, '
     b'"timestamp": "soon"}', "timestamp: 'soon' is not a number"),
    (b'{"name": "nvidia_smi", "tags": {"host": "n", "index": "0"}, "fields": {"temperature_gpu": "hot"}, '
     b'"timestamp": 1}', "temperature_gpu: value 'hot' is not a number"),
    (b'{"name": "nvidia_smi", "tags": {"index": "0"}, "fields": {"temperature_gpu": 1}, "timestamp": 1}',
     "temperature_gpu: no node tag (host, Hostname, node, instance)"),
    (b'{"name": "nvidia_smi", "tags": {"host": "n"}, "fields": {"temperature_gpu": 1}, "timestamp": 1}',
     "temperature_gpu: no GPU index tag (gpu, index)"),
])
def test_bad_messages_name_the_field_and_reason(message: bytes, reason: str) -> None:
    with pytest.raises(BadMessage) as err:
        PointMapper(KafkaTelemetrySettings()).points(message)
    assert str(err.value).startswith(reason)


def test_windows_group_a_node_per_interval_and_wait_for_the_grace_period() -> None:
    mapper = PointMapper(KafkaTelemetrySettings())
    windows = Windows(10.0, 5.0, IngestSettings(), "kafka-telegraf")
    for msg in (telegraf_nvidia_smi(0, 40, T0 + 1), telegraf_nvidia_smi(1, 60, T0 + 2),
                telegraf_nvidia_smi(0, 41, T0 + 3), telegraf_nvidia_smi(0, 50, T0 + 12)):
        for p in mapper.points(msg):
            windows.add(p)
    assert list(windows.due(T0 + 14.9)) == []
    (first,) = windows.due(T0 + 15)
    assert isinstance(first, r.GpuTelemetry)
    assert (first.node, first.ts, first.gpus, first.source) == ("gpu-node-1", T0 + 3, [0, 1], "kafka-telegraf")
    assert first.metrics.gpu_temp == [41.0, 60.0], "the newest value of a metric in the window wins"
    assert first.sku == "NVIDIA A100-SXM4-80GB" and first.uuids[1].endswith("1")
    (second,) = windows.due(float("inf"))
    assert isinstance(second, r.GpuTelemetry) and second.gpus == [0] and second.metrics.gpu_temp == [50.0]


def test_the_connector_republishes_a_users_topic_and_dead_letters_bad_messages(
    connector_settings: Callable[..., Settings],
) -> None:
    probe = connector_settings()
    source_topic = f"{probe.topics.prefix}user.telegraf"
    settings = connector_settings(f"exporters: {{kafka: {{topics: ['{source_topic}'], window_s: 10, grace_s: 0, "
                                  f"group_id: '{probe.topics.prefix}import'}}}}")
    now = time.time()
    base = now - now % 10 - 60  # complete windows in the past: emitted as soon as read
    messages = [telegraf_nvidia_smi(g, 40 + g + w, base + 10 * w + 1) for w in range(3) for g in range(2)]
    messages.append(b'{"name": "nvidia_smi", "tags": {"host": "n"}, "fields": {"temperature_gpu": 1}, "timestamp": 1}')
    messages.append(json.dumps({"name": "infiniband", "tags": {"host": "gpu-node-1", "device": "mlx5_0", "port": "1"},
                                "fields": {"symbol_error": 3, "port_rcv_data": 1000}, "timestamp": base + 1}).encode())
    asyncio.run(produce(settings.kafka.bootstrap_servers, [(source_topic, b"k", m) for m in messages]))

    registry = CollectorRegistry()
    metrics = ConnectorMetrics(registry, "kafka")
    outbox = Outbox(settings.exporters.queue_max, metrics)
    src = KafkaTelemetrySource(settings, outbox, metrics)
    gpu_topic, port_topic = settings.topics.topic("telemetry.gpu"), settings.topics.topic("telemetry.port")
    dead_topic = settings.topics.topic("deadletter")

    async def main() -> None:
        stop = asyncio.Event()

        async def watch() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                sent = registry.get_sample_value("fleetmedic_connector_records_out_total",
                                                 {"connector": "kafka", "topic": gpu_topic}) or 0
                if sent >= 3:
                    break
                await asyncio.sleep(0.1)
            stop.set()

        watching = asyncio.create_task(watch())
        await run_until_stopped(src.run, outbox, KafkaSink(settings), metrics, PumpSettings(), stop,
                                handle_signals=False)
        await watching

    asyncio.run(main())
    got = collect_sync(settings.kafka.bootstrap_servers, [gpu_topic, port_topic, dead_topic],
                       lambda c: len(c.values(gpu_topic)) >= 3 and len(c.values(dead_topic)) >= 1, 30)
    gpu = [r.decode(r.GpuTelemetry, v) for v in got.values(gpu_topic)]
    assert [g.metrics.gpu_temp for g in gpu] == [[40.0, 41.0], [41.0, 42.0], [42.0, 43.0]]
    assert all(g.node == "gpu-node-1" and g.gpus == [0, 1] for g in gpu)
    (ports,) = [r.decode(r.PortTelemetry, v) for v in got.values(port_topic)]
    assert ports.ports[0].port == "mlx5_0/1" and ports.ports[0].symbol_error_counter == 3
    assert ports.ports[0].port_rcv_data == 1000, "Telegraf's infiniband plugin reports sysfs words as they are"
    (dead,) = [r.decode(r.DeadLetter, v) for v in got.values(dead_topic)]
    assert dead.topic == source_topic and dead.stage == "exporter-kafka" and "no GPU index tag" in dead.error
    assert dead.original == messages[6]
    assert registry.get_sample_value("fleetmedic_connector_skipped_total", {
        "connector": "kafka", "reason": "temperature_gpu: no GPU index tag (gpu, index)"}) == 1


def test_a_dead_letter_the_broker_refuses_is_counted_and_the_telemetry_still_goes_out_once(
    connector_settings: Callable[..., Settings],
) -> None:
    """The connector's own dead-letter send is guarded. Here the real broker refuses the dead letter
    (its topic takes 1 KiB records; the bad message is 4 KB): the dead letter is dropped and counted,
    the batch is not sent again, and each telemetry record goes out once."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    probe = connector_settings()
    source_topic = f"{probe.topics.prefix}user.telegraf"
    settings = connector_settings(f"exporters: {{kafka: {{topics: ['{source_topic}'], window_s: 10, grace_s: 0, "
                                  f"group_id: '{probe.topics.prefix}import'}}}}")
    dead_topic, gpu_topic = settings.topics.topic("deadletter"), settings.topics.topic("telemetry.gpu")
    now = time.time()
    base = now - now % 10 - 60
    bad = json.dumps({"name": "nvidia_smi", "tags": {"host": "n", "pad": "x" * 4000},
                      "fields": {"temperature_gpu": 1}, "timestamp": 1}).encode()
    messages = [telegraf_nvidia_smi(0, 40 + w, base + 10 * w + 1) for w in range(3)]
    messages.insert(1, bad)  # between good ones: the batch that carries it carries telemetry too

    async def setup() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(dead_topic, 1, 1, topic_configs={"max.message.bytes": "1024"})])
        finally:
            await admin.close()
        await produce(settings.kafka.bootstrap_servers, [(source_topic, b"k", m) for m in messages])
    asyncio.run(setup())

    registry = CollectorRegistry()
    metrics = ConnectorMetrics(registry, "kafka")
    outbox = Outbox(settings.exporters.queue_max, metrics)
    src = KafkaTelemetrySource(settings, outbox, metrics)

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, {"connector": "kafka", **labels}) or 0.0

    async def main() -> None:
        stop = asyncio.Event()

        async def watch() -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not (
                    value("fleetmedic_connector_records_out_total", topic=gpu_topic) >= 3
                    and value("fleetmedic_connector_dead_letter_failures_total", reason="MessageSizeTooLargeError")):
                await asyncio.sleep(0.1)
            stop.set()

        watching = asyncio.create_task(watch())
        await run_until_stopped(src.run, outbox, KafkaSink(settings), metrics, PumpSettings(drain_timeout_s=3.0),
                                stop, handle_signals=False)
        await watching

    asyncio.run(main())
    got = collect_sync(settings.kafka.bootstrap_servers, [gpu_topic, dead_topic], lambda c: False, 3)
    gpu = [r.decode(r.GpuTelemetry, v) for v in got.values(gpu_topic)]
    assert [g.metrics.gpu_temp for g in gpu] == [[40.0], [41.0], [42.0]], "each record once, none lost"
    assert value("fleetmedic_connector_dead_letter_failures_total", reason="MessageSizeTooLargeError") == 1
    assert got.values(dead_topic) == []
    assert value("fleetmedic_connector_records_out_total", topic=dead_topic) == 0
    assert len(outbox) == 0
