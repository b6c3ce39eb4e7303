"""Settings: one YAML file, loaded into typed, immutable structs.

- Every section is a frozen ``msgspec.Struct`` that forbids unknown keys; every threshold a user may
  tune lives here with its default, and ``deploy/config/fleetmedic.yaml`` documents each one.
- Environment variables override any value: ``FLEETMEDIC__<SECTION>__<KEY>=value`` (double
  underscores between path parts, case-insensitive; the value is parsed as a YAML scalar or flow
  collection, e.g. ``FLEETMEDIC__SAFETY__MAX_QUARANTINED_FRACTION=0.02``).
- Errors raise :class:`ConfigError` naming the field path (``safety.max_quarantined_fraction``) and
  the reason (unknown key, wrong type, out of range), every error of a file at once. Keys under maps
  are checked against what they name (signals, counters, topics, step parameters, namespaces...),
  with a "did you mean" for a near miss.
- Loading is bounded: a file of at most :data:`MAX_CONFIG_BYTES`, UTF-8, nested at most
  :data:`MAX_DEPTH` levels, and aliases limited (no "billion laughs"); each is a ConfigError.
- :func:`config_warnings` lists settings that are valid but dangerous (``fleetmedic config check``
  prints them; the long-running roles log them at startup).

Pure: :func:`parse_config` takes text and an environment mapping; only :func:`read_config` opens a file.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Final, Literal, cast, get_args, get_origin

import msgspec
import yaml
from msgspec import Meta, Struct

from fleetmedic.bus import BY_NAME, DEFAULT_PREFIX, MAX_STATE_BYTES
from fleetmedic.k8s_keys import (
    LABEL_LEAF,
    LABEL_NVLINK_DOMAIN,
    LABEL_OPT_OUT,
    LABEL_POOL,
    LABEL_RACK,
    LABEL_SPINE,
    LABEL_STATE,
    TAINT_QUARANTINE,
    TAINT_STANDBY,
)
from fleetmedic.records import GPU_METRICS, Counter, IncidentClass, PortSample, Severity, SuspectKind

ENV_PREFIX = "FLEETMEDIC__"

PosFloat = Annotated[float, Meta(gt=0.0, le=1.0e9)]
NonNegFloat = Annotated[float, Meta(ge=0.0, le=1.0e9)]
PosInt = Annotated[int, Meta(ge=1, le=1_000_000_000)]
NonNegInt = Annotated[int, Meta(ge=0, le=1_000_000_000)]
Fraction = Annotated[float, Meta(ge=0.0, le=1.0)]


class Section(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every config section: immutable, unknown keys rejected."""


# --- Kafka --------------------------------------------------------------------------------------


class KafkaSettings(Section, frozen=True, kw_only=True):
    bootstrap_servers: str = "127.0.0.1:19092"
    client_id: str = "fleetmedic"
    consumer_group: str = "fleetmedic"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str = ""
    sasl_password_env: str = ""
    sasl_password_file: str = ""
    ssl_cafile: str = ""
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    ssl_check_hostname: bool = True
    acks: Literal["all", "1", "0"] = "all"
    request_timeout_s: PosFloat = 30.0
    # every client refreshes its cluster metadata this often (aiokafka's default is 5 min): a client
    # that keeps asking a partition's old leader learns the new one within this
    metadata_max_age_ms: Annotated[int, Meta(ge=1000, le=3_600_000)] = 30_000

    def __post_init__(self) -> None:
        if self.security_protocol.startswith("SASL") and self.sasl_mechanism is None:
            raise ValueError("`sasl_mechanism` is required when `security_protocol` is SASL_*")


class TopicSettings(Section, frozen=True, kw_only=True):
    prefix: str = DEFAULT_PREFIX
    names: dict[str, str] = {}
    partitions: dict[str, PosInt] = {}
    default_partitions: PosInt = 12
    replication_factor: Annotated[int, Meta(ge=1, le=15)] = 1  # 3 on a production cluster
    # min.insync.replicas of the topics fleetmedic creates: with acks=all a write needs this many
    # replicas; 0: replication_factor - 1, at most 2, at least 1 (3 -> 2: one broker may be lost)
    min_insync_replicas: Annotated[int, Meta(ge=0, le=15)] = 0

    def __post_init__(self) -> None:
        for table in (self.names, self.partitions):
            for key in table:
                if key not in BY_NAME:
                    known = ", ".join(sorted(BY_NAME))
                    raise ValueError(f"unknown topic `{key}` (known: {known})")
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError(f"`min_insync_replicas` ({self.min_insync_replicas}) exceeds `replication_factor` "
                             f"({self.replication_factor}): no write with acks=all could succeed")

    @property
    def min_isr(self) -> int:
        """The ``min.insync.replicas`` topics are created with (``min_insync_replicas``, or derived)."""
        return self.min_insync_replicas or max(1, min(2, self.replication_factor - 1))

    def topic(self, name: str) -> str:
        """Full topic name for a logical topic (``telemetry.gpu`` -> ``fleetmedic.telemetry.gpu``)."""
        if name not in BY_NAME:
            raise KeyError(name)
        return self.names.get(name, self.prefix + name)


class CommandKeySettings(Section, frozen=True, kw_only=True):
    """One more command key the executor accepts (``signing.command_keys``): its id (what the
    ``fleetmedic-key-id`` header names) and where the key is, a file or an environment variable."""

    id: str
    key_file: str = ""
    key_env: str = ""

    def __post_init__(self) -> None:
        if bool(self.key_file) == bool(self.key_env):
            raise ValueError(f"command key {self.id!r}: give exactly one of `key_file` and `key_env`")


class SigningSettings(Section, frozen=True, kw_only=True):
    """Keys by role (:mod:`fleetmedic.signing`): the command keys (the decision stage signs with the
    active one, ``key_file``/``key_env`` under the id ``key_id``; the executor accepts it and every one
    of ``command_keys``, by the id the record's header names) and the operator keys, by id
    (``fleetmedic ctl`` signs with one, the decision stage accepts any, the executor none). A command
    key id is never an operator key id."""

    key_file: str = ""
    key_env: str = "FLEETMEDIC_SIGNING_KEY"
    key_id: str = "command"  # the active command key's id (fleetmedic.signing.DEFAULT_COMMAND_KEY_ID)
    command_keys: list[CommandKeySettings] = []  # more keys the executor accepts: a key rotation's overlap
    command_ttl_s: PosFloat = 300.0
    operator_key_files: dict[str, str] = {}  # key id -> file holding that operator key
    operator_key_dir: str = ""  # or a folder (a mounted Secret): each file one key, its name the id
    operator_key_env: dict[str, str] = msgspec.field(
        default_factory=lambda: {"operator": "FLEETMEDIC_OPERATOR_KEY"})  # key id -> env var (used when set)
    operator_key_id: str = ""  # the key `fleetmedic ctl` signs with ("": the only one configured)
    allow_demo_keys: bool = False  # the published demo keys: only `fleetmedic demo` sets this

    def __post_init__(self) -> None:
        seen = {self.key_id: "`key_id`"}
        for i, k in enumerate(self.command_keys):
            if k.id in seen:
                why = ("the active key (key_file/key_env) has it: list only the other keys here"
                       if k.id == self.key_id else f"given twice (also {seen[k.id]})")
                raise ValueError(f"`command_keys[{i}].id` {k.id!r}: {why}")
            seen[k.id] = f"`command_keys[{i}].id`"
        for field, ids in (("operator_key_files", self.operator_key_files),
                           ("operator_key_env", self.operator_key_env)):
            for kid in ids:
                if kid in seen:
                    raise ValueError(f"`{field}` id {kid!r} is a command key id ({seen[kid]}): a header naming "
                                     f"it must say which role signed, so the ids of the roles never overlap")


# --- detection ----------------------------------------------------------------------------------


class BaselineSettings(Section, frozen=True, kw_only=True):
    warmup_samples: PosInt = 30
    halflife_samples: PosFloat = 120.0
    protect_z: PosFloat = 4.0
    min_std: PosFloat = 0.5


class MetricThreshold(Section, frozen=True, kw_only=True):
    direction: Literal["up", "down", "both"] = "up"
    z_warning: PosFloat = 4.0
    z_critical: PosFloat = 8.0
    min_delta: NonNegFloat = 0.0


