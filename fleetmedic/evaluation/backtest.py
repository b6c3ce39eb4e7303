"""``fleetmedic backtest``: run detection (and triage and policy) over recorded telemetry.

Inputs (files or directories, mixed freely):

- JSONL of fleetmedic records (``*.jsonl``): ``gpu_telemetry``, ``port_telemetry``, ``job_event``
  and ``kernel_event`` lines, recognised by their ``type``; other types are ignored;
- Prometheus text exposition and OpenMetrics (``*.prom``, ``*.txt``, ``*.om``): scrapes appended to
  a file, one raw ``/metrics`` scrape (no sample timestamps: they get ``scrape_time``, else the
  file's modification time, and the summary's ``timestamps`` says which; integer timestamps are
  seconds in ``*.om`` files, milliseconds elsewhere unless the text shows it is OpenMetrics), or ``promtool tsdb dump``
  / ``dump-openmetrics`` output (series by series: sorted by time on disk, in bounded memory);
  ``exporters.prometheus.node_labels`` says which label names the node, ``extra_labels`` are added
  to every sample as a scrape target's labels (``instance=gpu-node-1:9400``);
- recorded kernel logs (``*.kmsg``, ``*.dmesg``, ``*.journal``, ``*.log``: a ``kern.log``, a saved
  ``dmesg -T``, a ``journalctl -k -o json`` export), read as the kernel-log exporter reads them
  (:mod:`fleetmedic.evaluation.kernel_logs`: node, GPU and time of each line);
- the history a Prometheus server holds (``prometheus=``: range queries, see
  :mod:`fleetmedic.connectors.prometheus_history`).

Every file may be gzip-compressed (``*.jsonl.gz``, ``*.prom.gz``, ``*.dmesg.gz``, ...). A directory
is searched for files of these kinds; the others in it are ignored, and the summary's
``ignored_files`` says how many and why (per reason, with a few of their names).

Records of all inputs are merged in timestamp order and fed through the same stage objects the
pipeline runs: detection (:mod:`fleetmedic.models.stages`) and the decision engine (triage,
policy, safety; open loop: nothing acts on the commands). ``--topology`` gives racks and leaf
switches (a YAML/JSON map ``node -> {rack, leaf, pool, rails}``, or a simulator ``meta.json``).
Outputs in ``--out``: ``findings.jsonl``, ``incidents.jsonl``, ``commands.jsonl``, ``audit.jsonl``,
``summary.json``; with ``--truth`` also ``score.json`` (the simulator's scorer); with ``--report``
an HTML page. Malformed lines are skipped and counted per reason in the summary.

Bad input never stops the run: lines that are not UTF-8, longer than the caps or unreadable are
skipped and counted, a file that cannot be read further stops only itself, and the other files'
results are kept. ``summary.json``'s ``input_problems`` names every file with a problem (its lines,
records and problems per reason), ``skipped_by_file`` its number of skips, and ``series_not_read``
the exporter series that were present but are not ones fleetmedic reads; each file with problems
is also logged as a warning. A run whose input yields no record at all raises :class:`NoRecords`
with the most frequent reasons (``fleetmedic backtest`` exits 1).
"""

from __future__ import annotations

import gzip
import heapq
import json
import logging
import math
import os
import re
import struct
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol, TextIO

import msgspec

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.connectors.prometheus_text import MAX_LINE_CHARS, ExpositionReader, Sample, count
from fleetmedic.evaluation.kernel_logs import KERNEL_SUFFIXES, KernelLogOptions, kernel_log_records
from fleetmedic.models.event_time import refuse_future

if TYPE_CHECKING:
    from fleetmedic.models.stages import FleetDetection, NodeDetection

Telemetry = r.GpuTelemetry | r.PortTelemetry | r.JobEvent | r.KernelEvent
_INPUT_DECODER = msgspec.json.Decoder(r.GpuTelemetry | r.PortTelemetry | r.JobEvent | r.KernelEvent)
_TYPE_ONLY = msgspec.json.Decoder(dict[str, Any])
_WANTED = {"gpu_telemetry", "port_telemetry", "job_event", "kernel_event"}
#: the longest JSONL line read (a GPU record is ~2 KB, a Kafka message at most 1 MB by default)
MAX_JSONL_LINE_BYTES = 4 << 20
TEXT_SUFFIXES = (".prom", ".txt", ".om", ".openmetrics")
#: series-by-series input (promtool dumps) is sorted through temp files of this much time each
SORT_BUCKET_S = 600.0
#: the exposition reader's window: a sample further behind the newest is dropped when read as a stream
FLUSH_LAG_S = 120.0
log = logging.getLogger("fleetmedic.backtest")


