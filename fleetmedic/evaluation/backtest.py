"""``fleetmedic backtest``: run detection (and triage and policy) over recorded telemetry.

Inputs (files or directories, mixed freely; :mod:`fleetmedic.evaluation.backtest_inputs` reads
them): JSONL of fleetmedic records, Prometheus text exposition and OpenMetrics, recorded kernel
logs, each possibly gzip-compressed, and the history a Prometheus server holds (``prometheus=``:
:mod:`fleetmedic.connectors.prometheus.history`).

Records of all inputs are merged in timestamp order and fed through the same stage objects the
pipeline runs: detection (:mod:`fleetmedic.models.stages`) and the decision engine (triage,
policy, safety; open loop: nothing acts on the commands). ``--topology`` gives racks and leaf
switches (a YAML/JSON map ``node -> {rack, leaf, pool, rails}``, or a simulator ``meta.json``).
Outputs in ``--out``: ``findings.jsonl``, ``incidents.jsonl``, ``commands.jsonl``, ``audit.jsonl``,
``summary.json``; with ``--truth`` also ``score.json`` (the simulator's scorer); with ``--report``
an HTML page. Malformed lines are skipped and counted per reason in the summary.

Bad input never stops the run (lines that cannot be read are skipped and counted per reason, a
file that cannot be read further stops only itself). ``summary.json``'s ``input_problems`` names
every file with a problem, ``skipped_by_file`` its number of skips, and ``series_not_read`` the
exporter series that were present but are not ones fleetmedic reads. A run whose input yields no
record at all raises :class:`NoRecords` with the most frequent reasons (``fleetmedic backtest``
exits 1).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.connectors.prometheus.text import count
from fleetmedic.evaluation.backtest_inputs import TEXT_SUFFIXES, InputReader, Telemetry
from fleetmedic.evaluation.kernel_logs import KernelLogOptions
from fleetmedic.models.event_time import refuse_future

if TYPE_CHECKING:
    from fleetmedic.models.stages import FleetDetection, NodeDetection


class NoRecords(Exception):
    """The input yielded no record; the message names the most frequent reasons."""


@dataclass
class Backtest:
    """The pipeline in one process over recorded telemetry, in the records' time. A record stamped
    more than ``streams.max_future_skew_s`` ahead of the wall clock (``clock``) is refused and
    counted in :attr:`ahead` (:func:`~fleetmedic.models.event_time.refuse_future`, as the live
    stages refuse it): it moves no clock, so one sample stamped in 2096 cannot make every command
    expire in 2096."""

    settings: Settings
    topology: dict[str, dict[str, Any]] = field(default_factory=dict)
    batch_size: int = 256
    clock: Callable[[], float] = time.time
    ahead: Counter[str] = field(default_factory=Counter)  # refused records per reason
    findings: list[r.Finding] = field(default_factory=list)
    incidents: list[r.Incident] = field(default_factory=list)
    commands: list[r.RemediationCommand] = field(default_factory=list)
    audit: list[r.AuditRecord] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        # numpy / scikit-learn: imported here, not for `fleetmedic --help`
        from fleetmedic.models.stages import FleetDetection, NodeDetection
        from fleetmedic.remediation.engine import DecisionEngine
        from fleetmedic.remediation.topology import Topology

        self.node: NodeDetection = NodeDetection(self.settings.detection)
        self.fleet: FleetDetection = FleetDetection(self.settings.detection)
        self.engine = DecisionEngine(self.settings, Topology.from_dict(self.topology))
        self._pending: list[r.GpuTelemetry] = []
        self._next_tick = float("-inf")
        self._now = 0.0

    def feed(self, rec: Telemetry) -> bool:
        """Take one record; False (counted in :attr:`ahead`) when it is stamped ahead of the clock."""
        bound = self.settings.streams.max_future_skew_s
        if refuse_future(rec, self.clock(), bound) is not None:
            self.ahead[f"{type(rec).__name__}: stamped more than streams.max_future_skew_s ({bound:g} s) ahead of "
                       "the wall clock"] += 1
            return False
        self.counts[type(rec).__name__] += 1
        ts = float(rec.ts)
        self._now = max(self._now, ts)
        if ts >= self._next_tick:
            self._flush()
            if self._next_tick != float("-inf"):
                self._emit(self.fleet.tick(ts))
                self._decided(self.engine.tick(self._now))
            self._next_tick = ts + self.settings.detection.sample_interval_s
        named = rec.device if isinstance(rec, r.PortTelemetry) and rec.device_kind == "host" else \
            rec.node if isinstance(rec, r.GpuTelemetry | r.KernelEvent) else ""
        if named:  # the fleet, when no topology names it: as the embedded engine and the decision stage count it
            self.engine.nodes_seen((named,), self._now)
        if isinstance(rec, r.KernelEvent):
            self._flush()  # the node's telemetry before the line first: an XID from both is one event
            self._emit(self.node.on_kernel(rec))
        elif isinstance(rec, r.GpuTelemetry):
            self._pending.append(rec)
            self.fleet.on_gpu(rec)
            if len(self._pending) >= self.batch_size:
                self._flush()
        elif isinstance(rec, r.PortTelemetry):
            self._emit(self.node.on_port(rec) if rec.device_kind == "host" else self.fleet.on_port(rec))
        else:
            self._emit(self.fleet.on_job(rec))
            self._decided(self.engine.on_job_event(rec, self._now))
        return True

    def finish(self) -> None:
        self._flush()
        self._decided(self.engine.tick(self._now))

    def _flush(self) -> None:
        if self._pending:
            self._emit(self.node.on_gpu(self._pending))
            self._pending = []

    def _emit(self, findings: list[r.Finding]) -> None:
        self.findings.extend(findings)
        for f in findings:
            self._decided(self.engine.on_finding(f, self._now))

    def _decided(self, d: Any) -> None:
        self.incidents.extend(d.incidents)
        self.commands.extend(d.commands)
        self.audit.extend(d.audit)


def load_topology(path: str) -> dict[str, dict[str, Any]]:
    """A topology map, or the racks and leaves of a simulator's ``meta.json``."""
    import yaml

    with open(path, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    if not isinstance(doc, dict):
        raise ValueError(f"topology {path}: expected a mapping")
    if "nodes" in doc and "racks" in doc:  # fleetmedic simulate's meta.json
        leaves = doc.get("leaf_of", {})
        return {n: {"rack": doc["racks"].get(n, ""), "leaf": (leaves.get(n) or [""])[0],
                    "rails": {f"mlx5_{k}": leaf for k, leaf in enumerate(leaves.get(n, []))}} for n in doc["nodes"]}
    return {str(n): dict(v) for n, v in doc.items()}


def progress_bar(stream: TextIO, **options: Any) -> Any:
    """A tqdm bar on ``stream``: the size of its terminal, 100 x 24 where that has none (a pipe, a
    pseudo-terminal nobody sized: tqdm would hide the bar there and leave an empty line), plain
    ASCII off a terminal."""
    from tqdm import tqdm

    try:
        columns, lines = os.get_terminal_size(stream.fileno())
        tty = stream.isatty()
    except (AttributeError, OSError, ValueError):  # not a file (a test's buffer), or not a terminal
        columns, lines, tty = 0, 0, False
    return tqdm(file=stream, ncols=columns or 100, nrows=lines or 24, ascii=not tty, mininterval=0.5, leave=True,
                **options)


class Progress:
    """Progress bars on ``stream`` (stderr; tqdm, with totals and ETA), shown when it is a terminal
    or ``force``: the input bytes read, the Prometheus range queries, the report's second pass.
    Nothing is written when disabled; enabled, a short run shows its bars at 100 %, never an empty line."""

    def __init__(self, stream: TextIO, force: bool = False) -> None:
        isatty = getattr(stream, "isatty", None)
        self.stream, self.enabled = stream, force or bool(isatty and isatty())
        self._bars: dict[str, Any] = {}  # phase -> tqdm

    def _bar(self, key: str, desc: str, total: float | None, unit: str, unit_scale: bool) -> Any:
        if not self.enabled:
            return None
        bar = self._bars.get(key)
        if bar is None:
            bar = self._bars[key] = progress_bar(self.stream, total=total, desc=desc, unit=unit,
                                                 unit_scale=unit_scale, unit_divisor=1024 if unit == "B" else 1000,
                                                 position=len(self._bars))
        return bar

    def start(self, phase: str, total_bytes: int) -> None:
        """A pass over the input files begins: ``phase`` ("backtest", "report") of ``total_bytes``."""
        self.done()
        if total_bytes:
            self._bar(phase, phase, total_bytes, "B", True)

    def update(self, records: int, sim_ts: float, bytes_read: int | None = None, phase: str = "backtest") -> None:
        """Records so far and the time they reached; ``bytes_read``: of the input files."""
        bar = self._bars.get(phase)
        if bar is None:
            bar = self._bar(phase, phase, None, "rec", True)
            if bar is None:
                return
        if bytes_read is not None and bar.total is not None:
            bar.update(bytes_read - bar.n)
        elif bar.total is None:
            bar.update(records - bar.n)
        stamp = time.strftime("%Y-%m-%d %H:%M", time.gmtime(sim_ts))
        bar.set_postfix_str(f"{records:,} records, at {stamp} UTC", refresh=False)

    def chunk(self, done: int, total: int, seconds_done: float) -> None:
        """A Prometheus range query done: queries done of all (the bar shows the ETA)."""
        bar = self._bar("prometheus", "prometheus queries", total, "query", False)
        if bar is None:
            return
        bar.update(done - bar.n)
        bar.set_postfix_str(f"{seconds_done / 3600:,.1f} h of history", refresh=False)

    def done(self) -> None:
        """Close every bar (each stays on screen at its last value)."""
        for bar in self._bars.values():
            bar.close()
        self._bars.clear()


class RecordSource(Protocol):
    """Records from elsewhere than files, in time order (the CLI's ``--prometheus`` history:
    :class:`fleetmedic.connectors.prometheus.history.History`)."""

    skipped: Counter[str]  # reason -> samples that could not be used
    ignored: Counter[str]  # series present but not read

    def records(self) -> Iterator[r.GpuTelemetry | r.PortTelemetry]: ...

    def again(self) -> RecordSource:
        """The same source, to be read once more (the HTML report reads the records twice)."""
        ...

    def summary(self) -> dict[str, Any]: ...

    def bind_progress(self, progress: Progress | None) -> None: ...


def run(settings: Settings, inputs: list[str], out: Path, progress: Progress | None = None,
        report: str | None = None, topology: dict[str, dict[str, Any]] | None = None,
        truth: Path | None = None, scrape_time: float | None = None,
        extra_labels: dict[str, str] | None = None, history: RecordSource | None = None,
        kernel: KernelLogOptions | None = None, node_from_path: str = "") -> dict[str, Any]:
    """Run the backtest; raises :class:`NoRecords` (after writing ``summary.json``) when the input
    yields no record."""
    out.mkdir(parents=True, exist_ok=True)
    kernel = kernel or KernelLogOptions()
    reader = InputReader(settings, scrape_time=scrape_time, extra_labels=dict(extra_labels or {}), kernel=kernel,
                         node_from_path=node_from_path)
    bt = Backtest(settings, topology or {})
    started = time.monotonic()
    first = last = None
    n = 0
    more: list[Iterable[Telemetry]] = []
    if history is not None:
        history.bind_progress(progress)
        more.append(history.records())
    if progress:
        progress.start("backtest", reader.total_bytes(inputs))
    for rec in reader.records(inputs, *more):
        if not bt.feed(rec):
            continue
        n += 1
        last = float(rec.ts)
        first = last if first is None else first
        if progress and n % 500 == 0:
            progress.update(n, last, reader.bytes_read)
    bt.finish()
    if progress:
        if last is not None:
            progress.update(n, last, reader.bytes_read)
        progress.done()
    elapsed = time.monotonic() - started
    _write_jsonl(out / "findings.jsonl", bt.findings)
    _write_jsonl(out / "incidents.jsonl", bt.incidents)
    _write_jsonl(out / "commands.jsonl", bt.commands)
    _write_jsonl(out / "audit.jsonl", bt.audit)
    skipped = Counter(reader.skipped) + bt.ahead
    if history is not None:
        for reason, k in history.skipped.items():
            skipped[f"prometheus: {reason}"] += k
        for name, k in history.ignored.items():
            count(reader.not_read, name, k)
    summary = {
        "inputs": inputs,
        "records": dict(bt.counts),
        "lines_read": reader.lines,
        "skipped": dict(skipped.most_common(50)),
        "skipped_total": sum(skipped.values()),
        "skipped_by_reason": dict(_by_kind(skipped).most_common(20)),
        "skipped_by_file": reader.skipped_by_file(),
        "ignored_files": reader.ignored_files(),
        "input_problems": reader.problems(),
        "timestamps": reader.timestamps,
        "series_not_read": dict(reader.not_read.most_common(30)),
        "kernel_lines_not_published": dict(reader.kernel_not_published.most_common(20)),
        "span_s": (last - first) if first is not None and last is not None else 0.0,
        "elapsed_s": round(elapsed, 3),
        "records_per_s": round(n / elapsed, 1) if elapsed > 0 else None,
        "findings": len(bt.findings),
        "findings_by_detector": dict(Counter(f.detector for f in bt.findings)),
        "findings_by_kind": dict(Counter(f.kind for f in bt.findings)),
        "nodes_with_findings": len({f.node for f in bt.findings}),
        "incidents": len({i.id for i in bt.incidents}),
        "incidents_by_class": dict(Counter({i.id: i.incident_class for i in bt.incidents}.values())),
        "commands_by_action": dict(Counter(c.action for c in bt.commands)),
    }
    if history is not None:
        summary["prometheus"] = history.summary()
    if n == 0:
        (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        top = _by_kind(skipped).most_common(5)
        raise NoRecords("the input yielded no records" + (
            "; most frequent reasons: " + "; ".join(f"{reason} ({k:,})" for reason, k in top) if top else
            " (no readable lines)"))
    if truth is not None:
        summary["score"] = _score(truth, bt, out)
    if report:
        from fleetmedic.evaluation.backtest_report import write_report

        meta = {"inputs": ", ".join(inputs), "records": n, "findings": len(bt.findings),
                "start": first, "end": last, "records_by_type": dict(bt.counts), "score": summary.get("score")}
        again = InputReader(settings, scrape_time=scrape_time, extra_labels=dict(extra_labels or {}), kernel=kernel,
                         node_from_path=node_from_path)
        replay = [] if history is None else [history.again()]  # its queries again, with their bar
        for source in replay:
            source.bind_progress(progress)
        records = again.records(inputs, *(source.records() for source in replay))
        if progress:
            progress.start("report", again.total_bytes(inputs))
            records = _reported(records, again, progress)
        summary["report_plots"] = write_report(report, settings, records, bt.findings, bt.incidents, bt.commands,
                                               meta)
        if progress:
            progress.done()
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return summary


def _reported(records: Iterable[Telemetry], reader: InputReader, progress: Progress) -> Iterator[Telemetry]:
    """``records``, updating the report pass's progress bar on the way."""
    n, last = 0, 0.0
    for rec in records:
        yield rec
        n += 1
        last = float(rec.ts)
        if n % 500 == 0:
            progress.update(n, last, reader.bytes_read, phase="report")
    progress.update(n, last, reader.bytes_read, phase="report")


_SERIES_PREFIX = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*: ")


def _by_kind(skipped: Counter[str]) -> Counter[str]:
    """Skips per reason, whatever the file and series (``gpu.prom: DCGM_FI_DEV_GPU_TEMP: no node
    label (...)`` -> ``no node label (...)``)."""
    out: Counter[str] = Counter()
    for reason, n in skipped.items():
        kind = reason.split(": ", 1)[1] if ": " in reason and reason.split(": ", 1)[0].endswith(
            (*TEXT_SUFFIXES, ".jsonl", "prometheus")) else reason
        out[_SERIES_PREFIX.sub("", kind, count=1)] += n
    return out


def _score(truth: Path, bt: Backtest, out: Path) -> dict[str, Any]:
    from fleetmedic.evaluation.scoring import encode_report, score
    from fleetmedic.evaluation.truth import read_meta, read_truth

    meta_path = truth.parent / "meta.json"
    meta = read_meta(meta_path) if meta_path.exists() else None
    rep = score(read_truth(truth), bt.incidents, bt.commands, meta)
    (out / "score.json").write_bytes(encode_report(rep))
    return {"precision": rep.precision, "recall": rep.recall, "f1": rep.f1, "top1": rep.top1_accuracy,
            "false_incidents": rep.false_incidents, "delay_p50_s": rep.delay_p50_s}


def _write_jsonl(path: Path, items: Iterable[r.Record]) -> None:
    with path.open("wb") as fh:
        for item in items:
            fh.write(r.encode(item) + b"\n")
