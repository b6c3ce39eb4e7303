"""The whole config, :class:`Settings`: one field per top-level section, and the process-wide
sections (the metrics port, the stream worker)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from fleetmedic.bus import MAX_STATE_BYTES
from fleetmedic.config.cluster import (
    AdmissionSettings,
    ClusterSettings,
    ConditionSettings,
    ExecutorSettings,
    JobWatchSettings,
    PlacementSettings,
)
from fleetmedic.config.connectors import ExporterSettings, IngestSettings
from fleetmedic.config.decisions import PolicySettings, SafetySettings, TriageSettings
from fleetmedic.config.detection import DetectionSettings
from fleetmedic.config.messaging import KafkaSettings, SigningSettings, TopicSettings
from fleetmedic.config.section import PosFloat, PosInt, Section


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


class Settings(Section, frozen=True, kw_only=True):
    cluster: ClusterSettings = ClusterSettings()
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
    admission: AdmissionSettings = AdmissionSettings()