class NoRecords(Exception):
    """The input yielded no record; the message names the most frequent reasons."""


@dataclass
class FileReport:
    """What reading one input file found."""

    lines: int = 0
    records: int = 0
    problems: Counter[str] = field(default_factory=Counter)  # reason -> lines

    def problem(self, reason: str, n: int = 1) -> None:
        count(self.problems, reason, n)

    def as_dict(self) -> dict[str, Any]:
        return {"lines": self.lines, "records": self.records, "problems_total": sum(self.problems.values()),
                "problems": dict(self.problems.most_common(20))}


@dataclass
class InputReader:
    """Reads input files into records in time order. ``scrape_time`` stamps exposition samples
    without a timestamp (None: the file's modification time); ``extra_labels`` are added to every
    exposition sample as a scrape target's labels."""

    settings: Settings
    skipped: Counter[str] = field(default_factory=Counter)
    lines: int = 0
    files_read: dict[str, FileReport] = field(default_factory=dict)  # path -> what reading it found
    scrape_time: float | None = None
    extra_labels: dict[str, str] = field(default_factory=dict)
    timestamps: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> how samples were stamped
    not_read: Counter[str] = field(default_factory=Counter)  # exporter series present but not read
    bytes_read: int = 0  # of the input files, so far (progress)
    kernel: KernelLogOptions = field(default_factory=KernelLogOptions)
    kernel_not_published: Counter[str] = field(default_factory=Counter)  # kernel lines read, no device fault

    ignored: dict[str, list[str]] = field(default_factory=dict)  # reason -> files of a directory not read

    def total_bytes(self, paths: Iterable[str]) -> int:
        """The size of the input files, uncompressed (what :attr:`bytes_read` reaches at the end)."""
        return sum(_content_size(f) for f in self.files(paths))

    def problems(self) -> dict[str, dict[str, Any]]:
        """The files with problems: path -> lines, records and problems per reason."""
        return {path: rep.as_dict() for path, rep in self.files_read.items() if rep.problems}

    def skipped_by_file(self) -> dict[str, int]:
        return {path: sum(rep.problems.values()) for path, rep in self.files_read.items() if rep.problems}

    def ignored_files(self) -> dict[str, Any]:
        """The files of input directories that were not read: how many, and per reason how many
        with up to five of their names."""
        return {"count": sum(len(v) for v in self.ignored.values()),
                "by_reason": {reason: {"files": len(names), "examples": names[:5]}
                              for reason, names in sorted(self.ignored.items())}}

    def files(self, paths: Iterable[str]) -> list[Path]:
        """The files to read: each file named, and the files of each directory named whose kind
        (:func:`input_kind`) is known; the other files of a directory are recorded in :attr:`ignored`."""
        out: list[Path] = []
        self.ignored = {}
        for p in map(Path, paths):
            if p.is_dir():
                for f in sorted(f for f in p.rglob("*") if f.is_file()):
                    why = _why_ignored(f)
                    if why is None:
                        out.append(f)
                    else:
                        self.ignored.setdefault(why, []).append(str(f))
            elif p.exists():
                out.append(p)
            else:
                raise FileNotFoundError(f"input {p}: no such file or directory")
        return out

    def records(self, paths: Iterable[str], *more: Iterable[Telemetry]) -> Iterator[Telemetry]:
        """The records of the files (and of ``more`` streams, each in time order), merged by time."""
        streams: list[Iterable[Telemetry]] = [self._read(f) for f in self.files(paths)]
        yield from heapq.merge(*streams, *more, key=_ts)

    def _read(self, path: Path) -> Iterator[Telemetry]:
        report = self.files_read[str(path)] = FileReport()
        exposition: ExpositionReader | None = None
        try:
            kind = input_kind(path)
            with _open(path) as fh:
                if kind == ".jsonl":
                    for rec in self._jsonl(fh, report):
                        report.records += 1
                        yield rec
                elif kind in KERNEL_SUFFIXES:
                    kernel = kernel_log_records(path, self._text(fh, report), self.kernel, report.problems,
                                                self.kernel_not_published)
                    report.records += len(kernel)
                    yield from kernel
                else:
                    exposition = ExpositionReader.for_settings(self.settings, ignore_unknown=True)
                    default_ts = self.scrape_time if self.scrape_time is not None else path.stat().st_mtime
                    openmetrics = kind in (".om", ".openmetrics")
                    lines = self._text(fh, report)
                    head = _head(lines, 64)
                    samples = exposition.parse(_chain(head, lines), default_ts, self.extra_labels or None,
                                               openmetrics=openmetrics)
                    if _series_by_series(head) or _out_of_order(path, openmetrics, FLUSH_LAG_S):
                        samples = _time_sorted(samples)
                    for rec in exposition.read_samples(samples, FLUSH_LAG_S):
                        report.records += 1
                        yield rec
        except Exception as exc:  # unreadable from here on (an I/O error, a bug): this file stops, not the run
            report.problem(f"reading stopped at line {report.lines}: {type(exc).__name__}: {str(exc)[:200]}")
        finally:
            if exposition is not None:
                for reason, n in exposition.skipped.items():
                    report.problem(reason, n)
                for name, n in exposition.ignored.items():
                    count(self.not_read, name, n)
                if exposition.samples_without_ts:
                    self.timestamps[str(path)] = {
                        "samples_without_timestamp": exposition.samples_without_ts,
                        "stamped_with": "--scrape-time" if self.scrape_time is not None else "file modification time",
                        "scrape_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(default_ts)),
                    }
            for reason, n in report.problems.items():
                self.skipped[f"{path.name}: {reason}"] += n
            if report.problems:
                log.warning("input %s: %d of %d lines skipped, %d records read (%s)", path,
                            sum(report.problems.values()), report.lines, report.records,
                            "; ".join(f"{reason}: {n}" for reason, n in report.problems.most_common(3)))

    def _raw_lines(self, fh: IO[bytes], report: FileReport, limit: int) -> Iterator[bytes]:
        """The file's lines as bytes, at most ``limit`` each (memory stays bounded whatever the
        file holds: a longer line is skipped in pieces and counted)."""
        while raw := fh.readline(limit + 1):
            self.bytes_read += len(raw)
            self.lines += 1
            report.lines += 1
            if len(raw) > limit and not raw.endswith(b"\n"):
                while (rest := fh.readline(1 << 20)) and not rest.endswith(b"\n"):
                    self.bytes_read += len(rest)
                self.bytes_read += len(rest)
                report.problem(f"line longer than {limit} bytes")
                continue
            yield raw

    def _text(self, fh: IO[bytes], report: FileReport) -> Iterator[str]:
        for raw in self._raw_lines(fh, report, MAX_LINE_CHARS):
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError:
                report.problem("line is not UTF-8")

    def _jsonl(self, fh: IO[bytes], report: FileReport) -> Iterator[Telemetry]:
        for line in self._raw_lines(fh, report, MAX_JSONL_LINE_BYTES):
            if not line.strip():
                continue
            refused = r.json_limit_error(line, MAX_JSONL_LINE_BYTES)
            if refused is not None:
                report.problem(f"refused: {refused}")
                continue
            try:
                yield _INPUT_DECODER.decode(line)
            except msgspec.ValidationError as exc:
                kind = _type_of(line)
                if kind is not None and kind not in _WANTED:
                    continue  # e.g. findings in the same directory: not telemetry
                report.problem(str(exc)[:200])
            except msgspec.DecodeError:  # also bytes that are not UTF-8
                report.problem("not valid JSON")


