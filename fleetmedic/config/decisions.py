"""The decision stage: triage (findings into incidents), policy (rules on the job and node tracks,
the node lifecycle's timeouts and ladder) and safety (budgets and the circuit breaker)."""

from __future__ import annotations

from typing import Annotated, Literal, cast

import msgspec
from msgspec import Meta

from fleetmedic.actions import JOB_TRACK_ACTIONS, NODE_TRACK_ACTIONS, RuleAction
from fleetmedic.config.section import Fraction, NonNegFloat, NonNegInt, PosFloat, PosInt, Section
from fleetmedic.k8s_keys import (
    LABEL_LEAF,
    LABEL_OPT_OUT,
    LABEL_POOL,
    LABEL_RACK,
)
from fleetmedic.records import IncidentClass, Severity, SuspectKind


class TriageSettings(Section, frozen=True, kw_only=True):
    """Correlation of findings, job failures and topology into incidents (the remediation/triage/ package)."""

    failure_settle_s: NonNegFloat = 30.0
    evidence_window_s: PosFloat = 900.0
    network_settle_s: NonNegFloat = 30.0
    network_window_s: PosFloat = 300.0
    job_bug_min_nodes: Annotated[int, Meta(ge=2, le=1_000_000)] = 4
    job_bug_min_fraction: Fraction = 0.5
    max_hardware_suspects: PosInt = 2
    leaf_min_nodes: Annotated[int, Meta(ge=2, le=1_000_000)] = 2
    leaf_min_fraction: Fraction = 0.5
    incident_merge_s: PosFloat = 3600.0
    warning_confirmations: PosInt = 2  # also applies to degradation of any severity
    warning_confirm_window_s: PosFloat = 1800.0
    warning_confirm_min_span_s: NonNegFloat = 300.0
    # port counters that show congestion, not a broken link: never a link incident (or the cause of a
    # failed job) on their own; they still count towards a leaf switch's incident
    congestion_metrics: list[str] = msgspec.field(default_factory=lambda: ["port_xmit_wait"])
    patterns_file: str = ""
    rack_label: str = LABEL_RACK
    leaf_label: str = LABEL_LEAF
    pool_label: str = LABEL_POOL


class ActionStep(Section, frozen=True, kw_only=True):
    """One step of a track. ``at_job_boundary`` holds a node step until no job runs on the node."""

    action: RuleAction
    at_job_boundary: bool = False
    params: dict[str, str] = {}


class RuleMatch(Section, frozen=True, kw_only=True):
    """What an incident must look like for a rule to apply; an empty list matches anything."""

    classes: list[IncidentClass] = []
    suspect_kinds: list[SuspectKind] = []
    signals_any: list[str] = []
    signals_none: list[str] = []
    min_severity: Severity = "info"
    repeated_on_node: bool | None = None
    retries_exhausted: bool | None = None
    on_probation: bool | None = None


class PolicyRule(Section, frozen=True, kw_only=True):
    name: Annotated[str, Meta(min_length=1, max_length=128)]
    match: RuleMatch = RuleMatch()
    job: list[ActionStep] = []
    node: list[ActionStep] = []

    def __post_init__(self) -> None:
        for step in self.job:
            if step.action not in JOB_TRACK_ACTIONS:
                raise ValueError(f"rule `{self.name}`: `{step.action}` is not a job-track action")
            if step.at_job_boundary:
                raise ValueError(f"rule `{self.name}`: `at_job_boundary` applies to node steps only")
        for step in self.node:
            if step.action not in NODE_TRACK_ACTIONS:
                raise ValueError(f"rule `{self.name}`: `{step.action}` is not a node-track action")


def _steps(*names: str) -> list[ActionStep]:
    out: list[ActionStep] = []
    for name in names:
        action, _, when = name.partition("@")
        out.append(ActionStep(action=cast(RuleAction, action), at_job_boundary=when == "job_boundary"))
    return out


