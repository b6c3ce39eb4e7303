"""Triage: is it the node, the link, or the job?

Correlates findings, job failures (classified by :mod:`~fleetmedic.remediation.log_patterns`) and
topology into :class:`~fleetmedic.records.Incident` values, each with a class, ranked suspects, a
confidence and the evidence chain, handed to policy as an :class:`Assessment`.

==============  ======================================================================================
module          what it holds
==============  ======================================================================================
``facade``      :class:`Triage`: the parts composed over one state; routes inputs, decides settled groups
``records``     the serialisable state, the :class:`Assessment`, the helpers the rules share
``book``        the incident book: open, merge evidence, change status, forget closed incidents
``jobs``        where jobs run, their attempts, failure reports gathered per attempt
``findings``    a node's own findings: hardware incidents at once, degradation once reasserted
``network``     network findings gathered per leaf: one switch incident, or link incidents per node
``failures``    a failed job attempt: hardware, network, preemption, job bug, software, history
``history``     the failed jobs the history rule weighs: one entry a failure, a node's jobs derived when read
==============  ======================================================================================

Failure reports of one job attempt are gathered for ``failure_settle_s``, network findings per leaf
for ``network_settle_s``, before deciding, so that all ranks' logs and late findings are seen
together. Pure: state is a serialisable struct, time comes in as ``now``.
"""

from fleetmedic.remediation.triage.facade import Triage
from fleetmedic.remediation.triage.records import (
    ISOLATING_HINTS,
    QUIET_HINTS,
    SEVERITY_RANK,
    Assessment,
    FailureReport,
    JobRecord,
    JobStatus,
    PendingGroup,
    TriageState,
    finding_isolation,
    is_hardware_finding,
)

__all__ = ["ISOLATING_HINTS", "QUIET_HINTS", "SEVERITY_RANK", "Assessment", "FailureReport", "JobRecord",
           "JobStatus", "PendingGroup", "Triage", "TriageState", "finding_isolation", "is_hardware_finding"]
