"""Per-class node conditions: isolating a node sets the condition of its incident's class
(``fleetmedic.io/GPUHardware``, ``GPUDegraded``, ``Network``, ``Suspect``) with the policy rule as
reason and the incident in the message; failed diagnostics set ``DiagnosticsFailed``; a return to
service sets them ``False``. On the real API server with ``kubectl describe node``; the RBAC of
deploy/rbac/executor.yaml (nodes/status patch) is checked in test_rbac.py."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv import settings as devenv_settings
from fleetmedic.executor.node import conditions as nc
from fleetmedic.executor.node import plan as p
from fleetmedic.k8s_keys import (
    CONDITION_DIAGNOSTICS_FAILED,
    CONDITION_GPU_DEGRADED,
    CONDITION_GPU_HARDWARE,
    CONDITION_NETWORK,
    CONDITION_QUARANTINE,
    CONDITION_SUSPECT,
)
from fleetmedic.records import RemediationCommand
from fleetmedic.signing import sign
from tests.executor.helpers_executor import KEY, executor, settings

T = 1_700_000_000.0


def _cmd(action: str, node: str, incident: str, rule: str = "hardware-reset", **kw: Any) -> RemediationCommand:
    now = time.time()
    return sign(RemediationCommand(id=f"{incident}/{action}/{node}/e1.{uuid.uuid4().hex[:4]}", action=action,
                                   incident_id=incident, reason=f"rule {rule}, incident {incident}", issued_at=now,
                                   expires_at=now + 600, node=node, **kw), KEY)


def test_the_condition_follows_the_incidents_class_and_the_rule() -> None:
    hw = nc.isolated(_cmd("cordon", "n1", "hardware:node:n1:1700000000000"))
    assert hw is not None and hw[0] == CONDITION_GPU_HARDWARE
    assert (hw[1].status, hw[1].reason) == ("True", "HardwareReset")
    assert "hardware incident (hardware:node:n1:1700000000000)" in hw[1].message
    assert nc.isolated(_cmd("taint", "n1", "network:link:n1:1", rule="network-link"))[1:] == (
        nc.Condition("True", "NetworkLink", "fleetmedic taint for a network incident (network:link:n1:1): "
                                           "rule network-link, incident network:link:n1:1"),)
    assert nc.isolated(_cmd("cordon", "n1", "degradation:node:n1:1"))[0] == CONDITION_GPU_DEGRADED  # type: ignore[index]
    assert nc.isolated(_cmd("cordon", "n1", "unknown:node:n1:1", rule="repeated-on-node"))[0] == CONDITION_SUSPECT  # type: ignore[index]
    assert nc.isolated(_cmd("cordon", "n1", "inc-7")) is None  # no class: only FleetmedicQuarantine
    given = _cmd("cordon", "n1", "inc-7", params={"incident_class": "network"})
    assert nc.isolated(given)[0] == CONDITION_NETWORK  # type: ignore[index]
    present = {CONDITION_GPU_HARDWARE: "True", CONDITION_NETWORK: "False", "Ready": "True",
               CONDITION_DIAGNOSTICS_FAILED: "True"}
    assert [t for t, _ in nc.returned(present, "back")] == [CONDITION_GPU_HARDWARE, CONDITION_DIAGNOSTICS_FAILED]
    assert [(t, c.status) for t, c in nc.diagnosed(False, "diagnostics fail (memory)", {})] == [
        (CONDITION_DIAGNOSTICS_FAILED, "True")]
    assert [(t, c.status) for t, c in nc.diagnosed(True, "diagnostics pass", present)] == [
        (CONDITION_DIAGNOSTICS_FAILED, "False")]
    assert nc.diagnosed(True, "diagnostics pass", {}) == ()
    plan = p.plan_node_action(_cmd("cordon", "n1", "hardware:node:n1:1"), p.NodeView(name="n1"),
                              settings("ns").executor, time.time())
    assert f"condition {CONDITION_GPU_HARDWARE}=True (HardwareReset)" in plan.changes()  # what a dry run says


def _conditions(core: client.CoreV1Api, name: str) -> dict[str, Any]:
    return {c.type: c for c in core.read_node_status(name).status.conditions or []}


def test_isolation_sets_per_class_conditions_and_return_to_service_clears_them(
    kube_api: client.ApiClient, kube_config: Path, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    core = client.CoreV1Api(kube_api)
    (name,) = make_fleet(1).nodes
    ex = executor(kube_api, settings(namespace))
    hw, net = f"hardware:node:{name}:1700000000000", f"network:link:{name}:1700000000001"
    assert ex.handle(_cmd("cordon", name, hw)).outcome == "applied"
    assert ex.handle(_cmd("taint", name, net, rule="network-link")).outcome == "applied"
    conds = _conditions(core, name)
    gpu, network = conds[CONDITION_GPU_HARDWARE], conds[CONDITION_NETWORK]
    assert (gpu.status, gpu.reason) == ("True", "HardwareReset") and hw in gpu.message
    assert (network.status, network.reason) == ("True", "NetworkLink") and net in network.message
    assert conds["Ready"].status == "True" and CONDITION_GPU_DEGRADED not in conds  # kwok's stay; no others
    kubectl = shutil.which("kubectl") or str(devenv_settings.layout().k8s_bin / "kubectl")
    if Path(kubectl).is_file():
        out = subprocess.run([kubectl, "--kubeconfig", str(kube_config), "describe", "node", name],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        assert re.search(r"fleetmedic\.io/GPUHardware\s+True\s.*HardwareReset\s+fleetmedic cordon for a hardware "
                         r"incident", out), out
    elif devenv_settings.services_required():
        pytest.fail(f"no kubectl at {kubectl} (`fleetmedic dev build` builds it)", pytrace=False)
    back = ex.handle(_cmd("return_to_service", name, hw, params={"actor": "alice"}))
    assert back.outcome == "applied", back.reason
    conds = _conditions(core, name)
    assert {t: (conds[t].status, conds[t].reason) for t in (CONDITION_GPU_HARDWARE, CONDITION_NETWORK)} == {
        CONDITION_GPU_HARDWARE: ("False", "ReturnedToService"), CONDITION_NETWORK: ("False", "ReturnedToService")}
    assert conds[CONDITION_QUARANTINE].status == "False" and conds["Ready"].status == "True"
