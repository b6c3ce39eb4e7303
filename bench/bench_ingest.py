"""Ingest throughput per core: GPU samples/s into records, each path beside a floor measured in the
same run on the same bytes.

(a) Prometheus text (dcgm-exporter's real label set, from the field corpus' gpu-operator capture;
    N nodes x 8 GPUs x 16 series) -> GpuTelemetry through ExpositionReader; floor: prometheus_client's
    text parser, parse only (it builds no records).
(b) OpenMetrics (the same samples, float-second timestamps, ``# EOF``) -> GpuTelemetry; floor:
    prometheus_client's OpenMetrics parser, parse only.
(c) a Prometheus range-query answer (``/api/v1/query_range``, matrix, 30 steps) -> GpuTelemetry
    through api_samples and the reader, as ``backtest --prometheus`` does; floor: ``json.loads`` of the
    same bytes (raw decode).

Single thread, process CPU time, best of ``--rounds``. Prints samples/s for each and the ratio to its
floor (>= 0.5 is the target of issue #23; above 1, fleetmedic is faster than the floor).
The remote-write receiver is not built yet, so it has no row.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.connectors.prometheus_api import api_samples
from fleetmedic.connectors.prometheus_text import ExpositionReader

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
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    n_series = len(families())

    text = exposition(args.nodes, openmetrics=False)
    samples = args.nodes * 8 * n_series
    assert len(text_records(text, False)) == args.nodes
    ours = best(lambda: text_records(text, False), args.rounds)
    floor = best(lambda: [s for m in text_string_to_metric_families(text) for s in m.samples], args.rounds)
    row("(a) text -> records", samples, ours, "prometheus_client text parse", floor)

    om = exposition(args.nodes, openmetrics=True)
    assert len(text_records(om, True)) == args.nodes
    ours = best(lambda: text_records(om, True), args.rounds)
    floor = best(lambda: [s for m in om_families(om) for s in m.samples], args.rounds)
    row("(b) OpenMetrics -> records", samples, ours, "prometheus_client OpenMetrics parse", floor)

    body = range_answer(args.nodes, args.steps)
    assert len(range_records(body)) == args.nodes * args.steps
    ours = best(lambda: range_records(body), args.rounds)
    floor = best(lambda: json.loads(body), args.rounds)
    row("(c) range query -> records", samples * args.steps, ours, "json.loads (raw decode)", floor)


if __name__ == "__main__":
    main()
