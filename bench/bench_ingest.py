"""Ingest throughput per core: GPU samples/s into records, each path beside a floor measured in the
same run on the same bytes.

(a) Prometheus text (dcgm-exporter's real label set, from the field corpus' gpu-operator capture;
    N nodes x 8 GPUs x 16 series) -> GpuTelemetry through ExpositionReader; floor: prometheus_client's
    text parser, parse only (it builds no records).
(b) OpenMetrics (the same samples, float-second timestamps, ``# EOF``) -> GpuTelemetry; floor:
    prometheus_client's OpenMetrics parser, parse only.
(c) a Prometheus range-query answer (``/api/v1/query_range``, matrix, 30 steps) -> GpuTelemetry
    as ``backtest --prometheus`` does (typed msgspec decode, series by series through
    ``read_columns``); floor: ``json.loads`` of the same bytes (raw decode). Also the general path
    (``json.loads`` + api_samples + sorted samples through ``read_samples``), the one used before.
(d) Prometheus remote write 1.0 -> GpuTelemetry through the receiver's pure path (as ``exporter
    remote-write`` runs it, without HTTP and Kafka): the request's headers checked, snappy
    decompressed, the WriteRequest decoded, then ``Assembler.take`` (samples read with the
    receiver's label cache and held per node and scrape) and ``Assembler.records`` (the scrapes
    mapped to records). Also prints the CPU time per sample of each stage (decode, read + hold,
    records) of the best round, and the same path in Python only (without the C loop of
    ``fleetmedic/connectors/remote_write/_remote_write.c`` and the C columns of ``_gpu_record.c``), in
    interleaved rounds. The bodies are what Prometheus sends for the
    same dcgm-exporter series with its target labels (``instance``, ``job``) added: ``--scrapes``
    scrapes of the fleet, each cut into requests of ``max_samples_per_send`` (2,000) samples; the
    first scrape fills the label cache, as the first seconds of a running receiver do.
    Floor: snappy decompression (cramjam) + ``WriteRequest.ParseFromString`` of the same bodies
    with the protobuf runtime (upb), i.e. protobuf decode only: no label or sample is touched
    after the parse.

Single thread, process CPU time, best of ``--rounds``. Prints samples/s for each and the ratio to its
floor (the target is >= 0.5; above 1, fleetmedic is faster than the floor).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import cramjam
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.connectors.prometheus.api import api_samples
from fleetmedic.connectors.prometheus.history import matrix_columns
from fleetmedic.connectors.prometheus.text import ExpositionReader
from fleetmedic.connectors.remote_write.assembler import (
    Assembler,
    LabelCache,
    SampleCounts,
)
from fleetmedic.connectors.remote_write.codec import (
    WriteRequest,
    decode_request,
    encode_request,
)

CAPTURE = Path(__file__).parents[1] / "tests" / "data" / "field" / "dcgm-exporter" / "kops-l4-gpu-operator.prom"
T0 = 1_760_000_000.0


def families() -> list[tuple[str, str]]:
    """(series, label set of GPU 0) of the capture, one per dcgm-exporter family."""
    out = []
    for line in CAPTURE.read_text().splitlines():
        m = re.match(r"^(DCGM_\w+)\{(.*)\} \S+$", line)
        if m:
            out.append((m.group(1), m.group(2)))
    return out


def exposition(nodes: int, openmetrics: bool) -> str:
    lines = []
    for series, labels in families():
        lines.append(f"# TYPE {series} gauge")
        for n in range(nodes):
            for g in range(8):
                lab = labels.replace('gpu="0"', f'gpu="{g}"').replace('device="nvidia0"', f'device="nvidia{g}"')
                lab = lab.replace("i-030791dc5a37cd257", f"gpu-node-{n:04d}").replace("1343419b1a1c", f"{n:08d}{g:04d}")
                lines.append(f"{series}{{{lab}}} {40 + g}" + (f" {T0:.3f}" if openmetrics else ""))
    if openmetrics:
        lines.append("# EOF")
    return "\n".join(lines) + "\n"


def range_answer(nodes: int, steps: int) -> bytes:
    result = []
    for series, labels in families():
        base = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        for n in range(nodes):
            for g in range(8):
                metric = {**base, "__name__": series, "gpu": str(g), "Hostname": f"gpu-node-{n:04d}",
                          "instance": f"10.0.{n // 250}.{n % 250}:9400", "job": "dcgm-exporter"}
                result.append({"metric": metric, "values": [[T0 + 30 * k, str(40 + g)] for k in range(steps)]})
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()


#: what a remote-write sender's headers are (Prometheus's queue manager)
RW_HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
              "X-Prometheus-Remote-Write-Version": "0.1.0"}
MAX_SAMPLES_PER_SEND = 2000  # Prometheus's queue_config default


def remote_write_bodies(nodes: int, scrapes: int, interval_s: float = 30.0) -> list[list[bytes]]:
    """Per scrape, the snappy-compressed WriteRequests Prometheus would post for the capture's
    dcgm-exporter series on ``nodes`` nodes (one sample per series per scrape, target labels added,
    batches of :data:`MAX_SAMPLES_PER_SEND`)."""
    series = []
    for name, labels in families():
        base = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        for n in range(nodes):
            for g in range(8):
                series.append({**base, "__name__": name, "gpu": str(g), "device": f"nvidia{g}",
                               "UUID": f"GPU-{n:08d}-{g:04d}", "Hostname": f"gpu-node-{n:04d}",
                               "instance": f"10.0.{n // 250}.{n % 250}:9400", "job": "dcgm-exporter"})
    out = []
    for k in range(scrapes):
        ms = int((T0 + interval_s * k) * 1000)
        out.append([encode_request((labels, [(40.0 + int(labels["gpu"]), ms)])
                                   for labels in series[i:i + MAX_SAMPLES_PER_SEND])
                    for i in range(0, len(series), MAX_SAMPLES_PER_SEND)])
    return out


class RemoteWritePath:
    """The receiver's pure path, its state (label cache, assembly) kept across scrapes as a
    running receiver keeps it."""

    def __init__(self) -> None:
        settings = Settings()
        rw = settings.exporters.remote_write
        self.rw = rw
        self.reader = ExpositionReader.for_settings(settings, source="prometheus-remote-write", ignore_unknown=True)
        self.assembler = Assembler(self.reader, rw.assemble_s, rw.max_pending_samples, rw.max_nodes_tracked)
        self.cache = LabelCache()

    def scrape(self, bodies: list[bytes], split: dict[str, float] | None = None
               ) -> list[r.GpuTelemetry | r.PortTelemetry]:
        """The records of one scrape's requests; ``split`` adds the CPU time of each stage."""
        rw = self.rw
        clock = time.process_time
        t0 = clock()
        taking = 0.0
        for body in bodies:
            message = decode_request(body, RW_HEADERS, rw.max_body_bytes, rw.max_decompressed_bytes)
            t1 = clock()
            counts = SampleCounts()
            assert self.assembler.take(message, self.reader.skipped, counts, self.cache) is not None
            taking += clock() - t1
        t1 = clock()
        records = self.assembler.records(everything=True)
        if split is not None:
            split["decode"] += t1 - t0 - taking
            split["read + hold"] += taking
            split["records"] += clock() - t1
        return records


