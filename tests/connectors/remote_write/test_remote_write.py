"""The remote-write receiver without Prometheus: decoding, assembly across requests, and every
answer the HTTP server gives (204, 400/415, 404/405, 503) through a real aiohttp server and client.
The end-to-end test with a real Prometheus and the real broker is test_remote_write_prometheus.py."""

from __future__ import annotations

import asyncio
import math
import random
import struct
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import cramjam
import pytest
from prometheus_client import CollectorRegistry

from fleetmedic import records as r
from fleetmedic.config import Settings, parse_config
from fleetmedic.connectors.prometheus.text import ExpositionReader
from fleetmedic.connectors.remote_write.assembler import (
    Assembler,
    LabelCache,
    SampleCounts,
    parse_listen,
    write_request_samples,
)
from fleetmedic.connectors.remote_write.codec import (
    STALE_NAN_BITS,
    BadRequest,
    decode_request,
    encode_request,
    snappy_length,
)
from fleetmedic.connectors.remote_write.server import HealthSink, RemoteWriteReceiver
from fleetmedic.connectors.runtime import ConnectorMetrics, JsonlSink, KafkaSink, Outbox, PumpSettings, pump

FIELD = Path(__file__).parents[2] / "data" / "field"
DCGM_TEXT = (FIELD / "dcgm-exporter" / "kops-l4-gpu-operator.prom").read_text()
IB_TEXT = (FIELD / "node-exporter" / "e2e-output-infiniband-v1.12.1.prom").read_text()
#: the kops file's series, and those of them fleetmedic reads (the exposition reader's parse)
DCGM_SERIES = sum(1 for line in DCGM_TEXT.splitlines() if line and not line.startswith("#"))
DCGM_READ = len(list(ExpositionReader.for_settings(Settings(), ignore_unknown=True).parse(DCGM_TEXT.splitlines())))
HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
           "X-Prometheus-Remote-Write-Version": "0.1.0"}
TS = 1_760_000_000.0
LIMITS = (1 << 20, 8 << 20)


def _series(text: str, target: dict[str, str], ts_ms: int) -> list[tuple[dict[str, str], list[tuple[float, int]]]]:
    """The series of an exposition as Prometheus stores them after a scrape of ``target``: every
    series with its target labels and the scrape timestamp (what it then remote-writes)."""
    reader = ExpositionReader.for_settings(Settings(), keep_all=True)
    out = []
    for name, labels, value, _ in reader.parse(text.splitlines(), extra_labels=target):
        out.append(({"__name__": name, **labels}, [(value, ts_ms)]))
    return out


def _direct(text: str, target: dict[str, str], ts: float = TS) -> list[r.GpuTelemetry | r.PortTelemetry]:
    """What the exposition reader makes of the same scrape (the oracle)."""
    reader = ExpositionReader.for_settings(Settings(), ignore_unknown=True, source="prometheus-remote-write")
    return list(reader.read(text.splitlines(), default_ts=ts, extra_labels=target))


def _samples(body: bytes) -> tuple[list[Any], SampleCounts, Counter[str]]:
    counts, skipped = SampleCounts(), Counter[str]()
    return list(write_request_samples(decode_request(body, HEADERS, *LIMITS), skipped, counts)), counts, skipped


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


DCGM_TARGET = {"job": "dcgm", "instance": "10.0.0.7:9400"}
IB_TARGET = {"job": "node", "instance": "10.0.0.7:9100", "node": "gpu-node-1"}


