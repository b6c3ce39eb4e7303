"""A multivariate unsupervised model over per-node window features (scikit-learn).

Per-GPU baselines judge one signal at a time. Some degradations show only as an unusual
*combination* (a little hotter, a little slower, a few more replays). :class:`NodeWindowFeatures`
summarises each node's telemetry over ``multivariate.window_s`` into a feature vector of
features that follow the hardware more than the job: spreads between the node's GPUs (taken only
from samples under load, where they are comparable), throttling and error rates;
:class:`MultivariateModel` fits on recent windows judged healthy (no finding on that node in the
window), refits every ``refit_interval_s``, and flags outlying windows. Two algorithms:

- ``robust_covariance`` (default): features scaled by median/MAD (with per-unit floors) and
  clipped at zero (only the troubling side counts), then a Minimum Covariance Determinant fit
  (``sklearn.covariance.MinCovDet``); the score is the robust Mahalanobis distance, flagged above
  ``distance_threshold``.
- ``isolation_forest``: ``sklearn.ensemble.IsolationForest``; the score is ``2^(-E[h]/c(n))`` in
  (0, 1], flagged above ``score_threshold``.

Why robust covariance is the default: this is *novelty* detection (fit on healthy windows, judge
new ones), and an IsolationForest scores any point beyond the training range like the most extreme
training point: a node 20 degC hotter scores no higher than one 3 degC hotter. Measured on
injected anomalies in ``tests/models/test_other_detectors.py`` (AUC of both is asserted there).

Persistence without pickle (loading pickles from a topic would be an injection path): the model
is saved as plain arrays (:class:`~fleetmedic.models.multivariate_state.ModelPart`): its training
inputs (the healthy windows of its last fit and those learned since, each with its node and
time), the version and fit time, and for ``robust_covariance`` the fit itself (medians, scales,
location and precision matrix: a MinCovDet fit of 20,000 windows takes seconds); an
``isolation_forest`` is refitted on the same rows with the same ``seed`` (~1 s). Either way the
restored model scores exactly as the saved one (:meth:`MultivariateModel.state_bytes`,
:meth:`MultivariateModel.load_state`; :mod:`fleetmedic.models.state`). Rows are kept and fitted in a
canonical order (window time, node), at most ``max_training_windows`` of the newest, so that a model
split by node (stage 1 writes one part per partition: ``state_bytes(keep)``) and merged again
(:meth:`MultivariateModel.load_parts`) is the same. A node's open window travels with the node's
state (:meth:`NodeWindowFeatures.node_bytes`). Pure apart from scikit-learn.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import msgspec
import numpy as np
from numpy.typing import NDArray
from sklearn.covariance import MinCovDet
from sklearn.ensemble import IsolationForest

from fleetmedic.config import MultivariateSettings
from fleetmedic.models import sample_columns as sc
from fleetmedic.models.gpu_signals import THROTTLE_MASK
from fleetmedic.models.multivariate_state import (
    PART_FORMAT,
    ModelPart,
    Row,
    array_of,
    decode_part,
    newest,
    pack_rows,
    raw,
    unpack_rows,
)
from fleetmedic.models.state import require_finite
from fleetmedic.records import DetectionTelemetry, Evidence, Finding

FEATURES: tuple[str, ...] = (
    "gpu_temp_spread",
    "memory_temp_spread",
    "power_usage_spread",
    "sm_clock_spread",
    "throttled_share",
    "ecc_sbe_per_min",
    "pcie_replay_per_min",
    "nvlink_errors_per_min",
)
W = len(FEATURES)  # features per window
#: smallest scale per feature, in its unit (a constant feature must not make tiny changes infinite)
SCALE_FLOORS: tuple[float, ...] = (0.5, 0.5, 5.0, 5.0, 0.02, 1.0, 1.0, 1.0)
_RATES = {
    "ecc_sbe_per_min": ("ecc_sbe_vol_total",),
    "pcie_replay_per_min": ("pcie_replay_counter",),
    "nvlink_errors_per_min": (
        "nvlink_crc_flit_error_count_total",
        "nvlink_crc_data_error_count_total",
        "nvlink_replay_error_count_total",
        "nvlink_recovery_error_count_total",
    ),
}


N_GAUGES = 5  # the features that are means over the window's busy samples (the rest are rates)
_GAUGE_SPREADS = ("gpu_temp", "memory_temp", "power_usage", "sm_clock")
_RATE_COUNTERS = tuple(name for counters in _RATES.values() for name in counters)
SAMPLE_METRICS = (*_GAUGE_SPREADS, "clocks_event_reasons", "gpu_util", *_RATE_COUNTERS)
_RATE_SPANS = tuple(itertools.pairwise(itertools.accumulate((len(c) for c in _RATES.values()), initial=0)))


_BUSY_UTIL = MultivariateSettings().busy_util


def _sample_features(
    msgs: Sequence[DetectionTelemetry], batch: sc.MetricBatch | None = None, busy_util: float = _BUSY_UTIL
) -> tuple[NDArray[np.float64], NDArray[np.bool_], NDArray[np.float64]]:
    """Per message (rows of the arrays): the gauges (4 spreads between GPUs, the throttled share),
    whether the node was busy (median utilisation >= ``busy_util``, or not reported), and each rate
    feature's counter total; computed for the whole batch at once
    (:mod:`~fleetmedic.models.sample_columns`), from ``batch``'s columns when given."""
    n = len(msgs)
    gauges = np.full((n, N_GAUGES), np.nan)
    busy = np.ones(n, dtype=bool)
    totals = np.zeros((n, len(_RATES)))
    batch = batch or sc.MetricBatch.of(msgs, SAMPLE_METRICS)
    k = len(_GAUGE_SPREADS)
    for group, idx in enumerate(batch.groups):
        if not msgs[idx[0]].gpus:  # a node with no GPUs listed: nothing reported
            continue
        at = idx if len(idx) < n else slice(None)
        gauges[at, :k] = sc.spread(batch.take(group, _GAUGE_SPREADS))
        gauges[at, k] = sc.share_with_bits(batch.take(group, ("clocks_event_reasons",))[:, 0, :], THROTTLE_MASK)
        busy[at] = ~(batch.medians(group, ("gpu_util",))[:, 0] < busy_util)  # NaN (not reported): busy
        counters = sc.nansum(batch.take(group, _RATE_COUNTERS))  # [messages, counters]
        totals[at] = np.stack([counters[:, a:b].sum(axis=1) for a, b in _RATE_SPANS], axis=1)
    return gauges, busy, totals