def _default_metric_thresholds() -> dict[str, MetricThreshold]:
    return {
        "gpu_temp": MetricThreshold(direction="up", min_delta=5.0),
        "memory_temp": MetricThreshold(direction="up", min_delta=5.0),
        "sm_clock": MetricThreshold(direction="down", min_delta=100.0),
        "ecc_sbe_rate": MetricThreshold(direction="up", z_warning=6.0, z_critical=12.0, min_delta=1.0),
        "pcie_replay_rate": MetricThreshold(direction="up", z_warning=6.0, z_critical=12.0, min_delta=1.0),
        "nvlink_error_rate": MetricThreshold(direction="up", z_warning=6.0, z_critical=12.0, min_delta=1.0),
    }


class CusumSettings(Section, frozen=True, kw_only=True):
    drift_k: NonNegFloat = 0.5
    threshold_h: PosFloat = 20.0


class PeerSettings(Section, frozen=True, kw_only=True):
    z_threshold: PosFloat = 3.5
    continuity_window_s: PosFloat = 120.0
    min_peers: Annotated[int, Meta(ge=2, le=100_000)] = 4
    # across a SKU fleet, temperatures are judged against what the node's power draw predicts ("": raw)
    sku_adjust_by: Literal["", "power_usage", "gpu_util", "sm_clock"] = "power_usage"
    # across a SKU fleet, a node is judged against its own usual deviation from the median, learned
    # with this half-life (frozen while it stands out); 0: against the median itself
    offset_halflife_s: NonNegFloat = 21_600.0
    # a node's load band, from its median GPU utilisation (percent): nodes are compared with peers of
    # the same band ("idle" below the first, "busy" above the second, neither in between)
    idle_below_util: Annotated[float, Meta(ge=0.0, le=100.0)] = 10.0
    busy_above_util: Annotated[float, Meta(ge=0.0, le=100.0)] = 90.0

    def __post_init__(self) -> None:
        if self.idle_below_util > self.busy_above_util:
            raise ValueError("idle_below_util must not be above busy_above_util")


class StragglerSettings(Section, frozen=True, kw_only=True):
    slowdown_ratio: Annotated[float, Meta(gt=1.0, le=100.0)] = 1.10
    min_steps: PosInt = 5
    job_warmup_steps: PosInt = 20
    job_cusum_h: PosFloat = 10.0


class MultivariateSettings(Section, frozen=True, kw_only=True):
    enabled: bool = True
    algorithm: Literal["robust_covariance", "isolation_forest"] = "robust_covariance"
    window_s: PosFloat = 300.0
    refit_interval_s: PosFloat = 3600.0
    min_training_windows: PosInt = 64
    max_training_windows: PosInt = 20_000
    consecutive_windows: PosInt = 2
    distance_threshold: PosFloat = 25.0
    n_estimators: PosInt = 100
    score_threshold: Fraction = 0.65
    seed: NonNegInt = 0
    # a sample counts towards a window's features when the node's median GPU utilisation (percent) is
    # at least this (or not reported): an idle node's temperatures and clocks say little of its health
    busy_util: Annotated[float, Meta(ge=0.0, le=100.0)] = 50.0


def _default_ib_thresholds() -> dict[str, NonNegInt]:
    # rdma-core's default alert thresholds (per check interval), see BRIEF §3
    return {
        "symbol_error_counter": 10,
        "link_error_recovery_counter": 10,
        "link_downed_counter": 10,
        "port_rcv_errors": 10,
        "local_link_integrity_errors": 10,
        "excessive_buffer_overrun_errors": 10,
        "port_rcv_remote_physical_errors": 100,
        "port_xmit_discards": 100,
        "port_xmit_wait": 1000,
    }


# fleetmedic's action classes for XIDs; the NVIDIA catalog's buckets map onto them (models/xid_catalog.py)
XidAction = Literal["ignore", "restart_app", "reset_gpu", "reboot_node", "isolate", "investigate"]


class XidSettings(Section, frozen=True, kw_only=True):
    action_overrides: dict[Annotated[int, Meta(ge=0, le=100_000)], XidAction] = {}
    repeat_xids: list[int] = msgspec.field(default_factory=lambda: [13, 31, 43])
    repeat_count: Annotated[int, Meta(ge=2, le=1000)] = 2
    repeat_window_s: PosFloat = 3600.0
    repeat_max_gpus: Annotated[int, Meta(ge=1, le=1024)] = 2  # an XID on more GPUs at once is the application's
    repeat_burst_s: NonNegFloat = 10.0  # "at once": within this many seconds
    trend_xids: list[int] = msgspec.field(default_factory=lambda: [63, 94])
    trend_count: Annotated[int, Meta(ge=2, le=1000)] = 3
    trend_window_s: PosFloat = 86_400.0


class SiblingSettings(Section, frozen=True, kw_only=True):
    """A GPU's error rate against the median of its node's GPUs (detector ``gpu_siblings``): errors
    rising on one GPU while its siblings stay flat, however slowly (a per-GPU baseline can learn a
    slow rise as normal). Rates are per minute, smoothed per GPU with ``halflife_samples``."""

    signals: list[str] = msgspec.field(default_factory=lambda: ["nvlink_error_rate"])  # rate signals compared
    halflife_samples: PosFloat = 12.0
    min_excess: PosFloat = 3.0  # per minute above the median of the node's GPUs ...
    ratio: PosFloat = 4.0  # ... and at least this multiple of that median
    critical_excess: PosFloat = 60.0  # per minute (1/s: DCGM's limit for NVLink replay/recovery errors)
    min_gpus: Annotated[int, Meta(ge=2, le=256)] = 4  # GPUs of the node reporting the signal


class DetectionSettings(Section, frozen=True, kw_only=True):
    sample_interval_s: PosFloat = 10.0
    continuity_samples: PosInt = 4
    reassert_s: PosFloat = 600.0
    max_sample_gap_s: PosFloat = 120.0
    baseline: BaselineSettings = BaselineSettings()
    metrics: dict[str, MetricThreshold] = msgspec.field(default_factory=_default_metric_thresholds)
    cusum: CusumSettings = CusumSettings()
    peers: PeerSettings = PeerSettings()
    straggler: StragglerSettings = StragglerSettings()
    multivariate: MultivariateSettings = MultivariateSettings()
    xid: XidSettings = XidSettings()
    ib_thresholds: dict[str, NonNegInt] = msgspec.field(default_factory=_default_ib_thresholds)
    effective_ber_threshold: Fraction = 1.0e-12
    link_speed_min_ratio: Fraction = 0.9  # an up link below this share of its expected speed is degraded
    dbe_threshold: PosInt = 1
    thermal_throttle_fraction: Fraction = 0.2
    hw_thermal_is_hard: bool = True  # HW thermal slowdown (0x40) on a GPU is a hard fault (cooling)
    power_brake_min_gpu_fraction: Fraction = 0.5  # HW power brake (0x80) on this share of a node's GPUs: PSU; 0 = off
    # a GPU absent from a node's records (or listed with no values) is lost only once it was absent
    # from this many records in a row spanning this long: one partial or misaligned scrape is not a
    # GPU fallen off the bus. XID 79 for that GPU (NVML's lost-GPU error) confirms it at once
    gpu_missing_after_samples: PosInt = 3
    gpu_missing_after_s: NonNegFloat = 20.0
    # the same XID (node, GPU, code) from the kernel log and from NVML or dcgm within this many
    # seconds of event time is one event (models/event_dedup.py); 0: every report counts
    xid_dedup_window_s: Annotated[float, Meta(ge=0.0, le=3600.0)] = 60.0
    siblings: SiblingSettings = SiblingSettings()
    # stage 1's memory is bounded whatever node names arrive: a node silent this long (event time:
    # the latest record stamp stage 1 has seen) is forgotten, and beyond this many nodes a worker
    # forgets the least recently seen one. A forgotten node that returns starts fresh (baselines warm
    # up again: baseline.warmup_samples); its saved state is deleted from the state topic
    evict_node_after_s: PosFloat = 7 * 86400.0
    max_nodes_per_worker: PosInt = 50_000


# --- triage, policy, safety ---------------------------------------------------------------------


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


