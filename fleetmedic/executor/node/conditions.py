"""The per-class node conditions the executor writes (pure), so that ``kubectl describe node`` and
condition-aware tooling see why fleetmedic isolated a node.

When a command isolates a node (``cordon``, ``taint``), the condition of its incident's class is
set ``True`` (the keys are in :mod:`fleetmedic.k8s_keys`):

=====================  ===============================================================
incident class         condition
=====================  ===============================================================
hardware               ``fleetmedic.io/GPUHardware``
degradation            ``fleetmedic.io/GPUDegraded``
network                ``fleetmedic.io/Network``
any other              ``fleetmedic.io/Suspect``
=====================  ===============================================================

with the policy rule as its reason (``rule hardware-reset`` -> ``HardwareReset``) and the incident
and the command's reason as its message. Failed diagnostics set ``fleetmedic.io/DiagnosticsFailed``
(the failed tests in the message); passing ones clear it. A return to service sets every one of these
the node carries to ``False`` (reason ``ReturnedToService``): the history stays visible.

The class is the command's ``params.incident_class`` when given, else the prefix of its incident id
(the decision stage names incidents ``<class>:<subject>:<ms>``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from fleetmedic.k8s_keys import (
    CONDITION_DIAGNOSTICS_FAILED,
    CONDITION_GPU_DEGRADED,
    CONDITION_GPU_HARDWARE,
    CONDITION_NETWORK,
    CONDITION_SUSPECT,
)
from fleetmedic.records import RemediationCommand

BY_CLASS: Final = {"hardware": CONDITION_GPU_HARDWARE, "degradation": CONDITION_GPU_DEGRADED,
                   "network": CONDITION_NETWORK}
#: every per-class condition (what a return to service clears)
CLASS_CONDITIONS: Final = (CONDITION_GPU_HARDWARE, CONDITION_GPU_DEGRADED, CONDITION_NETWORK, CONDITION_SUSPECT,
                           CONDITION_DIAGNOSTICS_FAILED)
CLASSES: Final = frozenset({"hardware", "degradation", "network", "transient_software", "job_bug", "unknown"})
_RULE = re.compile(r"^rule ([A-Za-z0-9][\w.-]*)")



@dataclass(frozen=True)
class Condition:
    """A node condition's status, reason and message (its type is the key it is written under)."""

    status: Literal["True", "False"]
    reason: str
    message: str


ClassCondition = tuple[str, Condition]


def incident_class(cmd: RemediationCommand) -> str:
    """The class of the command's incident ("" if it does not say)."""
    given = cmd.params.get("incident_class", "")
    if given in CLASSES:
        return given
    prefix = cmd.incident_id.partition(":")[0]
    return prefix if prefix in CLASSES else ""


def isolated(cmd: RemediationCommand) -> ClassCondition | None:
    """The condition an isolating command sets, or None when its incident's class is unknown."""
    klass = incident_class(cmd)
    if not klass:
        return None
    rule = _RULE.match(cmd.reason)
    reason = _camel(rule.group(1)) if rule else _camel(klass)
    message = f"fleetmedic {cmd.action} for a {klass.replace('_', ' ')} incident ({cmd.incident_id}): {cmd.reason}"
    return BY_CLASS.get(klass, CONDITION_SUSPECT), Condition("True", reason, message[:1024])


def diagnosed(passed: bool, why: str, present: Mapping[str, str]) -> tuple[ClassCondition, ...]:
    """After diagnostics: failed sets ``DiagnosticsFailed``; passed clears it where the node has it."""
    if not passed:
        return ((CONDITION_DIAGNOSTICS_FAILED, Condition("True", "DiagnosticsFailed", why[:1024])),)
    if present.get(CONDITION_DIAGNOSTICS_FAILED) == "True":
        return ((CONDITION_DIAGNOSTICS_FAILED, Condition("False", "DiagnosticsPassed", why[:1024] or
                                                         "fleetmedic diagnostics passed")),)
    return ()


def returned(present: Mapping[str, str], why: str) -> tuple[ClassCondition, ...]:
    """A return to service: every per-class condition the node carries as ``True`` goes ``False``."""
    return tuple((t, Condition("False", "ReturnedToService", why[:1024])) for t in CLASS_CONDITIONS
                 if present.get(t) == "True")


def _camel(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in re.split(r"[^A-Za-z0-9]+", name) if p) or "Isolated"