def _default_rules() -> list[PolicyRule]:
    """BRIEF §1: hardware -> re-place the job at once || isolate, drain, diagnose; transient software
    -> retry in place, no isolation, escalate after repeated failures on one node; early degradation
    -> isolate at the job boundary (no eviction unless severe), then diagnose. First match wins."""
    isolate = ("cordon", "taint", "drain")
    at_boundary = ("cordon", "taint", "run_diagnostics@job_boundary")
    r = PolicyRule
    return [
        r(name="hardware-reboot", match=RuleMatch(classes=["hardware"], signals_any=["hint:reboot_node"]),
          job=_steps("restart_job"), node=_steps(*isolate, "reboot_node", "run_diagnostics")),
        r(name="hardware-reset", match=RuleMatch(classes=["hardware"], signals_any=["hint:reset_gpu"]),
          job=_steps("restart_job"), node=_steps(*isolate, "reset_gpu", "run_diagnostics")),
        r(name="hardware", match=RuleMatch(classes=["hardware"]),
          job=_steps("restart_job"), node=_steps(*isolate, "run_diagnostics")),
        r(name="network-switch",
          match=RuleMatch(classes=["network"], suspect_kinds=["switch"], min_severity="critical"),
          job=_steps("restart_job"), node=_steps("escalate")),
        r(name="network-switch-early", match=RuleMatch(classes=["network"], suspect_kinds=["switch"]),
          node=_steps("escalate")),
        r(name="network-link", match=RuleMatch(classes=["network"], min_severity="critical"),
          job=_steps("restart_job"), node=_steps(*isolate, "run_diagnostics")),
        r(name="network-link-early", match=RuleMatch(classes=["network"]), node=_steps(*at_boundary)),
        r(name="degradation-severe", match=RuleMatch(classes=["degradation"], min_severity="critical"),
          job=_steps("restart_job"), node=_steps(*isolate, "run_diagnostics")),
        r(name="degradation-on-probation", match=RuleMatch(classes=["degradation"], on_probation=True),
          job=_steps("restart_job"), node=_steps(*isolate, "run_diagnostics")),
        r(name="degradation-early", match=RuleMatch(classes=["degradation"]), node=_steps(*at_boundary)),
        r(name="preempted", match=RuleMatch(signals_any=["preemption"], classes=["transient_software"]),
          job=_steps("requeue_job")),
        r(name="repeated-on-node", match=RuleMatch(classes=["transient_software", "unknown"], repeated_on_node=True),
          job=_steps("restart_job"), node=_steps(*at_boundary)),
        r(name="repeated-job-failures", match=RuleMatch(signals_any=["repeated_job_failures"]),
          job=_steps("restart_job"), node=_steps(*at_boundary)),
        # a one-node job failed on a node back on probation: its restart goes elsewhere (its bug or the
        # node's? if it fails there too it is the job's), the node is not isolated for it
        r(name="probation-retry-elsewhere", match=RuleMatch(classes=["transient_software", "unknown"],
                                                            signals_any=["single_node_job"], on_probation=True),
          job=_steps("restart_job")),
        r(name="transient-retries-exhausted", match=RuleMatch(classes=["transient_software"], retries_exhausted=True),
          job=_steps("restart_job")),
        r(name="transient", match=RuleMatch(classes=["transient_software"]), job=_steps("retry_in_place")),
        r(name="job-bug", match=RuleMatch(classes=["job_bug"]), job=_steps("escalate")),
        r(name="unknown", match=RuleMatch(classes=["unknown"]), job=_steps("retry_in_place")),
    ]