def remote_write_floor(scrapes: list[list[bytes]]) -> None:
    for bodies in scrapes:
        for body in bodies:
            WriteRequest().ParseFromString(memoryview(cramjam.snappy.decompress_raw(body)))


def best(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return min(times)


def text_records(text: str, openmetrics: bool) -> list[r.GpuTelemetry | r.PortTelemetry]:
    reader = ExpositionReader.for_settings(Settings(), ignore_unknown=True)
    return list(reader.read_samples(reader.parse(text.splitlines(), default_ts=T0, openmetrics=openmetrics)))


def range_records(body: bytes) -> list[r.GpuTelemetry | r.PortTelemetry]:
    """What ``backtest --prometheus`` does with one answer (History.records)."""
    reader = ExpositionReader.for_settings(Settings(), ignore_unknown=True)
    return list(reader.read_columns(matrix_columns(body, reader.skipped)))


def range_records_general(body: bytes) -> list[r.GpuTelemetry | r.PortTelemetry]:
    """The general path (json.loads, api_samples, sorted samples through read_samples): what
    History did before the typed decode, kept as the "before" figure."""
    reader = ExpositionReader.for_settings(Settings(), ignore_unknown=True)
    samples = list(api_samples(json.loads(body), reader.skipped))
    samples.sort(key=lambda s: s[3] or 0.0)
    return list(reader.read_samples(samples))


def row(name: str, samples: int, ours: float, floor_name: str, floor: float) -> None:
    print(f"{name:<28} {samples / ours:>12,.0f} samples/s   {floor_name:<34} {samples / floor:>12,.0f} samples/s   "
          f"ratio {floor / ours:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30, help="range-query steps per series")
    ap.add_argument("--scrapes", type=int, default=4, help="remote-write scrapes timed (after one that warms up)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default="abcd", help="the cases to run (letters; default: all)")
    args = ap.parse_args()
    n_series = len(families())

    samples = args.nodes * 8 * n_series
    if "a" in args.cases:
        text_case(args, samples)
    if "b" in args.cases:
        om_case(args, samples)
    if "c" in args.cases:
        range_case(args, samples)
    if "d" in args.cases:
        remote_write_case(args, samples)


def text_case(args: argparse.Namespace, samples: int) -> None:
    text = exposition(args.nodes, openmetrics=False)
    assert len(text_records(text, False)) == args.nodes
    ours = best(lambda: text_records(text, False), args.rounds)
    floor = best(lambda: [s for m in text_string_to_metric_families(text) for s in m.samples], args.rounds)
    row("(a) text -> records", samples, ours, "prometheus_client text parse", floor)


def om_case(args: argparse.Namespace, samples: int) -> None:
    om = exposition(args.nodes, openmetrics=True)
    assert len(text_records(om, True)) == args.nodes
    ours = best(lambda: text_records(om, True), args.rounds)
    floor = best(lambda: [s for m in om_families(om) for s in m.samples], args.rounds)
    row("(b) OpenMetrics -> records", samples, ours, "prometheus_client OpenMetrics parse", floor)


def range_case(args: argparse.Namespace, samples: int) -> None:
    body = range_answer(args.nodes, args.steps)
    got = range_records(body)
    assert len(got) == args.nodes * args.steps and got == range_records_general(body)
    ours = best(lambda: range_records(body), args.rounds)
    general = best(lambda: range_records_general(body), args.rounds)
    floor = best(lambda: json.loads(body), args.rounds)
    row("(c) range query -> records", samples * args.steps, ours, "json.loads (raw decode)", floor)
    row("    general path (before)", samples * args.steps, general, "json.loads (raw decode)", floor)


def remote_write_case(args: argparse.Namespace, samples: int) -> None:
    bodies = remote_write_bodies(args.nodes, args.scrapes + 1)
    warm, timed = bodies[0], bodies[1:]

    def receive() -> int:
        path = RemoteWritePath()
        path.scrape(warm)  # the first scrape fills the label cache (not timed below)
        got = 0
        for scrape in timed:
            got += len(path.scrape(scrape))
        return got

    assert receive() == args.nodes * args.scrapes

    def receive_timed() -> tuple[float, dict[str, float]]:
        path = RemoteWritePath()
        path.scrape(warm)
        split = dict.fromkeys(("decode", "read + hold", "records"), 0.0)
        t0 = time.process_time()
        for scrape in timed:
            path.scrape(scrape, split)
        return time.process_time() - t0, split

    import fleetmedic.connectors.prometheus.text as pt
    import fleetmedic.connectors.remote_write.assembler as rw

    native, columns = rw._native_hold_inline, pt._native_common_columns
    runs: dict[str, list[tuple[float, dict[str, float]]]] = {"c": [], "python": []}
    floors = []
    for _ in range(args.rounds):  # interleaved, so a busy spell hits each alike
        for name, hold in (("c", native), ("python", None)):
            if name == "c" and native is None:
                continue
            rw._native_hold_inline = hold
            pt._native_common_columns = columns if name == "c" else None
            try:
                runs[name].append(receive_timed())
            finally:
                rw._native_hold_inline, pt._native_common_columns = native, columns
        floors.append(best(lambda: remote_write_floor(timed), 1))
    floor = min(floors)
    n = samples * args.scrapes
    for name, label in (("c", "(d) remote write -> records"), ("python", "    the same, Python only")):
        if not runs[name]:
            print(f"{label}: not measured (fleetmedic.connectors.remote_write._remote_write is not built)")
            continue
        ours, split = min(runs[name], key=lambda x: x[0])
        row(label, n, ours, "snappy + protobuf decode", floor)
        stages = ", ".join(f"{stage} {t / n * 1e6:.2f} us" for stage, t in split.items())
        print(f"      per sample (best round): {stages}; floor {floor / n * 1e6:.2f} us")
    print(f"    remote write: {sum(map(len, timed))} requests of <= {MAX_SAMPLES_PER_SEND} samples, "
          f"{sum(len(x) for b in timed for x in b) / 1e6:.1f} MB compressed in all")


if __name__ == "__main__":
    main()