def test_a_scrape_spread_over_requests_in_any_order_gives_the_exposition_readers_records() -> None:
    series = _series(DCGM_TEXT, DCGM_TARGET, int(TS * 1000)) + _series(IB_TEXT, IB_TARGET, int(TS * 1000) + 300)
    random.Random(7).shuffle(series)  # Prometheus shards by series hash: any series in any request
    clock = _Clock()
    reader = ExpositionReader.for_settings(Settings(), ignore_unknown=True, source="prometheus-remote-write")
    assembler = Assembler(reader, assemble_s=5.0, max_pending=10_000, clock=clock)
    for i in range(0, len(series), 7):
        samples, _, skipped = _samples(encode_request(series[i : i + 7]))
        assert not skipped
        assembler.add(samples)
        clock.now += 0.2
        assert assembler.records() == [], "nothing is released before assemble_s"
    clock.now += 5.0
    got = assembler.records()
    want = _direct(DCGM_TEXT, DCGM_TARGET) + _direct(IB_TEXT, IB_TARGET, TS + 0.3)
    assert len(got) == 2 and not reader.skipped
    (g,) = [x for x in got if isinstance(x, r.GpuTelemetry)]
    (p,) = [x for x in got if isinstance(x, r.PortTelemetry)]
    (wg,) = [x for x in want if isinstance(x, r.GpuTelemetry)]
    (wp,) = [x for x in want if isinstance(x, r.PortTelemetry)]
    assert (g.node, g.ts, g.gpus, g.metrics.gpu_temp, g.metrics.power_usage) == (
        "i-030791dc5a37cd257", TS, [0], [31.0], [16.365])
    assert (p.device, p.ts) == ("gpu-node-1", TS + 0.3)  # the node label Prometheus's relabelling added
    assert r.encode(g) == r.encode(wg), "the same record as the exposition reader makes of that scrape"
    assert r.encode(p) == r.encode(wp) and len(p.ports) == 3
    assert assembler.pending == 0


def test_a_scrape_already_released_is_not_published_again_nor_in_part() -> None:
    series = _series(DCGM_TEXT, DCGM_TARGET, int(TS * 1000))
    body = encode_request(series)
    clock = _Clock()
    reader = ExpositionReader.for_settings(Settings(), ignore_unknown=True)
    assembler = Assembler(reader, assemble_s=1.0, max_pending=10_000, clock=clock)
    assembler.add(_samples(body)[0])
    clock.now += 2
    assert len(assembler.records()) == 1
    n = assembler.add(_samples(body)[0])  # the sender retries a request whose 204 it never saw
    assert n == 0 and assembler.late == len(_samples(body)[0])
    clock.now += 2
    assert assembler.records() == []
    # the next scrape (15 s later) is taken
    assert assembler.add(_samples(encode_request(_series(DCGM_TEXT, DCGM_TARGET, int(TS * 1000) + 15_000)))[0]) > 0
    clock.now += 2
    (rec,) = assembler.records()
    assert rec.ts == TS + 15


