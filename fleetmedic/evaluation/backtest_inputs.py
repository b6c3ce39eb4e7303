"""The input reader of ``fleetmedic backtest`` (:class:`InputReader`): recorded telemetry files ->
records in time order.

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
  (:mod:`fleetmedic.evaluation.kernel_logs`: node, GPU and time of each line).

Every file may be gzip-compressed (``*.jsonl.gz``, ``*.prom.gz``, ``*.dmesg.gz``, ...). A directory
is searched for files of these kinds; the others in it are ignored, and the summary's
``ignored_files`` says how many and why (per reason, with a few of their names).

Each file's records come in time order, and :meth:`InputReader.records` merges the files (and
any other record streams: the history a Prometheus server holds, ``prometheus=``, read by
:mod:`fleetmedic.connectors.prometheus.history`) by time.

Bad input never stops the run: lines that are not UTF-8, longer than the caps or unreadable are
skipped and counted, a file that cannot be read further stops only itself, and the other files'
results are kept. ``summary.json``'s ``input_problems`` names every file with a problem (its lines,
records and problems per reason), ``skipped_by_file`` its number of skips, and ``series_not_read``
the exporter series that were present but are not ones fleetmedic reads; each file with problems
is also logged as a warning.
"""

from __future__ import annotations

import gzip
import heapq
import logging
import math
import struct
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.connectors.prometheus.text import MAX_LINE_CHARS, ExpositionReader, Sample, count
from fleetmedic.evaluation.kernel_logs import KERNEL_SUFFIXES, KernelLogOptions, kernel_log_records

Telemetry = r.GpuTelemetry | r.PortTelemetry | r.JobEvent | r.KernelEvent
_INPUT_DECODER = msgspec.json.Decoder(r.GpuTelemetry | r.PortTelemetry | r.JobEvent | r.KernelEvent)
_TYPE_ONLY = msgspec.json.Decoder(dict[str, Any])
_WANTED = {"gpu_telemetry", "port_telemetry", "job_event", "kernel_event"}
#: the longest JSONL line read (a GPU record is ~2 KB, a Kafka message at most 1 MB by default)
MAX_JSONL_LINE_BYTES = 4 << 20
TEXT_SUFFIXES = (".prom", ".txt", ".om", ".openmetrics")
#: series-by-series input (promtool dumps) is sorted through temp files of this much time each
SORT_BUCKET_S = 600.0
#: a file at most this size (uncompressed) is read whole and closed before the merge: thousands of
#: one-scrape files (a raw scrape per target and interval) stay within the open-file limit, and a
#: larger file streams (one open file each)
READ_WHOLE_BYTES = 1 << 20
#: the exposition reader's window: a sample further behind the newest is dropped when read as a stream
FLUSH_LAG_S = 120.0
log = logging.getLogger("fleetmedic.backtest")



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
    exposition sample as a scrape target's labels; ``node_from_path`` names the node of exposition
    samples that name none after where their file was saved: ``file`` (its name without suffixes,
    ``gpu-node-7.prom``) or ``dir`` (its directory, ``gpu-node-7/node-0001.prom``); "" leaves
    them unread."""

    settings: Settings
    skipped: Counter[str] = field(default_factory=Counter)
    lines: int = 0
    files_read: dict[str, FileReport] = field(default_factory=dict)  # path -> what reading it found
    scrape_time: float | None = None
    extra_labels: dict[str, str] = field(default_factory=dict)
    node_from_path: str = ""
    timestamps: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> how samples were stamped
    not_read: Counter[str] = field(default_factory=Counter)  # exporter series present but not read
    bytes_read: int = 0  # of the input files, so far (progress)
    kernel: KernelLogOptions = field(default_factory=KernelLogOptions)
    kernel_not_published: Counter[str] = field(default_factory=Counter)  # kernel lines read, no device fault

    ignored: dict[str, list[str]] = field(default_factory=dict)  # reason -> files of a directory not read

    def _node_of_path(self, path: Path) -> str:
        if self.node_from_path == "file":
            name = path.name.removesuffix(".gz")
            while (suffix := Path(name).suffix) in TEXT_SUFFIXES and suffix:
                name = name[: -len(suffix)]
            return name
        if self.node_from_path == "dir":
            return path.resolve().parent.name
        return ""

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
        """The records of the files (and of ``more`` streams, each in time order), merged by time.
        The merge holds every stream open at once, so files of at most :data:`READ_WHOLE_BYTES` are
        read whole first and closed."""
        streams: list[Iterable[Telemetry]] = [
            list(self._read(f)) if _content_size(f) <= READ_WHOLE_BYTES else self._read(f)
            for f in self.files(paths)]
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
                                               openmetrics=openmetrics, default_node=self._node_of_path(path))
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


