"""History from a Prometheus server (``fleetmedic backtest --prometheus URL --start T --end T``).

``[start, end]`` is cut into range queries (``/api/v1/query_range``) of at most
``exporters.prometheus.range_max_points`` points per series (the server refuses more than 11,000)
and at most an hour each, so an answer stays small; each is retried up to 4 times on a connection error, a
timeout, 429 or 5xx (1, 2, 4, 8 s apart), and a 4xx is an error that names the server's reason. The
points of one query come series by series and are mapped, series by series, by the same reader
as exposition files (:meth:`ExpositionReader.read_columns
<fleetmedic.connectors.prometheus.text.ExpositionReader.read_columns>`), so one step of one node is
one record. A callback reports progress (queries done, of how many).

An answer is decoded straight into typed structs (msgspec): no dict per point, no sample tuple, no
sort. One the typed decode does not take as it is (another result type, a value such as ``+Inf``,
an over-long label or value, an entry without ``__name__``...) is read by the general reader
(:func:`~fleetmedic.connectors.prometheus.api.api_samples`), which skips and counts what is bad;
both give the same records and the same counts.
"""

from __future__ import annotations

import json
import logging
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from fleetmedic.config import Settings
from fleetmedic.connectors.prometheus.api import ApiAnswerError, api_samples, plan_chunks
from fleetmedic.connectors.prometheus.ingest import MAX_ANSWER_BYTES, target_label
from fleetmedic.connectors.prometheus.text import (
    MAX_LABEL_VALUE_CHARS,
    MAX_VALUE_CHARS,
    TS_MAX,
    TS_MIN,
    Column,
    ExpositionReader,
    count,
    is_known_series,
)
from fleetmedic.records import GpuTelemetry, PortTelemetry, json_limit_error

log = logging.getLogger("fleetmedic.connectors.prometheus")
RETRIES = 4
#: called after each query: (queries done, queries in all, seconds of the range done)
ProgressFn = Callable[[int, int, float], None]


class _Progress(Protocol):
    def chunk(self, done: int, total: int, seconds_done: float) -> None: ...


class _Entry(msgspec.Struct):
    metric: dict[str, str]
    values: list[tuple[float, str]]


class _Data(msgspec.Struct):
    resultType: str
    result: list[_Entry]


class _Matrix(msgspec.Struct):
    """A ``query_range`` answer as Prometheus writes it (other fields ignored)."""

    status: str
    data: _Data


_MATRIX = msgspec.json.Decoder(_Matrix)


def matrix_columns(body: bytes, skipped: Counter[str]) -> list[Column]:
    """The series of a ``/api/v1/query_range`` answer, each with its usable points; bad points
    counted in ``skipped`` as :func:`~fleetmedic.connectors.prometheus.api.api_samples` counts
    them. Raises :class:`ApiAnswerError` for an answer that is not a query result, and
    ``ValueError`` for one that is not JSON."""
    refused = json_limit_error(body, len(body))  # its size is bounded where it is read
    if refused is not None:
        raise ValueError(f"the answer is refused: {refused}")
    columns = _typed_columns(body, skipped)
    if columns is not None:
        return columns
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"the answer is not JSON: {str(exc)[:200]}") from None
    columns = []
    last: dict[str, str] | None = None
    for name, labels, value, ts in api_samples(doc, skipped):  # series by series, one labels dict each
        assert ts is not None
        if labels is not last:
            columns.append((name, labels, []))
            last = labels
        columns[-1][2].append((ts, value))
    return columns


def _typed_columns(body: bytes, skipped: Counter[str]) -> list[Column] | None:
    """The fast path of :func:`matrix_columns`; None when the answer needs the general reader
    (nothing counted then)."""
    try:
        answer = _MATRIX.decode(body)
    except msgspec.DecodeError:  # not this shape (or not JSON: the general reader says so)
        return None
    if answer.status != "success" or answer.data.resultType != "matrix":
        return None
    reasons: Counter[str] = Counter()
    columns: list[Column] = []
    isfinite = math.isfinite
    for entry in answer.data.result:
        labels = entry.metric
        name = labels.pop("__name__", None)
        if name is None or any(len(v) > MAX_LABEL_VALUE_CHARS for v in labels.values()):
            return None
        points: list[tuple[float, float]] = []
        append = points.append
        for ts, text in entry.values:
            if len(text) > MAX_VALUE_CHARS:
                return None
            try:
                value = float(text)
            except ValueError:
                return None
            if isfinite(value) and TS_MIN <= ts <= TS_MAX:
                append((ts, value))
                continue
            series = name if is_known_series(name) else "other series"
            if not isfinite(value):
                reasons[f"{series}: value is {'NaN' if math.isnan(value) else 'infinite'}"] += 1
            else:
                reasons[f"{series}: timestamp out of range"] += 1
        columns.append((name, labels, points))
    for reason, n in reasons.items():
        count(skipped, reason, n)
    return columns


