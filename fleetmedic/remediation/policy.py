"""Policy: which ordered actions each track takes for an incident.

Rules come from the config (``policy.rules``, YAML); the first rule whose ``match`` fits the
incident decides. A match can test

- ``classes``: the incident class (hardware, degradation, network, transient_software, job_bug, unknown);
- ``suspect_kinds``: any suspect of these kinds (``switch``: a fabric incident);
- ``signals_any`` / ``signals_none``: signals triage attached (log signatures such as
  ``nccl_timeout``, ``cuda_ecc``, ``preemption``; ``hint:reset_gpu``; ``detector:xid_rules``;
  ``lone_timeout``, ``spread``, ``repeated_job_failures``, ``leaf_correlated``…);
- ``min_severity``;
- history: ``repeated_on_node`` (a suspect node has attributed software failures of
  ``escalate_after_failures`` distinct jobs within ``escalate_window_s``; on probation scaled by
  ``probation_threshold_scale``, except for the failure of a job that ran on that node alone,
  signal ``single_node_job``, which cannot tell the job's bug from the node's fault),
  ``retries_exhausted`` (the job spent ``transient_retry_max`` retries in place), ``on_probation``
  (a suspect node is on probation after a return to service).

A rule gives two ordered lists: ``job`` steps (restart/re-place, requeue, retry in place,
escalate to the job owner) and ``node`` steps (cordon, taint, drain, diagnostics, reset, reboot,
escalate). The tracks run in parallel: the job does not wait for the node.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from fleetmedic.config import ActionStep, PolicyRule, PolicySettings
from fleetmedic.remediation.triage import SEVERITY_RANK, Assessment


@dataclass(frozen=True)
class Decision:
    rule: str  # "" when no rule matched (nothing is done)
    job_steps: tuple[ActionStep, ...]
    node_steps: tuple[ActionStep, ...]
    explanation: str


class Policy:
    def __init__(self, settings: PolicySettings) -> None:
        self.settings = settings

    def failure_threshold(self, on_probation: bool) -> int:
        k = self.settings.escalate_after_failures
        return max(1, math.ceil(k * self.settings.probation_threshold_scale)) if on_probation else k

    def decide(self, a: Assessment, probation: Collection[str] = ()) -> Decision:
        inc = a.incident
        suspects = a.suspect_nodes
        on_probation = any(n in probation for n in suspects)
        failures = max(a.node_failures.values(), default=0)
        # probation's lower threshold needs failures that point at the node: a job that ran on one node
        # alone fails there whether the bug is its own or the node's (its retry elsewhere tells)
        ambiguous = "single_node_job" in a.signals
        threshold = min((self.failure_threshold(n in probation and not ambiguous) for n in suspects),
                        default=self.settings.escalate_after_failures)
        repeated = failures >= threshold and failures > 0
        exhausted = a.retries_in_place >= self.settings.transient_retry_max
        facts = _Facts(
            klass=inc.incident_class,
            kinds=frozenset(s.kind for s in inc.suspects),
            signals=a.signals,
            severity=SEVERITY_RANK[inc.severity],
            repeated=repeated,
            exhausted=exhausted,
            on_probation=on_probation,
        )
        for rule in self.settings.rules:
            if _matches(rule, facts):
                bits = [f"class {inc.incident_class}", f"severity {inc.severity}"]
                if repeated:
                    bits.append(f"failures of {failures} jobs on the node (threshold {threshold})")
                if exhausted:
                    spent, most = a.retries_in_place, self.settings.transient_retry_max
                    bits.append(f"{spent} retries in place spent (max {most})")
                if on_probation:
                    bits.append("suspect node on probation")
                return Decision(rule.name, tuple(rule.job), tuple(rule.node), f"rule `{rule.name}` ({', '.join(bits)})")
        return Decision("", (), (), f"no rule matched class {inc.incident_class}: no action")


@dataclass(frozen=True)
class _Facts:
    klass: str
    kinds: frozenset[str]
    signals: frozenset[str]
    severity: int
    repeated: bool
    exhausted: bool
    on_probation: bool


def _matches(rule: PolicyRule, f: _Facts) -> bool:
    m = rule.match
    if m.classes and f.klass not in m.classes:
        return False
    if m.suspect_kinds and not f.kinds.intersection(m.suspect_kinds):
        return False
    if m.signals_any and not f.signals.intersection(m.signals_any):
        return False
    if m.signals_none and f.signals.intersection(m.signals_none):
        return False
    if f.severity < SEVERITY_RANK[m.min_severity]:
        return False
    for want, have in ((m.repeated_on_node, f.repeated), (m.retries_exhausted, f.exhausted),
                       (m.on_probation, f.on_probation)):
        if want is not None and want != have:
            return False
    return True
