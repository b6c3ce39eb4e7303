"""Prometheus connector: dcgm-exporter/node-exporter text scraped over HTTP, and a real Prometheus
server's API polled, both mapped to GpuTelemetry/PortTelemetry on a real Kafka broker.

The fixture exporter serves real-format dcgm-exporter and node-exporter (infiniband collector) text
whose values change with every scrape; the tests read the produced records back from Kafka."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from fleetmedic import records as r
from fleetmedic.config import IngestSettings, Settings
from fleetmedic.connectors.prometheus.api import ApiAnswerError, Watermarks, api_samples
from fleetmedic.connectors.prometheus.ingest import PrometheusSource
from fleetmedic.connectors.prometheus.text import ExpositionReader
from fleetmedic.connectors.runtime import ConnectorMetrics, KafkaSink, Outbox, PumpSettings, run_until_stopped
from tests.connectors.prometheus.helpers_exposition import dcgm_text
from tests.streams.helpers_harness import Collected, collect_sync


def node_exporter_text(n: int, node: str = "gpu-node-7") -> str:
    lab = f'device="mlx5_0",port="1",node="{node}"'
    return (
        "# HELP node_infiniband_symbol_error_total Number of minor link errors detected on one or more lanes.\n"
        "# TYPE node_infiniband_symbol_error_total counter\n"
        f"node_infiniband_symbol_error_total{{{lab}}} {3 * n}\n"
        f"node_infiniband_port_data_received_bytes_total{{{lab}}} {4000 * (n + 1)}\n"
        f"node_infiniband_state_id{{{lab}}} 4\n"
        f"node_infiniband_rate_bytes_per_second{{{lab}}} 5e+10\n"
        "node_cpu_seconds_total{cpu=\"0\",mode=\"idle\"} 1234.5\n"
    )


def _run(settings: Settings, gpu_records: int, timeout: float = 60.0) -> CollectorRegistry:
    """Run the connector until it has sent ``gpu_records`` GPU records (or ``timeout`` s)."""
    registry = CollectorRegistry()
    metrics = ConnectorMetrics(registry, "prometheus")
    outbox = Outbox(settings.exporters.queue_max, metrics)
    source = PrometheusSource(settings, outbox, metrics)
    labels = {"connector": "prometheus", "topic": settings.topics.topic("telemetry.gpu")}

    async def main() -> None:
        stop = asyncio.Event()

        async def watch() -> None:
            deadline = time.monotonic() + timeout
            while (registry.get_sample_value("fleetmedic_connector_records_out_total", labels) or 0) < gpu_records:
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
            stop.set()

        watching = asyncio.create_task(watch())
        await run_until_stopped(source.run, outbox, KafkaSink(settings), metrics, PumpSettings(), stop,
                                handle_signals=False)
        await watching

    asyncio.run(main())
    return registry


def _records(c: Collected, settings: Settings) -> tuple[list[r.GpuTelemetry], list[r.PortTelemetry]]:
    gpu = [r.decode(r.GpuTelemetry, v) for v in c.values(settings.topics.topic("telemetry.gpu"))]
    ports = [r.decode(r.PortTelemetry, v) for v in c.values(settings.topics.topic("telemetry.port"))]
    return gpu, ports


def test_scrape_mode_maps_exporter_text_to_records_on_kafka(
    fixture_exporter: Callable[[Callable[[int], str]], str], connector_settings: Callable[..., Settings]
) -> None:
    dcgm, nodeexp = fixture_exporter(dcgm_text), fixture_exporter(node_exporter_text)
    settings = connector_settings(
        f"exporters: {{prometheus: {{mode: scrape, interval_s: 0.5, targets: ['{dcgm}', '{nodeexp}']}}}}")
    registry = _run(settings, gpu_records=3)
    topics = [settings.topics.topic("telemetry.gpu"), settings.topics.topic("telemetry.port")]
    got = collect_sync(settings.kafka.bootstrap_servers, topics, lambda c: len(c.values(topics[1])) >= 3, 30)
    gpu, ports = _records(got, settings)
    assert len(gpu) >= 3 and len(ports) >= 3
    first, last = gpu[0], gpu[-1]
    assert first.node == "gpu-node-7" and first.gpus == [0, 1] and first.source == "prometheus-scrape"
    assert first.sku == "NVIDIA H100 80GB HBM3" and first.uuids[1].endswith("0001")
    assert first.metrics.power_usage == [312.015, 312.115]
    assert last.metrics.gpu_temp is not None and last.metrics.gpu_temp[1] > first.metrics.gpu_temp[1]  # type: ignore[index]
    assert last.metrics.ecc_sbe_vol_total is not None and last.metrics.ecc_sbe_vol_total[1] >= 2
    assert last.metrics.clocks_event_reasons == [0, 0x20]
    port = ports[-1].ports[0]
    assert ports[-1].device == "gpu-node-7" and port.port == "mlx5_0/1" and port.link_state == "up"
    assert port.speed_gbps == 400.0 and port.port_rcv_data is not None and port.port_rcv_data % 1000 == 0
    assert registry.get_sample_value("fleetmedic_connector_records_out_total",
                                     {"connector": "prometheus", "topic": topics[0]}) >= 3  # type: ignore[operator]
    # the bad FB_USED line is counted per scrape (the reason never carries the value: a bounded label
    # set), the series fleetmedic does not read are not
    assert registry.get_sample_value("fleetmedic_connector_skipped_total", {
        "connector": "prometheus", "reason": "DCGM_FI_DEV_FB_USED: value is not a number"}) >= 3  # type: ignore[operator]
    assert registry.get_sample_value("fleetmedic_connector_last_success_timestamp_seconds",
                                     {"connector": "prometheus"}) > 1.7e9  # type: ignore[operator]


def test_api_mode_polls_a_real_prometheus_server_and_publishes_each_scrape_once(
    fixture_exporter: Callable[[Callable[[int], str]], str], prometheus: Callable[[list[str]], str],
    connector_settings: Callable[..., Settings],
) -> None:
    target = fixture_exporter(lambda n: dcgm_text(n, bad_line=False) + node_exporter_text(n))
    server = prometheus([target])
    settings = connector_settings(f"exporters: {{prometheus: {{mode: api, interval_s: 1.0, api_url: '{server}'}}}}")
    _run(settings, gpu_records=3)
    topics = [settings.topics.topic("telemetry.gpu"), settings.topics.topic("telemetry.port")]
    got = collect_sync(settings.kafka.bootstrap_servers, topics, lambda c: len(c.values(topics[1])) >= 2, 30)
    gpu, ports = _records(got, settings)
    assert len(gpu) >= 2 and len(ports) >= 2, "the connector ran until it had sent 3"
    # every record is one scrape of one node, published once: timestamps strictly increase
    stamps = [g.ts for g in gpu]
    assert stamps == sorted(set(stamps))
    assert all(g.node == "gpu-node-7" and g.gpus == [0, 1] and g.source == "prometheus-api" for g in gpu)
    temps = [g.metrics.gpu_temp[1] for g in gpu if g.metrics.gpu_temp is not None]
    assert temps == sorted(temps) and temps[-1] > temps[0], "the exporter's GPU 1 warms up scrape by scrape"
    assert all(p.ports[0].port == "mlx5_0/1" and p.ports[0].symbol_error_counter is not None for p in ports)


def test_api_answers_map_with_their_sample_timestamps_and_bad_points_are_counted() -> None:
    doc = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "3", "Hostname": "n1", "job": "dcgm",
                    "instance": "10.0.0.1:9400"},
         "values": [[1700000000.5, "41"], [1700000010.5, "43"], [1700000020.5, "NaN"], [1, "x"]]},
        {"metric": {"gpu": "0"}, "values": [[1700000000.5, "1"]]},
    ]}}
    skipped: Counter[str] = Counter()
    samples = list(api_samples(doc, skipped))
    assert [(s[3], s[2]) for s in samples] == [(1700000000.5, 41.0), (1700000010.5, 43.0)]
    assert skipped == Counter({"DCGM_FI_DEV_GPU_TEMP: value is NaN": 1, "api result without metric.__name__": 1,
                               "DCGM_FI_DEV_GPU_TEMP: api value is not [time, number]": 1})
    marks = Watermarks()
    assert len(marks.fresh(samples)) == 2
    assert marks.fresh(samples) == [], "a later poll over the same window publishes nothing twice"
    recs = list(ExpositionReader(IngestSettings()).read_samples(samples))
    assert [(x.node, x.ts, x.gpus) for x in recs if isinstance(x, r.GpuTelemetry)] == [
        ("n1", 1700000000.5, [3]), ("n1", 1700000010.5, [3])]
    with pytest.raises(ApiAnswerError, match="bad_data"):
        list(api_samples({"status": "error", "errorType": "bad_data", "error": "parse error"}, skipped))


def test_port_labels_follow_the_ingest_mapping() -> None:
    ingest = IngestSettings(node_labels=["host"], port_device_label="hca", port_label="p")
    text = 'node_infiniband_link_downed_total{hca="mlx5_3",p="2",host="n9"} 4 1700000000000\n'
    (rec,) = ExpositionReader(ingest).read(text.splitlines())
    assert isinstance(rec, r.PortTelemetry)
    assert rec.device == "n9" and rec.ports[0].port == "mlx5_3/2" and rec.ports[0].link_downed_counter == 4


def test_an_unreachable_target_is_counted_and_the_others_still_publish(
    fixture_exporter: Callable[[Callable[[int], str]], str],
) -> None:
    import aiohttp

    from fleetmedic.config import parse_config
    from fleetmedic.devenv import proc

    live = fixture_exporter(dcgm_text)
    (dead_port,) = proc.free_ports(1)
    settings = parse_config(f"exporters: {{prometheus: {{targets: ['{live}', 'http://127.0.0.1:{dead_port}/metrics']}}}}")
    registry = CollectorRegistry()
    metrics = ConnectorMetrics(registry, "prometheus")
    outbox = Outbox(10, metrics)
    source = PrometheusSource(settings, outbox, metrics, clock=lambda: 1_700_000_000.0)

    async def tick() -> int:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            return await source.tick(session)

    assert asyncio.run(tick()) == 1
    (out,) = outbox.peek(10)
    assert isinstance(out.record, r.GpuTelemetry) and out.record.ts == 1_700_000_000.0, "stamped with the scrape time"
    errors = {s.labels["kind"]: s.value for m in registry.collect() if m.name == "fleetmedic_connector_errors"
              for s in m.samples if s.name.endswith("_total")}
    assert errors == {"ClientConnectorError": 1.0}


def test_scrape_mode_adds_the_targets_instance_as_prometheus_does(
    fixture_exporter: Callable[[Callable[[int], str]], str],
) -> None:
    """node-exporter names no node, and an old dcgm-exporter's Hostname is its pod: both get the
    node from the target's ``instance`` (host without port), as they would through Prometheus."""
    import aiohttp

    from fleetmedic.config import parse_config

    lab = 'device="mlx5_0",port="1"'
    node_exporter = fixture_exporter(lambda n: f"node_infiniband_port_discards_transmitted_total{{{lab}}} 7\n"
                                               f"node_infiniband_physical_state_id{{{lab}}} 5\n"
                                               f"node_infiniband_state_id{{{lab}}} 4\n")
    old_dcgm = fixture_exporter(lambda n: dcgm_text(n, node="nvidia-dcgm-exporter-x7k2p", bad_line=False))
    settings = parse_config(f"exporters: {{prometheus: {{targets: ['{node_exporter}', '{old_dcgm}']}}}}")
    registry = CollectorRegistry()
    metrics = ConnectorMetrics(registry, "prometheus")
    outbox = Outbox(10, metrics)
    source = PrometheusSource(settings, outbox, metrics, clock=lambda: 1_700_000_000.0)

    async def tick() -> int:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            return await source.tick(session)

    assert asyncio.run(tick()) == 2
    port, gpu = (o.record for o in outbox.peek(10))
    assert isinstance(port, r.PortTelemetry) and isinstance(gpu, r.GpuTelemetry)
    assert port.device == "127.0.0.1" and port.ports[0].port_xmit_discards == 7 and port.ports[0].link_state == "up"
    assert gpu.node == "127.0.0.1" and gpu.gpus == [0, 1]  # the pod name is not taken for the node
