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

The rooms, each read alone; every public name is re-exported here (``from fleetmedic.config import X``):

- the sections, one module per part of the pipeline: :mod:`.messaging` (Kafka, topics, signing),
  :mod:`.detection`, :mod:`.decisions` (triage, policy, safety), :mod:`.cluster` (the cluster's
  name, executor, placement, job watch, node conditions), :mod:`.connectors` (ingest, exporters), all on
  :mod:`.section` (the base and the bounded numbers); :mod:`.settings` holds :class:`Settings`;
- :mod:`.names`: what the names under map and list fields must be;
- :mod:`.loader`: the hardened YAML loader; :mod:`.parse`: text to :class:`Settings`, errors, overrides;
- :mod:`.warnings`: valid but dangerous settings.
"""

from __future__ import annotations

from fleetmedic.config.cluster import (
    AdmissionSettings,
    ClusterSettings,
    ConditionRule,
    ConditionSettings,
    ConditionStatus,
    ExecutorSettings,
    IsolationKindName,
    JobWatchSettings,
    NamespaceDrainPolicy,
    PlacementSettings,
)
from fleetmedic.config.connectors import (
    ExporterSettings,
    InfinibandExporterSettings,
    InfinibandPortLink,
    IngestSettings,
    KafkaTelemetrySettings,
    KmsgExporterSettings,
    LogExporterSettings,
    NvmlExporterSettings,
    PodDiscoverySettings,
    PrometheusExporterSettings,
    RemoteWriteAuthSettings,
    RemoteWriteSettings,
    RemoteWriteTlsSettings,
)
from fleetmedic.config.decisions import (
    ActionStep,
    BreakerSettings,
    PolicyRule,
    PolicySettings,
    RuleMatch,
    SafetySettings,
    TriageSettings,
)
from fleetmedic.config.detection import (
    BaselineSettings,
    CusumSettings,
    DetectionSettings,
    MetricThreshold,
    MultivariateSettings,
    PeerSettings,
    SiblingSettings,
    StragglerSettings,
    XidAction,
    XidSettings,
)
from fleetmedic.config.loader import MAX_ALIAS_NODES, MAX_ALIASES, MAX_DEPTH, load_yaml
from fleetmedic.config.messaging import CommandKeySettings, KafkaSettings, SigningSettings, TopicSettings
from fleetmedic.config.names import (
    DETECTION_SIGNALS,
    METRIC_MAP_TARGETS,
    PORT_COUNTERS,
    PORT_METRICS,
    STEP_PARAMS,
    TOLERATION_FIELDS,
)
from fleetmedic.config.parse import (
    ENV_PREFIX,
    MAX_CONFIG_BYTES,
    MAX_LISTED_ERRORS,
    ConfigError,
    apply_env_overrides,
    parse_config,
    read_config,
    to_builtins,
    to_yaml,
    validate,
)
from fleetmedic.config.section import Fraction, NonNegFloat, NonNegInt, PosFloat, PosInt, Section
from fleetmedic.config.settings import MetricsSettings, Settings, StreamsSettings
from fleetmedic.config.warnings import (
    BREAKER_RULES,
    WARN_BREAKER_FRACTION,
    WARN_BREAKER_MIN_NODES,
    WARN_BREAKER_WINDOW_S,
    WARN_COMMAND_TTL_S,
    WARN_QUARANTINED_FRACTION,
    config_warnings,
)

__all__ = [
    "BREAKER_RULES",
    "DETECTION_SIGNALS",
    "ENV_PREFIX",
    "MAX_ALIASES",
    "MAX_ALIAS_NODES",
    "MAX_CONFIG_BYTES",
    "MAX_DEPTH",
    "MAX_LISTED_ERRORS",
    "METRIC_MAP_TARGETS",
    "PORT_COUNTERS",
    "PORT_METRICS",
    "STEP_PARAMS",
    "TOLERATION_FIELDS",
    "WARN_BREAKER_FRACTION",
    "WARN_BREAKER_MIN_NODES",
    "WARN_BREAKER_WINDOW_S",
    "WARN_COMMAND_TTL_S",
    "WARN_QUARANTINED_FRACTION",
    "ActionStep",
    "AdmissionSettings",
    "BaselineSettings",
    "BreakerSettings",
    "ClusterSettings",
    "CommandKeySettings",
    "ConditionRule",
    "ConditionSettings",
    "ConditionStatus",
    "ConfigError",
    "CusumSettings",
    "DetectionSettings",
    "ExecutorSettings",
    "ExporterSettings",
    "Fraction",
    "InfinibandExporterSettings",
    "InfinibandPortLink",
    "IngestSettings",
    "IsolationKindName",
    "JobWatchSettings",
    "KafkaSettings",
    "KafkaTelemetrySettings",
    "KmsgExporterSettings",
    "LogExporterSettings",
    "MetricThreshold",
    "MetricsSettings",
    "MultivariateSettings",
    "NamespaceDrainPolicy",
    "NonNegFloat",
    "NonNegInt",
    "NvmlExporterSettings",
    "PeerSettings",
    "PlacementSettings",
    "PodDiscoverySettings",
    "PolicyRule",
    "PolicySettings",
    "PosFloat",
    "PosInt",
    "PrometheusExporterSettings",
    "RemoteWriteAuthSettings",
    "RemoteWriteSettings",
    "RemoteWriteTlsSettings",
    "RuleMatch",
    "SafetySettings",
    "Section",
    "Settings",
    "SiblingSettings",
    "SigningSettings",
    "StragglerSettings",
    "StreamsSettings",
    "TopicSettings",
    "TriageSettings",
    "XidAction",
    "XidSettings",
    "apply_env_overrides",
    "config_warnings",
    "load_yaml",
    "parse_config",
    "read_config",
    "to_builtins",
    "to_yaml",
    "validate",
]
