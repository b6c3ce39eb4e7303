"""The one shape of a detector: records in, with the caller's clock, findings out.

Every detector of the stages (:mod:`fleetmedic.models.stages`) is called the same way::

    findings = detector.detect(records, now)

- ``records``: the records it reads, in the order they arrived (one record, or a micro-batch);
  each detector reads one kind (:class:`~fleetmedic.records.DetectionTelemetry`,
  :class:`~fleetmedic.records.KernelEvent`, :class:`~fleetmedic.records.PortTelemetry`,
  :class:`~fleetmedic.records.JobEvent`).
- ``now``: the clock the caller injects, in event time (the newest stamp among ``records`` for the
  stages; never the wall clock). A detector that judges by the records' own stamps ignores it.
- the result: the findings, in the order the records gave rise to them.

Pure: no I/O, no clock of its own. What a detector keeps between calls is saved and loaded through
the one state protocol (:mod:`fleetmedic.models.state`): :class:`NodeDetector` per node
(:class:`~fleetmedic.models.state.NodeState`, and ``forget(node)`` for a node evicted or moved to
another worker; stage 1), :class:`FleetDetector` as a whole
(:class:`~fleetmedic.models.state.State`; the fleet-wide stage).

- :class:`~fleetmedic.models.gpu_detector.GpuDetector`: GPU telemetry (a micro-batch; its
  ``batch=`` takes the columns when the caller converted them already), a :class:`NodeDetector`.
- :class:`~fleetmedic.models.kernel_events.KernelEventDetector`: kernel-log lines, a
  :class:`NodeDetector` (the XIDs it finds go to the GPU detector it is built with).
- :class:`~fleetmedic.models.port_detector.PortDetector`: NIC and switch port counters, both a
  :class:`NodeDetector` (a host's NICs, stage 1) and a :class:`FleetDetector` (switches).
- :class:`~fleetmedic.models.straggler.StragglerDetector`: job events, a :class:`FleetDetector`.

The peer comparison (:class:`~fleetmedic.models.peers.PeerComparison`) and the multivariate model
(:class:`~fleetmedic.models.multivariate.MultivariateModel`) are not detectors of records: the
first keeps node summaries and judges the groups its stage names on the stage's tick, the second
judges the feature vectors of the windows stage 1 closes; their stages call them.
``tests/models/test_conformance.py`` runs every detector through this shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar, runtime_checkable

from fleetmedic.records import Finding

R_contra = TypeVar("R_contra", contravariant=True)


@runtime_checkable
class Detector(Protocol[R_contra]):
    """Records in, with the injected clock ``now`` (event time), findings out."""

    def detect(self, records: Sequence[R_contra], now: float) -> list[Finding]: ...


@runtime_checkable
class NodeDetector(Detector[R_contra], Protocol[R_contra]):
    """A detector whose state is kept, saved and loaded per node (stage 1)."""

    def node_bytes(self, node: str) -> bytes | None: ...

    def load_node(self, node: str, data: bytes) -> None: ...

    def forget(self, node: str) -> None: ...


@runtime_checkable
class FleetDetector(Detector[R_contra], Protocol[R_contra]):
    """A detector whose state is saved and loaded whole (the fleet-wide stage)."""

    def state_bytes(self) -> bytes: ...

    def load_state(self, data: bytes) -> None: ...
