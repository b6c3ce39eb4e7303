"""The pure half of the long node actions: which pods a drain evicts (per namespace policy), the
diagnostics Job and hook Jobs to create, and what a finished Job means (verdict, failed tests).
No cluster access: :mod:`.long_apply` carries these out."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetmedic.config import ExecutorSettings
from fleetmedic.executor.node.plan import NodeView, annotation_json
from fleetmedic.k8s_keys import ANNOTATION_COMMAND, ANNOTATION_DRAIN, ANNOTATION_NODE, LABEL_ROLE
from fleetmedic.records import RemediationCommand

# --- drain -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    phase: str = "Running"
    owner_kind: str = ""
    mirror: bool = False
    deleting: bool = False
    role: str = ""  # the label LABEL_ROLE (fleetmedic's own diagnostics and hook pods)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class DrainStep:
    """One pass of a drain: pods to evict now, pods to wait for, pods left alone (and why)."""

    evict: tuple[PodView, ...]
    wait: tuple[PodView, ...]
    skipped: tuple[tuple[PodView, str], ...]
    timed_out: bool

    @property
    def done(self) -> bool:
        return not self.evict and not self.wait


def namespace_policy(namespace: str, cfg: ExecutorSettings) -> str:
    return cfg.namespace_policies.get(namespace, cfg.default_namespace_policy)


def plan_drain(pods: Sequence[PodView], cfg: ExecutorSettings, started_at: float, now: float) -> DrainStep:
    """Which pods of the node to evict now, per namespace policy; DaemonSet and mirror pods stay."""
    evict: list[PodView] = []
    wait: list[PodView] = []
    skipped: list[tuple[PodView, str]] = []
    elapsed = now - started_at
    for pod in pods:
        if pod.owner_kind == "DaemonSet":
            skipped.append((pod, "DaemonSet pod"))
        elif pod.mirror:
            skipped.append((pod, "mirror (static) pod"))
        elif pod.phase in ("Succeeded", "Failed"):
            skipped.append((pod, f"already {pod.phase}"))
        elif pod.deleting:
            wait.append(pod)
        else:
            policy = namespace_policy(pod.namespace, cfg)
            if policy == "evict_now" or (policy == "evict_after_timeout" and elapsed >= cfg.drain_evict_after_s):
                evict.append(pod)
            else:
                wait.append(pod)
    return DrainStep(tuple(evict), tuple(wait), tuple(skipped), elapsed >= cfg.drain_timeout_s)


def drain_state(annotations: Mapping[str, str]) -> dict[str, Any]:
    return annotation_json(annotations.get(ANNOTATION_DRAIN, ""))


def drain_started(annotations: Mapping[str, str], cmd: RemediationCommand, now: float) -> float:
    """The start of this command's drain (resumed after a restart), or ``now`` for a new one."""
    state = drain_state(annotations)
    return float(state["started"]) if state.get("command") == cmd.id and "started" in state else now


# --- diagnostics and hooks ------------------------------------------------------------------------


#: The diagnostics container's privileges: the least ``dcgmi diag`` is documented to need
#: (docs/executor.md, "Diagnostics: privileges"). DCGM's user guide says its host engine (which
#: ``dcgmi diag`` drives) should run as root, and the GPU performance counters that DCGM's profiling
#: module reads are restricted by the driver to CAP_SYS_ADMIN (``NVreg_RestrictProfilingToAdminUsers=1``,
#: the default since R418; NVIDIA runs its DCGM containers with ``--cap-add SYS_ADMIN`` for this).
#: Every other capability is dropped; the runtime's default seccomp profile; not privileged (the GPUs
#: come from the device plugin's ``nvidia.com/gpu`` requests), no host namespaces or paths, no
#: service-account token (the pod spec). ``allowPrivilegeEscalation`` cannot be false next to
#: SYS_ADMIN (the API server refuses the pair). The Job is short-lived, pinned to a node that is
#: cordoned and drained, in fleetmedic's own namespace.
DIAGNOSTICS_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsUser": 0,
    "runAsNonRoot": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def job_name(prefix: str, cmd: RemediationCommand) -> str:
    return f"{prefix}-{hashlib.sha256(cmd.id.encode()).hexdigest()[:12]}"


def diagnostics_job(cmd: RemediationCommand, node: NodeView, cfg: ExecutorSettings) -> dict[str, Any]:
    """The diagnostics Job: pinned to the node by ``nodeName``, tolerating fleetmedic's taint and the
    cordon (and ``executor.diagnostics_tolerations``), holding all the node's GPUs."""
    tolerations: list[dict[str, Any]] = [
        {"key": cfg.taint_key, "operator": "Exists"},
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
        *[dict(t) for t in cfg.diagnostics_tolerations],
    ]
    command = list(cfg.diagnostics_command)
    level = cmd.params.get("level")
    if level and level.isdigit() and "-r" in command and command.index("-r") + 1 < len(command):
        command[command.index("-r") + 1] = level
    gpus = {"nvidia.com/gpu": str(node.gpus)} if node.gpus else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name("fleetmedic-diag", cmd),
            "namespace": cfg.diagnostics_namespace,
            "labels": {"app.kubernetes.io/managed-by": "fleetmedic", LABEL_ROLE: "diagnostics"},
            "annotations": {ANNOTATION_NODE: node.name, ANNOTATION_COMMAND: cmd.id[:1024]},
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": int(cfg.diagnostics_timeout_s),
            "ttlSecondsAfterFinished": 86_400,
            "template": {
                "metadata": {
                    "labels": {LABEL_ROLE: "diagnostics"},
                    "annotations": {ANNOTATION_NODE: node.name, **cfg.diagnostics_pod_annotations},
                },
                "spec": {
                    "nodeName": node.name,
                    "restartPolicy": "Never",
                    "tolerations": tolerations,
                    # it talks to no API server and needs no Service environment
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "containers": [{
                        "name": "diag",
                        "image": cfg.diagnostics_image,
                        "command": command,
                        "resources": {"requests": gpus, "limits": gpus},
                        "securityContext": DIAGNOSTICS_SECURITY_CONTEXT,
                    }],
                },
            },
        },
    }


