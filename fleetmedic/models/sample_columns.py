"""Per-message reductions over a node's GPUs, for a whole micro-batch at once.

Stage 1 reduces every telemetry message to a few numbers besides the GPU detector's work: the
multivariate model's window inputs (spreads between GPUs, the throttled share, the busy test, the
error counters' totals) and the per-node medians the peer comparisons use. Done one message at a
time in plain Python that cost as much as the GPU detector itself; here one ``[messages, metrics,
GPUs]`` array per GPU count serves the whole batch.

The results equal the one-message definitions exactly (a missing value is NaN and left out, an
empty reduction is NaN, counters sum as integers in floats): :func:`columns` maps ``None`` to NaN,
as dropping it from the list did. Pure: numpy, and one C loop that fills the columns
(``_columns.c``, optional: the Python path below gives the same bits).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from operator import attrgetter, itemgetter
from typing import Any, get_type_hints

import msgspec
import numpy as np
from numpy.typing import NDArray

from fleetmedic.models.gpu_signals import nanmedian_last_axis
from fleetmedic.records import GPU_METRICS, DetectionTelemetry, GpuMetrics

_native_columns_into: Callable[[list[tuple[Any, ...]], tuple[int, ...], int, Any], None] | None
try:  # the same conversion in C (_columns.c), built with the package where a C compiler is found
    from fleetmedic.models._columns import columns_into as _native_columns_into
except ImportError:  # pragma: no cover - the pure-Python path below does the same, slower
    _native_columns_into = None

#: whether stage 1 converts metric columns with the compiled loop (fleetmedic/models/_columns.c)
NATIVE_COLUMNS: bool = _native_columns_into is not None

F64 = NDArray[np.float64]
_astuple = msgspec.structs.astuple
_chain = chain.from_iterable
_GPUS, _METRICS = attrgetter("gpus"), attrgetter("metrics")


#: metrics whose values decode as Python ints (counters, bitmasks, link widths, XIDs): numpy converts a
#: run of ints to int64 about twice as fast as it converts each int to a float on the way
INT_METRICS: frozenset[str] = frozenset(
    name for name, hint in get_type_hints(GpuMetrics, include_extras=True).items() if "[int," in repr(hint))


@lru_cache(maxsize=32)
def _getter(names: tuple[str, ...]) -> Any:
    """Picks ``names``' columns, in that order, out of ``astuple(msg.metrics)`` (always a tuple; a
    detection metric has the same index in :class:`~fleetmedic.records.DetectionMetrics` and in
    :class:`~fleetmedic.records.GpuMetrics`)."""
    pick = itemgetter(*(GPU_METRICS.index(n) for n in names))
    return pick if len(names) > 1 else (lambda row: (pick(row),))


@lru_cache(maxsize=32)
def _kinds(names: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...], NDArray[np.intp]]:
    """``names`` split into float- and int-valued metrics, and where each of the two runs, put end
    to end, goes back in ``names``' order."""
    floats = tuple(n for n in names if n not in INT_METRICS)
    ints = tuple(n for n in names if n in INT_METRICS)
    order = np.array([(floats + ints).index(n) for n in names], dtype=np.intp)
    return floats, ints, order