class PolicySettings(Section, frozen=True, kw_only=True):
    transient_retry_max: NonNegInt = 3
    transient_retry_backoff_s: NonNegFloat = 60.0
    # a restart or requeue not placed yet (waiting for capacity) gets the nodes fleetmedic starts
    # suspecting meanwhile added to its exclusions, for up to this long (0: its exclusions stay as issued)
    follow_suspects_s: NonNegFloat = 604_800.0
    # a restart excludes the incident's suspects and every node fleetmedic holds or works on; of the
    # other nodes it only suspects (settling, refused, evidence still being confirmed: still
    # schedulable, so each costs the job a node of capacity) at most this many, hardware and unknown
    # suspects first, the job's own nodes first within each: excluding every suspect of a large
    # fleet can leave a large job no room at all
    max_soft_exclusions: NonNegInt = 8
    # a restarted job is recovered at its first progress report, or once its new attempt has run this
    # long without failing (the Kubernetes job watcher sees pods run, not training steps); a recovery
    # resolves every incident that waited for the job, so their suspects stop being avoided
    # (0: only a progress report recovers a job)
    recovered_after_s: NonNegFloat = 600.0
    escalate_after_failures: PosInt = 2
    escalate_window_s: PosFloat = 86_400.0
    # failure signals that never count against a node: memory exhaustion follows the job's sizing
    node_neutral_signals: list[str] = msgspec.field(default_factory=lambda: ["oom"])
    suspect_after_failed_jobs: Annotated[int, Meta(ge=2, le=1_000_000)] = 2
    suspect_window_s: PosFloat = 21_600.0
    # ... and only when chance does not explain it: the nodes expected in all of its failed jobs by
    # chance (fleet x the product of each job's share of the fleet) must be at most this; failed
    # jobs of 32 and 64 nodes on 256 share 8 nodes by chance, two 2-node jobs 0.016. So must the
    # nodes expected in as many failed jobs if failures struck jobs whatever their size (each node
    # with the jobs it hosted in the window; the fleet's share of jobs that failed)
    suspect_max_chance_nodes: NonNegFloat = 1.0
    diagnostics_timeout_s: PosFloat = 3600.0
    action_timeout_s: PosFloat = 1800.0
    action_retries: NonNegInt = 2
    # a long step the executor refused (not a verdict) is retried after this, times the attempt number
    action_retry_delay_s: NonNegFloat = 120.0
    remediation_ladder: list[Literal["reset_gpu", "reboot_node"]] = msgspec.field(
        default_factory=lambda: ["reset_gpu", "reboot_node"]
    )
    # a node whose diagnostics passed after it was isolated on preventive evidence of one of these
    # metrics (what the diagnostics test under load: the GPU's temperatures) is not isolated again
    # on preventive evidence of them for acquittal_s: its GPU's temperatures under another job's
    # power are not a fault the diagnostics missed. Hard evidence (thermal slowdown) still acts.
    acquitted_metrics: list[str] = msgspec.field(default_factory=lambda: ["gpu_temp", "memory_temp"])
    acquittal_s: NonNegFloat = 604_800.0
    probation_s: NonNegFloat = 86_400.0
    probation_threshold_scale: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.5
    flap_window_s: PosFloat = 604_800.0
    flap_max_returns: PosInt = 2
    # a node isolated on definitive evidence (a lost GPU, an uncorrectable ECC error, a failed row
    # remap: docs/safety.md) whose diagnostics pass: "diagnostics" returns it (NVIDIA's recovery
    # workflow: reset, then field diagnostics); "repair" sends it to repair first, so a fault the
    # diagnostics miss never goes back schedulable, at the cost of a repair for a fault a reset fixed
    definitive_return: Literal["diagnostics", "repair"] = "repair"
    # the same definitive evidence again within this long of a passing diagnostic that returned the
    # node proves the diagnostics miss its fault: the next pass sends it to repair (0: never)
    definitive_recurrence_s: NonNegFloat = 2_592_000.0
    # a step waiting for the node's job to end (`@job_boundary`) for this long while that job runs on
    # without failing: the node returns to service unless its evidence is still reported (then a
    # human is told and it stays held); 0: wait for the boundary however long
    boundary_wait_s: NonNegFloat = 43_200.0
    # a node whose isolation evidence (its signature: an XID, a port down, a hard rule's metric) was
    # reported again while it was out of service, within this long before its diagnostics pass, is
    # sent to repair rather than returned: the diagnostics do not test what is still reported (keep
    # it above detection.reassert_s, the detectors' repeat interval for a lasting condition)
    evidence_quiet_s: PosFloat = 1_500.0
    rules: list[PolicyRule] = msgspec.field(default_factory=_default_rules)

    def __post_init__(self) -> None:
        names = [rule.name for rule in self.rules]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"rule names must be unique, repeated: {', '.join(dupes)}")


class BreakerSettings(Section, frozen=True, kw_only=True):
    """Correlated suspicion opens the breaker (remediation/safety.py): distinct nodes that became
    isolation candidates within ``window_s``, counted three ways; each trips at ``max(min, fraction x
    size)``. Fleet share (``trip_*``), one signature across the fleet (``signature_*``: the same XID,
    metric or log signal) and one failure domain (``domain_*``: a rack, a leaf switch)."""

    trip_suspect_fraction: Fraction = 0.02
    trip_min_nodes: PosInt = 6
    signature_fraction: Fraction = 0.002
    signature_min_nodes: PosInt = 4
    domain_fraction: Fraction = 0.5
    domain_min_nodes: PosInt = 3
    window_s: PosFloat = 300.0
    # while open, what it stops: "evidence" stops the tripped signatures and failure domains (and
    # everything once the fleet share trips), "all" stops every isolation
    scope: Literal["evidence", "all"] = "evidence"
    resume: Literal["auto", "command"] = "command"
    auto_resume_after_s: PosFloat = 1800.0
    # while open, definitive isolation of a node whose GPU or whole self is gone still proceeds
    # (unless the breaker tripped on that very signature outside the node's failure domain)
    pass_lost_devices: bool = True


class SafetySettings(Section, frozen=True, kw_only=True):
    dry_run: bool = False
    max_quarantined_fraction: Fraction = 0.05
    max_quarantined_count: NonNegInt = 64
    max_new_isolations: NonNegInt = 8
    isolation_window_s: PosFloat = 600.0
    max_per_rack: NonNegInt = 2
    max_per_switch: NonNegInt = 4
    node_cooldown_s: NonNegFloat = 1800.0
    preventive_share: Fraction = 0.5
    breaker: BreakerSettings = BreakerSettings()
    opt_out_label: str = LABEL_OPT_OUT
    retry_blocked_s: NonNegFloat = 600.0  # a refused isolation is escalated again after this (never dropped)
    settle_s: NonNegFloat = 60.0  # preventive candidates wait this long, so that a storm trips the breaker first
    fleet_forget_after_s: PosFloat = 86_400.0  # a node only telemetry showed leaves the fleet size after this silence
