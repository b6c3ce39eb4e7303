"""The event bus: every Kafka topic fleetmedic reads or writes, and how a client connects.

- :data:`TOPICS`: the public topics, their key, value and partitioning. This table is the contract
  subscribers rely on; the README's topic table and the JSON Schemas in ``deploy/schemas/`` are
  generated from it. Topic names are ``<prefix><name>`` with a configurable prefix (default
  ``fleetmedic.``) and per-topic overrides in the config.
- The pipeline's internal topics (:func:`state_topic`, :func:`detect_state_topic`,
  :func:`summaries_topic`, :func:`ticks_topic`), named after the consumer group, and how many
  partitions each topic gets (:func:`partitions_of`).
- :func:`client_options`: the one place a Kafka client's connection options (bootstrap, TLS, SASL,
  metadata refresh) are built from the ``kafka`` section; every producer, consumer and admin client
  of fleetmedic takes them, producers through :func:`producer_options` (idempotent, ``acks=all``).

Pure: no Kafka library is imported here (the TLS context comes from the standard library), and
nothing of fleetmedic but the records: the settings are read through their shape (``Protocol``).
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from fleetmedic.records import (
    AuditRecord,
    DeadLetter,
    Finding,
    GpuTelemetry,
    Incident,
    JobEvent,
    KernelEvent,
    NodeObservation,
    OperatorCommand,
    PortTelemetry,
    Record,
    RemediationCommand,
    RemediationResult,
)


# What the functions below read of :class:`~fleetmedic.config.Settings`. The config validates topic
# names against this module's table, so this module names the settings' shape instead of importing it.
class KafkaSettings(Protocol):
    @property
    def bootstrap_servers(self) -> str: ...
    @property
    def client_id(self) -> str: ...
    @property
    def consumer_group(self) -> str: ...
    @property
    def security_protocol(self) -> str: ...
    @property
    def sasl_mechanism(self) -> str | None: ...
    @property
    def sasl_username(self) -> str: ...
    @property
    def sasl_password_env(self) -> str: ...
    @property
    def sasl_password_file(self) -> str: ...
    @property
    def ssl_cafile(self) -> str: ...
    @property
    def ssl_certfile(self) -> str: ...
    @property
    def ssl_keyfile(self) -> str: ...
    @property
    def ssl_check_hostname(self) -> bool: ...
    @property
    def acks(self) -> str: ...
    @property
    def metadata_max_age_ms(self) -> int: ...


class TopicSettings(Protocol):
    @property
    def partitions(self) -> dict[str, int]: ...
    @property
    def default_partitions(self) -> int: ...


class Settings(Protocol):
    @property
    def kafka(self) -> KafkaSettings: ...
    @property
    def topics(self) -> TopicSettings: ...


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
    TopicSpec("kernel.events", KernelEvent, "node name", "by key (node), as many partitions as telemetry.gpu",
              "kernel-log exporter (`exporter kmsg`)", "detection stage (XIDs, SXids, PCIe AER, machine checks)"),
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


# --- partitions and the pipeline's internal topics ---------------------------------------------

MAX_STATE_BYTES: Final = 16 * 1024 * 1024  # an engine snapshot of a large fleet exceeds Kafka's 1 MB default
# one partition: the README's topic table (global order, global budgets)
SINGLE_PARTITION: Final = frozenset({"incidents", "remediation.commands", "remediation.results", "remediation.audit",
                                     "remediation.operator", "cluster.nodes"})


def partitions_of(settings: Settings, name: str) -> int:
    if name in SINGLE_PARTITION:
        return 1
    if name == "kernel.events" and name not in settings.topics.partitions:  # stage 1 reads both by node
        name = "telemetry.gpu"
    return settings.topics.partitions.get(name, settings.topics.default_partitions)


def state_topic(settings: Settings) -> str:
    """The compacted topic holding the decision engine's snapshots (one key, the latest wins)."""
    return f"{settings.kafka.consumer_group}-engine-state"


def detect_group(settings: Settings) -> str:
    """Stage 1's consumer group (``--role detect``): its workers share the telemetry partitions."""
    return f"{settings.kafka.consumer_group}-detect"


def detect_state_topic(settings: Settings) -> str:
    """Compacted, one record per node (key: node), partitioned like ``telemetry.gpu``."""
    return f"{detect_group(settings)}-state"


def summaries_topic(settings: Settings) -> str:
    """Stage 1 -> decision stage: batches of node summaries and the switch ports (one partition)."""
    return f"{settings.kafka.consumer_group}-fleet-inputs"


def ticks_topic(settings: Settings) -> str:
    """The decision stage's tick log (one partition): each tick's event time and the input offsets
    it had handled, so that a replay fires it at the same place (:mod:`fleetmedic.streams.replay`)."""
    return f"{settings.kafka.consumer_group}-ticks"


# --- connecting ---------------------------------------------------------------------------------


def client_options(k: KafkaSettings, **overrides: Any) -> dict[str, Any]:
    """aiokafka client options from the ``kafka`` section: bootstrap servers, client id, how often
    the cluster metadata is refreshed (``metadata_max_age_ms``), and the security protocol with its
    SASL credentials and TLS context (``ssl_cafile``, the client's certificate and key,
    ``ssl_check_hostname``). Reads the SASL password file or variable now. ``overrides`` replace
    options of the same name (a client that needs a faster metadata refresh passes its own)."""
    opts: dict[str, Any] = {"bootstrap_servers": k.bootstrap_servers, "client_id": k.client_id,
                            "security_protocol": k.security_protocol,
                            "metadata_max_age_ms": k.metadata_max_age_ms}
    if k.security_protocol.startswith("SASL"):
        opts.update(sasl_mechanism=k.sasl_mechanism, sasl_plain_username=k.sasl_username,
                    sasl_plain_password=sasl_password(k))
    if k.security_protocol.endswith("SSL"):
        opts["ssl_context"] = tls_context(k)
    opts.update(overrides)
    return opts


def producer_options(k: KafkaSettings, *, decisions: bool = False, **overrides: Any) -> dict[str, Any]:
    """:func:`client_options` for an ``AIOKafkaProducer``: idempotent with ``acks=all`` (a retried
    send is written once, an acknowledged one is on ``min.insync.replicas`` brokers) while
    ``kafka.acks`` is ``all``, the default. ``kafka.acks`` 1 or 0 trades that for latency, and
    idempotence needs ``all``; ``decisions`` (commands, results, operator commands, the engine's
    state) keeps ``all`` and idempotence whatever ``kafka.acks`` says. Every producer of fleetmedic
    is built from this (tests/foundation/test_producers.py checks)."""
    durable = decisions or k.acks == "all"
    return client_options(k, acks="all" if durable else int(k.acks), enable_idempotence=durable, **overrides)


def sasl_password(k: KafkaSettings) -> str:
    """The SASL password: ``sasl_password_file`` (stripped) wins over the ``sasl_password_env`` variable."""
    if k.sasl_password_file:
        return Path(k.sasl_password_file).read_text(encoding="utf-8").strip()
    return os.environ.get(k.sasl_password_env, "") if k.sasl_password_env else ""


def tls_context(k: KafkaSettings) -> ssl.SSLContext:
    """A client TLS context: the system's trust store or ``ssl_cafile``, the client certificate when
    given, host-name checks as ``ssl_check_hostname`` says."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=k.ssl_cafile or None)
    if k.ssl_certfile:
        ctx.load_cert_chain(k.ssl_certfile, k.ssl_keyfile or None)
    ctx.check_hostname = k.ssl_check_hostname
    return ctx