RuleAction = Literal[
    "cordon",
    "taint",
    "drain",
    "label",
    "run_diagnostics",
    "reset_gpu",
    "reboot_node",
    "restart_job",
    "requeue_job",
    "retry_in_place",
    "escalate",
]
JOB_ACTIONS = frozenset({"restart_job", "requeue_job", "retry_in_place", "escalate"})
NODE_ACTIONS = frozenset(
    {"cordon", "taint", "drain", "label", "run_diagnostics", "reset_gpu", "reboot_node", "escalate"}
)


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
            if step.action not in JOB_ACTIONS:
                raise ValueError(f"rule `{self.name}`: `{step.action}` is not a job-track action")
            if step.at_job_boundary:
                raise ValueError(f"rule `{self.name}`: `at_job_boundary` applies to node steps only")
        for step in self.node:
            if step.action not in NODE_ACTIONS:
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
    follow_suspects_s: NonNegFloat = 86_400.0
    # a restart excludes the incident's suspects and every node fleetmedic holds or works on; of the
    # other nodes it only suspects (settling, refused, evidence still being confirmed: still
    # schedulable, so each costs the job a node of capacity) at most this many, hardware and unknown
    # suspects first, the job's own nodes first within each: excluding every suspect of a large
    # fleet can leave a large job no room at all
    max_soft_exclusions: NonNegInt = 8
    escalate_after_failures: PosInt = 2
    escalate_window_s: PosFloat = 86_400.0
    # failure signals that never count against a node: memory exhaustion follows the job's sizing
    node_neutral_signals: list[str] = msgspec.field(default_factory=lambda: ["oom"])
    suspect_after_failed_jobs: Annotated[int, Meta(ge=2, le=1_000_000)] = 2
    suspect_window_s: PosFloat = 21_600.0
    diagnostics_timeout_s: PosFloat = 3600.0
    action_timeout_s: PosFloat = 1800.0
    action_retries: NonNegInt = 2
    # a long step the executor refused (not a verdict) is retried after this, times the attempt number
    action_retry_delay_s: NonNegFloat = 120.0
    remediation_ladder: list[Literal["reset_gpu", "reboot_node"]] = msgspec.field(
        default_factory=lambda: ["reset_gpu", "reboot_node"]
    )
    probation_s: NonNegFloat = 86_400.0
    probation_threshold_scale: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.5
    flap_window_s: PosFloat = 604_800.0
    flap_max_returns: PosInt = 2
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


# --- executor -----------------------------------------------------------------------------------


NamespaceDrainPolicy = Literal["evict_now", "wait_for_completion", "evict_after_timeout"]


class ExecutorSettings(Section, frozen=True, kw_only=True):
    kubeconfig: str = ""
    in_cluster: bool = False
    identity: str = ""
    taint_key: str = TAINT_QUARANTINE
    taint_effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"
    lifecycle_label: str = LABEL_STATE
    drain_timeout_s: PosFloat = 900.0
    eviction_retry_backoff_s: PosFloat = 5.0
    default_namespace_policy: NamespaceDrainPolicy = "evict_after_timeout"
    namespace_policies: dict[str, NamespaceDrainPolicy] = {}
    diagnostics_namespace: str = "fleetmedic-system"
    diagnostics_image: str = "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"
    diagnostics_command: list[str] = msgspec.field(default_factory=lambda: ["dcgmi", "diag", "-r", "3"])
    diagnostics_timeout_s: PosFloat = 3600.0
    lease_name: str = "fleetmedic-executor"
    lease_namespace: str = "fleetmedic-system"
    lease_duration_s: PosFloat = 15.0
    drain_evict_after_s: NonNegFloat = 600.0
    diagnostics_tolerations: list[dict[str, str]] = []
    diagnostics_pod_annotations: dict[str, str] = {}
    action_hooks: dict[Literal["reset_gpu", "reboot_node", "escalate"], str] = {}
    # keep nodes and pods in memory by list + watch (executor/cache.py) for the topology-aware restart;
    # false: list every node (placement.node_cache_s) and every live pod per restart instead
    cluster_cache: bool = True


class IngestSettings(Section, frozen=True, kw_only=True):
    node_labels: list[str] = msgspec.field(default_factory=lambda: ["Hostname", "node", "instance"])
    gpu_label: str = "gpu"
    port_device_label: str = "device"
    port_label: str = "port"


# --- exporters / connectors (``fleetmedic exporter ...``; docs/connectors.md) --------------------


class NvmlExporterSettings(Section, frozen=True, kw_only=True):
    interval_s: PosFloat = 10.0
    node_name: str = ""  # "" = $NODE_NAME, else the host name
    xid_wait_ms: Annotated[int, Meta(ge=10, le=60_000)] = 500


class PodDiscoverySettings(Section, frozen=True, kw_only=True):
    """Scrape mode: exporter pods found through the Kubernetes API (connectors/prometheus_ingest.py, the targets by
    connectors/prometheus_api.py)."""

    enabled: bool = False
    in_cluster: bool = True  # the pod's service account; false: kubeconfig ("" = $KUBECONFIG or ~/.kube/config)
    kubeconfig: str = ""
    namespace: str = ""  # "" = every namespace
    label_selector: str = "app=nvidia-dcgm-exporter"
    port_name: str = "metrics"  # the container port of that name, unless `port` is set
    port: Annotated[int, Meta(ge=0, le=65535)] = 0
    scheme: Literal["http", "https"] = "http"
    path: str = "/metrics"
    node_label: str = "node"  # the target label that carries the pod's spec.nodeName
    refresh_s: PosFloat = 60.0

    def __post_init__(self) -> None:
        if self.enabled and not (self.port or self.port_name):
            raise ValueError("discovery: needs port_name or port")
        if not self.path.startswith("/"):
            raise ValueError(f"discovery.path: must start with / (got {self.path[:64]!r})")
        if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", self.node_label):
            raise ValueError(f"discovery.node_label: not a Prometheus label name ({self.node_label[:64]!r})")


class RemoteWriteTlsSettings(Section, frozen=True, kw_only=True):
    """The receiver's HTTPS (what a sender's ``tls_config`` talks to); the files are read again
    when they change (connectors/remote_write_auth.py)."""

    cert_file: str = ""  # PEM certificate chain; with key_file the receiver serves HTTPS only
    key_file: str = ""  # its private key (PEM)
    client_ca_file: str = ""  # set: senders must present a certificate this CA signed (mutual TLS)
    min_version: Literal["TLS1.2", "TLS1.3"] = "TLS1.2"

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("tls: cert_file and key_file go together (both set, or neither)")
        if self.client_ca_file and not self.cert_file:
            raise ValueError("tls.client_ca_file: client certificates need TLS (set cert_file and key_file)")


class RemoteWriteAuthSettings(Section, frozen=True, kw_only=True):
    """Credentials a sender must present (either kind, when both are set); the files are read
    again when they change, so a rotation needs no restart."""

    # one accepted token per line (a sender's `authorization: {credentials_file}`, type Bearer)
    bearer_tokens_file: str = ""
    # one accepted `user:password` per line (a sender's `basic_auth`)
    basic_auth_file: str = ""