#: the placeholders of a hook template (``$name`` or ``${name}``; ``$$`` is a literal ``$``)
HOOK_PLACEHOLDERS = ("node", "gpu", "command_id", "reason", "name", "namespace")
_PLACEHOLDER = re.compile(r"\$(?:(\$)|\{(" + "|".join(HOOK_PLACEHOLDERS) + r")\}|(" + "|".join(HOOK_PLACEHOLDERS)
                          + r")(?![A-Za-z0-9_]))")
_TOKEN = re.compile(r"FleetmedicHook(Dollar|" + "|".join(p.replace("_", "") for p in HOOK_PLACEHOLDERS) + r")Z9q")


def _token(name: str) -> str:
    """A stand-in for a placeholder that is a plain YAML string wherever it stands."""
    return f"FleetmedicHook{name.replace('_', '')}Z9q"


def hook_job(template: str, cmd: RemediationCommand, node: NodeView, cfg: ExecutorSettings) -> dict[str, Any]:
    """A hook Job from a YAML template with ``${node}``, ``${gpu}``, ``${command_id}``, ``${reason}``,
    ``${name}`` and ``${namespace}`` substituted.

    The template is parsed first (each placeholder standing in as a plain word), and the values go
    into the parsed *string values* afterwards, as text: a node name, command id or reason can
    never add, change or remove YAML structure, nor turn into a number or a boolean. A placeholder
    in a mapping key is refused. (A template that hands a value to a shell, ``sh -c "... ${reason}"``,
    must quote it there itself; pass values as arguments or environment variables instead.)"""
    import yaml

    name = job_name(f"fleetmedic-{cmd.action.replace('_', '-')}", cmd)
    values = {"node": node.name, "gpu": cmd.params.get("gpu", "all"), "commandid": cmd.id, "reason": cmd.reason,
              "name": name, "namespace": cfg.diagnostics_namespace, "Dollar": "$"}
    where = f"executor.action_hooks.{cmd.action}"

    def protect(m: re.Match[str]) -> str:
        return _token("Dollar") if m.group(1) else _token(m.group(2) or m.group(3))

    try:
        doc = yaml.safe_load(_PLACEHOLDER.sub(protect, template))
    except yaml.YAMLError as exc:
        raise ValueError(f"{where}: the template is not valid YAML: {exc}") from None

    def fill(value: Any) -> Any:
        if isinstance(value, str):
            return _TOKEN.sub(lambda m: values[m.group(1)], value)
        if isinstance(value, list):
            return [fill(v) for v in value]
        if isinstance(value, dict):
            return {_key(k): fill(v) for k, v in value.items()}
        return value

    def _key(k: Any) -> Any:
        if not isinstance(k, str):
            return k
        k = k.replace(_token("Dollar"), "$")
        if _TOKEN.search(k):
            raise ValueError(f"{where}: a placeholder in the key {_TOKEN.sub('$...', k)!r}: "
                             f"placeholders go in values only")
        return k

    doc = fill(doc)
    if not isinstance(doc, dict) or doc.get("kind") != "Job":
        raise ValueError(f"{where}: the template must be one batch/v1 Job")
    meta = doc.setdefault("metadata", {})
    meta.setdefault("name", name)
    meta.setdefault("namespace", cfg.diagnostics_namespace)
    meta.setdefault("labels", {})["app.kubernetes.io/managed-by"] = "fleetmedic"
    pod_meta = doc.setdefault("spec", {}).setdefault("template", {}).setdefault("metadata", {})
    pod_meta.setdefault("labels", {})[LABEL_ROLE] = cmd.action
    return doc


@dataclass(frozen=True)
class JobOutcome:
    """A finished (or not) Job: ``None`` while it runs."""

    passed: bool | None
    message: str = ""


def job_outcome(conditions: Sequence[tuple[str, str, str]], failure_message: str = "") -> JobOutcome:
    """From the Job's ``(type, status, message)`` conditions: Complete -> passed, Failed -> failed."""
    for kind, status, message in conditions:
        if status != "True":
            continue
        if kind in ("Complete", "SuccessCriteriaMet"):
            return JobOutcome(True, message)
        if kind in ("Failed", "FailureTarget"):
            return JobOutcome(False, failure_message or message)
    return JobOutcome(None)


def failed_tests(message: str) -> str:
    """The failing tests from a diagnostics pod's termination message (``memory,pcie`` or free text)."""
    first = (message.strip().splitlines() or [""])[0].strip()
    if first and re.fullmatch(r"[A-Za-z0-9_,. -]+", first) and len(first) <= 200:
        return ",".join(p.strip() for p in first.split(",") if p.strip())
    return "diagnostics"

