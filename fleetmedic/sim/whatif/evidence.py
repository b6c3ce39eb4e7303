"""What fleetmedic's inputs would carry for a fault's evidence, built the way the real sources build it.

- ``xid:<code>``: the driver's ``NVRM: Xid`` line, classified by the kernel-log exporter's mapper
  (:class:`~fleetmedic.connectors.kernel.kmsg_map.KmsgMapper`, the shipped log-pattern library) into the
  :class:`~fleetmedic.records.KernelEvent` stage 1 reads.
- ``ib_link_down``, ``nic_speed_low``: the node's NIC port as the InfiniBand connector reports it
  (:class:`~fleetmedic.records.PortTelemetry`), first healthy, then down or trained low; stage 1's
  port detector makes the finding.
- ``node_condition:<Type>[=<Status>]``: the Node as the watch lists it, through the shipped condition
  rules (:class:`~fleetmedic.connectors.kube.node_conditions.ConditionTracker`).
- GPU-counter evidence (``pcie_width_low``, ``thermal_slowdown``, ``power_brake``, ``nvlink_errors``,
  ``ecc_sbe_rate``) and ``straggler``: the finding the GPU detector (or the straggler detector)
  emits for it, with its detector, kind, severity, metric and action hint
  (:mod:`fleetmedic.models.gpu_detector`); degradations are reasserted every
  ``detection.reassert_s`` while they last, as the detectors reassert a condition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.connectors.kernel.kmsg_map import KernelRecord, KmsgMapper, pci_key
from fleetmedic.connectors.kube.node_conditions import ConditionTracker
from fleetmedic.remediation.log_patterns import PatternLibrary
from fleetmedic.sim import xids

GPU_BUS: Final = "3b"  # the faulty GPU's PCI bus in the replay (GPU 0)
PORT: Final = "mlx5_0/1"
PORT_SPEED_GBPS: Final = 400.0

#: GPU-counter evidence -> (detector, kind, severity, metric, hint, summary)
_GPU_FINDINGS: Final[dict[str, tuple[str, r.FindingKind, r.Severity, str, str, str]]] = {
    "pcie_width_low": ("pcie_width", "degradation", "warning", "pcie_link_width", "",
                       "GPU 0 PCIe link width dropped to x8"),
    "thermal_slowdown": ("hard_rules", "hard_fault", "critical", "clocks_event_reasons", "isolate",
                         "GPU 0: HW thermal slowdown (over-temperature protection; cooling failed)"),
    "power_brake": ("power_brake", "hard_fault", "critical", "clocks_event_reasons", "isolate",
                    "HW power brake on 8 of 8 GPUs: power delivery (PSU) fault"),
    "nvlink_errors": ("gpu_siblings", "degradation", "warning", "nvlink_error_rate", "",
                      "GPU 0 nvlink_error_rate far above its siblings'"),
    "ecc_sbe_rate": ("gpu_siblings", "degradation", "warning", "ecc_sbe_rate", "",
                     "GPU 0 ecc_sbe_rate far above its siblings'"),
    "straggler": ("straggler", "degradation", "warning", "step_time_s", "",
                  "rank on this node is a straggler (step time above its peers')"),
}
#: evidence a detector keeps reasserting while the fault lasts
REASSERTED: Final = frozenset({"pcie_width_low", "nvlink_errors", "ecc_sbe_rate", "straggler", "nic_speed_low",
                               "ib_link_down", "thermal_slowdown", "power_brake"})


@dataclass
class EvidenceSource:
    """Builds the records of one kind of evidence on a node (keeps the mappers and trackers that
    need memory: the kernel-log joiner, the condition tracker)."""

    settings: Settings
    library: PatternLibrary
    _mappers: dict[str, KmsgMapper] = field(default_factory=dict)
    _conditions: ConditionTracker | None = None
    _seq: int = 0

    def kernel(self, node: str, code: int, ts: float) -> list[r.Record]:
        mapper = self._mappers.get(node)
        if mapper is None:
            mapper = self._mappers[node] = KmsgMapper(node, self.library, {pci_key(f"0000:{GPU_BUS}:00.0"): 0},
                                                      {}, f"boot-{node}")
        self._seq += 1
        out = mapper.map([KernelRecord(message=xids.nvrm_line(code, GPU_BUS), ts=ts, seq=self._seq)], ts)
        return out.records + mapper.due(ts, flush=True).records

    def ports(self, node: str, kind: str, ts: float, first: bool = True) -> list[r.PortTelemetry]:
        """The port healthy 30 s before (``first``), then as the fault leaves it."""
        healthy = r.PortTelemetry(device=node, device_kind="host", ts=ts - 30.0, source="whatif", ports=[
            r.PortSample(port=PORT, node=node, link_state="up", speed_gbps=PORT_SPEED_GBPS, width=4)])
        sample = (r.PortSample(port=PORT, node=node, link_state="down", speed_gbps=0.0, width=4)
                  if kind == "ib_link_down" else
                  r.PortSample(port=PORT, node=node, link_state="up", speed_gbps=PORT_SPEED_GBPS / 2, width=4))
        now = r.PortTelemetry(device=node, device_kind="host", ts=ts, source="whatif", ports=[sample])
        return [healthy, now] if first else [now]

    def condition(self, node: str, spec: str, ts: float) -> list[r.Finding]:
        if self._conditions is None:
            self._conditions = ConditionTracker.of(self.settings)
        ctype, _, status = spec.partition("=")
        stamp = f"{ts:.3f}"
        obj: dict[str, Any] = {"metadata": {"name": node}, "status": {"conditions": [
            {"type": ctype, "status": status or "True", "reason": "Whatif", "lastTransitionTime": stamp,
             "message": f"{ctype} (replayed fault)"}]}}
        found = self._conditions.observe("MODIFIED", obj, ts)
        self._conditions.forget(node)  # the next fault on this node is a new change
        return found

    def condition_cleared(self, node: str, spec: str, ts: float) -> list[r.Finding]:
        """The finding the node watch makes when ``spec``'s condition goes back to normal."""
        ctype, _, status = spec.partition("=")
        tracker = ConditionTracker.of(self.settings)

        def node_obj(st: str) -> dict[str, Any]:
            return {"metadata": {"name": node}, "status": {"conditions": [
                {"type": ctype, "status": st, "reason": "Whatif", "lastTransitionTime": f"{ts:.3f}"}]}}

        tracker.observe("MODIFIED", node_obj(status or "True"), ts)
        healthy = "True" if ctype == "Ready" else "False"
        return tracker.observe("MODIFIED", node_obj(healthy), ts)

    def gpu_finding(self, node: str, kind: str, ts: float, job: str = "") -> r.Finding:
        detector, fkind, severity, metric, hint, summary = _GPU_FINDINGS[kind]
        gpu = None if kind in ("power_brake", "straggler") else 0
        ev = r.Evidence(detector=detector, metric=metric, gpu=gpu, ts=ts, note="whatif replay")
        return r.Finding(id=f"{node}:whatif:{kind}:{ts:.3f}", ts=ts, node=node, detector=detector, kind=fkind,
                         severity=severity, summary=summary, evidence=[ev], gpu=gpu, job=job, action_hint=hint)


#: what a job's failed rank logs, by evidence (the log-pattern library classifies these lines)
def failure_lines(evidence: str) -> tuple[int, str, list[str]]:
    """(exit code, reason, log excerpt) of a rank that died of ``evidence``."""
    head = evidence.split(":", 1)[0]
    if head == "xid":
        return 1, "Error", ["RuntimeError: CUDA error: unspecified launch failure",
                            "CUDA kernel errors might be asynchronously reported at some other API call"]
    if head in ("ib_link_down", "nic_speed_low"):
        return 1, "Error", ["NCCL WARN NET/IB : Got completion from peer with error 12, opcode 0, len 0, "
                            "vendor err 129 (Recv)", "RuntimeError: NCCL communicator was aborted"]
    if head == "node_condition":
        return -1, "NodeLost", ["pod's node is NotReady"]
    if head == "software":
        return 1, "Error", ["Traceback (most recent call last):", "AssertionError: shape mismatch in attention"]
    return 1, "Error", ["RuntimeError: NCCL communicator was aborted on rank; watchdog caught collective operation "
                        "timeout"]
