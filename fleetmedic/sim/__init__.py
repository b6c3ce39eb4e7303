"""Fleet simulator with fault injection, ground truth and scoring.

Pure and deterministic per seed: no Kafka, Kubernetes, Prometheus or NVML libraries, simulated time
only, every random draw from ``numpy.random.Generator`` streams derived from the seed.

Public API:

- :class:`Simulator` / :class:`SimConfig` (:mod:`.engine`): the in-process generator. ``run()`` yields
  :class:`TickOutput` per GPU sampling round: a columnar :class:`GpuBatch`, a :class:`PortBatch` every
  port interval, :class:`~fleetmedic.records.JobEvent` and :class:`~fleetmedic.records.RemediationResult`
  lists. ``submit(RemediationCommand)`` closes the loop; ``truth()``, ``meta()`` and ``accounting()``
  report the injected faults, the run and the closed loop's measurements.
- :class:`GpuBatch` / :class:`PortBatch` (:mod:`.batch`): field-major numpy arrays a detector can read
  directly (``column``, ``metrics_array``), or materialise as records (``to_records``, ``encode_jsonl``).
- :func:`plan_faults` / :data:`KINDS` (:mod:`.fault_spec`, :mod:`.faults`): the ``--faults`` grammar
  and the fault library; :mod:`.trace` replays the StepFun trace.
- :class:`TruthRecord` / :class:`RunMeta` (:mod:`.truth`), :func:`score` / :class:`ScoreReport`
  (:mod:`.scoring`), :class:`Accounting` (:mod:`.closed_loop`).
- :mod:`.exposition` (Prometheus text), :mod:`.files` (a run to a directory).
"""

from fleetmedic.evaluation.scoring import ScoreReport, score
from fleetmedic.evaluation.truth import RunMeta, TruthRecord
from fleetmedic.sim.batch import GPU_FIELDS, PORT_FIELDS, GpuBatch, PortBatch
from fleetmedic.sim.closed_loop import Accounting, LoopSpec
from fleetmedic.sim.engine import SimConfig, Simulator, TickOutput, simulate
from fleetmedic.sim.fault_spec import plan_faults
from fleetmedic.sim.faults import KINDS
from fleetmedic.sim.fleet import FleetSpec
from fleetmedic.sim.telemetry import NoiseSpec
from fleetmedic.sim.units import parse_duration
from fleetmedic.sim.workload import WorkloadSpec

__all__ = [
    "GPU_FIELDS",
    "KINDS",
    "PORT_FIELDS",
    "Accounting",
    "FleetSpec",
    "GpuBatch",
    "LoopSpec",
    "NoiseSpec",
    "PortBatch",
    "RunMeta",
    "ScoreReport",
    "SimConfig",
    "Simulator",
    "TickOutput",
    "TruthRecord",
    "WorkloadSpec",
    "parse_duration",
    "plan_faults",
    "score",
    "simulate",
]
