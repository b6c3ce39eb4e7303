"""Hostile and sloppy input to every parser: a bad line or value is skipped and counted
by a reason naming the field, lengths and digit counts are capped before any regex or conversion
(so time and memory stay bounded whatever arrives), and the live scrape loop survives any target's
answer while the other targets' records arrive.

Each case here raised, or took gigabytes, before the fix: ``gpu="²"`` (``int()`` refuses what
``str.isdigit`` accepts), a 400-digit timestamp (``OverflowError``), a 5,000-digit one (Python's
4,300-digit limit), a 50 MB label value (the label regex took ~170 bytes per input byte)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from fleetmedic import records as r
from fleetmedic.config import IngestSettings, KafkaTelemetrySettings, LogExporterSettings, Settings, parse_config
from fleetmedic.connectors.infiniband.perfquery import parse_perfquery
from fleetmedic.connectors.kafka_telemetry.exporter_map import BadMessage, PointMapper
from fleetmedic.connectors.logs.failures import BadLogLine, parse_log_message
from fleetmedic.connectors.prometheus import ingest as prometheus_ingest
from fleetmedic.connectors.prometheus.api import api_samples
from fleetmedic.connectors.prometheus.ingest import PrometheusSource, target_label
from fleetmedic.connectors.prometheus.text import MAX_REASONS, OTHER_REASON, ExpositionReader
from fleetmedic.connectors.runtime import ConnectorMetrics, Outbox
from fleetmedic.evaluation.backtest_inputs import InputReader
from tests.connectors.prometheus.helpers_exposition import dcgm_text

TS_MS = 1_700_000_000_000
GOOD = f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",Hostname="n1"}} 50 {TS_MS}'
MB = 1 << 20


def _read(*lines: str) -> tuple[list[r.GpuTelemetry | r.PortTelemetry], Counter[str]]:
    reader = ExpositionReader(IngestSettings())
    return list(reader.read(lines)), reader.skipped


NOT_GPU = "DCGM_FI_DEV_GPU_TEMP: gpu label is not a GPU index"


@pytest.mark.parametrize(("line", "reason"), [
    (f'DCGM_FI_DEV_GPU_TEMP{{gpu="²",Hostname="n1"}} 50 {TS_MS}', NOT_GPU),
    (f'DCGM_FI_DEV_GPU_TEMP{{gpu="٣",Hostname="n1"}} 50 {TS_MS}', NOT_GPU),  # an Arabic-Indic 3: int() takes it
    (f'DCGM_FI_DEV_GPU_TEMP{{gpu="256",Hostname="n1"}} 50 {TS_MS}', NOT_GPU),
    ('DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="n1"} 50 ' + "9" * 400,
     "DCGM_FI_DEV_GPU_TEMP: timestamp has more than 18 digits"),
    ('DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="n1"} 50 ' + "9" * 5000,
     "DCGM_FI_DEV_GPU_TEMP: timestamp has more than 18 digits"),
    ('DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="n1"} 50 ' + "9" * 17,  # digits allowed, but year 5138
     "DCGM_FI_DEV_GPU_TEMP: timestamp out of range"),
    ('DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="n1"} ' + "1" * 5000 + f" {TS_MS}",
     "DCGM_FI_DEV_GPU_TEMP: value is not a number"),
    (f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",Hostname="{"x" * 5000}"}} 50 {TS_MS}',
     "DCGM_FI_DEV_GPU_TEMP: label Hostname longer than 4096 characters"),
    (f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",Hostname="n1" junk}} 50 {TS_MS}', "DCGM_FI_DEV_GPU_TEMP: malformed labels"),
    (f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",Hostname="n1"}} 50 {"1" * 100_000}', "line longer than 65536 characters"),
])
def test_a_hostile_exposition_line_is_skipped_with_its_reason_and_the_good_line_is_kept(
    line: str, reason: str
) -> None:
    recs, skipped = _read(line, GOOD)
    assert skipped == Counter({reason: 1})
    assert [(x.node, x.gpus, x.ts) for x in recs if isinstance(x, r.GpuTelemetry)] == [("n1", [0], TS_MS / 1000)]


def test_a_far_future_timestamp_does_not_make_every_other_sample_late() -> None:
    far = f'DCGM_FI_DEV_GPU_TEMP{{gpu="1",Hostname="n2"}} 50 {4_000_000_001_000}'
    recs, skipped = _read(far, *(GOOD.replace('gpu="0"', f'gpu="{g}"') for g in range(8)))
    assert skipped == Counter({"DCGM_FI_DEV_GPU_TEMP: timestamp out of range": 1})
    assert len(recs) == 1 and recs[0].gpus == list(range(8))  # type: ignore[union-attr]


@pytest.mark.parametrize("size", [50 * MB, 10 * MB])
def test_a_huge_label_value_or_line_is_refused_in_bounded_memory(size: int) -> None:
    huge = f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",Hostname="{"x" * size}"}} 50 {TS_MS}'  # built before measuring
    tracemalloc.start()
    try:
        recs, skipped = _read(huge, GOOD)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert skipped == Counter({"line longer than 65536 characters": 1})
    assert len(recs) == 1
    assert peak < 200 * MB, f"peak {peak / MB:.0f} MB"


def test_a_long_label_with_escapes_within_the_line_cap_is_read_in_bounded_memory() -> None:
    value = "\\\\" * 2000 + '\\"' + "y" * 60_000  # 2,001 escapes, then plain text, just under the line cap
    tracemalloc.start()
    try:
        recs, skipped = _read(f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",Hostname="n1",x="{value}"}} 50 {TS_MS}')
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert skipped == Counter({"DCGM_FI_DEV_GPU_TEMP: label x longer than 4096 characters": 1}) and not recs
    assert peak < 2 * MB, f"peak {peak / MB:.1f} MB"  # the former label regex: ~170 bytes per byte


def test_a_huge_label_value_in_a_backtest_file_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "big.prom"
    with path.open("w", encoding="utf-8") as fh:
        fh.write(GOOD + "\n")
        fh.write('DCGM_FI_DEV_GPU_TEMP{gpu="1",Hostname="')
        for _ in range(50):
            fh.write("x" * MB)
        fh.write(f'"}} 50 {TS_MS}\n')
        fh.write(GOOD.replace('gpu="0"', 'gpu="2"') + "\n")
    reader = InputReader(Settings())
    tracemalloc.start()
    try:
        recs = list(reader.records([str(path)]))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [x.gpus for x in recs] == [[0, 2]]  # type: ignore[union-attr]
    assert reader.problems() == {str(path): {"lines": 3, "records": 1, "problems_total": 1,
                                             "problems": {"line longer than 65536 bytes": 1}}}
    assert peak < 200 * MB, f"peak {peak / MB:.0f} MB"


def test_the_reasons_stay_a_small_set_whatever_the_input() -> None:
    lines = [f"unknown_series_{i} 1" for i in range(5000)]
    lines += [f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",Hostname="n1"}} nope{i} {TS_MS}' for i in range(5000)]
    _, skipped = _read(*lines)
    assert len(skipped) == MAX_REASONS + 1 and sum(skipped.values()) == 10_000
    assert skipped[OTHER_REASON] == 10_000 - MAX_REASONS + 1 - 1  # the value reason was counted before the cap


def test_hostile_prometheus_api_points_are_counted_not_raised() -> None:
    name = "DCGM_FI_DEV_GPU_TEMP"
    labels = {"__name__": name, "gpu": "0", "Hostname": "n1"}
    doc = json.loads(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": dict(labels), "values": [
            [1_700_000_000, "41"], [10**400, "1"], [1_700_000_001, "9" * 5000], [1_700_000_002, {"x": 1}],
            [1e300, "1"], [1_700_000_003, "NaN"], [True, "1"]]},
        {"metric": {**labels, "Hostname": "x" * 5000}, "values": [[1_700_000_000, "1"]]},
        {"metric": {**labels, "gpu": ["0"]}, "values": [[1_700_000_000, "1"]]},
        {"metric": dict(labels), "values": "[[1, 2]]"},
        "not an entry",
    ]}}))
    skipped: Counter[str] = Counter()
    samples = list(api_samples(doc, skipped))
    assert [(s[3], s[2]) for s in samples] == [(1_700_000_000.0, 41.0)]
    assert skipped == Counter({
        f"{name}: api value is not [time, number]": 4, f"{name}: timestamp out of range": 1,
        f"{name}: value is NaN": 1, f"{name}: label Hostname longer than 4096 characters": 1,
        f"{name}: api labels are not strings": 1, f"{name}: api values is not a list": 1,
        "api result without metric.__name__": 1})


@pytest.mark.parametrize(("message", "reason"), [
    ({"timestamp": 10**400}, "timestamp: out of range"),
    ({"timestamp": -5}, "timestamp: out of range"),
    ({"tags": {"host": "n", "index": "²"}}, "temperature_gpu: GPU index tag '²' is not 0-255"),
    ({"tags": {"host": "n", "index": "9" * 5000}}, "temperature_gpu: GPU index tag"),
    ({"tags": {"host": "x" * 300, "index": "0"}}, "temperature_gpu: node tag longer than 253 characters"),
    ({"fields": {"temperature_gpu": "9" * 5000}}, "temperature_gpu: value longer than 64 characters"),
    ({"fields": {"temperature_gpu": 10**400}}, "temperature_gpu: value"),
])
def test_hostile_kafka_telemetry_is_a_bad_message_naming_the_field(message: dict[str, object], reason: str) -> None:
    doc = {"name": "nvidia_smi", "tags": {"host": "n", "index": "0"}, "fields": {"temperature_gpu": 50},
           "timestamp": 1_700_000_000, **message}
    with pytest.raises(BadMessage) as err:
        PointMapper(KafkaTelemetrySettings()).points(json.dumps(doc).encode())
    assert str(err.value).startswith(reason)
    assert len(err.value.label) < 80


def test_deeply_nested_kafka_and_log_messages_are_bad_messages() -> None:
    deep = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    with pytest.raises(BadMessage, match="nest deeper than 64 levels"):
        PointMapper(KafkaTelemetrySettings()).points(deep)
    with pytest.raises(BadLogLine, match="nest deeper than 64 levels"):
        parse_log_message(deep, LogExporterSettings(), now=0)


def _log(attempt: str, **k8s: object) -> bytes:
    return json.dumps({"log": "x" * 100_000, "time": "9" * 5000, "kubernetes": {
        "namespace_name": "ml", "pod_name": "p", "host": "n1",
        "labels": {"job-name": "llama", "batch.kubernetes.io/job-completion-index": "0",
                   "training.kubeflow.org/job-name": "llama", "jobset.sigs.k8s.io/restart-attempt": attempt,
                   "restart-attempt": attempt}, **k8s}}).encode()


def test_hostile_log_lines_keep_a_bounded_text_and_a_sane_attempt_or_are_refused() -> None:
    cfg = LogExporterSettings()
    for attempt in ("²", "9" * 5000, "-1"):
        line = parse_log_message(_log(attempt), cfg, now=1_700_000_000.0)
        assert line.attempt == 0 and line.ts == 1_700_000_000.0 and len(line.text) == 16_384
    with pytest.raises(BadLogLine, match=r"kubernetes\.host: longer than 253"):
        parse_log_message(_log("0", host="h" * 1000), cfg, now=0)
    with pytest.raises(BadLogLine, match="namespace_name"):
        parse_log_message(_log("0", namespace_name="a" * 100_000), cfg, now=0)


def test_hostile_perfquery_output_is_counted_and_never_taken_for_another_port() -> None:
    text = "\n".join([
        "# Port counters: Lid 214 port 35 (CapMask: 0x5A00)",
        "SymbolErrorCounter:..............12",
        "PortXmitDiscards:................" + "9" * 4000,  # int() would refuse past 4,300 digits
        "LinkDownedCounter:..............." + "1" * 20,  # > 2**63 - 1
        "PortRcvErrors:...................٣",
        "# Port counters: Lid " + "9" * 4000 + " port 1",
        "SymbolErrorCounter:..............99",  # not the first block's
        "# Port counters: Lid 215 port 1",
        "LinkDownedCounter:...............2",
        "# Port counters: Lid 216 port " + "9" * 5000,  # over the line cap: the block is not started
        "SymbolErrorCounter:..............98",
    ])
    skipped: Counter[str] = Counter()
    first, second = parse_perfquery(text, skipped)
    assert first.counters == {"SymbolErrorCounter": 12} and second.counters == {"LinkDownedCounter": 2}
    assert skipped == Counter({
        "perfquery PortXmitDiscards: value is not a number": 1, "perfquery LinkDownedCounter: value out of range": 1,
        "perfquery PortRcvErrors: value is not a number": 1, "perfquery: header LID or port out of range": 1,
        "perfquery: unparsable line": 2, "perfquery: line longer than 4096 characters": 1})


# --- the live scrape loop ---------------------------------------------------------------------------

BINARY = b"\xff\xfe\x00binary\x00\n\x80\x81 garbage \xc3\x28\n"  # not UTF-8
HOSTILE = ('DCGM_FI_DEV_GPU_TEMP{gpu="\u00b2",Hostname="bad"} 50\n'
           'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="bad"} 50 ' + "9" * 5000 + "\n"
           'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="' + "x" * (2 * MB) + '"} 50\n')


def _source(targets: list[str]) -> tuple[PrometheusSource, Outbox, CollectorRegistry]:
    quoted = ", ".join(f"'{t}'" for t in targets)
    settings = parse_config(f"exporters: {{prometheus: {{targets: [{quoted}]}}}}")
    registry = CollectorRegistry()
    metrics = ConnectorMetrics(registry, "prometheus")
    outbox = Outbox(100, metrics)
    return PrometheusSource(settings, outbox, metrics, clock=lambda: 1_700_000_000.0), outbox, registry


def _tick(source: PrometheusSource) -> int:
    import aiohttp

    async def tick() -> int:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            return await source.tick(session)

    return asyncio.run(tick())


def _samples(registry: CollectorRegistry, metric: str) -> dict[tuple[str, ...], float]:
    return {tuple(v for k, v in sorted(s.labels.items()) if k != "connector"): s.value
            for m in registry.collect() if m.name == metric for s in m.samples if s.name.endswith("_total")}


def test_a_target_answering_garbage_does_not_stop_the_others(
    fixture_exporter: Callable[[Callable[[int], str | bytes]], str],
) -> None:
    binary, hostile = fixture_exporter(lambda n: BINARY), fixture_exporter(lambda n: HOSTILE)
    source, outbox, registry = _source([binary, hostile, fixture_exporter(dcgm_text)])
    assert _tick(source) == 1
    (out,) = outbox.peek(10)
    assert isinstance(out.record, r.GpuTelemetry) and out.record.node == "gpu-node-7"
    skipped = _samples(registry, "fleetmedic_connector_skipped")
    assert skipped[("DCGM_FI_DEV_GPU_TEMP: gpu label is not a GPU index",)] == 1
    assert skipped[("DCGM_FI_DEV_GPU_TEMP: timestamp has more than N digits",)] == 1
    assert skipped[("line longer than N characters",)] == 1
    assert skipped[("unparsable line",)] == 2, "the binary answer's lines, read with replacement characters"
    assert not _samples(registry, "fleetmedic_connector_target_errors")


def test_a_target_whose_reading_raises_is_counted_and_logged_and_the_others_publish(
    fixture_exporter: Callable[[Callable[[int], str | bytes]], str], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad, good = fixture_exporter(lambda n: "boom\n"), fixture_exporter(dcgm_text)
    source, _, registry = _source([bad, good])
    real = prometheus_ingest.map_samples

    def map_samples(reader: ExpositionReader, samples: object) -> list[r.GpuTelemetry | r.PortTelemetry]:
        got = real(reader, samples)  # type: ignore[arg-type]
        if not got:
            raise RuntimeError("a reader bug")
        return got

    monkeypatch.setattr(prometheus_ingest, "map_samples", map_samples)
    with caplog.at_level(logging.WARNING, "fleetmedic.connectors.prometheus"):
        assert _tick(source) == 1
        assert _tick(source) == 1
    assert _samples(registry, "fleetmedic_connector_target_errors") == {
        ("answer_RuntimeError", target_label(bad)): 2.0}
    assert _samples(registry, "fleetmedic_connector_errors") == {("answer_RuntimeError",): 2.0}
    warnings = [m for m in caplog.messages if "failed" in m]
    assert len(warnings) == 1 and target_label(bad) in warnings[0] and "a reader bug" in warnings[0], \
        "logged with the target once, not every interval"


def test_an_answer_over_the_size_cap_is_counted_for_its_target(
    fixture_exporter: Callable[[Callable[[int], str | bytes]], str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(prometheus_ingest, "MAX_ANSWER_BYTES", 4096)
    big, good = fixture_exporter(lambda n: dcgm_text(n) * 10), fixture_exporter(lambda n: GOOD + "\n")
    source, _, registry = _source([big, good])
    assert _tick(source) == 1
    assert _samples(registry, "fleetmedic_connector_target_errors") == {("AnswerTooLarge", target_label(big)): 1.0}


def test_a_target_label_carries_no_credentials() -> None:
    assert target_label("http://user:secret@10.0.0.1:9400/metrics?token=x") == "http://10.0.0.1:9400/metrics"
    assert target_label("http://[::1]:9100/metrics") == "http://[::1]:9100/metrics"


def test_a_slow_hostile_exposition_is_still_linear() -> None:
    # many label starts inside one unterminated value: a findall-style scan would be quadratic
    line = 'DCGM_FI_DEV_GPU_TEMP{a="' + '\\"a="' * 10_000 + "} 50 " + str(TS_MS)
    started = time.process_time()
    _, skipped = _read(line)
    assert time.process_time() - started < 2.0
    assert skipped == Counter({"DCGM_FI_DEV_GPU_TEMP: malformed labels": 1})