INPUT_SUFFIXES = (".jsonl", *TEXT_SUFFIXES, *KERNEL_SUFFIXES)


def input_kind(path: Path) -> str:
    """The suffix that says how a file is read, under a ``.gz``: ``a.prom.gz`` -> ``.prom``."""
    name = path.name.removesuffix(".gz") if path.name.endswith(".gz") else path.name
    return Path(name).suffix


def _why_ignored(path: Path) -> str | None:
    """Why a file found in an input directory is not read, or None when it is."""
    kind = input_kind(path)
    if kind in INPUT_SUFFIXES:
        return None
    return (f"suffix {kind!r} is no input kind ({', '.join(INPUT_SUFFIXES)}, each also as .gz)" if kind
            else f"no suffix, so no input kind ({', '.join(INPUT_SUFFIXES)}, each also as .gz)")


def _open(path: Path) -> IO[bytes]:
    """The file's bytes, decompressed when its name ends in ``.gz``."""
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]  # a GzipFile reads as IO[bytes]
    return path.open("rb")


def _content_size(path: Path) -> int:
    """The bytes a reader gets from the file: for gzip, the size its trailer records (modulo 4 GiB)."""
    size = path.stat().st_size
    if not path.name.endswith(".gz") or size < 18:
        return size
    with path.open("rb") as fh:
        fh.seek(-4, 2)
        return int.from_bytes(fh.read(4), "little") or size


