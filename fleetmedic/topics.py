"""The event bus: every Kafka topic fleetmedic reads or writes, its key, value and partitioning.

This table is the contract subscribers rely on; the README's topic table and the JSON Schemas in
``deploy/schemas/`` are generated from it. Topic names are ``<prefix><name>`` with a configurable
prefix (default ``fleetmedic.``) and per-topic overrides in the config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from fleetmedic.records import (
    AuditRecord,
    DeadLetter,
    Finding,
    GpuTelemetry,
    Incident,
    JobEvent,
    NodeObservation,
    OperatorCommand,
    PortTelemetry,
    Record,
    RemediationCommand,
    RemediationResult,
)


@dataclass(frozen=True)
class TopicSpec:
    name: str  # without the prefix
    value: type[Record]
    key: str
    partitioning: str
    producers: str
    consumers: str
    compacted: bool = False  # cleanup.policy=compact: the latest record per key is what counts

    @property
    def schema_file(self) -> str:
        return f"{self.value.__name__}.schema.json"


TOPICS: Final[tuple[TopicSpec, ...]] = (
    TopicSpec(
        "telemetry.gpu",
        GpuTelemetry,
        "node name",
        "by key (node): a node's samples stay ordered on one partition",
        "NVML exporter, dcgm-exporter/Prometheus ingest, simulator",
        "detection stage",
    ),
    TopicSpec(
        "telemetry.port",
        PortTelemetry,
        "device name (switch or host)",
        "by key (device)",
        "switch/NIC counter connector, node-exporter ingest, simulator",
        "detection stage",
    ),
    TopicSpec(
        "jobs.events",
        JobEvent,
        "job (namespace/name)",
        "by key (job)",
        "job watcher, log shipper, simulator",
        "correlation stage, detection stage (step times)",
    ),
    TopicSpec(
        "findings",
        Finding,
        "node name",
        "by key (node)",
        "detection stage",
        "correlation stage, dashboards",
    ),
    TopicSpec(
        "incidents",
        Incident,
        "incident id",
        "single partition (low volume, globally ordered)",
        "correlation stage",
        "decision stage, ticketing, dashboards",
    ),
    TopicSpec(
        "remediation.commands",
        RemediationCommand,
        "target (node name or namespace/name of the job)",
        "single partition (decisions are global: budgets, breaker)",
        "decision stage",
        "Kubernetes executor, schedulers, ticketing",
    ),
    TopicSpec(
        "remediation.results",
        RemediationResult,
        "command id",
        "single partition",
        "Kubernetes executor",
        "decision stage (node lifecycle), dashboards",
    ),
    TopicSpec(
        "remediation.audit",
        AuditRecord,
        "target (node name or namespace/name of the job; empty for fleet-wide decisions)",
        "single partition (one ordered log of decisions)",
        "decision stage",
        "operators, ticketing, dashboards, compliance",
    ),
    TopicSpec(
        "remediation.operator",
        OperatorCommand,
        "node name, or `fleet` for fleet-wide commands",
        "single partition (read by the one decision stage, in order)",
        "operators (`fleetmedic ctl`)",
        "decision stage",
    ),
    TopicSpec(
        "cluster.nodes",
        NodeObservation,
        "node name",
        "single partition, compacted (the latest observation per node)",
        "job watcher (`watch-jobs`, Node watch)",
        "decision stage (topology, fleet size, opt-outs, foreign cordons)",
        compacted=True,
    ),
    TopicSpec(
        "deadletter",
        DeadLetter,
        "source topic",
        "by key (source topic)",
        "every stage and connector",
        "operators, alerting",
    ),
)

BY_NAME: Final[dict[str, TopicSpec]] = {t.name: t for t in TOPICS}


def topic_table_markdown(prefix: str = "fleetmedic.") -> str:
    """The README's topic table."""
    rows = [
        "| topic | key | value schema | partitioning | producers | consumers |",
        "|---|---|---|---|---|---|",
    ]
    for t in TOPICS:
        rows.append(
            f"| `{prefix}{t.name}` | {t.key} | [`{t.value.__name__}`](deploy/schemas/{t.schema_file}) "
            f"| {t.partitioning} | {t.producers} | {t.consumers} |"
        )
    return "\n".join(rows)