class RemoteWriteSettings(Section, frozen=True, kw_only=True):
    """``fleetmedic exporter remote-write``: Prometheus remote write 1.0 (connectors/remote_write*.py)."""

    listen: str = "0.0.0.0:9201"  # HOST:PORT (--listen overrides)
    path: str = "/api/v1/write"
    max_body_bytes: Annotated[int, Meta(ge=1024, le=1 << 30)] = 8 << 20  # compressed; larger: 400
    max_decompressed_bytes: Annotated[int, Meta(ge=1024, le=1 << 31)] = 64 << 20  # the snappy header's; larger: 400
    # samples of one scrape reach us in several requests (Prometheus shards series across queues):
    # a scrape is published as one record this long after its first sample arrived
    assemble_s: Annotated[float, Meta(gt=0, le=300)] = 10.0
    max_pending_samples: PosInt = 2_000_000  # samples held for assembly; beyond them requests get 503
    max_nodes_tracked: PosInt = 100_000  # per-node "already published" marks kept (oldest forgotten)
    # label sets decoded once and kept (a series' labels, and their encoded bytes, by its label bytes):
    # all of them are forgotten when either limit is reached, and each sample is then decoded whole
    # again, ~30x the CPU. dcgm-exporter sends ~20 series a GPU (160 a node) of ~300 label bytes, and
    # a set is kept twice (labels, encoded): 1,000,000 sets and 768 MiB hold ~6,000 nodes a receiver
    label_cache_max_series: PosInt = 1_000_000
    label_cache_max_bytes: Annotated[int, Meta(ge=1 << 20, le=1 << 36)] = 768 << 20
    # bodies being received, all requests together; a request that would pass it gets 503
    max_inflight_bytes: Annotated[int, Meta(ge=1024, le=1 << 34)] = 64 << 20
    # a connection that has not sent a whole request's headers this long after it opened or after
    # its last answer is closed (idle keep-alive connections too: the sender opens another)
    header_timeout_s: Annotated[float, Meta(gt=0, le=3600)] = 60.0
    # a body not received this long after its headers: 503 and the connection is closed
    # (Prometheus gives up on a request after its remote_timeout, 30 s by default)
    body_timeout_s: Annotated[float, Meta(gt=0, le=3600)] = 60.0
    # the Retry-After of a 503 (whole seconds; 0: none), which Prometheus waits before retrying
    retry_after_s: Annotated[int, Meta(ge=0, le=3600)] = 1
    tls: RemoteWriteTlsSettings = RemoteWriteTlsSettings()
    auth: RemoteWriteAuthSettings = RemoteWriteAuthSettings()
    # listen on an address beyond loopback with no client certificates and no credentials
    allow_unauthenticated: bool = False
    # how often the TLS and credential files are checked for a change (their stat)
    files_check_s: Annotated[float, Meta(gt=0, le=3600)] = 1.0

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError(f"path: must start with / (got {self.path[:64]!r})")

    @property
    def authenticated(self) -> bool:
        """Senders must prove who they are (a client certificate or credentials)."""
        return bool(self.tls.client_ca_file or self.auth.bearer_tokens_file or self.auth.basic_auth_file)


class PrometheusExporterSettings(Section, frozen=True, kw_only=True):
    mode: Literal["scrape", "api"] = "scrape"
    targets: list[str] = []  # scrape: exporter URLs (http://host:9400/metrics)
    api_url: str = ""  # api: Prometheus server base URL (http://prometheus:9090)
    api_selector: str = '{__name__=~"DCGM_FI_.*|DCGM_EXP_.*|node_infiniband_.*"}'
    bearer_token_file: str = ""
    interval_s: PosFloat = 30.0
    timeout_s: PosFloat = 10.0
    # which label names the node, first present wins, for Prometheus text, OpenMetrics, the API and
    # backtest files: dcgm-exporter's Hostname (gpu-operator sets it from spec.nodeName; `hostname`
    # on dcgm-exporter's main branch), node/kubernetes_node from relabelling, instance without its
    # port. A config that sets only ingest.node_labels keeps that order (docs/connectors.md).
    node_labels: list[str] = msgspec.field(
        default_factory=lambda: ["Hostname", "hostname", "node", "kubernetes_node", "instance"])
    # label values that are not a node's name: a dcgm-exporter pod's (exporters before 3.1 or
    # gpu-operator before v23.9 report the pod's host name) or a Docker container id; the next label is used
    node_label_ignore: str = r"^(nvidia-)?dcgm-exporter-[a-z0-9]{5}$|^[0-9a-f]{12}$"
    # samples of one node within this of each other are one scrape, one record
    group_tolerance_ms: Annotated[int, Meta(ge=0, le=60_000)] = 500
    # range queries (backtest --prometheus): points per series per query, under the server's 11,000
    range_max_points: Annotated[int, Meta(ge=10, le=11_000)] = 10_000
    discovery: PodDiscoverySettings = PodDiscoverySettings()

    def __post_init__(self) -> None:
        try:
            re.compile(self.node_label_ignore)
        except re.error as exc:
            raise ValueError(f"node_label_ignore: not a regular expression: {exc}") from None


class KafkaTelemetrySettings(Section, frozen=True, kw_only=True):
    topics: list[str] = []
    format: Literal["telegraf", "prometheus_kafka_adapter"] = "telegraf"
    group_id: str = "fleetmedic-telemetry-import"
    window_s: PosFloat = 10.0
    grace_s: NonNegFloat = 5.0
    node_tags: list[str] = msgspec.field(default_factory=lambda: ["host", "Hostname", "node", "instance"])
    gpu_tags: list[str] = msgspec.field(default_factory=lambda: ["gpu", "index"])
    port_device_tag: str = "device"
    port_tag: str = "port"
    metric_map: dict[str, str] = {}
    dead_letter: bool = True

    def __post_init__(self) -> None:
        for source, target in self.metric_map.items():
            port_field = target.startswith("port.") and target[5:] in PortSample.__struct_fields__
            if target not in GPU_METRICS and not port_field:
                raise ValueError(f"metric_map.{source}: `{target}` is not a GPU metric nor port.<PortSample field>")


class InfinibandPortLink(Section, frozen=True, kw_only=True):
    lid: NonNegInt | None = None  # perfquery's LID, or
    device: str = ""  # switch name / HCA (mlx5_0)
    port: PosInt
    node: str = ""  # the node this port belongs to or faces
    peer: str = ""  # "device:port" at the other end
    device_kind: Literal["switch", "host"] = "switch"


class InfinibandExporterSettings(Section, frozen=True, kw_only=True):
    interval_s: PosFloat = 60.0
    perfquery_command: list[str] = msgspec.field(default_factory=lambda: ["perfquery", "-x"])
    timeout_s: PosFloat = 10.0
    topology: list[InfinibandPortLink] = []


class LogExporterSettings(Section, frozen=True, kw_only=True):
    topics: list[str] = []
    group_id: str = "fleetmedic-log-import"
    job_labels: list[str] = msgspec.field(default_factory=lambda: [
        "jobset.sigs.k8s.io/jobset-name", "training.kubeflow.org/job-name", "batch.kubernetes.io/job-name", "job-name"])
    attempt_label: str = "jobset.sigs.k8s.io/restart-attempt"
    excerpt_lines: Annotated[int, Meta(ge=1, le=100)] = 5
    settle_s: NonNegFloat = 5.0
    per_job_interval_s: NonNegFloat = 60.0
    patterns_file: str = ""


class KmsgExporterSettings(Section, frozen=True, kw_only=True):
    """``fleetmedic exporter kmsg``: the node's kernel log -> ``kernel.events`` (connectors/kmsg.py)."""

    # an event equal to one published less than this before it (kernel time) is counted, not published
    coalesce_s: NonNegFloat = 60.0


class ExporterSettings(Section, frozen=True, kw_only=True):
    queue_max: PosInt = 10_000
    reconnect_min_s: PosFloat = 0.5
    reconnect_max_s: PosFloat = 30.0
    drain_timeout_s: NonNegFloat = 10.0
    nvml: NvmlExporterSettings = NvmlExporterSettings()
    prometheus: PrometheusExporterSettings = PrometheusExporterSettings()
    remote_write: RemoteWriteSettings = RemoteWriteSettings()
    kafka: KafkaTelemetrySettings = KafkaTelemetrySettings()
    infiniband: InfinibandExporterSettings = InfinibandExporterSettings()
    logs: LogExporterSettings = LogExporterSettings()
    kmsg: KmsgExporterSettings = KmsgExporterSettings()


class JobWatchSettings(Section, frozen=True, kw_only=True):
    """``fleetmedic watch-jobs``: Kubernetes training jobs -> ``jobs.events`` (connectors/kube_jobs.py)."""

    kubeconfig: str = ""
    in_cluster: bool = False
    namespaces: list[str] = []
    kinds: list[Literal["Job", "PyTorchJob", "JobSet"]] = msgspec.field(
        default_factory=lambda: ["Job", "PyTorchJob", "JobSet"])
    pod_label_selector: str = ""
    workload_label_selector: str = ""
    gpu_only: bool = True
    gpu_resource: str = "nvidia.com/gpu"
    watch_timeout_s: Annotated[int, Meta(ge=1, le=3600)] = 300
    reconnect_backoff_s: PosFloat = 1.0
    max_backoff_s: PosFloat = 30.0
    missing_kind_retry_s: PosFloat = 60.0
    queue_size: PosInt = 10_000
    # a deleted workload's lingering pods (updated before the garbage collector deletes them) are
    # not taken for a new job of that name for this long
    deleted_memory_s: PosFloat = 600.0
    watch_nodes: bool = True  # Node watch -> cluster.nodes (topology, opt-outs, cordons for the decision stage)