@lru_cache(maxsize=32)
def _picks(names: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(GPU_METRICS.index(n) for n in names)


def columns(msgs: Sequence[DetectionTelemetry], names: Sequence[str]) -> F64:
    """``[messages, names, gpus]`` for messages with the same GPU count (NaN: not reported).

    With the compiled loop (:data:`NATIVE_COLUMNS`) one C call fills the array; what it refuses (a
    column of another length, a value that is not a number: decoded telemetry has neither) takes
    the Python path, whose result it equals bit for bit (tests/models/test_native_columns.py).

    The float-valued and the int-valued metrics are converted apart, each packed into an array of
    its own dtype (:func:`_packer`: several times faster than ``np.array`` on the nested lists, and
    ints become int64 without a float object each); the int64 values then become float64 as
    ``float(int)`` would (exact below 2**53, correctly rounded above, both ways). A ``null`` inside a
    column (one GPU not reporting), or a value not of its column's type, falls back to
    ``np.array``, which maps ``null`` to NaN."""
    key = tuple(names)
    tuples = list(map(_astuple, map(_METRICS, msgs)))  # every column of each message, once
    if _native_columns_into is not None:
        native = np.empty((len(msgs), len(key), len(msgs[0].gpus)))
        try:
            _native_columns_into(tuples, _picks(key), native.shape[2], native)
            return native
        except (TypeError, ValueError, OverflowError, IndexError):
            pass
    return _python_columns(tuples, key, len(msgs[0].gpus))


def _python_columns(tuples: list[tuple[Any, ...]], key: tuple[str, ...], g: int) -> F64:
    """:func:`columns` in Python, from ``astuple`` of each message's metrics."""
    floats, ints, order = _kinds(key)
    if not floats or not ints:
        return _columns_of(tuples, key, np.float64 if floats else np.int64, g).astype(np.float64, copy=False)
    nf = len(floats)
    out = np.empty((len(tuples), len(key), g))
    out[:, :nf] = _columns_of(tuples, floats, np.float64, g)
    out[:, nf:] = _columns_of(tuples, ints, np.int64, g)  # int64 -> float64 as it is assigned
    return out if np.array_equal(order, np.arange(len(order))) else out[:, order, :]


def _columns_of(tuples: list[tuple[Any, ...]], names: tuple[str, ...], dtype: type[np.generic],
                g: int) -> NDArray[Any]:
    """``names``' columns of messages (``astuple`` of their metrics) with ``g`` GPUs, as ``dtype``
    (float64 where the fallback had to map nulls to NaN)."""
    rows = list(map(_getter(names), tuples))
    out = np.empty((len(rows), len(names), g), dtype=dtype)
    pack = _packer("d" if dtype is np.float64 else "q", out.size)
    try:
        pack(out, 0, *_chain(_chain(rows)))
        return out
    except (struct.error, TypeError):
        pass
    # metrics no GPU reported (None where a list belongs: an exporter without them sends none, in
    # every message), packed as zeros and then NaN
    zeros, holes, fixed = [0] * g, [], []
    for i, cols in enumerate(rows):
        if None in cols:
            holes += [(i, j) for j, c in enumerate(cols) if c is None]
            cols = tuple(zeros if c is None else c for c in cols)
        fixed.append(cols)
    try:
        pack(out, 0, *_chain(_chain(fixed)))
    except (struct.error, TypeError):  # a null inside a column, a value not of its type or beyond int64
        nan_row = [float("nan")] * g
        return np.array([[nan_row if c is None else c for c in cols] for cols in rows], dtype=np.float64)
    result = out.astype(np.float64, copy=False)
    if holes:
        at = np.array(holes, dtype=np.intp)
        result[at[:, 0], at[:, 1], :] = np.nan
    return result


@lru_cache(maxsize=64)
def _packer(code: str, count: int) -> Any:
    """``pack_into`` of ``count`` values of the struct type ``code`` ("d": float64, "q": int64).
    Packing the chained values into the array's buffer takes ~40 % less time than ``np.fromiter``,
    and refuses what is not of its type (a float among ints) instead of truncating it."""
    packer = struct.Struct(f"={count}{code}")
    assert packer.size == 8 * count  # standard sizes: "d" and "q" are 8 bytes, as float64 and int64
    return packer.pack_into


@dataclass(frozen=True)
class MetricBatch:
    """A micro-batch's metric columns, converted once and shared by everything that reduces them.

    Converting the messages' lists into numpy is the largest cost of stage 1; the GPU detector, the
    multivariate model's windows and the peer summaries each read a subset of the same columns, so
    :meth:`of` converts the union once per GPU count and :meth:`take` hands each its rows (a view
    where they are contiguous). ``groups[k]`` are the message indices of ``arrays[k]``
    (``[messages, names, gpus]``; None for messages that list no GPUs)."""

    names: tuple[str, ...]
    groups: list[list[int]]
    arrays: list[F64 | None]
    _rows: dict[tuple[str, ...], slice | NDArray[np.intp]] = field(default_factory=dict, compare=False)
    _medians: dict[tuple[int, tuple[str, ...]], F64] = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, msgs: Sequence[DetectionTelemetry], names: Sequence[str]) -> MetricBatch:
        floats, ints, _ = _kinds(tuple(names))
        ordered = floats + ints  # as :func:`columns` converts them: no reordering copy
        groups = by_gpu_count(msgs)
        arrays = [columns([msgs[i] for i in idx], ordered) if msgs[idx[0]].gpus else None for idx in groups]
        return cls(ordered, groups, arrays)

    def take(self, group: int, names: Sequence[str]) -> F64:
        """``[messages of the group, names, gpus]`` (the group must list GPUs)."""
        x = self.arrays[group]
        if x is None:
            raise ValueError(f"group {group} of the batch lists no GPUs")
        key = tuple(names)
        rows = self._rows.get(key)
        if rows is None:
            at = [self.names.index(n) for n in key]
            contiguous = at == list(range(at[0], at[0] + len(at)))
            rows = self._rows[key] = slice(at[0], at[0] + len(at)) if contiguous else np.array(at, dtype=np.intp)
        return x[:, rows, :]

    def medians(self, group: int, names: Sequence[str]) -> F64:
        """:func:`nanmedian` of :meth:`take` (``[messages of the group, names]``), computed once per
        group: for a subset of names already asked for, those columns."""
        key = tuple(names)
        got = self._medians.get((group, key))
        if got is None:
            for (g, wider), medians in self._medians.items():
                if g == group and set(key) <= set(wider):
                    got = medians[:, [wider.index(n) for n in key]]
                    break
            else:
                got = nanmedian(self.take(group, key))
            self._medians[(group, key)] = got
        return got


