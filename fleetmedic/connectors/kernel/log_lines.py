"""When and where a line of a recorded kernel log was written: the time stamps and host names that
``dmesg``, ``journalctl`` and syslog daemons put in front of a kernel message.

A live exporter reads ``/dev/kmsg`` or the journal, whose records carry their time. A recorded log
(what ``fleetmedic backtest`` reads: a ``kern.log`` kept by rsyslog, a ``dmesg -T`` saved in a
ticket, a ``journalctl -k`` export) carries it in text, in one of these forms (the examples are
lines of the field corpus, ``tests/data/kmsg``):

- ``dmesg -T`` / ``--ctime``: ``[Fri Aug 30 11:11:22 2024] NVRM: Xid ...``;
- ``dmesg --time-format=iso`` (also behind ``dmesg -x``'s ``kern  :err   : `` decoration), and
  ``journalctl -o short-iso`` / rsyslog's RFC 3339 format with a host:
  ``2024-08-30T11:11:22,123456+00:00 NVRM: ...``, ``2024-08-30T11:11:22+0000 worker4 kernel: ...``;
- BSD syslog (``/var/log/kern.log``, ``journalctl``'s default ``short``):
  ``Dec  2 10:43:35 worker4 kernel: [240314.528856] NVRM: ...`` — no year: the caller gives it;
- the kernel's own uptime stamp ``[240314.528856]``: seconds since boot, so a time only with the
  boot time (``--boot-time``).

:func:`stamp` returns the time (Unix seconds; a stamp without a zone is read as UTC), the host the
line names ("" when none) and the message without the stamps; ``None`` for the time when the
line carries none that can be placed. Pure: no clock, no I/O.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Final

_MONTHS: Final = {m: i for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct",
                                                "nov", "dec"), 1)}
#: ``dmesg -x``'s facility and level columns, before any stamp
_DECORATION = re.compile(r"^[a-z]+ *:[a-z]+ *: ")
_CTIME = re.compile(r"^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?P<mon>[A-Z][a-z]{2}) +(?P<day>\d{1,2}) "
                    r"(?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2}) (?P<year>\d{4})\] ?")
_ISO = re.compile(r"^(?P<date>\d{4}-\d{2}-\d{2})[T ](?P<time>\d{2}:\d{2}:\d{2})(?:[.,](?P<frac>\d{1,9}))?"
                  r"(?P<zone>Z|[+-]\d{2}:?\d{2})?(?= )")
_BSD = re.compile(r"^(?P<mon>[A-Z][a-z]{2}) +(?P<day>\d{1,2}) (?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2})(?= )")
#: ``host kernel: `` after a syslog or journal stamp (also ``host kernel[0]:``)
_HOST_KERNEL = re.compile(r"^ (?P<host>[A-Za-z0-9][A-Za-z0-9._-]{0,252}) kernel(?:\[\d+\])?: ?")
_KERNEL_ONLY = re.compile(r"^ +kernel(?:\[\d+\])?: ?")
_UPTIME = re.compile(r"^\[ *(?P<up>\d{1,10}\.\d{1,9})\] ?")


@dataclass(frozen=True)
class Stamped:
    ts: float | None  # Unix seconds; None: no time that can be placed
    host: str  # the host the line names ("" when none)
    message: str  # the kernel's message, stamps removed


def stamp(line: str, year: int | None = None, boot_time: float | None = None) -> Stamped:
    """The time, host and message of one recorded kernel log line. ``year``: the year of BSD
    syslog stamps (which have none; ``None``: such a line has no time); ``boot_time``: Unix seconds
    of the boot, for the kernel's uptime stamps."""
    text = _DECORATION.sub("", line.rstrip("\r\n"), count=1)
    ts: float | None = None
    host = ""
    if m := _CTIME.match(text):
        ts = _utc(int(m["year"]), m["mon"], int(m["day"]), int(m["h"]), int(m["m"]), int(m["s"]))
        text = text[m.end():]
        if h := _HOST_KERNEL.match(f" {text}"):  # a syslog line saved with dmesg's stamp in front
            text, host = text[h.end() - 1:], h["host"]
    elif m := _ISO.match(text):
        ts = _iso(m["date"], m["time"], m["frac"], m["zone"])
        text, host = _after_stamp(text[m.end():])
    elif m := _BSD.match(text):
        ts = _utc(year, m["mon"], int(m["day"]), int(m["h"]), int(m["m"]), int(m["s"])) if year else None
        text, host = _after_stamp(text[m.end():])
    if m := _UPTIME.match(text):
        if ts is None and boot_time is not None:
            ts = boot_time + float(m["up"])
        text = text[m.end():]
    return Stamped(ts, host, text)


def _after_stamp(rest: str) -> tuple[str, str]:
    """The message and host after a syslog/journal stamp: `` host kernel: msg``, `` kernel: msg``
    or `` msg`` (``dmesg --time-format=iso``)."""
    if m := _HOST_KERNEL.match(rest):
        return rest[m.end():], m["host"]
    if m := _KERNEL_ONLY.match(rest):
        return rest[m.end():], ""
    return rest[1:], ""


def _utc(year: int | None, mon: str, day: int, h: int, mi: int, s: int) -> float | None:
    month = _MONTHS.get(mon.lower())
    if year is None or month is None or not 1 <= day <= 31 or h > 23 or mi > 59 or s > 60:
        return None
    try:
        return float(calendar.timegm(datetime(year, month, day, h, mi, min(s, 59)).timetuple()))
    except ValueError:  # 31 February
        return None


def _iso(date: str, time: str, frac: str | None, zone: str | None) -> float | None:
    z = "+00:00" if zone is None or zone == "Z" else (zone if ":" in zone else f"{zone[:3]}:{zone[3:]}")
    try:
        dt = datetime.fromisoformat(f"{date}T{time}{z}")
    except ValueError:
        return None
    return dt.timestamp() + (int(frac) / 10 ** len(frac) if frac else 0.0)
