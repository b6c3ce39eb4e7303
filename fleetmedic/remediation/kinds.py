"""Kinds of isolation: how sure fleetmedic is that taking a node out of service costs nothing.

- **definitive**: hard evidence that the device or the node is already unusable: a GPU lost (fallen
  off the bus), an uncorrectable ECC error or a failed row remap, an XID NVIDIA's catalog buckets as
  reset, reboot or workflow (RMA), the node down. The capacity is gone whatever fleetmedic does;
  leaving the node schedulable only crashes every job placed on it. Never refused by the budgets.
- **preventive**: degradation: the node still works, but worse or at risk (throttling, rising error
  counters, a straggler). Isolating it costs capacity: budgeted.
- **uncertain**: anything else that isolates (a link's errors, failures repeated on one node, a
  hardware log line without a device-level error). Budgeted like preventive isolation.

Triage decides the kind from the evidence (:func:`fleetmedic.remediation.triage.records.finding_isolation`)
and hands it to the node track with the assessment; the safety gate
(:meth:`fleetmedic.remediation.safety.SafetyGate.check_isolation`) budgets by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, get_args

IsolationKind = Literal["definitive", "preventive", "uncertain"]
KINDS: Final = get_args(IsolationKind)
KIND_RANK: Final[dict[str, int]] = {"preventive": 0, "uncertain": 1, "definitive": 2}


@dataclass(frozen=True)
class Isolation:
    """What an isolation would rest on: its kind, the evidence's signature (what the breaker counts
    across nodes: ``xid:79``, ``hard_rules:ecc_dbe_vol_total``, ``gpu_baseline:sm_clock``…) and
    whether the device or node is already gone (a lost GPU, a node down)."""

    kind: IsolationKind = "uncertain"
    signature: str = ""
    device_gone: bool = False

    def stronger(self, other: Isolation) -> Isolation:
        """The stronger of the two (definitive > uncertain > preventive; a lost device wins a tie)."""
        mine, theirs = (KIND_RANK[self.kind], self.device_gone), (KIND_RANK[other.kind], other.device_gone)
        return other if theirs > mine else self


def kind_of(value: str, critical: bool = False) -> IsolationKind:
    """A kind read back from state (``""`` in snapshots older than the kinds: critical evidence was
    budgeted as uncertain, the rest as preventive)."""
    if value in KIND_RANK:
        return value  # type: ignore[return-value]
    return "uncertain" if critical else "preventive"
