"""Fault histories as ``fleetmedic whatif`` reads them: one :class:`HistoryFault` a fault.

Two formats, told apart by content when not named:

- ``stepfun``: the published StepFun trace (InfiniteHBD-Trace, ``fault_trace.json``): a JSON list of
  events ``{node_id, event_time (days since the first event), event_type (fault_start|fault_end),
  fault_type {Level, Class, Desc}}``. A ``fault_start`` is paired with the next ``fault_end`` of the
  same node and type; one without an end is not repaired within the history. The category is
  ``"<Class>: <Desc>"``.
- ``csv``: a header ``node,start,end,category[,detail]``; ``start``/``end`` ISO 8601 (a time without a
  zone is UTC) or epoch seconds; an empty ``end`` means not repaired within the history. Lines that
  start with ``#`` are comments.

A row that cannot be read is named with its line (a JSON event: its index) and the reason
(:class:`BadRow`); the caller decides how many it accepts (``--max-bad``). Nothing here raises
anything but :class:`HistoryError` for a file that cannot be read at all.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal

Format = Literal["stepfun", "csv"]
FORMATS: Final = ("stepfun", "csv")
#: the StepFun trace's days start here (its README: "348 days of fault data starting from March 30, 2024")
STEPFUN_EPOCH: Final = datetime(2024, 3, 30, tzinfo=UTC).timestamp()
MAX_NAME: Final = 253
MAX_CATEGORY: Final = 256


class HistoryError(ValueError):
    """The history cannot be used: unreadable, an unknown format, or more bad rows than allowed."""


@dataclass(frozen=True)
class HistoryFault:
    """A fault of the history: ``node`` broke at ``start`` and was repaired at ``end`` (epoch
    seconds; None: not within the history). ``line``: where it was read (1-based)."""

    node: str
    start: float
    end: float | None
    category: str
    detail: str = ""
    line: int = 0

    @property
    def repair_s(self) -> float | None:
        return None if self.end is None else self.end - self.start


@dataclass(frozen=True)
class BadRow:
    line: int
    reason: str


@dataclass
class History:
    """The faults in time order, the nodes they name, the span they cover and the rows refused."""

    faults: list[HistoryFault]
    format: Format
    start: float
    end: float
    nodes: list[str] = field(default_factory=list)
    bad: list[BadRow] = field(default_factory=list)
    source: str = ""

    @property
    def days(self) -> float:
        return (self.end - self.start) / 86400.0


def detect_format(text: str) -> Format:
    """``stepfun`` for a JSON list (or a document starting with ``[``), else ``csv``."""
    head = text.lstrip()[:1]
    return "stepfun" if head in ("[", "{") else "csv"


def parse_history(text: str, fmt: Format | None = None, source: str = "", max_bad: int = 0) -> History:
    """Read a history; :class:`HistoryError` when unreadable or with more than ``max_bad`` bad rows
    (its message names the first few with their line and reason)."""
    fmt = fmt or detect_format(text)
    if fmt not in FORMATS:
        raise HistoryError(f"unknown history format {fmt!r}: one of {', '.join(FORMATS)}")
    faults, bad = (_stepfun(text) if fmt == "stepfun" else _csv(text))
    if len(bad) > max_bad:
        shown = "; ".join(f"line {b.line}: {b.reason}" for b in bad[:5])
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        raise HistoryError(f"{source or 'history'}: {len(bad)} bad row(s), more than --max-bad {max_bad}: "
                           f"{shown}{more}")
    if not faults:
        raise HistoryError(f"{source or 'history'}: no faults in it")
    faults.sort(key=lambda f: (f.start, f.node, f.line))
    start = min(f.start for f in faults)
    end = max(max(f.start, f.end or f.start) for f in faults)
    if fmt == "stepfun":
        start = STEPFUN_EPOCH  # day 0 of the trace
    nodes = list(dict.fromkeys(f.node for f in faults))
    return History(faults, fmt, start, end, nodes, bad, source)


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} is missing or empty")
    value = value.strip()
    if len(value) > (MAX_NAME if what == "node" else MAX_CATEGORY):
        raise ValueError(f"{what} is longer than {MAX_NAME if what == 'node' else MAX_CATEGORY} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"{what} holds a control character")
    return str(value)


# --- the StepFun trace -----------------------------------------------------------------------------

def _stepfun(text: str) -> tuple[list[HistoryFault], list[BadRow]]:
    try:
        events = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise HistoryError(f"not JSON: {exc}") from None
    if not isinstance(events, list):
        raise HistoryError("a StepFun trace is a JSON list of events")
    bad: list[BadRow] = []
    open_: dict[tuple[str, str, str], list[tuple[float, int]]] = {}
    faults: list[HistoryFault] = []
    for i, ev in enumerate(events, start=1):
        try:
            node, t, kind, level, category = _stepfun_event(ev)
        except ValueError as exc:
            bad.append(BadRow(i, str(exc)))
            continue
        key = (node, level, category)
        if kind == "fault_start":
            open_.setdefault(key, []).append((t, i))
            continue
        starts = open_.get(key)
        if not starts:
            bad.append(BadRow(i, f"fault_end of {category!r} on {node} without a fault_start"))
            continue
        t0, line = starts.pop(0)
        if t < t0:
            bad.append(BadRow(i, f"fault_end at day {(t - STEPFUN_EPOCH) / 86400:.4f} before its start"))
            continue
        faults.append(HistoryFault(node, t0, t, category, "", line))
    for (node, _, category), starts in open_.items():
        faults += [HistoryFault(node, t0, None, category, "", line) for t0, line in starts]
    return faults, bad


def _stepfun_event(ev: Any) -> tuple[str, float, str, str, str]:
    if not isinstance(ev, dict):
        raise ValueError("an event is not a JSON object")
    node = _name(ev.get("node_id"), "node_id")
    day = ev.get("event_time")
    if isinstance(day, bool) or not isinstance(day, (int, float)) or not math.isfinite(day):
        raise ValueError("event_time is not a finite number of days")
    if not 0 <= day <= 36_500:
        raise ValueError(f"event_time {day} is outside 0-36500 days")
    kind = ev.get("event_type")
    if kind not in ("fault_start", "fault_end"):
        raise ValueError(f"event_type {kind!r} is neither fault_start nor fault_end")
    ft = ev.get("fault_type")
    if not isinstance(ft, dict):
        raise ValueError("fault_type is not an object with Level, Class and Desc")
    level = _name(ft.get("Level"), "fault_type.Level")
    category = f"{_name(ft.get('Class'), 'fault_type.Class')}: {_name(ft.get('Desc'), 'fault_type.Desc')}"
    return node, STEPFUN_EPOCH + float(day) * 86400.0, kind, level, category


# --- CSV -------------------------------------------------------------------------------------------

CSV_COLUMNS: Final = ("node", "start", "end", "category")


def parse_time(value: str, what: str) -> float:
    """ISO 8601 (no zone: UTC) or epoch seconds -> epoch seconds; ValueError naming ``what``."""
    value = value.strip()
    try:
        t = float(value)
    except ValueError:
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ValueError(f"{what} {value[:40]!r} is neither ISO 8601 nor epoch seconds") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        t = dt.timestamp()
    if not math.isfinite(t) or not 0 < t < 4_102_444_800:  # 1970 .. 2100
        raise ValueError(f"{what} {value[:40]!r} is not a time between 1970 and 2100")
    return t


def _csv(text: str) -> tuple[list[HistoryFault], list[BadRow]]:
    lines = [(n, ln) for n, ln in enumerate(text.splitlines(), start=1)
             if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise HistoryError("empty CSV history")
    header_line, header = lines[0]
    cols = [c.strip().lower() for c in next(csv.reader([header]))]
    if tuple(cols[:4]) != CSV_COLUMNS:
        raise HistoryError(f"line {header_line}: the header must start with {','.join(CSV_COLUMNS)}, "
                           f"not {header[:80]!r}")
    faults: list[HistoryFault] = []
    bad: list[BadRow] = []
    for n, ln in lines[1:]:
        try:
            try:
                row = next(csv.reader([ln]))
            except (csv.Error, StopIteration) as exc:
                raise ValueError(f"not a CSV row: {exc}") from None
            if len(row) < 4:
                raise ValueError(f"{len(row)} columns, at least 4 expected ({','.join(CSV_COLUMNS)})")
            node = _name(row[0], "node")
            start = parse_time(row[1], "start")
            end = parse_time(row[2], "end") if row[2].strip() else None
            if end is not None and end < start:
                raise ValueError("end is before start")
            category = _name(row[3], "category")
            detail = row[4].strip()[:MAX_CATEGORY] if len(row) > 4 else ""
        except ValueError as exc:
            bad.append(BadRow(n, str(exc)))
            continue
        faults.append(HistoryFault(node, start, end, category, detail, n))
    return faults, bad


def write_csv(faults: Iterable[HistoryFault]) -> str:
    """The ``csv`` format of ``faults`` (times as ISO 8601 UTC)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["node", "start", "end", "category", "detail"])
    for f in faults:
        w.writerow([f.node, _iso(f.start), "" if f.end is None else _iso(f.end), f.category, f.detail])
    return out.getvalue()


def _iso(t: float) -> str:
    return datetime.fromtimestamp(round(t), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
