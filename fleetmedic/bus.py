"""The event bus: every Kafka topic fleetmedic reads or writes, and how a client connects.

- :data:`TOPICS`: the public topics, their key, value, partitioning and the components that write and
  read them (from which :mod:`fleetmedic.acls` derives the grants). This table is the contract
  subscribers rely on; the README's topic table and the JSON Schemas in ``deploy/schemas/`` are
  generated from it. Topic names are ``<prefix><name>`` with a configurable prefix (default
  ``fleetmedic.``) and per-topic overrides in the config.
- The pipeline's internal topics (:data:`INTERNAL_TOPICS`: :func:`state_topic`,
  :func:`detect_state_topic`, :func:`summaries_topic`, :func:`ticks_topic`), named after the
  consumer group, and how many partitions each topic gets (:func:`partitions_of`).
- :func:`client_options`: the one place a Kafka client's connection options (bootstrap, TLS, SASL,
  metadata refresh) are built from the ``kafka`` section; every producer, consumer and admin client
  of fleetmedic takes them, producers through :func:`producer_options` (idempotent, ``acks=all``).
- The client profiles (:class:`ClientProfile`: :data:`TELEMETRY`, :data:`DECISIONS`,
  :data:`STAGE_OUTPUTS`, ...): how one kind of client uses the bus (batching, request and fetch
  sizes, whether its writes are decisions that keep ``acks=all``), written here once and taken by
  :func:`producer_options` and :func:`consumer_options`; :func:`faust_options` gives the decision
  stage's Faust app the same acknowledgements and metadata refresh.

Pure: no Kafka library is imported here (the TLS context comes from the standard library), and
nothing of fleetmedic but the records: the settings are read through their shape (``Protocol``).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Protocol

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
    def topic(self, name: str) -> str: ...
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
    single_partition: bool = False  # one partition whatever ``topics.partitions`` says (global order)
    partitions_like: str = ""  # unless ``topics.partitions`` names it: as many partitions as this topic
    # the components (:data:`COMPONENTS`) that write and read it: what :mod:`fleetmedic.acls` grants
    writers: tuple[str, ...] = ()
    readers: tuple[str, ...] = ()

    @property
    def schema_file(self) -> str:
        return f"{self.value.__name__}.schema.json"


#: the topic names' prefix unless ``topics.prefix`` says otherwise
DEFAULT_PREFIX: Final = "fleetmedic."

#: what runs under one Kafka principal (:mod:`fleetmedic.acls` describes each)
COMPONENTS: Final = ("detect", "decide", "executor", "connector", "watch-jobs", "ctl", "subscriber")

TOPICS: Final[tuple[TopicSpec, ...]] = (
    TopicSpec(
        "telemetry.gpu",
        GpuTelemetry,
        "node name",
        "by key (node): a node's samples stay ordered on one partition",
        "NVML exporter, dcgm-exporter/Prometheus ingest, simulator",
        "detection stage",
        writers=("connector",),
        readers=("detect",),
    ),
    TopicSpec(
        "telemetry.port",
        PortTelemetry,
        "device name (switch or host)",
        "by key (device)",
        "switch/NIC counter connector, node-exporter ingest, simulator",
        "detection stage",
        writers=("connector",),
        readers=("detect",),
    ),
    TopicSpec("kernel.events", KernelEvent, "node name", "by key (node), as many partitions as telemetry.gpu",
              "kernel-log exporter (`exporter kmsg`)", "detection stage (XIDs, SXids, PCIe AER, machine checks)",
              partitions_like="telemetry.gpu",  # stage 1 reads both by node
              writers=("connector",), readers=("detect",)),
    TopicSpec(
        "jobs.events",
        JobEvent,
        "job (namespace/name)",
        "by key (job)",
        "job watcher, log shipper, simulator",
        "correlation stage, detection stage (step times)",
        writers=("connector", "watch-jobs"),
        readers=("decide",),
    ),
    TopicSpec(
        "findings",
        Finding,
        "node name",
        "by key (node)",
        "detection stage",
        "correlation stage, dashboards",
        writers=("detect", "watch-jobs"),
        readers=("decide", "subscriber"),
    ),
    TopicSpec(
        "incidents",
        Incident,
        "incident id",
        "single partition (low volume, globally ordered)",
        "correlation stage",
        "decision stage, ticketing, dashboards",
        single_partition=True,
        writers=("decide",),
        readers=("ctl", "subscriber"),
    ),
    TopicSpec(
        "remediation.commands",
        RemediationCommand,
        "target (node name or namespace/name of the job)",
        "single partition (decisions are global: budgets, breaker)",
        "decision stage",
        "Kubernetes executor, schedulers, ticketing",
        single_partition=True,
        writers=("decide",),
        readers=("decide", "executor", "subscriber"),
    ),
    TopicSpec(
        "remediation.results",
        RemediationResult,
        "command id",
        "single partition",
        "Kubernetes executor",
        "decision stage (node lifecycle), dashboards",
        single_partition=True,
        writers=("executor",),
        readers=("decide", "subscriber"),
    ),
    TopicSpec(
        "remediation.audit",
        AuditRecord,
        "target (node name or namespace/name of the job; empty for fleet-wide decisions)",
        "single partition (one ordered log of decisions)",
        "decision stage",
        "operators, ticketing, dashboards, compliance",
        single_partition=True,
        writers=("decide",),
        readers=("decide", "ctl", "subscriber"),
    ),
    TopicSpec(
        "remediation.operator",
        OperatorCommand,
        "node name, or `fleet` for fleet-wide commands",
        "single partition (read by the one decision stage, in order)",
        "operators (`fleetmedic ctl`)",
        "decision stage",
        single_partition=True,
        writers=("ctl",),
        readers=("decide",),
    ),
    TopicSpec(
        "cluster.nodes",
        NodeObservation,
        "node name",
        "single partition, compacted (the latest observation per node)",
        "job watcher (`watch-jobs`, Node watch)",
        "decision stage (topology, fleet size, opt-outs, foreign cordons)",
        compacted=True,
        single_partition=True,
        writers=("watch-jobs",),
        readers=("decide",),
    ),
    TopicSpec(
        "deadletter",
        DeadLetter,
        "source topic",
        "by key (source topic)",
        "every stage and connector",
        "operators, alerting",
        writers=("detect", "decide", "executor", "connector"),
        readers=("subscriber",),
    ),
)

BY_NAME: Final[dict[str, TopicSpec]] = {t.name: t for t in TOPICS}


def topic_table_markdown(prefix: str = DEFAULT_PREFIX) -> str:
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


def partitions_of(settings: Settings, name: str) -> int:
    """The partitions of the public topic ``name``: one for a single-partition topic of the table,
    else ``topics.partitions`` or ``topics.default_partitions`` (of the topic it is partitioned like)."""
    spec = BY_NAME.get(name)
    if spec is not None and spec.single_partition:
        return 1
    if spec is not None and spec.partitions_like and name not in settings.topics.partitions:
        name = spec.partitions_like
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


@dataclass(frozen=True)
class InternalTopic:
    """A topic of the pipeline's own, named after the consumer group, with its writers and readers."""

    holds: str
    name: Callable[[Settings], str]
    writers: tuple[str, ...]
    readers: tuple[str, ...]


