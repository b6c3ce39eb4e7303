"""What the names under a map (its keys or values) or the items of a list field must be: signals,
counters, topics, step parameters, namespaces... (:data:`NAMES`), with a "did you mean" for a near miss."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence
from typing import Literal

import msgspec

from fleetmedic.bus import BY_NAME
from fleetmedic.config.cluster import ExecutorSettings
from fleetmedic.config.connectors import KafkaTelemetrySettings
from fleetmedic.config.decisions import ActionStep, TriageSettings
from fleetmedic.config.detection import DetectionSettings, SiblingSettings
from fleetmedic.config.messaging import TopicSettings
from fleetmedic.records import GPU_METRICS, Counter, PortSample

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


def did_you_mean(name: object, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.6)
    return f" (did you mean `{close[0]}`?)" if close else ""


def _is_namespace(name: str) -> bool:
    return bool(_DNS_LABEL.match(name))


def _is_annotation_key(name: str) -> bool:
    prefix, slash, rest = name.rpartition("/")
    if slash and not (len(prefix) <= 253 and _DNS_SUBDOMAIN.match(prefix)):
        return False
    return bool(_QUALIFIED_NAME.match(rest))


class Names:
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
        hint = did_you_mean(name, self.known)
        if not hint and len(self.known) <= 30:
            hint = f" (known: {', '.join(self.known)})"
        if self.form:
            return f"`{name}` is not {self.form}{hint}"
        return f"unknown {self.what} `{name}`{hint}"


#: (section, field) -> what the names under that map or list field must be
NAMES: dict[tuple[type, str], Names] = {
    (TopicSettings, "names"): Names("topic", tuple(BY_NAME)),
    (TopicSettings, "partitions"): Names("topic", tuple(BY_NAME)),
    (DetectionSettings, "metrics"): Names("signal", DETECTION_SIGNALS),
    (SiblingSettings, "signals"): Names(
        "rate signal", tuple(n for n in DETECTION_SIGNALS if n.endswith("_rate")), of="values"),
    (DetectionSettings, "ib_thresholds"): Names("counter", PORT_COUNTERS),
    (TriageSettings, "congestion_metrics"): Names("port metric", PORT_METRICS, of="values"),
    (ActionStep, "params"): Names("step parameter", STEP_PARAMS),
    (ExecutorSettings, "namespace_policies"): Names(
        "namespace", valid=_is_namespace, form="lowercase letters, digits and '-', at most 63"),
    (ExecutorSettings, "diagnostics_tolerations"): Names("toleration field", TOLERATION_FIELDS),
    (ExecutorSettings, "diagnostics_pod_annotations"): Names(
        "annotation key", valid=_is_annotation_key, form="[dns-subdomain/]name, the name at most 63 characters"),
    (KafkaTelemetrySettings, "metric_map"): Names(
        "metric", METRIC_MAP_TARGETS, of="values", form="a GPU metric nor port.<PortSample field>"),
}
