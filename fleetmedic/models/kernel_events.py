"""Stage 1's reading of a node's kernel log: :class:`~fleetmedic.records.KernelEvent` -> findings.

- **XIDs** (an ``NVRM: Xid`` line, or an XID in the driver's own words, on a GPU the node's map
  knows) go to the GPU detector's XID rules (:meth:`~fleetmedic.models.gpu_detector.GpuDetector.observe_events`):
  the same XID from NVML or dcgm within ``detection.xid_dedup_window_s`` is one event, not two
  (:mod:`fleetmedic.models.event_dedup`), and nothing of the node's metric state moves. An XID on
  a GPU the exporter could not map to an index (no NVML, no ``--pci-map``) is judged by the XID
  catalog alone: a finding of detector ``xid_rules`` naming the GPU by its PCI address, without an
  index (an XID that isolates isolates the node, which needs none), once per ``reassert_s``.
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
is kept per node and saved with the node's state (:class:`~fleetmedic.models.state.NodeState`:
``node_bytes`` / ``load_node``), so a restarted worker, or the one its partition moves to, does not
report a condition again; a node keeps the :data:`MAX_CONDITIONS` latest conditions (a log naming
ever new devices cannot grow it without bound). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec

from fleetmedic.config import DetectionSettings
from fleetmedic.models.event_dedup import KERNEL
from fleetmedic.models.gpu_detector import GpuDetector
from fleetmedic.models.state import require_finite
from fleetmedic.records import Evidence, Finding, FindingKind, KernelEvent, Severity, XidEvent

DETECTOR = "kernel_log"
_KINDS: dict[str, FindingKind] = {"hardware": "hard_fault", "degradation": "degradation", "network": "network"}
#: conditions remembered per node; past it, the least recently reported half is forgotten
MAX_CONDITIONS: Final = 512
_decode_seen = msgspec.msgpack.Decoder(dict[str, float]).decode


class KernelEventDetector:
    """Findings from kernel-log lines; the XIDs among them go to ``gpu``, the node's GPU detector."""

    def __init__(self, settings: DetectionSettings, gpu: GpuDetector) -> None:
        self.settings = settings
        self.gpu = gpu
        self._reported: dict[str, dict[str, float]] = {}  # node -> condition -> event time last reported

    def detect(self, records: Sequence[KernelEvent], now: float) -> list[Finding]:
        """Findings for kernel-log lines, in order (:class:`~fleetmedic.models.detector.Detector`):
        the lines' own stamps time them, ``now`` is not read."""
        if len(records) == 1:
            return self.observe(records[0])
        return [f for ev in records for f in self.observe(ev)]

    def observe(self, ev: KernelEvent) -> list[Finding]:
        gpu = self.gpu
        if ev.xid is not None and ev.gpu is not None:
            xid = XidEvent(gpu=ev.gpu, xid=ev.xid, ts=ev.ts, message=f"kernel log: {ev.message}"[:4096])
            return gpu.observe_events(ev.node, float(ev.ts), [xid], ev.gpus, KERNEL)
        if ev.xid is not None and ev.device == "gpu":
            return self._unmapped_xid(ev, ev.xid, gpu)
        kind = _KINDS.get(ev.incident_class)
        if kind is None or ev.severity == "info":
            return []
        where, subject = _subject(ev)
        key = f"{ev.signal}:{subject}"
        if not self._reassert(ev, key):
            return []
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

    def _unmapped_xid(self, ev: KernelEvent, code: int, gpu: GpuDetector) -> list[Finding]:
        """An XID on a GPU known by its PCI address only: the catalog's verdict, without an index."""
        info = gpu.catalog.lookup(code)
        if info.action == "ignore" or not self._reassert(ev, f"xid:{code}:pci:{ev.pci}"):
            return []
        severity: Severity = "critical" if info.isolates else "warning" if info.action == "investigate" else "info"
        where = f"the GPU at PCI {ev.pci or 'address not logged'} (index unknown)"
        note = f"{info.mnemonic} ({info.bucket or 'not in catalog'}): kernel log: {ev.message}"
        evidence = Evidence(detector="xid_rules", metric="xid", value=float(code), ts=ev.ts, note=note[:4000])
        return [Finding(id=f"{ev.node}:xid_rules:{code}:pci:{ev.pci}:{ev.ts:.3f}", ts=ev.ts, node=ev.node,
                        detector="xid_rules", kind="hard_fault", severity=severity,
                        summary=f"XID {code} ({info.mnemonic}) on {where}"[:4096], evidence=[evidence],
                        action_hint=info.action)]

    def _reassert(self, ev: KernelEvent, key: str) -> bool:
        """Whether the condition ``key`` of ``ev``'s node is reported now (first, or ``reassert_s``
        after it was last)."""
        seen = self._reported.setdefault(ev.node, {})
        last = seen.get(key)
        if last is not None and ev.ts - last < self.settings.reassert_s and ev.ts >= last:
            return False
        seen[key] = float(ev.ts)
        if len(seen) > MAX_CONDITIONS:
            self._reported[ev.node] = _latest(seen, MAX_CONDITIONS // 2)
        return True

    def forget(self, node: str) -> None:
        self._reported.pop(node, None)

    def node_bytes(self, node: str) -> bytes | None:
        """The conditions ``node`` reported and when (msgpack), None if none."""
        seen = self._reported.get(node)
        return msgspec.msgpack.encode(seen) if seen else None

    def load_node(self, node: str, data: bytes) -> None:
        """Load what :meth:`node_bytes` wrote (the node's memory replaced)."""
        seen = _decode_seen(data)
        require_finite("kernel conditions", seen.values())
        seen = _latest(seen, MAX_CONDITIONS)
        if seen:
            self._reported[node] = seen
        else:
            self._reported.pop(node, None)


def _latest(seen: dict[str, float], n: int) -> dict[str, float]:
    """The ``n`` conditions of ``seen`` reported last (``seen`` itself when it has no more)."""
    return seen if len(seen) <= n else dict(sorted(seen.items(), key=lambda kv: kv[1])[-n:])


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
