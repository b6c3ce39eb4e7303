"""The embedded engine reads kernel-log events as the Kafka stage 1 does: a fatal AER error on a
node's PCIe bridge is a critical hard fault that isolates the node (through the same triage,
budgets and policy), info lines count the node in the fleet and decide nothing, and an event
stamped far ahead of the clock is dead-lettered."""

from __future__ import annotations

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.sim.embedded import EmbeddedPipeline

T = 1_790_000_000.0


def _line(node: str, ts: float, severity: str, what: str) -> r.KernelEvent:
    return r.KernelEvent(node=node, ts=ts, signal="pcie", incident_class="hardware", severity=severity,  # type: ignore[arg-type]
                         pci="0000:18:00.0", message=f"pcieport 0000:18:00.0: AER: {what} error received")


def test_a_fatal_aer_line_isolates_its_node_and_corrected_ones_decide_nothing() -> None:
    pipeline = EmbeddedPipeline(Settings(), key=b"k" * 40)
    for i in range(20):
        assert pipeline.kernel(_line(f"gpu-{i}", T, "info", "Corrected"), T) == []
    assert pipeline.out.findings == [] and pipeline.out.commands == []
    pipeline.kernel(_line("gpu-3", T + 5, "critical", "Uncorrected (Fatal)"), T + 5)
    for k in range(1, 6):
        pipeline.tick(T + 5 + 10 * k)
    (finding,) = pipeline.out.findings
    assert (finding.detector, finding.kind, finding.severity) == ("kernel_log", "hard_fault", "critical")
    assert [c.action for c in pipeline.out.commands if c.node == "gpu-3"] == ["cordon", "taint", "drain"]
    assert not [c for c in pipeline.out.commands if c.node != "gpu-3"]

    ahead = Settings().streams.max_future_skew_s + 60
    assert pipeline.kernel(_line("gpu-4", T + 100 + ahead, "critical", "Uncorrected (Fatal)"), T + 100) == []
    (dl,) = pipeline.out.dead_letters
    assert dl.topic == "kernel.events" and len(pipeline.out.findings) == 1
