"""Telemetry in: how ingest reads labels, and the exporters (``fleetmedic exporter ...``;
docs/connectors.md)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from fleetmedic.config.section import NonNegFloat, NonNegInt, PosFloat, PosInt, Section
from fleetmedic.records import GPU_METRICS, PortSample


class IngestSettings(Section, frozen=True, kw_only=True):
    node_labels: list[str] = msgspec.field(default_factory=lambda: ["Hostname", "node", "instance"])
    gpu_label: str = "gpu"
    port_device_label: str = "device"
    port_label: str = "port"


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
    when they change (fleetmedic/tls_files.py)."""

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
