"""Ground truth: one :class:`TruthRecord` per injected fault (``truth.jsonl``), and the run's
:class:`RunMeta` (``meta.json``: fleet size, time span, names) the scorer needs for rates.

These are the simulator's own records, not a Kafka topic. Field meanings:

- ``kind`` (e.g. ``xid79``, ``straggler``, ``leaf_switch``) and ``class``: ``hardware``,
  ``degradation``, ``network``, ``transient_software``, ``job_bug`` or ``negative_control``;
- ``component``: what is broken — ``gpu``, ``node``, ``nic``, ``link``, ``switch`` or ``job``;
- ``blame``: the suspects a correct attribution names (any one of them is right; more specific
  first), e.g. ``gpu gpu-node-0003/2`` then ``node gpu-node-0003``; for a leaf failure only the
  switch; for a job bug only the job;
- ``expected_response``: ``isolate_node`` (cordon/drain, diagnose; for degradation at a job
  boundary), ``isolate_link`` (take the node behind the bad cable out, replace the cable),
  ``isolate_switch`` (the switch is at fault — do not blame each node behind it),
  ``retry_in_place`` (transient software: retry, do not isolate), ``fix_job`` (a bug in the job:
  no node is at fault, retrying does not help) or ``no_action`` (negative controls);
- ``isolate_nodes``: nodes whose isolation during ``[onset, end]`` is justified (for a leaf failure,
  the nodes behind it — their rail is down — although none of them is to blame);
- ``nodes``: every node the fault touches; ``affected_jobs``: jobs with ranks on them while active
  (for job-level faults, the target job);
- ``onset``/``end``: simulated epoch seconds; ``end`` is when the fault would stop by itself (a
  hardware fault: when a technician would have fixed it without the closed loop); ``cleared_at``/
  ``cleared_by`` record an earlier end caused by a remediation (``reset_gpu``, ``reboot_node``,
  ``escalate`` …);
- ``unobserved``: why no telemetry or job could show the fault (``repair``: it began and ended while
  its nodes were away for repair, powered off on a technician's bench); the scorer leaves such faults
  out of detection recall and counts them apart;
- ``symptoms``: what the fault claims to produce in telemetry and job events (the tests check them).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import msgspec
from msgspec import Struct, field

FaultClass = Literal["hardware", "degradation", "network", "transient_software", "job_bug", "negative_control"]
Component = Literal["gpu", "node", "nic", "link", "switch", "job"]
ExpectedResponse = Literal[
    "isolate_node", "isolate_link", "isolate_switch", "retry_in_place", "fix_job", "no_action"
]
SuspectKindT = Literal["node", "gpu", "link", "switch", "job"]


class Blame(Struct, frozen=True, kw_only=True):
    kind: SuspectKindT
    name: str


class TruthRecord(Struct, frozen=True, kw_only=True):
    id: str
    kind: str
    fault_class: FaultClass = field(name="class")
    component: Component
    onset: float
    end: float
    expected_response: ExpectedResponse
    blame: list[Blame] = []
    node: str = ""
    nodes: list[str] = []
    isolate_nodes: list[str] = []
    gpu: int | None = None
    port: str = ""
    switch: str = ""
    job: str = ""
    affected_jobs: list[str] = []
    xids: list[int] = []
    symptoms: list[str] = []
    source: str = ""
    description: str = ""
    params: dict[str, str] = {}
    cleared_at: float | None = None
    cleared_by: str = ""
    unobserved: str = ""  # "repair": it began and ended while its nodes were away for repair

    @property
    def is_negative_control(self) -> bool:
        return self.fault_class == "negative_control"

    @property
    def is_software(self) -> bool:
        """Faults for which isolating a node is always wrong."""
        return self.fault_class in ("transient_software", "job_bug", "negative_control")


class RunMeta(Struct, frozen=True, kw_only=True):
    seed: int
    start: float
    end: float
    nodes: list[str]
    gpus_per_node: int
    switches: list[str] = []
    racks: dict[str, str] = {}  # node -> rack
    leaf_of: dict[str, list[str]] = {}  # node -> leaves behind its NICs
    faults_spec: str = ""
    gpu_interval_s: float = 10.0
    port_interval_s: float = 30.0

    @property
    def node_days(self) -> float:
        return len(self.nodes) * max(0.0, self.end - self.start) / 86_400.0


_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder(TruthRecord)


def write_truth(path: Path, records: Iterable[TruthRecord]) -> None:
    with path.open("wb") as fh:
        for r in records:
            fh.write(_enc.encode(r) + b"\n")


def read_truth(path: Path) -> list[TruthRecord]:
    return [_dec.decode(line) for line in path.read_bytes().splitlines() if line.strip()]


def write_meta(path: Path, meta: RunMeta) -> None:
    path.write_bytes(msgspec.json.format(_enc.encode(meta), indent=2) + b"\n")


def read_meta(path: Path) -> RunMeta:
    return msgspec.json.decode(path.read_bytes(), type=RunMeta)
