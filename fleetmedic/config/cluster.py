"""Kubernetes, acted on and read: the cluster this deployment serves (its name), the executor,
topology-aware placement of restarted jobs, the job watch (``fleetmedic watch-jobs``) and the node
conditions it turns into findings."""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from fleetmedic.config.section import NonNegFloat, PosFloat, PosInt, Section
from fleetmedic.k8s_keys import (
    LABEL_LEAF,
    LABEL_NVLINK_DOMAIN,
    LABEL_POOL,
    LABEL_RACK,
    LABEL_SPINE,
    LABEL_STATE,
    TAINT_QUARANTINE,
    TAINT_STANDBY,
)
from fleetmedic.records import ClusterName, Severity

NamespaceDrainPolicy = Literal["evict_now", "wait_for_completion", "evict_after_timeout"]


class ClusterSettings(Section, frozen=True, kw_only=True):
    """The cluster this deployment serves, so one Kafka and one Grafana can serve several. ``name``
    goes into every record fleetmedic produces (``cluster``, inside a command's signature) and onto
    every metric (a ``cluster`` label, when set); consumers skip records of another cluster, and the
    executor refuses a command addressed to one (docs/operations.md, "Several clusters")."""

    name: ClusterName = ""
    # the executor of a named cluster acts on a command that names no cluster (from a decision stage
    # without `cluster.name`) only when this is true
    accept_unlabeled_commands: bool = False


class AdmissionSettings(Section, frozen=True, kw_only=True):
    """The bind-time check (docs/safety.md, "The bind-time check"): the decision worker answers the
    API server's validating webhook for pod bindings, refusing a bind to a node whose cordon
    fleetmedic issued and has not yet seen applied. The API server calls webhooks over HTTPS only;
    the chart's ValidatingWebhookConfiguration fails open (``failurePolicy: Ignore``)."""

    enabled: bool = False
    listen: str = "0.0.0.0:8443"  # host:port the decision worker serves the webhook on
    path: str = "/admission/binding"
    cert_file: str = ""  # PEM certificate chain the API server verifies (the webhook's caBundle signed it)
    key_file: str = ""  # its private key (PEM)

    def __post_init__(self) -> None:
        host, sep, port = self.listen.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"listen: not host:port ({self.listen[:100]!r})")
        if not self.path.startswith("/"):
            raise ValueError(f"path: must start with / ({self.path[:100]!r})")
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("cert_file and key_file go together (both set, or neither)")
        if self.enabled and not self.cert_file:
            raise ValueError("enabled: the API server calls webhooks over HTTPS only (set cert_file and key_file)")


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
    # objects a list asks for at once: a page is decoded whole (a kwok Node ~20 KiB), and what a
    # list holds at its peak sets the watcher's RSS for good (pages freed leave memory behind)
    list_page_size: Annotated[int, Meta(ge=1, le=5000)] = 100
    # a deleted workload's lingering pods (updated before the garbage collector deletes them) are
    # not taken for a new job of that name for this long
    deleted_memory_s: PosFloat = 600.0
    watch_nodes: bool = True  # Node watch -> cluster.nodes (topology, opt-outs, cordons for the decision stage)


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
