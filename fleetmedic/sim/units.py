"""Durations as people write them (``90s``, ``15m``, ``6h``, ``1h30m``, ``2d``) and back."""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 604_800.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d|w)?")


def parse_duration(text: str) -> float:
    """Seconds in ``text``: a number (seconds) or number-unit parts (``1h30m``, ``1.5h``, ``500ms``)."""
    s = text.strip().lower().replace(" ", "")
    if not s:
        raise ValueError("empty duration")
    pos, total = 0, 0.0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            raise ValueError(f"bad duration {text!r} (examples: 90s, 15m, 6h, 1h30m, 2d)")
        unit = m.group(2)
        if unit is None and m.end() != len(s):
            raise ValueError(f"bad duration {text!r}: a bare number must be the last part")
        total += float(m.group(1)) * _UNITS[unit or "s"]
        pos = m.end()
    return total


def format_duration(seconds: float) -> str:
    """Short human form: ``6h``, ``1h30m``, ``45s``, ``2d3h``."""
    s = round(seconds)
    if s == 0:
        return "0s"
    out = []
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            out.append(f"{s // size}{unit}")
            s %= size
    return "".join(out)
