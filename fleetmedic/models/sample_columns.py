"""Per-message reductions over a node's GPUs, for a whole micro-batch at once.

Stage 1 reduces every telemetry message to a few numbers besides the GPU detector's work: the
multivariate model's window inputs (spreads between GPUs, the throttled share, the busy test, the
error counters' totals) and the per-node medians the peer comparisons use. Done one message at a
time in plain Python that cost as much as the GPU detector itself; here one ``[messages, metrics,
GPUs]`` array per GPU count serves the whole batch.

The results equal the one-message definitions exactly (a missing value is NaN and left out, an
empty reduction is NaN, counters sum as integers in floats): :func:`columns` maps ``None`` to NaN,
as dropping it from the list did. Pure: numpy only.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from operator import itemgetter
from typing import Any

import msgspec
import numpy as np
from numpy.typing import NDArray

from fleetmedic.models.gpu_signals import nanmedian_last_axis
from fleetmedic.records import GPU_METRICS, GpuTelemetry

F64 = NDArray[np.float64]
_astuple = msgspec.structs.astuple
_chain = chain.from_iterable


@lru_cache(maxsize=32)
def _getter(names: tuple[str, ...]) -> Any:
    """Picks ``names``' columns, in that order, out of ``astuple(msg.metrics)`` (always a tuple)."""
    pick = itemgetter(*(GPU_METRICS.index(n) for n in names))
    return pick if len(names) > 1 else (lambda row: (pick(row),))


def columns(msgs: Sequence[GpuTelemetry], names: Sequence[str]) -> F64:
    """``[messages, names, gpus]`` for messages with the same GPU count (NaN: not reported).

    ``np.fromiter`` over the chained columns is ~2x faster than ``np.array``; a ``null`` inside a
    column (one GPU not reporting) falls back to ``np.array``, which maps it to NaN."""
    get = _getter(tuple(names))
    g = len(msgs[0].gpus)
    nan_row = [float("nan")] * g
    rows = []
    for m in msgs:
        cols = get(_astuple(m.metrics))
        if None in cols:  # a metric no GPU reported
            cols = tuple(nan_row if c is None else c for c in cols)
        rows.append(cols)
    try:
        flat = np.fromiter(_chain(_chain(rows)), dtype=np.float64, count=len(rows) * len(names) * g)
    except TypeError:
        return np.array(rows, dtype=np.float64)
    return flat.reshape(len(rows), len(names), g)


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

    @classmethod
    def of(cls, msgs: Sequence[GpuTelemetry], names: Sequence[str]) -> MetricBatch:
        groups = by_gpu_count(msgs)
        arrays = [columns([msgs[i] for i in idx], names) if msgs[idx[0]].gpus else None for idx in groups]
        return cls(tuple(names), groups, arrays)

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


def by_gpu_count(msgs: Sequence[GpuTelemetry]) -> list[list[int]]:
    """Indices of ``msgs`` grouped by their GPU count (one array shape per group)."""
    groups: dict[int, list[int]] = {}
    for i, m in enumerate(msgs):
        groups.setdefault(len(m.gpus), []).append(i)
    return list(groups.values())


def spread(x: F64) -> F64:
    """Max minus min over the last axis, of the reported values (NaN when none)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices are expected: NaN
        out: F64 = np.nanmax(x, axis=-1) - np.nanmin(x, axis=-1)
    return out


def nanmedian(x: F64) -> F64:
    """Median over the last axis, of the reported values (NaN when none)."""
    out: F64 = nanmedian_last_axis(x)[..., 0]
    return out


def share_with_bits(x: F64, mask: int) -> F64:
    """Share of the reported values (integers in floats) with any bit of ``mask`` set (NaN: none)."""
    finite = np.isfinite(x)
    hits = ((np.where(finite, x, 0).astype(np.int64) & mask) != 0) & finite
    n = finite.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out: F64 = np.where(n > 0, hits.sum(axis=-1) / np.maximum(n, 1), np.nan)
    return out