class MetricsSettings(Section, frozen=True, kw_only=True):
    bind_address: str = "127.0.0.1"
    port: Annotated[int, Meta(ge=0, le=65535)] = 9108
    # /healthz fails (the kubelet restarts the process) when an event loop has not run for this long
    stall_after_s: Annotated[float, Meta(ge=10.0, le=3600.0)] = 120.0


class StreamsSettings(Section, frozen=True, kw_only=True):
    """``fleetmedic worker`` (docs/streams.md)."""

    batch_size: PosInt = 256  # stage 1 micro-batch, messages
    batch_within_s: PosFloat = 0.5  # a micro-batch waits at most this long to fill
    engine_snapshot_every_s: PosFloat = 30.0  # decision stage: state + input offsets
    detect_snapshot_every_s: PosFloat = 60.0  # stage 1: the nodes that changed since the last write
    session_timeout_s: Annotated[float, Meta(ge=6.0, le=300.0)] = 10.0  # a dead worker's partitions move after this
    # a record stamped further ahead of the clock than this is dead-lettered: it never moves event
    # time (the decision clock, command expiry, stage 1's windows); docs/streams.md
    max_future_skew_s: Annotated[float, Meta(ge=0.0, le=86_400.0)] = 300.0
    # the decision stage drops a finding id it handled before (stage 1 replays the telemetry after
    # its last checkpoint when it restarts): it remembers the ids of this much event time, at most
    # duplicate_findings_max of them (bounded, not a fixed 20,000 carried in every snapshot)
    duplicate_findings_window_s: PosFloat = 900.0
    duplicate_findings_max: PosInt = 50_000
    # the decision snapshot is written in parts of at most this many bytes when it is larger (the
    # state topic's max.message.bytes, less headroom, must take one part)
    snapshot_part_bytes: Annotated[int, Meta(ge=4096, le=MAX_STATE_BYTES - 4096)] = MAX_STATE_BYTES - 4096


class PlacementSettings(Section, frozen=True, kw_only=True):
    """Topology-aware re-placement of restarted jobs (docs/placement.md)."""

    enabled: bool = True
    rack_label: str = LABEL_RACK
    leaf_label: str = LABEL_LEAF
    spine_label: str = LABEL_SPINE
    nvlink_domain_label: str = LABEL_NVLINK_DOMAIN
    pool_label: str = LABEL_POOL
    nvlink_weight: Annotated[int, Meta(ge=0, le=100)] = 80
    leaf_weight: Annotated[int, Meta(ge=0, le=100)] = 40
    rack_weight: Annotated[int, Meta(ge=0, le=100)] = 20
    spine_weight: Annotated[int, Meta(ge=0, le=100)] = 10
    pool_weight: Annotated[int, Meta(ge=0, le=100)] = 5
    gpu_resource: str = "nvidia.com/gpu"
    node_cache_s: NonNegFloat = 2.0
    capacity_wait_s: NonNegFloat = 60.0
    capacity_poll_s: PosFloat = 1.0
    standby_label: str = ""
    standby_value: str = "true"
    standby_taint_key: str = TAINT_STANDBY
    standby_weight: Annotated[int, Meta(ge=0, le=100)] = 100
    exclude_suspects: bool = True
    kueue: Literal["auto", "off"] = "auto"


# --- node conditions as inputs (the Node watch of `watch-jobs`) ----------------------------------

ConditionStatus = Literal["True", "False", "Unknown"]
IsolationKindName = Literal["definitive", "preventive", "uncertain"]


class ConditionRule(Section, frozen=True, kw_only=True):
    """A node condition (its ``type`` in that ``status``, the reason matching ``reason_regex`` when
    given) that makes a finding: of this ``severity`` (``info``: recorded only, opens no incident),
    an isolation of this ``kind`` (``definitive`` is never refused by the safety budgets; keep it
    for conditions that prove the node or a device gone), about this ``component``."""

    type: Annotated[str, Meta(min_length=1, max_length=316)]
    status: ConditionStatus = "True"
    reason_regex: Annotated[str, Meta(max_length=1024)] = ""
    severity: Severity = "warning"
    kind: IsolationKindName = "uncertain"
    component: Annotated[str, Meta(pattern=r"^[a-z][a-z0-9_-]{0,31}$")] = "node"

    def __post_init__(self) -> None:
        if self.reason_regex:
            try:
                re.compile(self.reason_regex)
            except re.error as exc:
                raise ValueError(f"`reason_regex` of {self.type}: not a regular expression: {exc}") from None


def _condition_rules() -> list[ConditionRule]:
    """The kubelet's own conditions, node-problem-detector's (config/kernel-monitor.json,
    docker-monitor.json, the systemd monitors) and NVSentinel's (its health monitors' check names,
    which NVSentinel writes as condition types, ``True`` on a fatal event). docs/operations.md."""
    c = ConditionRule
    gpu_fatal = ("GpuMemWatch", "GpuNvlinkWatch", "GpuPcieWatch", "GpuInforomWatch", "GpuSmWatch", "GpuMcuWatch",
                 "GpuPmuWatch", "GpuDriverWatch", "SysLogsXIDError")
    return [
        c(type="Ready", status="False", severity="critical", kind="uncertain", component="node"),
        c(type="Ready", status="Unknown", severity="critical", kind="uncertain", component="node"),
        c(type="MemoryPressure", severity="info", kind="preventive", component="node"),
        c(type="DiskPressure", severity="info", kind="preventive", component="node"),
        c(type="PIDPressure", severity="info", kind="preventive", component="node"),
        c(type="KernelDeadlock", severity="critical", kind="uncertain", component="kernel"),
        c(type="ReadonlyFilesystem", severity="critical", kind="uncertain", component="storage"),
        c(type="FrequentUnregisterNetDevice", severity="warning", kind="preventive", component="network"),
        c(type="FrequentKubeletRestart", severity="warning", kind="preventive", component="node"),
        c(type="FrequentContainerdRestart", severity="warning", kind="preventive", component="node"),
        c(type="SysLogsGPUFallenOff", severity="critical", kind="definitive", component="gpu"),
        c(type="SysLogsSXIDError", severity="critical", kind="uncertain", component="nvswitch"),
        *(c(type=t, severity="critical", kind="uncertain", component="gpu") for t in gpu_fatal),
        c(type="GpuThermalWatch", severity="warning", kind="preventive", component="gpu"),
        c(type="GpuPowerWatch", severity="warning", kind="preventive", component="gpu"),
    ]


class ConditionSettings(Section, frozen=True, kw_only=True):
    """Kubernetes node conditions (the kubelet's, node-problem-detector's, NVSentinel's) as inputs:
    ``watch-jobs``' Node watch turns a change of a condition into a finding when a rule matches it
    (first match wins); a condition that does not change makes nothing."""

    enabled: bool = True
    rules: list[ConditionRule] = msgspec.field(default_factory=_condition_rules)


class Settings(Section, frozen=True, kw_only=True):
    kafka: KafkaSettings = KafkaSettings()
    topics: TopicSettings = TopicSettings()
    signing: SigningSettings = SigningSettings()
    detection: DetectionSettings = DetectionSettings()
    triage: TriageSettings = TriageSettings()
    policy: PolicySettings = PolicySettings()
    safety: SafetySettings = SafetySettings()
    executor: ExecutorSettings = ExecutorSettings()
    ingest: IngestSettings = IngestSettings()
    exporters: ExporterSettings = ExporterSettings()
    metrics: MetricsSettings = MetricsSettings()
    streams: StreamsSettings = StreamsSettings()
    jobwatch: JobWatchSettings = JobWatchSettings()
    placement: PlacementSettings = PlacementSettings()
    conditions: ConditionSettings = ConditionSettings()


# --- names that keys under maps (and items of some lists) must be --------------------------------

