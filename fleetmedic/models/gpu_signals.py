"""The vectorised arithmetic of GPU detection, over a micro-batch of nodes at once.

Arrays are ``[B, ..., G]``: B nodes of the batch, G GPUs per node (the batch groups nodes with the
same GPU count). Nothing here knows about nodes, messages or findings; :mod:`gpu_detector` does.
The signals and the baseline step also exist as C passes (``_baselines.c``: :func:`signals_at`,
:func:`step_baselines_at`), whose results equal those of :func:`compute_signals` and
:func:`step_baselines`; the numpy functions stay the reference and the fallback.

Signals (one baseline each per GPU):

- *residual gauges* (``gpu_temp``, ``memory_temp``, ``power_usage``, ``sm_clock``, ``mem_clock``):
  the GPU's value minus the median of its node's GPUs. The GPUs of a node run the same lock-step
  workload, so the residual removes workload swings (idle, checkpoint, data stalls) and leaves each
  GPU's own offset, which the baseline learns; a change of that offset is degradation. (A whole
  node drifting together is the job of :mod:`peers`: node against the nodes of its job.)
- *rates* of cumulative counters per minute, with reset detection (a counter that goes down, a new
  ``boot_id`` or a gap longer than ``max_sample_gap_s`` gives no rate for that sample):
  ``ecc_sbe_rate``, ``pcie_replay_rate``, ``nvlink_error_rate`` (the sum of the four NVLink error
  counters, of those present: dcgm-exporter often enables only the CRC flit one),
  ``power_violation_rate`` and ``thermal_violation_rate`` (µs of violation per minute).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Final

import numpy as np
from numpy.typing import NDArray

from fleetmedic.records import COUNTER_METRICS, GPU_METRICS, DetectionTelemetry

F64 = NDArray[np.float64]
BOOL = NDArray[np.bool_]

_native_step: Callable[..., None] | None
_native_signals: Callable[..., None] | None
try:  # the signals and step_baselines in C (_baselines.c), built where a C compiler is found
    from fleetmedic.models._baselines import signals_at as _native_signals
    from fleetmedic.models._baselines import step_baselines_at as _native_step
except ImportError:  # pragma: no cover - the numpy paths below do the same, slower
    _native_step = _native_signals = None

#: whether the GPU detector computes its signals and steps its baselines with the compiled loops
#: (fleetmedic/models/_baselines.c)
NATIVE_BASELINES: bool = _native_step is not None


RESIDUAL_SIGNALS: Final[dict[str, str]] = {
    "gpu_temp": "gpu_temp",
    "memory_temp": "memory_temp",
    "power_usage": "power_usage",
    "sm_clock": "sm_clock",
    "mem_clock": "mem_clock",
}
RATE_SIGNALS: Final[dict[str, tuple[str, ...]]] = {
    "ecc_sbe_rate": ("ecc_sbe_vol_total",),
    "pcie_replay_rate": ("pcie_replay_counter",),
    "nvlink_error_rate": (
        "nvlink_crc_flit_error_count_total",
        "nvlink_crc_data_error_count_total",
        "nvlink_replay_error_count_total",
        "nvlink_recovery_error_count_total",
    ),
    "power_violation_rate": ("power_violation",),
    "thermal_violation_rate": ("thermal_violation",),
}
KNOWN_SIGNALS: Final[tuple[str, ...]] = (*RESIDUAL_SIGNALS, *RATE_SIGNALS)

#: metrics whose previous value is kept per GPU (counters, state flags, the XID gauge)
WATCHED: Final[tuple[str, ...]] = (
    *(m for m in GPU_METRICS if m in COUNTER_METRICS),
    "uncorrectable_remapped_rows",
    "row_remap_failure",
    "row_remap_pending",
    "nvlink_links_down",
    "pcie_link_width",
    "xid_errors",
)
W: Final = {name: i for i, name in enumerate(WATCHED)}

#: the metrics detection reads (a subset of GPU_METRICS: converting unused columns costs time)
USED_METRICS: Final[tuple[str, ...]] = tuple(
    m
    for m in GPU_METRICS
    if m in RESIDUAL_SIGNALS.values()
    or m in WATCHED
    or m in ("clocks_event_reasons",)
)
USED_INDEX: Final[tuple[int, ...]] = tuple(GPU_METRICS.index(m) for m in USED_METRICS)
#: metric name -> row in the ``[B, M, G]`` arrays detection works on
M: Final = {name: i for i, name in enumerate(USED_METRICS)}

# clocks_event_reasons bits that mean the GPU is slowed by heat or power protection
THROTTLE_MASK: Final = 0x8 | 0x20 | 0x40 | 0x80  # HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE
#: the GPU's own over-temperature protection cut its clocks (by half or more): cooling has failed
HW_THERMAL: Final = 0x40
#: the board asserted the external power brake (e.g. a power supply failed or lost redundancy)
HW_POWER_BRAKE: Final = 0x80

WATCHED_ROWS: Final = np.array([M[n] for n in WATCHED])

# planes of the per-signal state array [B, K, S, G]
COUNT, MEAN, VAR, CUSUM_UP, CUSUM_DOWN, STREAK = range(6)
PLANES: Final = 6


def nanmedian_last_axis(x: F64) -> F64:
    """Median over the last axis ignoring NaN, vectorised (np.nanmedian is slow on small rows)."""
    s = np.sort(x, axis=-1)  # NaN sort last
    n = np.sum(np.isfinite(x), axis=-1, keepdims=True)
    lo = np.clip((n - 1) // 2, 0, None)
    hi = np.clip(n // 2, 0, None)
    med = 0.5 * (np.take_along_axis(s, lo, -1) + np.take_along_axis(s, hi, -1))
    result: F64 = np.where(n > 0, med, np.nan)
    return result


def reported(msg: DetectionTelemetry, name: str) -> list[float]:
    """The values of one metric that the node's GPUs reported (plain Python: on 8 values numpy's
    per-call overhead is most of the cost)."""
    column = getattr(msg.metrics, name)
    return [float(v) for v in column if v is not None] if column else []


def median(vals: list[float]) -> float:
    """Median of a short list (NaN when empty)."""
    if not vals:
        return math.nan
    s = sorted(vals)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])


@dataclass(frozen=True)
class SignalPlan:
    """Which signals are monitored, and their thresholds, as arrays aligned with the signal axis."""

    names: tuple[str, ...]
    residual_idx: NDArray[np.intp]  # metric index per residual signal
    n_residual: int
    rate_groups: tuple[NDArray[np.intp], ...]  # WATCHED indices summed per rate signal
    sign: F64  # +1 up, -1 down, 0 both  [S, 1]
    z_warning: F64
    z_critical: F64
    min_delta: F64
    std_floor: F64  # per signal: max(baseline.min_std, min_delta / z_warning)

    @cached_property
    def flat_thresholds(self) -> tuple[F64, F64, F64, F64, F64]:
        """sign, z_warning, z_critical, min_delta, std_floor as contiguous float64 ``[S]`` arrays (the
        C loop's form; a plan whose arrays do not hold one value per signal raises ValueError)."""
        s = len(self.names)
        return (np.ascontiguousarray(self.sign, dtype=np.float64).reshape(s),
                np.ascontiguousarray(self.z_warning, dtype=np.float64).reshape(s),
                np.ascontiguousarray(self.z_critical, dtype=np.float64).reshape(s),
                np.ascontiguousarray(self.min_delta, dtype=np.float64).reshape(s),
                np.ascontiguousarray(self.std_floor, dtype=np.float64).reshape(s))

    @cached_property
    def flat_groups(self) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
        """The rate signals' groups of watched values end to end (the C loop's form): (starts, members)."""
        sizes = [len(group) for group in self.rate_groups]
        starts = np.zeros(len(sizes) + 1, dtype=np.intp)
        np.cumsum(sizes, out=starts[1:])
        members = np.concatenate(self.rate_groups).astype(np.intp) if sizes else np.zeros(0, dtype=np.intp)
        return starts, members


def compute_signals(x: F64, prev: F64, dt: F64, reset: BOOL, plan: SignalPlan, max_gap_s: float,
                    medians: F64 | None = None) -> F64:
    """Signals ``[B, S, G]`` from metrics ``x [B, M, G]`` and previous watched values ``prev [B, W, G]``;
    ``medians [B, n_residual]``: the residual gauges' medians over the GPUs, when already computed."""
    b, _, g = x.shape
    out = np.empty((b, len(plan.names), g))
    if plan.n_residual:
        gauges = x[:, plan.residual_idx, :]
        centre = nanmedian_last_axis(gauges) if medians is None else medians[:, :, None]
        out[:, : plan.n_residual, :] = gauges - centre
    if plan.rate_groups:
        cur = x[:, WATCHED_ROWS, :]
        delta = cur - prev
        ok = (~reset) & (dt > 0) & (dt <= max_gap_s)
        per_min = delta * (60.0 / np.where(dt > 0, dt, 1.0))[:, None, None]
        for j, group in enumerate(plan.rate_groups):
            # a composite rate sums the counters present (exporters often enable one NVLink counter of
            # four); a counter that went down, a reset or a gap gives no rate at all
            rates = per_min[:, group, :]
            present = ~np.isnan(rates)
            with np.errstate(invalid="ignore"):
                down = (present & (rates < 0)).any(axis=1)
            total = np.where(present, rates, 0.0).sum(axis=1) + 0.0  # + 0.0: no -0.0, as the C loop
            out[:, plan.n_residual + j, :] = np.where(ok[:, None] & present.any(axis=1) & ~down, total, np.nan)
    return out


def signals_at(x: F64, prev: F64, slab_prev: F64, idx: NDArray[np.intp], dt: F64, reset: BOOL, plan: SignalPlan,
               max_gap_s: float, medians: F64 | None = None) -> F64:
    """:func:`compute_signals` of the nodes in the rows ``idx`` (distinct) of the watched values
    ``slab_prev [N, W, G]`` (``prev``: those rows, ``slab_prev[idx]``), then each watched value of
    ``x`` that was reported (finite) written into those rows, in place. With the compiled loop one
    C pass does both; what it refuses it refuses before writing anything, and numpy does it."""
    if medians is None and plan.n_residual:
        medians = nanmedian_last_axis(x[:, plan.residual_idx, :])[:, :, 0]
    if _native_signals is not None:
        b, m, g = x.shape
        out = np.empty((b, len(plan.names), g))
        starts, members = plan.flat_groups
        try:
            _native_signals((b, m, g, len(plan.names), len(WATCHED)), len(slab_prev), x, slab_prev, idx, dt, reset,
                            medians if medians is not None else np.empty((b, 0)), plan.residual_idx, WATCHED_ROWS,
                            starts, members, float(max_gap_s), out)
        except (TypeError, ValueError, IndexError, BufferError):
            pass
        else:
            return out
    y = compute_signals(x, prev, dt, reset, plan, max_gap_s, medians)
    watched = x[:, WATCHED_ROWS, :]
    slab_prev[idx] = np.where(np.isfinite(watched), watched, prev)
    return y


@dataclass
class StepResult:
    value: F64  # [B, S, G] the signal
    z: F64  # [B, S, G] direction-signed z-score (NaN while warming up)
    deviation: F64  # [B, S, G] direction-signed distance from the baseline mean
    baseline: F64  # [B, S, G] baseline mean before this sample
    exceeded: BOOL  # [B, S, G] beyond z_warning and min_delta now
    critical: BOOL
    persistent: BOOL  # exceeded for >= continuity samples
    drifting: BOOL  # CUSUM above threshold


@dataclass(frozen=True)
class BaselineParams:
    """How the per-signal baselines learn and score (from :class:`~fleetmedic.config.DetectionSettings`)."""

    alpha: float  # EWMA weight of a new sample
    warmup: int  # samples before a baseline scores
    min_std: float
    protect_z: float  # a sample beyond this |z| is not learnt
    continuity: int  # samples beyond z_warning in a row that make a signal persistent
    cusum_k: float
    cusum_h: float


def step_baselines(y: F64, planes: F64, plan: SignalPlan, params: BaselineParams) -> StepResult:
    """Score signals ``y [B, S, G]`` against ``planes [B, K, S, G]`` and learn them (in place)."""
    alpha, warmup, min_std, protect_z = params.alpha, params.warmup, params.min_std, params.protect_z
    continuity, cusum_k, cusum_h = params.continuity, params.cusum_k, params.cusum_h
    count, mean, var = planes[:, COUNT], planes[:, MEAN], planes[:, VAR]
    baseline = mean.copy()
    std = np.maximum(np.sqrt(var), np.maximum(min_std, plan.std_floor))
    raw = y - mean
    warm = count >= warmup
    finite = np.isfinite(y)
    both = plan.sign == 0
    # one division serves all: |raw| / std == |raw / std| and (raw * s) / std == (raw / std) * s for
    # s = +-1, exactly (a sign change is exact)
    q = raw / std
    aq, absraw = np.abs(q), np.abs(raw)
    signed = np.where(both, absraw, raw * plan.sign)
    z = np.where(warm & finite, np.where(both, aq, q * plan.sign), np.nan)
    with np.errstate(invalid="ignore"):
        exceeded = (z >= plan.z_warning) & (signed >= plan.min_delta)
        critical = exceeded & (z >= plan.z_critical)
        protect = warm & (aq > protect_z)
    streak = np.where(exceeded, planes[:, STREAK] + 1, np.where(finite, 0.0, planes[:, STREAK]))
    planes[:, STREAK] = streak
    # two one-sided CUSUMs of z (clipped so one outlier cannot trip them), gated by min_delta; a
    # signal watched in one direction only uses that side
    zc = np.clip(q, -protect_z, protect_z)  # +-inf clip to the bounds; NaN (nothing to learn) counts 0
    zc[np.isnan(zc)] = 0.0
    big = absraw >= plan.min_delta
    up = np.where(warm, np.maximum(0.0, planes[:, CUSUM_UP] + np.where(big, zc, np.minimum(zc, 0.0)) - cusum_k), 0.0)
    down = np.where(warm, np.maximum(0.0, planes[:, CUSUM_DOWN] - np.where(big, zc, np.maximum(zc, 0.0)) - cusum_k),
                    0.0)
    # capped at twice the threshold: a long fault must not leave a sum that takes hours to decay
    # once it is gone (after a repair the signal is healthy again within h / k samples)
    planes[:, CUSUM_UP], planes[:, CUSUM_DOWN] = np.minimum(up, 2 * cusum_h), np.minimum(down, 2 * cusum_h)
    drifting = ((plan.sign >= 0) & (up > cusum_h)) | ((plan.sign <= 0) & (down > cusum_h))
    # learn (West's EWMA), protected where the sample is anomalous
    take = finite & ~protect
    first = take & (count == 0)
    a = np.where(first, 1.0, np.where(take, alpha, 0.0))
    d = np.where(take, raw, 0.0)
    planes[:, MEAN] = mean + a * d
    planes[:, VAR] = np.where(first, 0.0, (1.0 - a) * (var + a * d * d))
    planes[:, COUNT] = count + take
    return StepResult(
        value=y,
        z=z,
        deviation=signed,
        baseline=baseline,
        exceeded=exceeded,
        critical=critical,
        persistent=streak >= continuity,
        drifting=drifting,
    )


def step_baselines_at(y: F64, slab: F64, idx: NDArray[np.intp], plan: SignalPlan,
                      params: BaselineParams) -> StepResult:
    """:func:`step_baselines` on the rows ``idx`` (distinct) of the planes ``slab [N, K, S, G]``,
    in place. With the compiled loop (:data:`NATIVE_BASELINES`) one C pass reads and writes the
    rows where they are; its results equal the numpy path's (tests/models/test_native_baselines.py).
    What it refuses (an array of another type or shape, a row twice) it refuses before writing
    anything, and the numpy path runs instead."""
    if _native_step is not None:
        b, s, g = y.shape
        floats, flags = np.empty((3, b, s, g)), np.empty((4, b, s, g), dtype=np.bool_)
        try:
            _native_step((b, s, g), len(slab), y, slab, idx, *plan.flat_thresholds, float(params.alpha),
                         float(params.warmup), float(params.min_std), float(params.protect_z),
                         float(params.continuity), float(params.cusum_k), float(params.cusum_h),
                         floats[0], floats[1], floats[2], flags)
        except (TypeError, ValueError, IndexError, BufferError):
            pass
        else:
            return StepResult(value=y, z=floats[0], deviation=floats[1], baseline=floats[2], exceeded=flags[0],
                              critical=flags[1], persistent=flags[2], drifting=flags[3])
    planes = slab[idx]
    result = step_baselines(y, planes, plan, params)
    slab[idx] = planes
    return result

