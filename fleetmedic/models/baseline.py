"""Robust running baselines: exponentially weighted mean and variance, vectorised over any shape.

``EwmaBaseline`` keeps, for every element of an array (e.g. ``[gpus, signals]`` of one node, or
``[nodes, gpus, signals]`` of a micro-batch), an exponentially weighted mean and variance with a
half-life in samples. Two methods:

- :meth:`score` standardises a new observation against the baseline (a z-score; NaN while warming
  up or when the value is missing);
- :meth:`learn` folds an observation in, except where ``protect`` says not to (the caller passes
  ``|z| > protect_z`` so that anomalies do not poison the baseline, as river's ``AnomalyFilter``).

The state is three arrays (count, mean, var); it saves and loads as bytes
(:class:`~fleetmedic.models.state.State`) and merges (two baselines of the same element learned on
disjoint data combine by their effective weights). Pure numpy.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fleetmedic.models.state import require_finite

F64 = NDArray[np.float64]


@dataclass
class EwmaBaseline:
    count: F64  # samples learned (saturates: it only gates warm-up)
    mean: F64
    var: F64

    @classmethod
    def empty(cls, shape: tuple[int, ...]) -> EwmaBaseline:
        return cls(np.zeros(shape), np.zeros(shape), np.zeros(shape))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.mean.shape)

    def score(self, x: F64, warmup: int, min_std: float | F64) -> F64:
        """z-score of ``x`` against the baseline; NaN where warming up or ``x`` is missing."""
        std = np.sqrt(self.var)
        np.maximum(std, min_std, out=std)
        z = (x - self.mean) / std
        z[self.count < warmup] = np.nan
        return z

    def learn(self, x: F64, alpha: float, protect: NDArray[np.bool_] | None = None) -> None:
        """Fold ``x`` in with weight ``alpha`` where it is finite and not protected."""
        take = np.isfinite(x)
        if protect is not None:
            take &= ~protect
        first = take & (self.count == 0)
        # West's exponentially weighted update: mean += a*d; var = (1-a)*(var + a*d^2)
        d = np.where(take, x - self.mean, 0.0)
        a = np.where(first, 1.0, np.where(take, alpha, 0.0))
        self.mean += a * d
        self.var = np.where(first, 0.0, (1.0 - a) * (self.var + a * d * d))
        self.count += take

    def merge(self, other: EwmaBaseline) -> EwmaBaseline:
        """Combine two baselines of the same elements, weighting each by its sample count."""
        n = self.count + other.count
        w = np.divide(self.count, n, out=np.zeros_like(n), where=n > 0)
        mean = w * self.mean + (1 - w) * other.mean
        var = w * (self.var + (self.mean - mean) ** 2) + (1 - w) * (other.var + (other.mean - mean) ** 2)
        return EwmaBaseline(n, mean, var)

    def state_bytes(self) -> bytes:
        """The three arrays as one float32 ``.npy`` array ``[3, *shape]``."""
        buf = io.BytesIO()
        np.save(buf, np.stack([self.count, self.mean, self.var]).astype(np.float32), allow_pickle=False)
        return buf.getvalue()

    def load_state(self, data: bytes) -> None:
        """Replace the arrays with what :meth:`state_bytes` wrote (their shape with them)."""
        arr = np.load(io.BytesIO(data), allow_pickle=False).astype(np.float64)
        require_finite("baseline", arr)
        self.count, self.mean, self.var = arr[0].copy(), arr[1].copy(), arr[2].copy()


def alpha_for_halflife(halflife_samples: float) -> float:
    """EWMA weight whose influence halves after ``halflife_samples`` samples."""
    return float(1.0 - 0.5 ** (1.0 / halflife_samples))