#: the GPU detector's signals, the keys of ``detection.metrics``: its residual signals (raw metrics)
#: and its rate signals (fleetmedic.models.gpu_signals.KNOWN_SIGNALS, which a test keeps equal;
#: the models sit above the config and cannot be imported here)
DETECTION_SIGNALS: tuple[str, ...] = (
    "gpu_temp", "memory_temp", "power_usage", "sm_clock", "mem_clock",
    "ecc_sbe_rate", "pcie_replay_rate", "nvlink_error_rate", "power_violation_rate", "thermal_violation_rate",
)
#: cumulative port counters, the keys of ``detection.ib_thresholds``
PORT_COUNTERS: tuple[str, ...] = tuple(
    f.name for f in msgspec.structs.fields(PortSample) if f.type == (Counter | None))
#: what a port finding's evidence measures (``triage.congestion_metrics``): every PortSample
#: measurement (the counters, link_state, speed_gbps, width, effective_ber)
PORT_METRICS: tuple[str, ...] = tuple(n for n in PortSample.__struct_fields__ if n not in ("port", "node", "peer"))
#: what ``exporters.kafka.metric_map`` may map a source series onto
METRIC_MAP_TARGETS: tuple[str, ...] = (*GPU_METRICS, *(f"port.{n}" for n in PortSample.__struct_fields__))
#: the parameters a policy step's ``params`` may set, the union over actions of what the executor
#: and the decision stage read (docs/executor.md, docs/workloads.md, docs/placement.md)
STEP_PARAMS: tuple[str, ...] = (
    "effect",  # taint
    "state", "value",  # label
    "level", "gpu",  # run_diagnostics, reset_gpu, hooks
    "escalation", "target_kind",  # escalate
    "kind", "timeout_s", "opt_out_label", "anti_affinity", "taint_key",  # restart_job, requeue_job
    "actor", "untaint", "uncordon",  # return_to_service
)
#: the fields of a Kubernetes toleration that a string value can set (``executor.diagnostics_tolerations``)
TOLERATION_FIELDS: tuple[str, ...] = ("key", "operator", "value", "effect")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def _did_you_mean(name: object, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.6)
    return f" (did you mean `{close[0]}`?)" if close else ""


def _is_namespace(name: str) -> bool:
    return bool(_DNS_LABEL.match(name))


def _is_annotation_key(name: str) -> bool:
    prefix, slash, rest = name.rpartition("/")
    if slash and not (len(prefix) <= 253 and _DNS_SUBDOMAIN.match(prefix)):
        return False
    return bool(_QUALIFIED_NAME.match(rest))


class _Names:
    """What the keys (or the values / items) of one map or list field name."""

    def __init__(self, what: str, known: Sequence[str] = (), *, of: Literal["keys", "values"] = "keys",
                 valid: Callable[[str], bool] | None = None, form: str = "") -> None:
        self.what, self.known, self.of, self.valid, self.form = what, tuple(known), of, valid, form

    def problem(self, name: object) -> str | None:
        if not isinstance(name, str):
            return None  # a wrong type is reported by the type check
        if self.valid is not None:
            return None if self.valid(name) else f"`{name}` is not a valid {self.what} ({self.form})"
        if name in self.known:
            return None
        hint = _did_you_mean(name, self.known)
        if not hint and len(self.known) <= 30:
            hint = f" (known: {', '.join(self.known)})"
        if self.form:
            return f"`{name}` is not {self.form}{hint}"
        return f"unknown {self.what} `{name}`{hint}"


#: (section, field) -> what the names under that map or list field must be
_NAMES: dict[tuple[type, str], _Names] = {
    (TopicSettings, "names"): _Names("topic", tuple(BY_NAME)),
    (TopicSettings, "partitions"): _Names("topic", tuple(BY_NAME)),
    (DetectionSettings, "metrics"): _Names("signal", DETECTION_SIGNALS),
    (SiblingSettings, "signals"): _Names(
        "rate signal", tuple(n for n in DETECTION_SIGNALS if n.endswith("_rate")), of="values"),
    (DetectionSettings, "ib_thresholds"): _Names("counter", PORT_COUNTERS),
    (TriageSettings, "congestion_metrics"): _Names("port metric", PORT_METRICS, of="values"),
    (ActionStep, "params"): _Names("step parameter", STEP_PARAMS),
    (ExecutorSettings, "namespace_policies"): _Names(
        "namespace", valid=_is_namespace, form="lowercase letters, digits and '-', at most 63"),
    (ExecutorSettings, "diagnostics_tolerations"): _Names("toleration field", TOLERATION_FIELDS),
    (ExecutorSettings, "diagnostics_pod_annotations"): _Names(
        "annotation key", valid=_is_annotation_key, form="[dns-subdomain/]name, the name at most 63 characters"),
    (KafkaTelemetrySettings, "metric_map"): _Names(
        "metric", METRIC_MAP_TARGETS, of="values", form="a GPU metric nor port.<PortSample field>"),
}


# --- loading ------------------------------------------------------------------------------------

#: a config file larger than this is refused before it is parsed (a ConfigMap holds at most 1 MiB)
MAX_CONFIG_BYTES = 1 << 20
#: deepest nesting of mappings and lists (through aliases too); the deepest option is 6 levels down
MAX_DEPTH = 64
#: aliases (``*name``) a document may use
MAX_ALIASES = 1_000
#: nodes that aliases may repeat in all (an alias of a 10-node list repeats 10): refuses alias
#: expansion bombs ("billion laughs") before anything is built
MAX_ALIAS_NODES = 100_000
#: errors listed in one ConfigError; the rest are counted
MAX_LISTED_ERRORS = 50


class ConfigError(ValueError):
    """An invalid config: ``path`` is the dotted field path (``""`` = the document), ``reason`` why.

    ``errors`` lists every problem found (``(path, reason)``, in document order); ``path`` and
    ``reason`` are the first's. ``str()`` gives one line per error, ``source: path: reason``."""

    def __init__(self, path: str, reason: str, source: str = "config",
                 more: Sequence[tuple[str, str]] = ()) -> None:
        self.path = path
        self.reason = reason
        self.source = source
        self.errors: tuple[tuple[str, str], ...] = ((path, reason), *more)
        super().__init__("\n".join(self.messages()))

    @classmethod
    def of(cls, errors: Sequence[tuple[str, str]], source: str) -> ConfigError:
        listed = list(errors[:MAX_LISTED_ERRORS])
        if len(errors) > MAX_LISTED_ERRORS:
            listed.append(("", f"... and {len(errors) - MAX_LISTED_ERRORS} more errors"))
        (path, reason), *more = listed
        return cls(path, reason, source, more)

    def messages(self) -> list[str]:
        """One line per error: ``source: path: reason`` (``source: reason`` for the document)."""
        return [f"{self.source}: {p}: {r}" if p else f"{self.source}: {r}" for p, r in self.errors]


class _LimitError(Exception):
    """The YAML document is over one of the limits (raised by :class:`_Loader`)."""


class _DuplicateKey(_LimitError):
    """A mapping of the YAML document gives one key twice (raised by :class:`_Loader`)."""


