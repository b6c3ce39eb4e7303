"""Stage 1's reading of a node's kernel log: :class:`~fleetmedic.records.KernelEvent` -> findings.

- **XIDs** (an ``NVRM: Xid`` line, or an XID in the driver's own words, on a GPU the node's map
  knows) go to the GPU detector's XID rules (:meth:`~fleetmedic.models.gpu_detector.GpuDetector.observe_events`):
  the same XID from NVML or dcgm within ``detection.xid_dedup_window_s`` is one event, not two
  (:mod:`fleetmedic.models.event_dedup`), and nothing of the node's metric state moves.
- **SXids** point at the NVSwitch: the finding names the switch (``nvidia-nvswitch3``) and its
  PCI address, in its summary and as the evidence's ``port`` (``nvswitch:<pci>``); a fatal SXid is
  a critical hard fault that isolates the node (its NVLink fabric is broken), a non-fatal one a
  degradation.
- **PCIe AER** errors point at the device at the PCI address the line names: a GPU of the node's map
  (the finding's ``gpu``), a NIC port (the finding's ``port``), or the address itself. Uncorrected
  fatal errors are critical hard faults, non-fatal ones warnings.
- **Other device faults** (machine checks, EDAC, GSP, mlx5 driver errors) become findings of their
  class: hardware -> ``hard_fault``, degradation -> ``degradation``, network -> ``network``.

Lines of severity ``info`` (corrected errors, a slower PCIe link) make no finding: they stay on the
``kernel.events`` topic for dashboards. A condition (node, signal, device) is reported once, then
again only after ``detection.reassert_s`` of event time: an AER storm is one finding. That memory
is kept per node in the worker (not in the saved state: a restarted worker may report a condition
once more). Pure: no I/O, no clock.
"""

from __future__ import annotations

from fleetmedic.config import DetectionSettings
from fleetmedic.models.event_dedup import KERNEL
from fleetmedic.models.gpu_detector import GpuDetector
from fleetmedic.records import Evidence, Finding, FindingKind, KernelEvent, XidEvent

DETECTOR = "kernel_log"
_KINDS: dict[str, FindingKind] = {"hardware": "hard_fault", "degradation": "degradation", "network": "network"}


class KernelEventDetector:
    def __init__(self, settings: DetectionSettings) -> None:
        self.settings = settings
        self._reported: dict[str, dict[str, float]] = {}  # node -> condition -> event time last reported

    def observe(self, ev: KernelEvent, gpu: GpuDetector) -> list[Finding]:
        if ev.xid is not None and ev.gpu is not None:
            xid = XidEvent(gpu=ev.gpu, xid=ev.xid, ts=ev.ts, message=f"kernel log: {ev.message}"[:4096])
            return gpu.observe_events(ev.node, float(ev.ts), [xid], ev.gpus, KERNEL)
        kind = _KINDS.get(ev.incident_class)
        if kind is None or ev.severity == "info":
            return []
        where, subject = _subject(ev)
        key = f"{ev.signal}:{subject}"
        seen = self._reported.setdefault(ev.node, {})
        last = seen.get(key)
        if last is not None and ev.ts - last < self.settings.reassert_s and ev.ts >= last:
            return []
        seen[key] = float(ev.ts)
        code = f" {ev.code}" if ev.code else ""
        what = {"sxid": f"SXid{code}", "pcie": "PCIe uncorrected (AER) error"}.get(ev.signal, f"{ev.signal}{code}")
        if ev.signal == "pcie" and ev.severity == "critical":
            what = "PCIe uncorrected fatal (AER) error"
        critical = ev.severity == "critical"
        hint = "isolate" if kind == "hard_fault" and critical else "investigate"
        evidence = Evidence(detector=DETECTOR, metric=ev.signal, value=float(ev.code) if ev.code.isdigit() else None,
                            gpu=ev.gpu, port=ev.port or (f"nvswitch:{ev.pci}" if ev.device == "nvswitch" else ""),
                            ts=ev.ts, note=f"{ev.pattern}: {ev.message}"[:4000])
        return [Finding(id=f"{ev.node}:{DETECTOR}:{key}:{ev.ts:.3f}", ts=ev.ts, node=ev.node, detector=DETECTOR,
                        kind=kind, severity="critical" if critical else "warning",
                        summary=f"{what} on {where} (kernel log)"[:4096], evidence=[evidence], gpu=ev.gpu,
                        port=ev.port, action_hint=hint)]

    def forget(self, node: str) -> None:
        self._reported.pop(node, None)


def _subject(ev: KernelEvent) -> tuple[str, str]:
    """What the event points at: words for the summary, and a key for the hysteresis."""
    if ev.device == "nvswitch":
        name = f"{ev.switch} " if ev.switch else ""
        return f"NVSwitch {name}({ev.pci or 'PCI address not logged'})", f"nvswitch:{ev.pci or ev.switch}"
    if ev.gpu is not None:
        return f"GPU {ev.gpu} ({ev.pci})", f"gpu:{ev.gpu}"
    if ev.port:
        return f"NIC port {ev.port} ({ev.pci})", f"port:{ev.port}"
    if ev.pci:
        return f"PCI device {ev.pci}", f"pci:{ev.pci}"
    return f"the node ({ev.device or 'kernel'})", ev.device or "node"
