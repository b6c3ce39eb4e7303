"""The detector contracts every detector in :mod:`fleetmedic.models` follows.

Two levels, both with serialisable state (it lives in Faust table changelogs):

- :class:`ScalarDetector`: one numeric stream, river-style ``learn_one`` / ``score_one``, state
  that round-trips through bytes and merges (two detectors that learned disjoint parts of a stream
  combine). :class:`EwmaScalar` is the reference implementation, over :class:`EwmaBaseline`.
- :class:`StreamDetector`: a detector of wire records (``observe(record) -> findings``) whose whole
  state exports to bytes and imports back; the vectorised batch path is an extra method where it
  pays (:meth:`fleetmedic.models.gpu_detector.GpuDetector.observe_batch`).

The conformance suite in ``tests/models/test_conformance.py`` runs against every implementation.
"""

from __future__ import annotations

import math
from typing import Protocol, TypeVar, runtime_checkable

import numpy as np

from fleetmedic.models.baseline import EwmaBaseline, alpha_for_halflife
from fleetmedic.records import Finding

R_contra = TypeVar("R_contra", contravariant=True)


@runtime_checkable
class ScalarDetector(Protocol):
    def learn_one(self, x: float) -> None: ...
    def score_one(self, x: float) -> float: ...
    def to_bytes(self) -> bytes: ...


class StreamDetector(Protocol[R_contra]):
    def observe(self, record: R_contra) -> list[Finding]: ...


class EwmaScalar:
    """|z| of a value against an EWMA baseline; protected learning (anomalies are not learned)."""

    def __init__(self, halflife: float = 120.0, warmup: int = 30, min_std: float = 1e-6, protect_z: float = 4.0):
        self.halflife, self.warmup, self.min_std, self.protect_z = halflife, warmup, min_std, protect_z
        self.alpha = alpha_for_halflife(halflife)
        self.state = EwmaBaseline.empty((1,))

    def score_one(self, x: float) -> float:
        if not math.isfinite(x):
            return math.nan
        z = self.state.score(np.array([x]), self.warmup, self.min_std)[0]
        return float(abs(z))

    def learn_one(self, x: float) -> None:
        if not math.isfinite(x):
            return
        z = self.score_one(x)
        protect = np.array([math.isfinite(z) and z > self.protect_z])
        self.state.learn(np.array([x], dtype=np.float64), self.alpha, protect)

    def merge(self, other: EwmaScalar) -> EwmaScalar:
        merged = EwmaScalar(self.halflife, self.warmup, self.min_std, self.protect_z)
        merged.state = self.state.merge(other.state)
        return merged

    def to_bytes(self) -> bytes:
        return self.state.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes, **kwargs: float) -> EwmaScalar:
        det = cls(**kwargs)  # type: ignore[arg-type]
        det.state = EwmaBaseline.from_bytes(data)
        return det