def _at(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "somewhere"


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with limits: nesting depth and aliases counted while composing, the
    alias expansion measured on the composed graph before any object is built, and a value that
    cannot be built (an integer of 5,000 digits, a bad date) a load error naming its line. A key
    given twice in one mapping is an error naming both lines (PyYAML keeps the last one silently:
    ``safety: {dry_run: true}`` then ``safety: {dry_run: false}`` would run live); a key a merge
    (``<<: *defaults``) brings in may still be given."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:
        # the scanner looks ahead for simple keys across every open ``[``/``{``: stop before that
        # gets quadratic (5,000 ``[`` would take seconds before the composer sees the depth)
        if self.flow_level >= MAX_DEPTH:
            raise _LimitError(f"nested deeper than {MAX_DEPTH} levels ({_at(cast(Any, self).get_mark())})")
        super().fetch_flow_collection_start(TokenClass)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                mark = cast(Any, self).peek_event().start_mark
                raise _LimitError(f"more than {MAX_ALIASES} aliases ({_at(mark)})")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = cast(Any, self).peek_event().start_mark
                raise _LimitError(f"nested deeper than {MAX_DEPTH} levels ({_at(mark)})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError, TypeError) as exc:
            raise _LimitError(f"cannot read the value at {_at(node.start_mark)}: {exc}") from None

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                try:
                    earlier = first.setdefault(key, key_node)
                except TypeError:  # an unhashable key: the constructor names it
                    continue
                if earlier is not key_node:
                    raise _DuplicateKey(f"the key {key!r} is given twice in one mapping ({_at(earlier.start_mark)} "
                                        f"and {_at(key_node.start_mark)}): keep one")
        return super().construct_mapping(node, deep)


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a graph whose aliases would repeat more than :data:`MAX_ALIAS_NODES` nodes, nest
    deeper than :data:`MAX_DEPTH` once expanded, or refer to themselves. Linear in the composed
    nodes (memoized per node); its recursion is bounded by the composed depth, because an alias
    always refers to a node composed (and so walked) before it."""
    seen: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded size, expanded depth)
    active: set[int] = set()

    def walk(node: yaml.Node) -> tuple[int, int]:
        key = id(node)
        done = seen.get(key)
        if done is not None:
            return done
        if key in active:
            raise _LimitError(f"an alias refers to the node that contains it ({_at(node.start_mark)})")
        active.add(key)
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            children = []
        size, depth = 1, 0
        for child in children:
            s, d = walk(child)
            size += s
            depth = max(depth, d)
            if size - len(seen) > MAX_ALIAS_NODES + 1:
                raise _LimitError(f"aliases repeat more than {MAX_ALIAS_NODES} nodes (an alias expansion "
                                  f"bomb?) ({_at(node.start_mark)})")
        if depth + 1 > MAX_DEPTH:
            raise _LimitError(f"nested deeper than {MAX_DEPTH} levels once aliases are expanded "
                              f"({_at(node.start_mark)})")
        active.discard(key)
        seen[key] = (size, depth + 1)
        return seen[key]

    walk(root)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` within the limits above: raises ``yaml.YAMLError`` for invalid YAML and
    :class:`_LimitError` for a document over a limit or with a key given twice in one mapping.
    ``None`` for an empty document."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _load(text: str, path: str, source: str) -> Any:
    try:
        return load_yaml(text)
    except _LimitError as exc:
        raise ConfigError(path, f"refused: {exc}", source) from None
    except yaml.YAMLError as exc:
        raise ConfigError(path, f"not valid YAML: {exc}", source) from None
    except RecursionError:  # pragma: no cover - the depth limit comes first
        raise ConfigError(path, f"refused: nested deeper than {MAX_DEPTH} levels", source) from None


_AT = re.compile(r"^(?P<reason>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<key>[^`]*)`$")


_TOKEN = re.compile(r"\.(\w+)|\[(\d+|\.\.\.)\]")


def _dotted(path: str, doc: Any, tp: Any = None) -> str:
    """Turn msgspec's ``.a.b[...][2]`` into ``a.b.<key>.2``; msgspec hides mapping keys as
    ``[...]``, so find the offending key by validating the document with one key at a time."""
    parts: list[str] = []
    node = doc
    trail: list[str | int] = []
    for m in _TOKEN.finditer(path):
        attr, index = m.group(1), m.group(2)
        if attr is not None:
            parts.append(attr)
            trail.append(attr)
            node = node.get(attr) if isinstance(node, dict) else None
        elif index == "...":
            key = _failing_key(doc, trail, node, Settings if tp is None else tp)
            parts.append(str(key) if key is not None else "<key>")
            trail.append(key if key is not None else "")
            node = node.get(key) if isinstance(node, dict) and key is not None else None
        else:
            parts.append(index)
            trail.append(int(index))
            node = node[int(index)] if isinstance(node, list) and int(index) < len(node) else None
    return ".".join(parts)


def _failing_key(doc: Any, trail: list[str | int], mapping: Any, tp: Any) -> Any:
    if not isinstance(mapping, dict) or not trail:
        return None
    for key in mapping:
        trial = _deep_copy(doc)
        holder = trial
        for step in trail[:-1]:
            holder = holder[step]
        holder[trail[-1]] = {key: mapping[key]}
        try:
            msgspec.convert(trial, tp)
        except msgspec.ValidationError:
            return key
    return None


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _error_of(exc: Exception, value: Any, tp: Any, where: str) -> tuple[str, str]:
    """``(path, reason)`` of msgspec's error converting ``value`` (found at ``where``) to ``tp``."""
    m = _AT.match(str(exc))
    reason, rel = (m.group("reason"), _dotted(m.group("path") or "", value, tp)) if m else (str(exc), "")
    path = _join(where, rel) if rel else where
    unknown = _UNKNOWN.match(reason)
    if unknown:
        key = unknown.group("key")
        known = msgspec.structs.fields(tp) if isinstance(tp, type) and issubclass(tp, Struct) else ()
        return _join(path, key), "unknown key" + _did_you_mean(key, [f.encode_name for f in known])
    return path, reason


def _error_from(exc: Exception, source: str, doc: Any) -> ConfigError:
    path, reason = _error_of(exc, doc, Settings, "")
    return ConfigError(path, reason, source)


def _convert_errors(value: Any, tp: Any, where: str) -> list[tuple[str, str]]:
    try:
        msgspec.convert(value, tp)
    except msgspec.ValidationError as exc:
        return [_error_of(exc, value, tp, where)]
    return []


def _bare(tp: Any) -> Any:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _check(value: Any, tp: Any, where: str, names: _Names | None = None) -> list[tuple[str, str]]:
    """Every problem of ``value`` (found at ``where``) as a ``tp``: structs and containers are walked
    key by key and item by item, so one bad value does not hide the next (msgspec stops at the
    first); a struct's own checks (``__post_init__``, required fields) run once its fields pass."""
    bare = _bare(tp)
    if isinstance(bare, type) and issubclass(bare, Struct) and isinstance(value, dict):
        fields = {f.encode_name: f for f in msgspec.structs.fields(bare)}
        errors: list[tuple[str, str]] = []
        for key, item in value.items():
            field = fields.get(key) if isinstance(key, str) else None
            if field is None:
                errors.append((_join(where, key), "unknown key" + _did_you_mean(key, list(fields))))
            else:
                errors += _check(item, field.type, _join(where, key), _NAMES.get((bare, field.name)))
        return errors or _convert_errors(value, tp, where)
    origin = get_origin(bare)
    if origin is dict and isinstance(value, dict):
        key_tp, item_tp = get_args(bare)
        errors = []
        for key, item in value.items():
            here = _join(where, key)
            try:
                msgspec.convert({key: None}, dict[key_tp, Any])  # type: ignore[valid-type]
            except msgspec.ValidationError as exc:
                reason = str(exc).split(" - at `", 1)[0]
                errors.append((here, f"invalid key: {reason}"))
                continue
            problem = names.problem(key if names.of == "keys" else item) if names is not None else None
            if problem is not None:
                errors.append((here, problem))
                continue
            errors += _check(item, item_tp, here)
        return errors
    if origin is list and isinstance(value, list):
        (item_tp,) = get_args(bare)
        errors = []
        for i, item in enumerate(value):
            problem = names.problem(item) if names is not None and names.of == "values" else None
            if problem is not None:
                errors.append((_join(where, i), problem))
            else:
                errors += _check(item, item_tp, _join(where, i), names if names is not None and names.of == "keys"
                                 else None)
        return errors
    return _convert_errors(value, tp, where)


def validate(doc: Any) -> list[tuple[str, str]]:
    """Every problem of a config document (a parsed YAML mapping) as ``(path, reason)``, in
    document order; empty when ``msgspec.convert(doc, Settings)`` succeeds."""
    return _check(doc, Settings, "")


def apply_env_overrides(doc: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """Return a copy of ``doc`` with ``FLEETMEDIC__A__B=v`` applied as ``doc[a][b] = yaml(v)``."""
    out: dict[str, Any] = _deep_copy(doc)
    for name in sorted(env):
        if not name.upper().startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in name[len(ENV_PREFIX) :].split("__") if p]
        if not parts:
            continue
        path = ".".join(parts)
        if len(env[name]) > MAX_CONFIG_BYTES:
            raise ConfigError(path, f"the value of {name} is longer than {MAX_CONFIG_BYTES} characters", "environment")
        try:
            value = load_yaml(env[name])
        except _LimitError as exc:
            raise ConfigError(path, f"refused value of {name}: {exc}", "environment") from None
        except yaml.YAMLError as exc:
            reason = f"cannot parse value of {name}: {exc}"
            raise ConfigError(path, reason, "environment") from None
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(".".join(parts[: i + 1]), f"{name} needs a mapping here", "environment")
            node = child
        node[parts[-1]] = value
    return out


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


def parse_config(text: str, env: Mapping[str, str] | None = None, source: str = "config") -> Settings:
    """Settings from YAML ``text`` and ``FLEETMEDIC__*`` overrides in ``env``; raises
    :class:`ConfigError` listing every error (``source`` names the file in its messages)."""
    if len(text) > MAX_CONFIG_BYTES or len(text.encode("utf-8", "replace")) > MAX_CONFIG_BYTES:
        raise ConfigError("", f"refused: larger than {MAX_CONFIG_BYTES} bytes", source)
    doc = _load(text, "", source) if text.strip() else {}
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError("", f"the document must be a mapping, got {type(doc).__name__}", source)
    doc = apply_env_overrides(doc, env or {})
    errors = validate(doc)
    if errors:
        raise ConfigError.of(errors, source)
    try:
        return msgspec.convert(doc, Settings)
    except msgspec.ValidationError as exc:  # pragma: no cover - validate() found nothing
        raise _error_from(exc, source, doc) from None


def read_config(path: str | None, env: Mapping[str, str] | None = None) -> Settings:
    """Load the config file at ``path`` (or only defaults + environment when ``path`` is None).
    The file must be UTF-8 and at most :data:`MAX_CONFIG_BYTES`; every problem is a ConfigError."""
    if path is None:
        return parse_config("", env, "defaults")
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError("", f"cannot read: {exc.strerror or exc}", path) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError("", f"refused: larger than {MAX_CONFIG_BYTES} bytes", path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        reason = (f"not UTF-8: byte 0x{data[exc.start]:02x} at byte offset {exc.start} (line {line}) "
                  f"cannot be decoded ({exc.reason})")
        raise ConfigError("", reason, path) from None
    return parse_config(text, env, path)


# --- dangerous but valid ------------------------------------------------------------------------

#: ``config_warnings`` thresholds (see its docstring)
WARN_QUARANTINED_FRACTION = 0.25
WARN_BREAKER_FRACTION = 0.5
WARN_BREAKER_MIN_NODES = 1_000
WARN_BREAKER_WINDOW_S = 60.0
WARN_COMMAND_TTL_S = 3_600.0


def config_warnings(settings: Settings) -> list[str]:
    """Settings that are valid but dangerous, one line each as ``path: why`` (empty: none).

    While fleetmedic acts (``safety.dry_run: false``):

    - ``safety.max_quarantined_fraction`` above 0.25 (:data:`WARN_QUARANTINED_FRACTION`): more than a
      quarter of the fleet may be taken out of service, bounded only by ``max_quarantined_count``;
    - a rule of the circuit breaker effectively off: a ``*_fraction`` above 0.5 (it opens only once
      more than half of its nodes are suspect at once) or a ``*_min_nodes`` of 1,000 or more (it never
      opens in a smaller storm), for the fleet-share, one-signature and one-domain rules alike; each
      warning names the rules left on (or says none is); or ``breaker.window_s`` under 60 s
      (suspicions are forgotten before a storm that unfolds over minutes reaches the trip level).

    Always:

    - a zero budget: ``safety.max_quarantined_count``, ``max_quarantined_fraction`` or
      ``max_new_isolations`` of 0 (no node is ever isolated: faults stay in service while the
      decisions look normal; ``dry_run: true`` is the way to observe only), ``max_per_rack`` or
      ``max_per_switch`` of 0 (no node in a labelled rack / behind a labelled leaf is ever isolated);
    - ``signing.command_ttl_s`` above one hour (:data:`WARN_COMMAND_TTL_S`): a signed command stays
      valid, and can be replayed or applied late on stale evidence, that long (the default is 300 s).
    """
    s = settings.safety
    b = s.breaker
    out: list[str] = []
    if not s.dry_run:
        if s.max_quarantined_fraction > WARN_QUARANTINED_FRACTION:
            out.append(f"safety.max_quarantined_fraction: {s.max_quarantined_fraction:g} with dry_run false lets "
                       f"fleetmedic take up to {s.max_quarantined_fraction:.0%} of the fleet out of service (only "
                       f"max_quarantined_count {s.max_quarantined_count} bounds it; above "
                       f"{WARN_QUARANTINED_FRACTION:g} is dangerous)")
        out += _breaker_rule_warnings(b, s.max_quarantined_count)
        if b.window_s < WARN_BREAKER_WINDOW_S:
            out.append(f"safety.breaker.window_s: {b.window_s:g}s: suspicions are forgotten before a storm that "
                       f"unfolds over minutes reaches the trip level (effectively off; under "
                       f"{WARN_BREAKER_WINDOW_S:g}s is dangerous)")
    never = "no node is ever isolated: faulty nodes stay in service (use dry_run: true to only observe)"
    if s.max_quarantined_count == 0:
        out.append(f"safety.max_quarantined_count: 0: {never}")
    if s.max_quarantined_fraction == 0:
        out.append(f"safety.max_quarantined_fraction: 0: {never}")
    if s.max_new_isolations == 0:
        out.append(f"safety.max_new_isolations: 0: {never}")
    if s.max_per_rack == 0:
        out.append("safety.max_per_rack: 0: no node with a rack label is ever isolated")
    if s.max_per_switch == 0:
        out.append("safety.max_per_switch: 0: no node with a leaf label is ever isolated")
    if settings.signing.command_ttl_s > WARN_COMMAND_TTL_S:
        out.append(f"signing.command_ttl_s: {settings.signing.command_ttl_s:g}s: a signed command stays valid "
                   f"(replayable, or applied late on stale evidence) that long; over {WARN_COMMAND_TTL_S:g}s is "
                   f"dangerous (default 300s)")
    if settings.signing.allow_demo_keys:
        out.append("signing.allow_demo_keys: true: the demo's published keys are accepted; anyone can sign "
                   "commands and operator commands (only the demo may set this)")
    return out


#: the breaker's rules: (name, what it counts, the min_nodes setting, the fraction setting)
BREAKER_RULES: Final = (
    ("fleet-share", "suspect nodes across the fleet", "trip_min_nodes", "trip_suspect_fraction"),
    ("one-signature", "suspect nodes with the same evidence", "signature_min_nodes", "signature_fraction"),
    ("one-domain", "suspect nodes of one rack or leaf", "domain_min_nodes", "domain_fraction"),
)


def _breaker_rule_warnings(b: BreakerSettings, max_count: int) -> list[str]:
    """One warning per breaker rule a setting turns off (its level ``WARN_BREAKER_MIN_NODES`` nodes or
    more, or a fraction above ``WARN_BREAKER_FRACTION``), naming the rules left on: none claims a
    rule that is off still protects."""
    off: dict[str, str] = {}
    for name, counts, min_key, fraction_key in BREAKER_RULES:
        min_nodes, fraction = getattr(b, min_key), getattr(b, fraction_key)
        if min_nodes >= WARN_BREAKER_MIN_NODES:
            off[name] = (f"safety.breaker.{min_key}: {min_nodes}: the {name} rule of the circuit breaker never "
                         f"opens for fewer {counts} at once (effectively off)")
        elif fraction > WARN_BREAKER_FRACTION:
            off[name] = (f"safety.breaker.{fraction_key}: {fraction:g}: the {name} rule of the circuit breaker "
                         f"opens only once more than {WARN_BREAKER_FRACTION:.0%} of its nodes are suspect at once "
                         "(effectively off)")
    on = [name for name, *_ in BREAKER_RULES if name not in off]
    left = (f"; only the {' and the '.join(on)} rule{'s' if len(on) > 1 else ''} can still open it" if on else
            "; no rule can open the breaker: a storm of one cause is isolated up to the budgets")
    out = []
    for name, why in off.items():
        extra = (f"; the budget for distinct evidence follows its level, up to max_quarantined_count {max_count}"
                 if name == "fleet-share" else "")
        out.append(why + extra + left)
    return out


def to_builtins(settings: Settings) -> dict[str, Any]:
    result: dict[str, Any] = msgspec.to_builtins(settings)
    return result


def to_yaml(settings: Settings) -> str:
    return yaml.safe_dump(to_builtins(settings), sort_keys=False, default_flow_style=False)