class _Window(msgspec.Struct, array_like=True):
    """A node's open window: running sums of the busy samples' gauges and the counters' ends (the
    form it is saved in; :class:`NodeWindowFeatures` keeps every node's in arrays)."""

    start: float
    rows: int = 0  # busy samples
    sums: list[float] = msgspec.field(default_factory=lambda: [0.0] * N_GAUGES)  # of the finite values
    finite: list[int] = msgspec.field(default_factory=lambda: [0] * N_GAUGES)
    first_counters: dict[str, float] = {}
    last_counters: dict[str, float] = {}
    last_ts: float = 0.0
    samples: int = 0


_encode = msgspec.msgpack.Encoder().encode
_decode_window = msgspec.msgpack.Decoder(_Window).decode


@dataclass
class NodeWindowFeatures:
    """Accumulates each node's samples; :meth:`add` returns a feature vector when a window closes.

    Every node's open window is one row of a few arrays (a slot per node), so that a micro-batch
    updates all its nodes' windows in a handful of numpy operations; a node's samples are added in
    their order (a batch holding a node twice is applied in waves), and the sums are the same
    additions, in the same order, as one sample at a time in Python."""

    window_s: float
    busy_util: float = _BUSY_UTIL  # multivariate.busy_util
    _slot: dict[str, int] = field(default_factory=dict)
    _free: list[int] = field(default_factory=list)
    _open: NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=bool))
    _start: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    _last_ts: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    _rows: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _samples: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _sums: NDArray[np.float64] = field(default_factory=lambda: np.zeros((0, N_GAUGES)))
    _finite: NDArray[np.int64] = field(default_factory=lambda: np.zeros((0, N_GAUGES), dtype=np.int64))
    _first: NDArray[np.float64] = field(default_factory=lambda: np.zeros((0, len(_RATES))))  # NaN: not yet seen
    _last: NDArray[np.float64] = field(default_factory=lambda: np.zeros((0, len(_RATES))))

    def add(self, msg: DetectionTelemetry) -> NDArray[np.float64] | None:
        return self.add_batch([msg])[0]

    def add_batch(
        self, msgs: Sequence[DetectionTelemetry], batch: sc.MetricBatch | None = None
    ) -> list[NDArray[np.float64] | None]:
        """Add each message's sample in order; per message, the feature vector of the window it
        closed (or None). The per-sample reductions run over the whole batch at once (over
        ``batch``'s converted columns when given)."""
        gauges, busy, totals = _sample_features(msgs, batch, self.busy_util)
        out: list[NDArray[np.float64] | None] = [None] * len(msgs)
        get = self._slot.get
        known = [get(m.node) for m in msgs]
        slots: list[int] = known if None not in known else [self._slot_of(m.node) for m in msgs]  # type: ignore[assignment]
        ts = np.fromiter([m.ts for m in msgs], dtype=np.float64, count=len(msgs))
        if len(set(slots)) == len(slots):
            self._add_wave(np.array(slots, dtype=np.intp), np.arange(len(msgs)), ts, gauges, busy, totals, out)
            return out
        seen: dict[int, int] = {}
        waves: list[list[int]] = []
        for i, slot in enumerate(slots):  # the k-th sample of each node goes in wave k
            k = seen[slot] = seen.get(slot, -1) + 1
            if k == len(waves):
                waves.append([])
            waves[k].append(i)
        for wave in waves:
            at = np.array(wave, dtype=np.intp)
            self._add_wave(np.array([slots[i] for i in wave], dtype=np.intp), at, ts[at], gauges[at], busy[at],
                           totals[at], out)
        return out

    def _add_wave(self, idx: NDArray[np.intp], at: NDArray[np.intp], ts: NDArray[np.float64],
                  gauges: NDArray[np.float64], busy: NDArray[np.bool_], totals: NDArray[np.float64],
                  out: list[NDArray[np.float64] | None]) -> None:
        """One sample each of distinct nodes (slots ``idx``; ``at``: their places in ``out``)."""
        is_open = self._open[idx]
        closing = is_open & (ts - self._start[idx] >= self.window_s)
        for j in np.flatnonzero(closing).tolist():  # rare: a node's window ends
            out[int(at[j])] = self._close(self._window(int(idx[j])))
        fresh = idx[~is_open | closing]
        if len(fresh):
            self._open[fresh], self._start[fresh] = True, ts[~is_open | closing]
            self._rows[fresh] = self._samples[fresh] = 0
            self._sums[fresh], self._finite[fresh], self._first[fresh], self._last[fresh] = 0.0, 0, np.nan, np.nan
        self._samples[idx] += 1
        self._rows[idx] += busy
        take = np.isfinite(gauges) & busy[:, None]  # spreads between GPUs depend on the load: busy samples only
        self._sums[idx] = np.where(take, self._sums[idx] + gauges, self._sums[idx])
        self._finite[idx] += take
        first = self._first[idx]
        self._first[idx] = np.where(np.isnan(first), totals, first)
        self._last[idx], self._last_ts[idx] = totals, ts

    def _slot_of(self, node: str) -> int:
        slot = self._slot.get(node)
        if slot is None:
            if not self._free:
                self._grow()
            slot = self._slot[node] = self._free.pop()
            self._open[slot] = False
        return slot

    def _grow(self) -> None:
        old = len(self._open)  # every array has this many slots
        new = max(64, 2 * old)
        for name in ("_open", "_start", "_last_ts", "_rows", "_samples", "_sums", "_finite", "_first", "_last"):
            a = getattr(self, name)
            grown = np.zeros((new, *a.shape[1:]), dtype=a.dtype)
            grown[:old] = a
            setattr(self, name, grown)
        self._free.extend(range(new - 1, old - 1, -1))  # lowest slot first

    def _window(self, slot: int) -> _Window:
        present = [(f, a, b) for f, a, b in zip(_RATES, self._first[slot].tolist(), self._last[slot].tolist(),
                                                strict=True) if a == a]  # NaN: not seen in this window
        return _Window(start=float(self._start[slot]), rows=int(self._rows[slot]), sums=self._sums[slot].tolist(),
                       finite=self._finite[slot].tolist(), first_counters={f: a for f, a, _ in present},
                       last_counters={f: b for f, _, b in present if b == b}, last_ts=float(self._last_ts[slot]),
                       samples=int(self._samples[slot]))

    def window(self, node: str) -> _Window | None:
        """The node's open window (a copy), or None."""
        slot = self._slot.get(node)
        return None if slot is None or not self._open[slot] else self._window(slot)

    def node_bytes(self, node: str) -> bytes | None:
        """The node's open window (msgpack), or None."""
        w = self.window(node)
        return None if w is None else _encode(w)

    def load_node(self, node: str, data: bytes | None) -> None:
        """Load what :meth:`node_bytes` wrote (None: no open window)."""
        if data is None:
            self.forget(node)
            return
        w = _decode_window(data)
        if len(w.sums) != N_GAUGES or len(w.finite) != N_GAUGES:
            raise ValueError(f"multivariate window of {node}: {len(w.sums)} gauges, not {N_GAUGES}")
        require_finite(f"multivariate window of {node}", [w.start, w.last_ts, *w.sums])
        require_finite(f"multivariate counters of {node}", [*w.first_counters.values(), *w.last_counters.values()],
                       nan_is_none=True)
        slot = self._slot_of(node)
        self._open[slot], self._start[slot], self._last_ts[slot] = True, w.start, w.last_ts
        self._rows[slot], self._samples[slot] = w.rows, w.samples
        self._sums[slot], self._finite[slot] = w.sums, w.finite
        self._first[slot] = [w.first_counters.get(f, np.nan) for f in _RATES]
        self._last[slot] = [w.last_counters.get(f, np.nan) for f in _RATES]

    def forget(self, node: str) -> None:
        slot = self._slot.pop(node, None)
        if slot is not None:
            self._open[slot] = False
            self._free.append(slot)

    @staticmethod
    def _close(w: _Window) -> NDArray[np.float64] | None:
        if w.rows < max(2, w.samples // 2):
            return None  # mostly idle: nothing comparable
        if min(w.finite) == 0:
            return None  # a feature never reported in the window (e.g. an exporter without power)
        gauges = np.array(w.sums) / np.array(w.finite)
        minutes = max((w.last_ts - w.start) / 60.0, 1e-9)
        rates = [max(0.0, w.last_counters[f] - w.first_counters[f]) / minutes for f in _RATES]
        vec = np.concatenate([gauges, rates])
        return vec if np.all(np.isfinite(vec)) else None


@dataclass(frozen=True)
class Fit:
    """A fitted model's arrays: the robust centre and spread of each feature, and MinCovDet's
    location and precision (``robust_covariance``) or the forest (``isolation_forest``)."""

    ref: NDArray[np.float64]
    spread: NDArray[np.float64]
    location: NDArray[np.float64] | None = None
    precision: NDArray[np.float64] | None = None
    forest: IsolationForest | None = None


@dataclass(frozen=True)
class RefitJob:
    """A refit of the model on ``rows`` (canonical order): pure, so it may run in another thread."""

    rows: list[Row]
    now: float
    settings: MultivariateSettings
    held: tuple[Row, ...] = ()  # every row the model held when it was planned (kept alive: ids stay unique)

    def run(self) -> Fit:
        s = self.settings
        data = np.array([row[2] for row in self.rows], dtype=np.float64)
        ref = np.median(data, axis=0)
        mad = np.median(np.abs(data - ref), axis=0) * 1.4826
        spread = np.maximum(mad, np.array(SCALE_FLOORS))
        if s.algorithm == "robust_covariance":
            with warnings.catch_warnings():  # constant features (error rates of a healthy fleet) are expected
                warnings.filterwarnings("ignore", message=".*not full rank.*")
                mcd = MinCovDet(random_state=s.seed).fit(np.maximum((data - ref) / spread, 0.0))
            return Fit(ref, spread, location=mcd.location_, precision=mcd.get_precision())
        return Fit(ref, spread, forest=IsolationForest(n_estimators=s.n_estimators, random_state=s.seed).fit(data))


@dataclass
class MultivariateModel:
    settings: MultivariateSettings
    version: int = 0
    trained_on: int = 0
    fitted_at: float = float("-inf")
    _forest: IsolationForest | None = None  # isolation_forest
    _location: NDArray[np.float64] | None = None  # robust_covariance: MinCovDet's location and precision
    _precision: NDArray[np.float64] | None = None
    _ref: NDArray[np.float64] | None = None
    _spread: NDArray[np.float64] | None = None
    _trained: list[Row] = field(default_factory=list)  # the rows of the last fit, canonical order
    _pending: list[Row] = field(default_factory=list)  # learned since (trimmed to the cap now and then)
    _fitting: bool = False  # a planned refit is running (plan_refit .. install)
    _planned_at: float = float("-inf")
    revision: int = 0  # moves on every change (what to write again)

    @property
    def cap(self) -> int:
        """The most healthy windows kept and fitted on (``multivariate.max_training_windows``)."""
        return self.settings.max_training_windows

    @property
    def threshold(self) -> float:
        s = self.settings
        return s.distance_threshold if s.algorithm == "robust_covariance" else s.score_threshold

    def learn(self, vector: NDArray[np.float64], node: str = "", ts: float = 0.0) -> None:
        """Remember a window of ``node`` closed at ``ts`` judged healthy (no finding on its node)."""
        # rounded to float32 (7 digits: far finer than the telemetry) so that it persists in 4 bytes, exactly
        self._pending.append((ts, node, np.asarray(vector, dtype=np.float32).astype(np.float64)))
        self.revision += 1
        if len(self._pending) >= 2 * self.cap:
            self._pending = newest(self._pending, self.cap)

    @property
    def healthy(self) -> list[Row]:
        """The rows the next fit would use: the newest ``cap`` of the last fit's and those learned since."""
        return newest([*self._trained, *self._pending], self.cap)

    def maybe_refit(self, now: float) -> bool:
        """Refit now if one is due (:meth:`plan_refit`), in this thread."""
        job = self.plan_refit(now)
        if job is None:
            return False
        self.install(job, job.run())
        return True

    def plan_refit(self, now: float) -> RefitJob | None:
        """The refit that is due (every ``refit_interval_s``, once ``min_training_windows`` healthy
        windows are known), or None. Its :meth:`RefitJob.run` is pure and may run in another thread
        (a worker keeps judging with the current fit meanwhile); :meth:`install` puts it in place. No
        other refit is planned until then."""
        if self._fitting or not self.refit_due(now):
            return None
        self._fitting, self._planned_at = True, now
        return RefitJob(self.healthy, now, self.settings, (*self._trained, *self._pending))

    def refit_due(self, now: float) -> bool:
        """A refit is due: ``refit_interval_s`` since the last one was planned, and enough rows."""
        s = self.settings
        if now - max(self.fitted_at, self._planned_at) < s.refit_interval_s:
            return False
        return len(self._trained) + len(self._pending) >= s.min_training_windows

    def install(self, job: RefitJob, fit: Fit) -> None:
        """Use ``fit`` (``job.run()``) from now on, as a new version. Rows learned while it ran stay
        pending (those it left out as too old are dropped, as a fit in place drops them); rows of
        nodes forgotten meanwhile (:meth:`forget`) leave the training set."""
        kept = {id(row) for row in (*self._trained, *self._pending)}
        held = {id(row) for row in job.held}
        self._apply(job, fit)
        self._trained = [row for row in job.rows if id(row) in kept]
        self._pending = [row for row in self._pending if id(row) not in held]
        self._fitting = False
        self.version += 1

    def cancel_refit(self) -> None:
        """Forget the planned refit (it failed): the next one can be planned at once."""
        self._fitting, self._planned_at = False, float("-inf")

    def _fit(self, rows: list[Row], now: float) -> None:
        """Fit on ``rows`` (canonical order) at once: the same rows and seed give the same model."""
        job = RefitJob(rows, now, self.settings)
        self._apply(job, job.run())
        self._trained, self._pending = rows, []

    def _apply(self, job: RefitJob, fit: Fit) -> None:
        self._ref, self._spread, self._location, self._precision, self._forest = (
            fit.ref, fit.spread, fit.location, fit.precision, fit.forest)
        self.fitted_at, self.trained_on = job.now, len(job.rows)
        self.revision += 1

    def _scaled(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """Robust z per feature, counting only the side that means trouble (wider spreads between a
        node's GPUs, more throttling, more errors): a quieter window is never an anomaly."""
        assert self._ref is not None and self._spread is not None
        scaled: NDArray[np.float64] = np.maximum((np.atleast_2d(x) - self._ref) / self._spread, 0.0)
        return scaled

    def score(self, vectors: NDArray[np.float64]) -> NDArray[np.float64]:
        """Outlier scores (higher = more anomalous; see ``threshold``); NaN before the first fit."""
        if self._location is not None and self._precision is not None:
            diff = self._scaled(vectors) - self._location  # squared robust Mahalanobis distance:
            d2: NDArray[np.float64] = np.sum((diff @ self._precision) * diff, axis=1)
            return np.sqrt(np.maximum(d2, 0.0))
        if self._forest is None:
            return np.full(len(np.atleast_2d(vectors)), np.nan)
        scores: NDArray[np.float64] = -self._forest.score_samples(np.atleast_2d(vectors))
        return scores

    @property
    def fitted(self) -> bool:
        return self._ref is not None

    def judge(self, node: str, vector: NDArray[np.float64], now: float) -> Finding | None:
        score = float(self.score(vector[None, :])[0])
        if not np.isfinite(score) or score < self.threshold:
            return None
        assert self._ref is not None and self._spread is not None
        top = int(np.argmax(np.abs(vector - self._ref) / self._spread))
        algo = self.settings.algorithm
        ev = Evidence(detector=algo, metric=FEATURES[top], value=float(vector[top]), baseline=float(self._ref[top]),
                      score=score, threshold=self.threshold, window_s=self.settings.window_s, ts=now,
                      note=f"model v{self.version}, {self.trained_on} healthy windows")
        return Finding(id=f"{node}:{algo}:{now:.3f}", ts=now, node=node, detector=algo, kind="degradation",
                       severity="warning",
                       summary=f"{node}: unusual combination of telemetry (score {score:.2f}, "
                       f"most off: {FEATURES[top]})",
                       evidence=[ev])

    # --- persistence (no pickle: the training inputs, refitted on restore) ----------------------------

    def state_bytes(self, keep: Callable[[str], bool] | None = None) -> bytes:
        """The model as a part (:class:`ModelPart`, msgpack): the rows of the nodes ``keep`` accepts
        (default: all, the whole model), with the version and the fit."""
        def mine(rows: list[Row]) -> list[Row]:
            return rows if keep is None else [row for row in rows if keep(row[1])]

        self._pending = newest(self._pending, self.cap)
        index: dict[str, int] = {}
        trained, pending = pack_rows(mine(self._trained), index, W), pack_rows(mine(self._pending), index, W)
        return _encode(ModelPart(format=PART_FORMAT, features=list(FEATURES), version=self.version,
                                 trained_on=self.trained_on, fitted_at=self.fitted_at, nodes=list(index),
                                 trained_ts=trained[0], trained_node=trained[1], trained_x=trained[2],
                                 pending_ts=pending[0], pending_node=pending[1], pending_x=pending[2],
                                 ref=raw(self._ref), spread=raw(self._spread), location=raw(self._location),
                                 precision=raw(self._precision)))

    def load_state(self, data: bytes) -> None:
        """Replace the model with what :meth:`state_bytes` wrote (see :meth:`load_parts`)."""
        fresh = MultivariateModel(self.settings, revision=self.revision)
        vars(self).update(vars(fresh))  # every field as built, then the part's fit and rows
        self.load_parts([data])

    def load_parts(self, parts: Iterable[bytes]) -> int:
        """Merge parts written by :meth:`state_bytes` (e.g. one per partition) into this model;
        return the rows loaded.

        A model not fitted yet takes the parts' fit: their trained rows merged in canonical order and
        fitted again with the same settings and seed (the same model as before the export when the
        parts hold all its nodes). A model already fitted keeps its fit and learns the rows as new.
        Raises ValueError for bytes that are not a part of this feature set."""
        decoded = []
        for data in parts:
            try:
                part = decode_part(data)
            except msgspec.DecodeError as exc:
                raise ValueError(f"model part: {exc}") from exc
            if part.format != PART_FORMAT or tuple(part.features) != FEATURES:
                raise ValueError(f"model part: format {part.format}, features {part.features}: not this model's")
            decoded.append((part, unpack_rows(part.trained_ts, part.trained_node, part.trained_x, part.nodes, W),
                            unpack_rows(part.pending_ts, part.pending_node, part.pending_x, part.nodes, W)))
        loaded = sum(len(t) + len(p) for _, t, p in decoded)
        self.revision += 1
        if not self.fitted and any(t for _, t, _ in decoded):
            fitted = max((part for part, t, _ in decoded if t), key=lambda part: (part.version, part.fitted_at))
            trained = newest([row for _, t, _ in decoded for row in t], self.cap)
            if self.settings.algorithm == "robust_covariance" and fitted.location:
                self._load_fit(fitted, trained)
            else:
                self._fit(trained, fitted.fitted_at)
            self.version = fitted.version
            self._pending = newest([*self._pending, *(row for _, _, p in decoded for row in p)], self.cap)
        else:
            self._pending = newest([*self._pending, *(row for _, t, p in decoded for row in (*t, *p))], self.cap)
        return loaded

    def _load_fit(self, part: ModelPart, trained: list[Row]) -> None:
        n = len(FEATURES)
        ref, spread, location = (array_of(part.ref, n), array_of(part.spread, n), array_of(part.location, n))
        precision = array_of(part.precision, n * n).reshape(n, n)
        self._ref, self._spread, self._location, self._precision = ref, spread, location, precision
        self._forest, self.fitted_at, self.trained_on = None, part.fitted_at, part.trained_on
        self._trained = trained

    def forget(self, nodes: set[str]) -> None:
        """Drop the rows of ``nodes`` (another worker carries on with them); the current fit stays."""
        if not nodes:
            return
        trained = [row for row in self._trained if row[1] not in nodes]
        pending = [row for row in self._pending if row[1] not in nodes]
        if len(trained) != len(self._trained) or len(pending) != len(self._pending):
            self.revision += 1  # (a node without rows changes nothing to write again)
            self._trained, self._pending = trained, pending