def by_gpu_count(msgs: Sequence[DetectionTelemetry]) -> list[list[int]]:
    """Indices of ``msgs`` grouped by their GPU count (one array shape per group)."""
    counts = list(map(len, map(_GPUS, msgs)))
    if counts and counts.count(counts[0]) == len(counts):  # the usual batch: one GPU count
        return [list(range(len(counts)))]
    groups: dict[int, list[int]] = {}
    for i, m in enumerate(msgs):
        groups.setdefault(len(m.gpus), []).append(i)
    return list(groups.values())


def spread(x: F64) -> F64:
    """Max minus min over the last axis, of the reported values (NaN when none): ``fmax``/``fmin``
    skip NaN as ``nanmax``/``nanmin`` do, without their copies and warnings."""
    out: F64 = np.fmax.reduce(x, axis=-1) - np.fmin.reduce(x, axis=-1)
    return out


def nansum(x: F64) -> F64:
    """Sum over the last axis of the reported values (0 when none), as ``np.nansum``; the plain sum
    (the same additions) where nothing is missing, which is nearly always."""
    out: F64 = x.sum(axis=-1)
    return np.nansum(x, axis=-1) if np.isnan(out).any() else out


def nanmedian(x: F64) -> F64:
    """Median over the last axis, of the reported values (NaN when none)."""
    out: F64 = nanmedian_last_axis(x)[..., 0]
    return out


def bit_fields(x: F64) -> NDArray[np.int64]:
    """Bit masks carried in floats (``clocks_event_reasons``) as integers. What is not finite, or
    below 0, or at or past 2^63 (a record's largest mask, 2^63 - 1, is 2^63 as a float) is 0: no
    bit rather than an undefined cast. A float that large has no bit below 2^11 set, so every mask
    the detectors test reads as Python's ``int(v) & mask`` does."""
    ok = np.isfinite(x) & (x >= 0) & (x < 2.0**63)
    return np.where(ok, x, 0).astype(np.int64)


def share_with_bits(x: F64, mask: int) -> F64:
    """Share of the reported values (integers in floats) with any bit of ``mask`` set (NaN: none)."""
    finite = np.isfinite(x)
    hits = ((bit_fields(x) & mask) != 0) & finite
    n = finite.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out: F64 = np.where(n > 0, hits.sum(axis=-1) / np.maximum(n, 1), np.nan)
    return out
