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

The fitted model is persisted with a version, the feature names and the training size
(:meth:`MultivariateModel.to_bytes`; pickle inside, so only load bytes fleetmedic wrote, e.g. from
its own changelog topic). Deterministic for a given ``seed``. Pure apart from scikit-learn.
"""

from __future__ import annotations

import math
import pickle
import warnings
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray
from sklearn.covariance import MinCovDet
from sklearn.ensemble import IsolationForest

from fleetmedic.config import MultivariateSettings
from fleetmedic.models.gpu_signals import THROTTLE_MASK, median, reported
from fleetmedic.records import Evidence, Finding, GpuTelemetry

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
#: smallest scale per feature, in its unit (a constant feature must not make tiny changes infinite)
SCALE_FLOORS: tuple[float, ...] = (0.5, 0.5, 5.0, 5.0, 0.02, 1.0, 1.0, 1.0)
BUSY_UTIL = 50.0  # a sample counts when the node's median GPU utilisation is at least this
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


def _spread(vals: list[float]) -> float:
    return max(vals) - min(vals) if vals else math.nan


@dataclass
class _Window:
    start: float
    rows: list[list[float]] = field(default_factory=list)
    first_counters: dict[str, float] = field(default_factory=dict)
    last_counters: dict[str, float] = field(default_factory=dict)
    last_ts: float = 0.0
    samples: int = 0


@dataclass
class NodeWindowFeatures:
    """Accumulates each node's samples; :meth:`add` returns a feature vector when a window closes."""

    window_s: float
    _open: dict[str, _Window] = field(default_factory=dict)

    def add(self, msg: GpuTelemetry) -> NDArray[np.float64] | None:
        ts = float(msg.ts)
        w = self._open.get(msg.node)
        done: NDArray[np.float64] | None = None
        if w is not None and ts - w.start >= self.window_s:
            done = self._close(w)
            w = None
        if w is None:
            w = self._open[msg.node] = _Window(start=ts)
        # plain Python on 8 values: numpy's per-call overhead costs more than the arithmetic here
        t, p, c = reported(msg, "gpu_temp"), reported(msg, "power_usage"), reported(msg, "sm_clock")
        reasons = reported(msg, "clocks_event_reasons")
        throttled = sum(1 for v in reasons if int(v) & THROTTLE_MASK) / len(reasons) if reasons else math.nan
        w.samples += 1
        util = reported(msg, "gpu_util")
        if not util or median(util) >= BUSY_UTIL:  # spreads between GPUs depend on the load: judge busy nodes
            w.rows.append([_spread(t), _spread(reported(msg, "memory_temp")), _spread(p), _spread(c), throttled])
        for feature, counters in _RATES.items():
            total = sum(sum(reported(msg, name)) for name in counters)
            w.first_counters.setdefault(feature, total)
            w.last_counters[feature] = total
        w.last_ts = ts
        return done

    @staticmethod
    def _close(w: _Window) -> NDArray[np.float64] | None:
        if len(w.rows) < max(2, w.samples // 2):
            return None  # mostly idle: nothing comparable
        rows = np.array(w.rows)
        if not np.all(np.isfinite(rows).any(axis=0)):
            return None  # a feature never reported in the window (e.g. an exporter without power)
        gauges = np.nanmean(rows, axis=0)
        minutes = max((w.last_ts - w.start) / 60.0, 1e-9)
        rates = [max(0.0, w.last_counters[f] - w.first_counters[f]) / minutes for f in _RATES]
        vec = np.concatenate([gauges, rates])
        return vec if np.all(np.isfinite(vec)) else None


@dataclass
class MultivariateModel:
    settings: MultivariateSettings
    history: int = 20_000
    version: int = 0
    trained_on: int = 0
    fitted_at: float = float("-inf")
    _model: IsolationForest | MinCovDet | None = None
    _ref: NDArray[np.float64] | None = None
    _spread: NDArray[np.float64] | None = None
    _healthy: deque[NDArray[np.float64]] = field(default_factory=deque)

    @property
    def threshold(self) -> float:
        s = self.settings
        return s.distance_threshold if s.algorithm == "robust_covariance" else s.score_threshold

    def learn(self, vector: NDArray[np.float64]) -> None:
        """Remember a window judged healthy (no finding on its node)."""
        self._healthy.append(vector)
        while len(self._healthy) > self.history:
            self._healthy.popleft()

    def maybe_refit(self, now: float) -> bool:
        s = self.settings
        if now - self.fitted_at < s.refit_interval_s or len(self._healthy) < s.min_training_windows:
            return False
        data = np.array(self._healthy)
        self._ref = np.median(data, axis=0)
        mad = np.median(np.abs(data - self._ref), axis=0) * 1.4826
        self._spread = np.maximum(mad, np.array(SCALE_FLOORS))
        model: IsolationForest | MinCovDet
        if s.algorithm == "robust_covariance":
            with warnings.catch_warnings():  # constant features (error rates of a healthy fleet) are expected
                warnings.filterwarnings("ignore", message=".*not full rank.*")
                model = MinCovDet(random_state=s.seed).fit(self._scaled(data))
        else:
            model = IsolationForest(n_estimators=s.n_estimators, random_state=s.seed).fit(data)
        self._model, self.fitted_at, self.trained_on = model, now, len(data)
        self.version += 1
        return True

    def _scaled(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """Robust z per feature, counting only the side that means trouble (wider spreads between a
        node's GPUs, more throttling, more errors): a quieter window is never an anomaly."""
        assert self._ref is not None and self._spread is not None
        scaled: NDArray[np.float64] = np.maximum((np.atleast_2d(x) - self._ref) / self._spread, 0.0)
        return scaled

    def score(self, vectors: NDArray[np.float64]) -> NDArray[np.float64]:
        """Outlier scores (higher = more anomalous; see ``threshold``); NaN before the first fit."""
        if self._model is None:
            return np.full(len(np.atleast_2d(vectors)), np.nan)
        if isinstance(self._model, MinCovDet):
            d2: NDArray[np.float64] = self._model.mahalanobis(self._scaled(vectors))
            return np.sqrt(np.maximum(d2, 0.0))
        scores: NDArray[np.float64] = -self._model.score_samples(np.atleast_2d(vectors))
        return scores

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

    def to_bytes(self) -> bytes:
        return pickle.dumps({"format": 1, "version": self.version, "features": FEATURES, "trained_on": self.trained_on,
                             "fitted_at": self.fitted_at, "model": self._model, "ref": self._ref,
                             "spread": self._spread})

    @classmethod
    def from_bytes(cls, settings: MultivariateSettings, data: bytes) -> MultivariateModel:
        doc = pickle.loads(data)
        if doc.get("format") != 1 or tuple(doc.get("features", ())) != FEATURES:
            raise ValueError("model bytes: unknown format or feature set; refit needed")
        return cls(settings, version=doc["version"], trained_on=doc["trained_on"], fitted_at=doc["fitted_at"],
                   _model=doc["model"], _ref=doc["ref"], _spread=doc["spread"])
