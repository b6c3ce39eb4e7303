"""Pure part of the log connector: a log shipper's JSON line -> :class:`LogLine`, and
:class:`FailureLogGate`, which turns classified lines into rate-limited failure JobEvents (see
:mod:`fleetmedic.connectors.logs.events` for the behaviour).

:func:`parse_log_message` raises :class:`BadLogLine` and nothing else, whatever the bytes; sizes
are checked before any regex or conversion, and a line's text is cut to :data:`MAX_LOG_TEXT_CHARS`
before it is classified.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec

from fleetmedic import records as r
from fleetmedic.config import LogExporterSettings
from fleetmedic.remediation.log_patterns import LineMatch, PatternLibrary

_JOB_PART = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
#: the largest message read (Fluent Bit's chunks are 32 KB; container runtimes split lines at 16 KB)
MAX_MESSAGE_BYTES = 1 << 20
#: a line's text is cut to this many characters before the pattern library sees it
MAX_LOG_TEXT_CHARS = 16_384
_MAX_NAMESPACE, _MAX_NAME, _MAX_NODE, _MAX_ATTEMPT_DIGITS, _MAX_TIME_TEXT = 63, 253, 253, 7, 64
_TS_MIN, _TS_MAX = 0.0, 4e9  # the records' Timestamp range


class BadLogLine(ValueError):
    """A message that is not a usable log line; the text names the field and the reason."""


@dataclass(frozen=True)
class LogLine:
    job: str  # namespace/name
    attempt: int
    node: str
    pod: str
    ts: float
    text: str


def parse_log_message(message: bytes, cfg: LogExporterSettings, now: float) -> LogLine:
    """The log line of one message; :class:`BadLogLine` (only) when it is not one."""
    if len(message) > MAX_MESSAGE_BYTES:
        raise BadLogLine(f"message longer than {MAX_MESSAGE_BYTES} bytes")
    refused = r.json_limit_error(message, MAX_MESSAGE_BYTES)
    if refused is not None:
        raise BadLogLine(f"refused: {refused}")
    try:
        return _parse(message, cfg, now)
    except BadLogLine:
        raise
    except Exception as exc:  # a parsing bug must cost this message, not the consumer
        raise BadLogLine(f"unreadable ({type(exc).__name__})") from None


def _parse(message: bytes, cfg: LogExporterSettings, now: float) -> LogLine:
    try:
        doc = msgspec.json.decode(message)
    except msgspec.DecodeError:
        raise BadLogLine("not valid JSON") from None
    if not isinstance(doc, dict):
        raise BadLogLine("the message is not a JSON object")
    text = doc.get("log", doc.get("message"))
    if not isinstance(text, str):
        raise BadLogLine("log: missing or not a string")
    k8s = doc.get("kubernetes")
    if not isinstance(k8s, dict):
        raise BadLogLine("kubernetes: missing or not an object")
    namespace = k8s.get("namespace_name")
    if not isinstance(namespace, str) or len(namespace) > _MAX_NAMESPACE or not _JOB_PART.match(namespace):
        raise BadLogLine("kubernetes.namespace_name: missing or not a namespace name")
    labels = k8s.get("labels") or {}
    if not isinstance(labels, dict):
        raise BadLogLine("kubernetes.labels: not an object")
    name = next((str(labels[k]) for k in cfg.job_labels if labels.get(k)), "")
    if not name:
        raise BadLogLine("kubernetes.labels: no job label")
    if len(name) > _MAX_NAME or not _JOB_PART.match(name):
        raise BadLogLine("kubernetes.labels: the job label is not a Kubernetes name")
    attempt_text = str(labels.get(cfg.attempt_label, "0"))
    # ASCII digits only: str.isdigit() accepts "²", which int() refuses
    ok = attempt_text.isascii() and attempt_text.isdigit() and len(attempt_text) <= _MAX_ATTEMPT_DIGITS
    attempt = int(attempt_text) if ok else 0
    node, pod = str(k8s.get("host") or ""), str(k8s.get("pod_name") or "")
    if len(node) > _MAX_NODE:
        raise BadLogLine(f"kubernetes.host: longer than {_MAX_NODE} characters")
    if len(pod) > _MAX_NAME:
        raise BadLogLine(f"kubernetes.pod_name: longer than {_MAX_NAME} characters")
    return LogLine(job=f"{namespace}/{name}", attempt=min(attempt, 1_000_000), node=node, pod=pod,
                   ts=_time_of(doc, now), text=text[:MAX_LOG_TEXT_CHARS].rstrip("\r\n"))


def _time_of(doc: dict[str, Any], now: float) -> float:
    for key in ("@timestamp", "date", "timestamp"):
        value = doc.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 4e9:
            return float(value)
    value = doc.get("time", doc.get("@timestamp"))
    if isinstance(value, str) and len(value) <= _MAX_TIME_TEXT:
        try:
            t = datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except (ValueError, OverflowError, OSError):
            return now
        if _TS_MIN < t < _TS_MAX:
            return t
    return now


@dataclass
class _Pending:
    first_seen: float
    lines: list[tuple[float, int, LogLine, LineMatch]] = field(default_factory=list)  # (ts, seq, line, match)


@dataclass
class FailureLogGate:
    """Classified lines -> rate-limited failure events per job (see the module docstring)."""

    excerpt_lines: int
    settle_s: float
    per_job_interval_s: float
    dropped: Counter[str] = field(default_factory=Counter)
    _pending: dict[tuple[str, int], _Pending] = field(default_factory=dict)
    _last_emit: dict[str, float] = field(default_factory=dict)
    _seq: int = 0

    def add(self, line: LogLine, match: LineMatch, now: float) -> None:
        pending = self._pending.setdefault((line.job, line.attempt), _Pending(now))
        self._seq += 1
        pending.lines.append((line.ts, self._seq, line, match))
        if len(pending.lines) > self.excerpt_lines:
            weakest = min(pending.lines, key=lambda e: (e[3].distinctive, e[3].priority, -e[1]))
            pending.lines.remove(weakest)
            self.dropped["log line beyond excerpt_lines"] += 1

    def due(self, now: float) -> list[r.JobEvent]:
        out: list[r.JobEvent] = []
        for (job, attempt), pending in sorted(self._pending.items()):
            if now - pending.first_seen < self.settle_s:
                continue
            if now - self._last_emit.get(job, float("-inf")) < self.per_job_interval_s:
                continue
            del self._pending[(job, attempt)]
            self._last_emit[job] = now
            out += self._events(job, attempt, pending)
        return out

    def _events(self, job: str, attempt: int, pending: _Pending) -> list[r.JobEvent]:
        by_node: dict[str, list[tuple[float, int, LogLine, LineMatch]]] = defaultdict(list)
        for entry in pending.lines:
            by_node[entry[2].node].append(entry)
        events = []
        for node, entries in sorted(by_node.items()):
            entries.sort(key=lambda e: (e[0], e[1]))
            best = PatternLibrary.strongest(e[3] for e in entries)
            assert best is not None
            ranks = {e[3].rank for e in entries if e[3].rank is not None}
            events.append(r.JobEvent(
                job=job, event="failure", ts=entries[-1][0], attempt=attempt, node=node,
                rank=ranks.pop() if len(ranks) == 1 else None,
                reason=f"log: {best.pattern} ({best.incident_class}) in pod {entries[-1][2].pod}"[:4096],
                log_excerpt=[e[2].text[:4096] for e in entries]))
        return events