INTERNAL_TOPICS: Final[tuple[InternalTopic, ...]] = (
    InternalTopic("the decision engine's snapshots", state_topic, writers=("decide",), readers=("decide",)),
    InternalTopic("stage 1's node state", detect_state_topic, writers=("detect",), readers=("detect",)),
    InternalTopic("node summaries for the decision stage", summaries_topic, writers=("detect",), readers=("decide",)),
    InternalTopic("the decision stage's tick log", ticks_topic, writers=("decide",), readers=("decide",)),
)


def topics_of(settings: Settings, component: str, access: Literal["read", "write"]) -> tuple[str, ...]:
    """The names of the topics, public then internal, that ``component`` reads or writes."""
    public = [settings.topics.topic(t.name) for t in TOPICS
              if component in (t.readers if access == "read" else t.writers)]
    internal = [t.name(settings) for t in INTERNAL_TOPICS
                if component in (t.readers if access == "read" else t.writers)]
    return (*public, *internal)


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


@dataclass(frozen=True)
class ClientProfile:
    """How one kind of client uses the bus. ``decisions``: its writes (commands, results, operator
    commands, the stages' outputs and state) keep ``acks=all`` and idempotence whatever
    ``kafka.acks`` says; the sizes are aiokafka's options of the same name (0: aiokafka's default)."""

    name: str
    decisions: bool = False
    linger_ms: int = 0
    max_request_size: int = 0
    max_batch_size: int = 0
    fetch_max_bytes: int = 0
    max_partition_fetch_bytes: int = 0

    def producer(self) -> dict[str, Any]:
        sizes = {"linger_ms": self.linger_ms, "max_request_size": self.max_request_size,
                 "max_batch_size": self.max_batch_size}
        return {k: v for k, v in sizes.items() if v}

    def consumer(self) -> dict[str, Any]:
        sizes = {"fetch_max_bytes": self.fetch_max_bytes, "max_partition_fetch_bytes": self.max_partition_fetch_bytes}
        return {k: v for k, v in sizes.items() if v}


