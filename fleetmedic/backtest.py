"""``fleetmedic backtest``: run detection (and triage and policy) over recorded telemetry.

Inputs (files or directories, mixed freely):

- JSONL of fleetmedic records (``*.jsonl``): ``gpu_telemetry``, ``port_telemetry`` and
  ``job_event`` lines, recognised by their ``type``; other types are ignored;
- Prometheus text exposition (``*.prom``, ``*.txt``) with sample timestamps as dcgm-exporter and
  node-exporter write them; ``ingest.node_labels`` in the config says which label names the node.

Records of all inputs are merged in timestamp order and fed through the same stage objects the
pipeline runs (:mod:`fleetmedic.models.stages`, and the decision engine when present). Outputs in
``--out``: ``findings.jsonl``, ``incidents.jsonl``, ``commands.jsonl``, ``summary.json``; with
``--truth`` also ``score.json`` (the simulator's scorer); with ``--report`` an HTML page.
Malformed lines are skipped and counted per reason in the summary.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import msgspec

from fleetmedic import records as r
from fleetmedic.config import ConfigError, Settings, read_config
from fleetmedic.connectors.prometheus_text import ExpositionReader

if TYPE_CHECKING:
    from fleetmedic.models.stages import FleetDetection, NodeDetection

Telemetry = r.GpuTelemetry | r.PortTelemetry | r.JobEvent
_INPUT_DECODER = msgspec.json.Decoder(r.GpuTelemetry | r.PortTelemetry | r.JobEvent)
_TYPE_ONLY = msgspec.json.Decoder(dict[str, Any])
_WANTED = {"gpu_telemetry", "port_telemetry", "job_event"}


@dataclass
class InputReader:
    settings: Settings
    skipped: Counter[str] = field(default_factory=Counter)
    lines: int = 0

    def files(self, paths: Iterable[str]) -> list[Path]:
        out: list[Path] = []
        for p in map(Path, paths):
            if p.is_dir():
                out.extend(sorted(f for f in p.rglob("*") if f.suffix in (".jsonl", ".prom", ".txt")))
            elif p.exists():
                out.append(p)
            else:
                raise FileNotFoundError(f"input {p}: no such file or directory")
        return out

    def records(self, paths: Iterable[str]) -> Iterator[Telemetry]:
        streams = [self._read(f) for f in self.files(paths)]
        yield from heapq.merge(*streams, key=_ts)

    def _read(self, path: Path) -> Iterator[Telemetry]:
        with path.open(encoding="utf-8") as fh:
            if path.suffix == ".jsonl":
                yield from self._jsonl(path, fh)
            else:
                reader = ExpositionReader(self.settings.ingest)
                yield from reader.read(self._count(fh))
                for reason, n in reader.skipped.items():
                    self.skipped[f"{path.name}: {reason}"] += n

    def _count(self, fh: TextIO) -> Iterator[str]:
        for line in fh:
            self.lines += 1
            yield line

    def _jsonl(self, path: Path, fh: TextIO) -> Iterator[Telemetry]:
        for number, line in enumerate(fh, 1):
            self.lines += 1
            if not line.strip():
                continue
            try:
                yield _INPUT_DECODER.decode(line)
            except msgspec.ValidationError as exc:
                kind = _type_of(line)
                if kind is not None and kind not in _WANTED:
                    continue  # e.g. findings in the same directory: not telemetry
                self.skipped[f"{path.name}: {exc}"] += 1
            except msgspec.DecodeError:
                self.skipped[f"{path.name}: line {number} is not valid JSON"] += 1


def _type_of(line: str) -> str | None:
    try:
        kind = _TYPE_ONLY.decode(line).get("type")
    except msgspec.MsgspecError:
        return None
    return kind if isinstance(kind, str) else None


def _ts(rec: Telemetry) -> float:
    return float(rec.ts)


@dataclass
class Backtest:
    settings: Settings
    batch_size: int = 256
    findings: list[r.Finding] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        from fleetmedic.models.stages import FleetDetection, NodeDetection  # numpy/scikit-learn: not for --help

        self.node: NodeDetection = NodeDetection(self.settings.detection)
        self.fleet: FleetDetection = FleetDetection(self.settings.detection)
        self._pending: list[r.GpuTelemetry] = []
        self._next_tick = float("-inf")

    def feed(self, rec: Telemetry) -> None:
        self.counts[type(rec).__name__] += 1
        ts = float(rec.ts)
        if ts >= self._next_tick:
            self._flush()
            if self._next_tick != float("-inf"):
                self._emit(self.fleet.tick(ts))
            self._next_tick = ts + self.settings.detection.sample_interval_s
        if isinstance(rec, r.GpuTelemetry):
            self._pending.append(rec)
            self.fleet.on_gpu(rec)
            if len(self._pending) >= self.batch_size:
                self._flush()
        elif isinstance(rec, r.PortTelemetry):
            self._emit(self.node.on_port(rec) if rec.device_kind == "host" else self.fleet.on_port(rec))
        else:
            self._emit(self.fleet.on_job(rec))

    def finish(self) -> None:
        self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._emit(self.node.on_gpu(self._pending))
            self._pending = []

    def _emit(self, findings: list[r.Finding]) -> None:
        self.findings.extend(findings)


class Progress:
    """A one-line progress report on stderr when it is a terminal (or ``force``)."""

    def __init__(self, stream: TextIO, force: bool = False) -> None:
        self.stream, self.enabled = stream, force or stream.isatty()
        self.start = self.last = time.monotonic()

    def update(self, records: int, sim_ts: float) -> None:
        now = time.monotonic()
        if self.enabled and now - self.last >= 0.5:
            self.last = now
            rate = records / max(now - self.start, 1e-9)
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(sim_ts))
            self.stream.write(f"\r{records:>12,} records  {rate:>10,.0f}/s  at {stamp} UTC")
            self.stream.flush()

    def done(self) -> None:
        if self.enabled:
            self.stream.write("\n")


def run(settings: Settings, inputs: list[str], out: Path, progress: Progress | None = None,
        report: str | None = None) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    reader = InputReader(settings)
    bt = Backtest(settings)
    started = time.monotonic()
    first = last = None
    n = 0
    for rec in reader.records(inputs):
        bt.feed(rec)
        n += 1
        last = float(rec.ts)
        first = last if first is None else first
        if progress and n % 2000 == 0:
            progress.update(n, last)
    bt.finish()
    if progress:
        progress.done()
    elapsed = time.monotonic() - started
    _write_jsonl(out / "findings.jsonl", bt.findings)
    _write_jsonl(out / "incidents.jsonl", [])
    _write_jsonl(out / "commands.jsonl", [])
    summary = {
        "inputs": inputs,
        "records": dict(bt.counts),
        "lines_read": reader.lines,
        "skipped": dict(reader.skipped.most_common(50)),
        "skipped_total": sum(reader.skipped.values()),
        "span_s": (last - first) if first is not None and last is not None else 0.0,
        "elapsed_s": round(elapsed, 3),
        "records_per_s": round(n / elapsed, 1) if elapsed > 0 else None,
        "findings": len(bt.findings),
        "findings_by_detector": dict(Counter(f.detector for f in bt.findings)),
        "findings_by_kind": dict(Counter(f.kind for f in bt.findings)),
        "nodes_with_findings": len({f.node for f in bt.findings}),
    }
    if report:
        from fleetmedic.backtest_report import write_report

        meta = {"inputs": ", ".join(inputs), "records": n, "findings": len(bt.findings)}
        summary["report_plots"] = write_report(report, settings, InputReader(settings).records(inputs),
                                               bt.findings, [], [], meta)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return summary


def _write_jsonl(path: Path, items: Iterable[r.Record]) -> None:
    with path.open("wb") as fh:
        for item in items:
            fh.write(r.encode(item) + b"\n")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("backtest", help="run detection over recorded telemetry (JSONL records or Prometheus text)")
    p.add_argument("--config", help="YAML config (default: built-in defaults + FLEETMEDIC__* env)")
    p.add_argument("--input", action="append", required=True, help="file or directory; repeatable")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--report", metavar="HTML", help="also write a self-contained HTML report to this file")
    p.add_argument("--progress", action="store_true", help="show progress even when stderr is not a terminal")
    p.set_defaults(handler=_main)


def _main(args: argparse.Namespace) -> int:
    try:
        settings = read_config(args.config, os.environ)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        summary = run(settings, args.input, Path(args.out), Progress(sys.stderr, args.progress), args.report)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({k: summary[k] for k in ("records", "findings", "findings_by_kind", "skipped_total",
                                              "elapsed_s")}, sort_keys=True))
    return 0
