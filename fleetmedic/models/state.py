"""The one way the models save and load their state: bytes out, bytes loaded into an object built
with the same settings.

Stage 1 writes each node's state to its compacted state topic and the decision stage writes its
whole state in a snapshot to another (:mod:`fleetmedic.streams.state`); a restarted or newly
assigned worker builds its models from the settings and loads those bytes into them. Two
protocols, one per kind of state:

- :class:`State`: an object's whole state. ``state_bytes()`` writes it; ``load_state(data)``
  replaces the state of this object (built with the same settings) with what ``state_bytes``
  wrote. :class:`~fleetmedic.models.stages.FleetDetection`,
  :class:`~fleetmedic.models.peers.PeerComparison`,
  :class:`~fleetmedic.models.straggler.StragglerDetector`,
  :class:`~fleetmedic.models.port_detector.PortDetector`,
  :class:`~fleetmedic.models.multivariate.MultivariateModel` and
  :class:`~fleetmedic.models.baseline.EwmaBaseline`.
- :class:`NodeState`: state kept per node, saved and loaded one node at a time (what stage 1 needs:
  its nodes move between workers with their partitions). ``node_bytes(node)`` writes the node's
  part (None: nothing kept for it); ``load_node(node, data)`` loads it into this object, whatever
  it keeps for other nodes staying as it is. :class:`~fleetmedic.models.gpu_detector.GpuDetector`,
  :class:`~fleetmedic.models.port_detector.PortDetector` (a host's NIC ports),
  :class:`~fleetmedic.models.kernel_events.KernelEventDetector` (the kernel-log conditions it
  reported) and :class:`~fleetmedic.models.multivariate.NodeWindowFeatures` (the node's open window).

Other saved parts are named the same way, ``<part>_bytes`` / ``load_<part>``: the multivariate
model's rows of some nodes (``MultivariateModel.state_bytes(keep)``, several merged with
``load_parts``) and :class:`~fleetmedic.models.stages.NodeDetection`'s per-node multivariate memory
(open window, outlier streak: ``multivariate_bytes`` / ``load_multivariate``).

Loading refuses a value no running detector can hold (:func:`require_finite`): a baseline, a
count or a time that is NaN or infinite raises :class:`ValueError` naming the part, and stage 1
starts that node fresh (counted in ``fleetmedic_state_unreadable_total``) rather than load
baselines that would blind it (every comparison with a NaN is false: no finding, ever).

The bytes are a stable format (msgpack; a ``.npy`` array for the
:class:`~fleetmedic.models.baseline.EwmaBaseline`): what an older worker wrote loads into a newer
one. ``tests/models/test_conformance.py`` runs every implementation through the round trip, the
detectors mid-stream.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike


@runtime_checkable
class State(Protocol):
    """Whole-object state, loaded in place into an object built with the same settings."""

    def state_bytes(self) -> bytes: ...

    def load_state(self, data: bytes) -> None: ...


@runtime_checkable
class NodeState(Protocol):
    """State kept per node, saved and loaded one node at a time."""

    def node_bytes(self, node: str) -> bytes | None: ...

    def load_node(self, node: str, data: bytes) -> None: ...


def require_finite(part: str, values: ArrayLike | Iterable[float], nan_is_none: bool = False) -> None:
    """Raise :class:`ValueError` naming ``part`` if ``values`` hold an infinity, or a NaN (unless
    ``nan_is_none``: parts where NaN stands for "no value yet", such as a previous sample)."""
    arr = values if isinstance(values, np.ndarray) else np.asarray(list(values), dtype=np.float64)  # type: ignore[arg-type]
    bad = np.isinf(arr) if nan_is_none else ~np.isfinite(arr)
    if bad.any():
        raise ValueError(f"{part}: {int(bad.sum())} of {bad.size} values are "
                         f"{'infinite' if nan_is_none else 'NaN or infinite'}; saved state must be finite")


def require_finite_time(part: str, value: float | None) -> None:
    """Raise :class:`ValueError` naming ``part`` if the time ``value`` is infinite (NaN: not known)."""
    if value is not None and math.isinf(value):
        raise ValueError(f"{part}: {value} is no time; saved state must be finite")