def _head(lines: Iterator[str], n: int) -> list[str]:
    out: list[str] = []
    for line in lines:
        out.append(line)
        if len(out) >= n:
            break
    return out


def _chain(head: list[str], rest: Iterator[str]) -> Iterator[str]:
    yield from head
    yield from rest


def _series_by_series(head: list[str]) -> bool:
    """Whether a file lists each series' samples together (``promtool tsdb dump``), not scrape by
    scrape: two consecutive sample lines of the same series."""
    prev = None
    for line in head:
        line = line.strip()
        if not line or line[0] == "#":
            continue
        key = line.rsplit("}", 1)[0] if "}" in line else line.split(" ", 1)[0]
        if key == prev:
            return True
        prev = key
    return False


def _out_of_order(path: Path, openmetrics: bool, lag_s: float) -> bool:
    """Whether a sample of the file is stamped more than ``lag_s`` before one above it: the
    streaming reader would drop it (it flushes what is that far behind the newest). Files grouped by
    metric family with each family scrape by scrape (all of one metric's history, then the next
    metric's) are like that, and so is any file put together out of order. A quick pass over the
    timestamps only; ``_series_by_series`` catches promtool's dumps from their first lines already."""
    newest = -math.inf
    scale = 1.0 if openmetrics else 1e-3  # OpenMetrics stamps in seconds, the text format in milliseconds
    with _open(path) as fh:
        while raw := fh.readline(MAX_LINE_CHARS + 1):
            if raw[:1] in (b"#", b"\n") or len(raw) > MAX_LINE_CHARS:
                continue
            body = raw.split(b" # ", 1)[0].rstrip()  # an OpenMetrics exemplar follows " # "
            labels_end = body.rfind(b"}")
            fields = body[labels_end + 1:].split() if labels_end >= 0 else body.split()[1:]
            if len(fields) < 2:
                continue  # no timestamp: stamped with the scrape time, all alike
            try:
                ts = float(fields[-1]) * scale
            except ValueError:
                continue  # the reader counts it
            if ts < newest - lag_s:
                return True
            newest = max(newest, ts)
    return False


def _time_sorted(samples: Iterator[Sample], bucket_s: float = SORT_BUCKET_S) -> Iterator[Sample]:
    """``samples`` in time order, through temp files of ``bucket_s`` each (memory holds one bucket)."""
    enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(tuple[str, dict[str, str], float, float])
    with tempfile.TemporaryDirectory(prefix="fleetmedic-sort-") as tmp:
        files: dict[int, IO[bytes]] = {}
        try:
            for s in samples:
                if s[3] is None or not math.isfinite(s[3]):
                    yield s  # the reader counts it
                    continue
                k = int(s[3] // bucket_s)
                fh = files.get(k)
                if fh is None:
                    if len(files) > 100_000:
                        raise ValueError("input spans too many sort buckets (timestamps out of range?)")
                    fh = files[k] = open(Path(tmp) / f"{k}.bin", "wb")  # noqa: SIM115 (closed below)
                data = enc.encode(s)
                fh.write(struct.pack("<I", len(data)) + data)
        finally:
            for fh in files.values():
                fh.close()
        for k in sorted(files):
            raw = (Path(tmp) / f"{k}.bin").read_bytes()
            bucket: list[Sample] = []
            pos = 0
            while pos < len(raw):
                (size,) = struct.unpack_from("<I", raw, pos)
                bucket.append(dec.decode(raw[pos + 4 : pos + 4 + size]))
                pos += 4 + size
            bucket.sort(key=lambda s: s[3] or 0.0)
            yield from bucket


def _type_of(line: bytes) -> str | None:
    try:
        kind = _TYPE_ONLY.decode(line).get("type")
    except msgspec.MsgspecError:
        return None
    return kind if isinstance(kind, str) else None


def _ts(rec: Telemetry) -> float:
    return float(rec.ts)


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
    :class:`fleetmedic.connectors.prometheus_history.History`)."""

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
        kernel: KernelLogOptions | None = None) -> dict[str, Any]:
    """Run the backtest; raises :class:`NoRecords` (after writing ``summary.json``) when the input
    yields no record."""
    out.mkdir(parents=True, exist_ok=True)
    kernel = kernel or KernelLogOptions()
    reader = InputReader(settings, scrape_time=scrape_time, extra_labels=dict(extra_labels or {}), kernel=kernel)
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
        again = InputReader(settings, scrape_time=scrape_time, extra_labels=dict(extra_labels or {}), kernel=kernel)
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