#: aiokafka's defaults, acknowledgements as ``kafka.acks`` says
PLAIN: Final = ClientProfile("plain")
#: connectors, the job watcher and the simulator's producer: many small records, batched for 20 ms
TELEMETRY: Final = ClientProfile("telemetry", linger_ms=20)
#: the executor's results and ``ctl``'s operator commands: one record at a time, never lost
DECISIONS: Final = ClientProfile("decisions", decisions=True)
#: what both stages write through their one producer (findings, incidents, commands, audit, engine
#: snapshots in parts): batched for 5 ms, requests up to a snapshot's size
STAGE_OUTPUTS: Final = ClientProfile("stage outputs", decisions=True, linger_ms=5, max_request_size=MAX_STATE_BYTES,
                                     max_batch_size=1024 * 1024)
#: an engine snapshot written on its own
SNAPSHOTS: Final = ClientProfile("snapshots", decisions=True, max_request_size=MAX_STATE_BYTES)
#: ``fleetmedic demo --bootstrap``: the simulated fleet's inputs and its executor's results
DEMO: Final = ClientProfile("demo", decisions=True, linger_ms=5)
#: stage 1's telemetry consumer: large fetches of many small records
TELEMETRY_READER: Final = ClientProfile("telemetry reader", fetch_max_bytes=64 << 20, max_partition_fetch_bytes=8 << 20)
#: a reader of the state topics: one record may be a whole snapshot
STATE_READER: Final = ClientProfile("state reader", fetch_max_bytes=64 << 20, max_partition_fetch_bytes=MAX_STATE_BYTES)
#: the decision stage's replay of its inputs
REPLAY_READER: Final = ClientProfile("replay reader", max_partition_fetch_bytes=8 << 20)


def _durable(k: KafkaSettings, profile: ClientProfile) -> bool:
    return profile.decisions or k.acks == "all"


def producer_options(k: KafkaSettings, profile: ClientProfile = PLAIN, **overrides: Any) -> dict[str, Any]:
    """:func:`client_options` for an ``AIOKafkaProducer`` of ``profile``: idempotent with
    ``acks=all`` (a retried send is written once, an acknowledged one is on ``min.insync.replicas``
    brokers) while ``kafka.acks`` is ``all``, the default. ``kafka.acks`` 1 or 0 trades that for
    latency, and idempotence needs ``all``; a profile of ``decisions`` keeps ``all`` and idempotence
    whatever ``kafka.acks`` says. Every producer of fleetmedic is built from this
    (tests/foundation/test_producers.py checks)."""
    durable = _durable(k, profile)
    opts = {"acks": "all" if durable else int(k.acks), "enable_idempotence": durable, **profile.producer()}
    return client_options(k, **(opts | overrides))


def consumer_options(k: KafkaSettings, profile: ClientProfile = PLAIN, **overrides: Any) -> dict[str, Any]:
    """:func:`client_options` for an ``AIOKafkaConsumer`` of ``profile`` (its fetch sizes)."""
    return client_options(k, **(profile.consumer() | overrides))


def faust_options(k: KafkaSettings) -> dict[str, Any]:
    """The decision stage's Faust app: its producer acknowledges as ``kafka.acks`` says (-1 is
    ``all``), takes requests up to a snapshot's size, and both its clients refresh metadata as every
    other client (Faust's default is aiokafka's 5 min); it reads a new topic from its beginning."""
    return {"producer_acks": -1 if _durable(k, PLAIN) else int(k.acks),
            "producer_max_request_size": MAX_STATE_BYTES,
            "consumer_auto_offset_reset": "earliest",
            "consumer_metadata_max_age_ms": k.metadata_max_age_ms,
            "producer_metadata_max_age_ms": k.metadata_max_age_ms}


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