class HistoryError(Exception):
    """The server cannot give this history (refused query, unreachable after the retries)."""


@dataclass
class History:
    """Range queries over ``[start, end]`` at ``step`` for ``selector``; :meth:`records` yields
    records in time order. ``reader.skipped`` counts what could not be used; :attr:`queries`,
    :attr:`points` and :attr:`retries` say what was asked."""

    settings: Settings
    url: str
    start: float
    end: float
    step: float
    selector: str = ""
    progress: ProgressFn | None = None
    sleep: Callable[[float], None] = time.sleep
    reader: ExpositionReader = field(init=False)
    queries: int = 0
    points: int = 0
    retries: int = 0

    def __post_init__(self) -> None:
        p = self.settings.exporters.prometheus
        self.selector = self.selector or p.api_selector
        self.reader = ExpositionReader.for_settings(self.settings, source="prometheus-history", ignore_unknown=True)
        self.chunks = plan_chunks(self.start, self.end, self.step, p.range_max_points)
        self.skipped = self.reader.skipped
        self.ignored = self.reader.ignored

    def records(self) -> Iterator[GpuTelemetry | PortTelemetry]:
        """The records of every query in time order (queries cover consecutive, disjoint ranges)."""
        for i, (a, b) in enumerate(self.chunks, 1):
            columns = self._query(a, b)
            self.points += sum(len(points) for _, _, points in columns)
            yield from self.reader.read_columns(columns)
            if self.progress is not None:
                self.progress(i, len(self.chunks), b - self.start)

    def again(self) -> History:
        return History(self.settings, self.url, self.start, self.end, self.step, self.selector, sleep=self.sleep)

    def bind_progress(self, progress: _Progress | None) -> None:
        self.progress = progress.chunk if progress is not None else None

    def summary(self) -> dict[str, Any]:
        return {"url": target_label(self.url), "start": self.start, "end": self.end, "step_s": self.step,
                "selector": self.selector, "queries": self.queries, "points": self.points, "retries": self.retries,
                "skipped": dict(self.reader.skipped.most_common(20))}

    def _query(self, a: float, b: float) -> list[Column]:
        p = self.settings.exporters.prometheus
        params = urllib.parse.urlencode({"query": self.selector, "start": f"{a:.3f}", "end": f"{b:.3f}",
                                         "step": f"{self.step:g}"})
        url = self.url.rstrip("/") + "/api/v1/query_range?" + params
        headers = {"Accept": "application/json"}
        if p.bearer_token_file:
            with open(p.bearer_token_file, encoding="utf-8") as fh:
                headers["Authorization"] = f"Bearer {fh.read().strip()}"
        self.queries += 1
        delay = 1.0
        for attempt in range(RETRIES + 1):
            try:
                with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=p.timeout_s) as resp:
                    body = resp.read(MAX_ANSWER_BYTES + 1)
                if len(body) > MAX_ANSWER_BYTES:
                    raise HistoryError(f"{target_label(self.url)}: an answer over {MAX_ANSWER_BYTES} bytes; "
                                       "use a smaller --step range or a narrower --match")
                try:
                    return matrix_columns(body, self.reader.skipped)
                except ApiAnswerError as exc:
                    raise HistoryError(f"{target_label(self.url)}: {exc}") from None
            except urllib.error.HTTPError as exc:
                if exc.code != 429 and exc.code < 500:  # the query is wrong: retrying will not help
                    raise HistoryError(f"{target_label(self.url)}: HTTP {exc.code}: {_error_of(exc)}") from None
                why = f"HTTP {exc.code}"
            except (urllib.error.URLError, TimeoutError, ConnectionError, ValueError) as exc:  # ValueError: not JSON
                why = f"{type(exc).__name__}: {str(exc)[:200]}"
            if attempt == RETRIES:
                raise HistoryError(f"{target_label(self.url)}: {why} (after {RETRIES} retries)")
            self.retries += 1
            log.warning("prometheus history: %s; retrying in %.0f s", why, delay)
            self.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")


def _error_of(exc: urllib.error.HTTPError) -> str:
    try:
        doc = json.loads(exc.read(65536))
        return f"{doc.get('errorType', '')}: {doc.get('error', '')}"[:500]
    except Exception:  # not the API's JSON error: the status line says enough
        return str(exc.reason)[:200]