def test_stale_markers_are_counted_apart_and_bad_samples_are_skipped_by_reason() -> None:
    stale = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]
    labels = {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0", "Hostname": "n1"}
    body = encode_request([
        (labels, [(stale, 1_000), (math.nan, 2_000), (math.inf, 3_000), (40.0, 4_000), (41.0, -5)]),
        ({"__name__": "up", "instance": "x:1"}, [(1.0, 1_000)]),
        ({**labels, "gpu": "1", "pod": "p" * 5000}, [(40.0, 1_000)]),
    ])
    samples, counts, skipped = _samples(body)
    assert [(s[0], s[1]["gpu"], s[2], s[3]) for s in samples] == [("DCGM_FI_DEV_GPU_TEMP", "0", 40.0, 4.0)]
    assert (counts.read, counts.stale, counts.ignored, counts.skipped) == (1, 1, 1, 4)
    assert skipped == Counter({"DCGM_FI_DEV_GPU_TEMP: value is NaN": 1, "DCGM_FI_DEV_GPU_TEMP: value is infinite": 1,
                               "DCGM_FI_DEV_GPU_TEMP: timestamp out of range": 1,
                               "DCGM_FI_DEV_GPU_TEMP: label pod longer than 4096 characters": 1})


def test_openmetrics_total_names_map_like_the_exposition_reader() -> None:
    body = encode_request([({"__name__": "node_infiniband_link_downed_total", "device": "mlx5_0", "port": "1",
                             "node": "n1"}, [(3.0, 1_000)]),
                           ({"__name__": "DCGM_FI_DEV_XID_ERRORS_total", "gpu": "2", "Hostname": "n1"},
                            [(79.0, 1_000)])])
    samples, _, _ = _samples(body)
    assert [s[0] for s in samples] == ["node_infiniband_link_downed_total", "DCGM_FI_DEV_XID_ERRORS"]


@pytest.mark.parametrize(("headers", "body", "kind", "status"), [
    ({"Content-Type": "text/plain"}, None, "content_type", 400),
    ({"Content-Type": ""}, None, "content_type", 400),
    ({"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request"}, None, "unsupported_proto", 415),
    ({"Content-Encoding": "gzip"}, None, "content_encoding", 400),
    ({"Content-Encoding": ""}, None, "content_encoding", 400),
    ({}, b"", "snappy", 400),
    ({}, b"\xff\xff\xff\xff\xff\xff", "snappy", 400),
    ({}, b"\x10" + b"\x00" * 5, "snappy", 400),  # announces 16 bytes, holds garbage
    ({}, bytes(cramjam.snappy.compress_raw(b"\x0a\xff\xff\xff\xff\x0f")), "protobuf", 400),  # a field past the end
    ({}, bytes(cramjam.snappy.compress_raw(b"\x0a\x04\x0a\x02\xff\xfe")), "protobuf", 400),  # a label not UTF-8
    ({}, b"\xff\xff\xff\xff\x07", "too_large", 400),  # announces 2 GiB
    ({}, b"\x00" * (2 << 20), "too_large", 400),
])
def test_an_unreadable_request_is_refused_saying_why(headers: dict[str, str], body: bytes | None, kind: str,
                                                     status: int) -> None:
    good = encode_request(_series(DCGM_TEXT, DCGM_TARGET, 1_000))
    with pytest.raises(BadRequest) as exc:  # what the server does with a request: decode, then read every series
        request = decode_request(good if body is None else body, {**HEADERS, **headers}, *LIMITS)
        list(write_request_samples(request, Counter(), SampleCounts()))
    assert (exc.value.kind, exc.value.status) == (kind, status), str(exc.value)


def test_the_request_parameters_prometheus_may_send_are_taken() -> None:
    good = encode_request(_series(DCGM_TEXT, DCGM_TARGET, 1_000))
    for ctype in ("application/x-protobuf", "Application/X-Protobuf; proto=prometheus.WriteRequest"):
        assert len(decode_request(good, {**HEADERS, "Content-Type": ctype}, *LIMITS).timeseries) == DCGM_SERIES
    assert snappy_length(good) == len(cramjam.snappy.decompress_raw(good))


def test_listen_addresses() -> None:
    assert parse_listen("0.0.0.0:9201") == ("0.0.0.0", 9201)
    assert parse_listen(":9201") == ("0.0.0.0", 9201)
    assert parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("9201", "host:", "host:99999", "a:b:1"):
        with pytest.raises(ValueError, match="--listen"):
            parse_listen(bad)


# --- the HTTP server --------------------------------------------------------------------------------


def _settings(extra: str = "") -> Settings:
    return parse_config("exporters: {remote_write: {assemble_s: 0.3, max_body_bytes: 65536" + extra + "}}")


async def _serve(settings: Settings, sink: Any, body: Callable[[str, aiohttp.ClientSession, RemoteWriteReceiver,
                                                                 CollectorRegistry], Awaitable[None]]) -> None:
    registry = CollectorRegistry()
    metrics = ConnectorMetrics(registry, "remote-write")
    outbox = Outbox(settings.exporters.queue_max, metrics)
    health = HealthSink(sink)
    receiver = RemoteWriteReceiver(settings, outbox, metrics, registry, health=health, listen="127.0.0.1:0")
    stop = asyncio.Event()
    pumping = asyncio.create_task(pump(outbox, health, metrics, stop, PumpSettings(drain_timeout_s=0.5)))
    serving = asyncio.create_task(receiver.run(stop))
    while receiver.bound is None:
        await asyncio.sleep(0.01)
    url = f"http://127.0.0.1:{receiver.bound[1]}"
    try:
        async with aiohttp.ClientSession() as session:
            await body(url, session, receiver, registry)
    finally:
        stop.set()
        await serving
        await pumping
        await health.stop()


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_the_server_answers_204_400_415_404_405_and_publishes_one_record_per_scrape(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    good = encode_request(_series(DCGM_TEXT, DCGM_TARGET, int(TS * 1000)))

    async def body(url: str, s: aiohttp.ClientSession, rx: RemoteWriteReceiver, reg: CollectorRegistry) -> None:
        async def post(data: bytes, path: str = "/api/v1/write", **headers: str) -> tuple[int, str]:
            async with s.post(url + path, data=data, headers={**HEADERS, **headers}) as resp:
                return resp.status, await resp.text()

        assert await post(good) == (204, "")
        assert (await post(good, **{"Content-Type": "text/plain"}))[0] == 400
        status, text = await post(b"garbage")
        assert status == 400 and "snappy" in text
        assert (await post(b"\x00" * 70_000))[0] == 400  # over max_body_bytes
        assert (await post(good, **{"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request"})
                )[0] == 415
        assert (await post(good, path="/write"))[0] == 404
        async with s.get(url + "/api/v1/write") as resp:
            assert resp.status == 405
        for _ in range(100):
            if _value(reg, "fleetmedic_connector_records_out_total", connector="remote-write",
                      topic="fleetmedic.telemetry.gpu"):
                break
            await asyncio.sleep(0.05)
        assert [_value(reg, "fleetmedic_remote_write_requests_total", code=c) for c in ("204", "400", "415", "404",
                                                                                         "405")] == [1, 3, 1, 1, 1]
        assert _value(reg, "fleetmedic_remote_write_rejected_total", reason="too_large") == 1
        assert _value(reg, "fleetmedic_remote_write_samples_total", outcome="read") == DCGM_READ == 15
        assert _value(reg, "fleetmedic_remote_write_samples_total", outcome="ignored") == DCGM_SERIES - DCGM_READ
        assert _value(reg, "fleetmedic_remote_write_records_total") == 1

    asyncio.run(_serve(_settings(), JsonlSink(str(out)), body))
    import json

    (line,) = out.read_text().splitlines()
    doc = json.loads(line)
    assert doc["topic"] == "fleetmedic.telemetry.gpu" and doc["key"] == "i-030791dc5a37cd257"
    assert doc["record"]["metrics"]["gpu_temp"] == [31.0] and doc["record"]["source"] == "prometheus-remote-write"


def test_the_server_answers_503_while_kafka_takes_nothing_and_holds_the_records() -> None:
    # a real Kafka client pointed at a port where no broker listens
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    settings = _settings()
    import msgspec

    settings = msgspec.structs.replace(settings, kafka=msgspec.structs.replace(
        settings.kafka, bootstrap_servers=f"127.0.0.1:{dead}", request_timeout_s=2.0))
    good = encode_request(_series(DCGM_TEXT, DCGM_TARGET, int(TS * 1000)))

    async def body(url: str, s: aiohttp.ClientSession, rx: RemoteWriteReceiver, reg: CollectorRegistry) -> None:
        async with s.post(url + "/api/v1/write", data=good, headers=HEADERS) as resp:
            assert resp.status == 204  # taken: held for assembly
        status = 204
        for _ in range(200):  # released after assemble_s; the pump's first send fails
            await asyncio.sleep(0.05)
            async with s.post(url + "/api/v1/write", data=good, headers=HEADERS) as resp:
                status, text = resp.status, await resp.text()
            if status == 503:
                break
        assert status == 503 and "Kafka" in text
        assert len(rx.outbox) == 1, "the record waits in the outbox for the broker"
        assert _value(reg, "fleetmedic_remote_write_requests_total", code="503") >= 1
        assert sum(_value(reg, "fleetmedic_connector_errors_total", connector="remote-write", kind=k)
                   for k in ("KafkaConnectionError", "KafkaTimeoutError")) >= 1

    asyncio.run(_serve(settings, KafkaSink(settings), body))


def test_the_server_answers_503_when_too_many_samples_wait_for_assembly() -> None:
    good = encode_request(_series(DCGM_TEXT, DCGM_TARGET, int(TS * 1000)))
    settings = parse_config("exporters: {remote_write: {assemble_s: 60, max_pending_samples: 20}}")

    async def body(url: str, s: aiohttp.ClientSession, rx: RemoteWriteReceiver, reg: CollectorRegistry) -> None:
        async with s.post(url + "/api/v1/write", data=good, headers=HEADERS) as resp:
            assert resp.status == 204
        later = encode_request(_series(DCGM_TEXT, DCGM_TARGET, int(TS * 1000) + 15_000))
        async with s.post(url + "/api/v1/write", data=later, headers=HEADERS) as resp:
            assert resp.status == 503 and "retry later" in await resp.text()
        assert rx.assembler.pending == DCGM_READ

    asyncio.run(_serve(settings, JsonlSink("/dev/null"), body))


def test_the_pure_part_imports_no_adapter_library() -> None:
    import subprocess
    import sys

    code = ("import sys\nimport fleetmedic.connectors.remote_write.assembler\n"
            "print(sorted(m for m in ['prometheus_client', 'aiokafka', 'aiohttp', 'faust', 'kubernetes'] "
            "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_on_stop_the_scrapes_still_held_are_published_before_the_pump_drains(tmp_path: Path) -> None:
    # assemble_s far beyond the run: the record can only come from the release at shutdown
    import argparse
    import json
    import socket

    from fleetmedic.cli.exporter import _run

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "out.jsonl"
    settings = parse_config("exporters: {remote_write: {assemble_s: 300}}")
    good = encode_request(_series(DCGM_TEXT, DCGM_TARGET, int(TS * 1000)))

    async def main() -> int:
        running = asyncio.create_task(_run("remote-write", settings, str(out), 2.0, -1,
                                           argparse.Namespace(listen=f"127.0.0.1:{port}")))
        async with aiohttp.ClientSession() as s:
            for _ in range(100):
                try:
                    async with s.post(f"http://127.0.0.1:{port}/api/v1/write", data=good, headers=HEADERS) as resp:
                        assert resp.status == 204
                        break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.02)
        return await running

    assert asyncio.run(main()) == 0
    (line,) = out.read_text().splitlines()
    assert json.loads(line)["record"]["node"] == "i-030791dc5a37cd257"


def test_label_sets_are_decoded_once_and_keep_their_dict() -> None:
    body = encode_request(_series(DCGM_TEXT, DCGM_TARGET, 1_000))
    cache = LabelCache()
    first = list(write_request_samples(decode_request(body, HEADERS, *LIMITS), Counter(), SampleCounts(), cache))
    again = list(write_request_samples(decode_request(body, HEADERS, *LIMITS), Counter(), SampleCounts(), cache))
    assert len(cache) == DCGM_SERIES and [id(s[1]) for s in first] == [id(s[1]) for s in again]
    small = LabelCache(max_entries=5)
    list(write_request_samples(decode_request(body, HEADERS, *LIMITS), Counter(), SampleCounts(), small))
    assert len(small) <= 5


def test_a_request_whose_reading_raises_is_answered_400_not_retried_forever() -> None:
    good = encode_request(_series(DCGM_TEXT, DCGM_TARGET, int(TS * 1000)))

    async def body(url: str, s: aiohttp.ClientSession, rx: RemoteWriteReceiver, reg: CollectorRegistry) -> None:
        def broken(key: tuple[bytes, ...]) -> Any:
            raise RuntimeError("a bug")

        rx.label_cache.get = broken  # type: ignore[method-assign]
        async with s.post(url + "/api/v1/write", data=good, headers=HEADERS) as resp:
            assert resp.status == 400 and "RuntimeError" in await resp.text()
        assert _value(reg, "fleetmedic_remote_write_rejected_total", reason="internal_RuntimeError") == 1

    asyncio.run(_serve(_settings(), JsonlSink("/dev/null"), body))


def test_the_tail_fast_path_reads_every_series_as_the_whole_parse_does() -> None:
    """A series seen before is read from its label bytes and its last sample alone; whatever the
    values, timestamps and layout, the samples and counts equal those of parsing each series whole
    (the first pass, with an empty cache)."""
    rng = random.Random(7)
    stale = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]
    values = [0.0, -0.0, 1.0, 40.5, 2.0**53, -3.25, float("inf"), float("nan"), stale, 5e-324]
    times = [int(TS * 1000), 0, -1, 1, 127, 128, 2**62, int(TS * 1000) + 1]
    series: list[tuple[dict[str, str], list[tuple[float, int]]]] = []
    for n in range(300):
        name = rng.choice(["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "node_load1",
                           "node_infiniband_port_errors_received_total"])
        labels = {"__name__": name, "Hostname": f"n{n % 7}", "gpu": str(n % 8), "device": "mlx5_0", "port": "1",
                  # bytes a tail could be mistaken for: 0x12, 0x10, 0x09 and a length
                  "odd": rng.choice(["", "\x12\x10\x09", "\x10", "x" * rng.randint(0, 40), "\x12\x07\x10\x01"])}
        k = rng.choice([1, 1, 1, 0, 2])
        series.append((labels, [(rng.choice(values), rng.choice(times)) for _ in range(k)]))
    # the shortest series: no labels at all, one sample (value or 0.0, this era's timestamp or 0)
    series += [({}, [(1.5, int(TS * 1000))]), ({}, [(0.0, int(TS * 1000))]), ({}, [(0.0, 0)]), ({}, [])]
    body = encode_request(series)

    def read(cache: LabelCache) -> tuple[list[Any], SampleCounts, Counter[str]]:
        counts, skipped = SampleCounts(), Counter[str]()
        got = list(write_request_samples(decode_request(body, HEADERS, *LIMITS), skipped, counts, cache))
        return [(n, sorted(lab.items()), struct.pack("<d", v), ts) for n, lab, v, ts in got], counts, skipped

    cache = LabelCache()
    whole = read(cache)
    assert cache._prefixes, "one-sample series left their label bytes for the fast path"
    assert read(cache) == whole
    assert whole[1].read > 0 and whole[1].stale > 0 and whole[1].skipped > 0 and whole[1].ignored > 0


def test_the_receivers_label_cache_holds_a_large_prometheus_shards_series() -> None:
    """A Prometheus scraping 1,000 dcgm-exporters (the kops capture's series and label set for 8
    GPUs a node, target labels added) sends the same label sets every scrape: the receiver, as
    configured by default, keeps every one of them across scrapes. A cache that empties itself
    when full decodes every sample whole again, ~30x the CPU: at 2,000 nodes (320,000 series every
    10 s) bench/soak.py's receiver needed ~9 CPU s per 10 s and fell further behind every minute."""
    one_gpu = _series(DCGM_TEXT, DCGM_TARGET, 0)
    gpu_of = next(k for k in ("gpu", "GPU") if k in one_gpu[0][0])
    node_of = next(k for k in ("Hostname", "node") if k in one_gpu[0][0])
    nodes = 1000
    receiver = RemoteWriteReceiver(_settings(), Outbox(1 << 20, ConnectorMetrics(CollectorRegistry(), "rw")),
                                   ConnectorMetrics(CollectorRegistry(), "rw2"), CollectorRegistry(),
                                   listen="127.0.0.1:0")
    series = 0
    for scrape in range(2):
        ms = int(TS * 1000) + 10_000 * scrape
        for n in range(nodes):
            body = encode_request(({**labels, node_of: f"gpu-node-{n:04d}", gpu_of: str(g)}, [(value, ms)])
                                  for labels, [(value, _)] in one_gpu for g in range(8))
            receiver.assembler.take(decode_request(body, HEADERS, *LIMITS), Counter(), SampleCounts(),
                                    receiver.label_cache)
            if scrape == 0:
                series += len(one_gpu) * 8
        receiver.assembler.records(everything=True)
    assert len(receiver.label_cache) == series == nodes * 8 * DCGM_SERIES
