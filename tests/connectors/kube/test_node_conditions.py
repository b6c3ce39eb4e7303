"""Node conditions as inputs: the kubelet's, node-problem-detector's and NVSentinel's
conditions become findings by the rules of the ``conditions`` section, only when a condition changes
into a state a rule names; triage reads the rule's kind. On the real control plane: a kwok node's
status conditions patched through the API (as NPD and NVSentinel write them) reach the Node watch
of ``watch-jobs`` and come out as findings."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from fleetmedic.config import ConfigError, JobWatchSettings, Settings, parse_config
from fleetmedic.connectors.kube.jobs import JobWatcher
from fleetmedic.connectors.kube.node_conditions import ConditionTracker
from fleetmedic.devenv import fleet as fl
from fleetmedic.records import Finding, decode, encode
from fleetmedic.remediation.triage.records import finding_class, finding_isolation

T = 1_700_000_000.0


def _node(name: str, *conds: tuple[str, str, str], beat: str = "2026-12-02T01:00:00Z",
          message: str = "") -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"conditions": [
        {"type": t, "status": s, "reason": r, "message": message or f"{t} says {r}", "lastHeartbeatTime": beat,
         "lastTransitionTime": "2026-12-02T00:00:00Z"} for t, s, r in conds]}}


READY = ("Ready", "True", "KubeletReady")


def test_only_a_change_into_a_state_a_rule_names_makes_a_finding() -> None:
    t = ConditionTracker.of(Settings())
    healthy = ("KernelDeadlock", "False", "KernelHasNoDeadlock")
    assert t.observe("ADDED", _node("gpu-1", READY, healthy), T) == []
    hung = ("KernelDeadlock", "True", "DockerHung")
    (f,) = t.observe("MODIFIED", _node("gpu-1", READY, hung), T + 5)
    assert (f.node, f.detector, f.kind, f.severity, f.action_hint, f.ts) == (
        "gpu-1", "node_condition", "hard_fault", "critical", "isolate", T + 5)
    assert f.summary == "node condition KernelDeadlock=True (DockerHung) (kernel)"
    assert f.evidence[0].metric == "uncertain:KernelDeadlock" and "KernelDeadlock says DockerHung" in f.evidence[0].note
    assert decode(Finding, encode(f)) == f
    # heartbeats and a new message alone: nothing; a new reason is a change
    assert t.observe("MODIFIED", _node("gpu-1", READY, hung, beat="2026-12-02T01:00:10Z", message="other"), T + 9) == []
    assert len(t.observe("MODIFIED", _node("gpu-1", READY, ("KernelDeadlock", "True", "AUFSUmountHung")), T + 20)) == 1
    # recovery: recorded, no incident; a node isolated for it may return once diagnostics passed
    (cleared,) = t.observe("MODIFIED", _node("gpu-1", READY, healthy), T + 30)
    assert (cleared.kind, cleared.severity, cleared.evidence[0].metric) == ("telemetry", "info",
                                                                            "cleared:KernelDeadlock")
    assert finding_class(cleared) is None and decode(Finding, encode(cleared)) == cleared
    assert t.observe("MODIFIED", _node("gpu-1", READY, healthy), T + 35) == []
    assert len(t.observe("MODIFIED", _node("gpu-1", READY, hung), T + 40)) == 1  # again


def test_the_kubelets_not_ready_and_pressure_and_nvsentinels_conditions() -> None:
    t = ConditionTracker.of(Settings())
    (down,) = t.observe("ADDED", _node("gpu-2", ("Ready", "Unknown", "NodeStatusUnknown")), T)
    assert (down.kind, down.severity, finding_isolation(down).kind) == ("hard_fault", "critical", "uncertain")
    (disk,) = t.observe("MODIFIED", _node("gpu-2", ("Ready", "Unknown", "NodeStatusUnknown"),
                                          ("DiskPressure", "True", "KubeletHasDiskPressure")), T + 1)
    assert disk.kind == "telemetry" and finding_class(disk) is None  # info: recorded, no incident
    fallen = ("SysLogsGPUFallenOff", "True", "SysLogsGPUFallenOffIsNotHealthy")
    (lost,) = t.observe("ADDED", _node("gpu-3", READY, fallen), T)
    assert finding_class(lost) == "hardware"
    assert (finding_isolation(lost).kind, finding_isolation(lost).signature) == (
        "definitive", "node_condition:SysLogsGPUFallenOff")
    (hot,) = t.observe("ADDED", _node("gpu-4", ("GpuThermalWatch", "True", "GpuThermalWatchIsNotHealthy")), T)
    assert (hot.kind, finding_class(hot), finding_isolation(hot).kind) == ("degradation", "degradation", "preventive")
    assert t.observe("DELETED", _node("gpu-4"), T) == [] and "gpu-4" not in t.nodes
    # a preventive or info condition that clears makes nothing
    assert t.observe("MODIFIED", _node("gpu-2", ("Ready", "Unknown", "NodeStatusUnknown"),
                                       ("DiskPressure", "False", "KubeletHasNoDiskPressure")), T + 2) == []


def test_rules_come_from_the_config_and_a_bad_regex_names_its_field() -> None:
    s = parse_config("""
conditions:
  rules:
    - {type: GpuXidError, status: "True", reason_regex: "^Xid(79|48)", severity: critical, kind: definitive,
       component: gpu}
""")
    t = ConditionTracker.of(s)
    assert t.observe("ADDED", _node("gpu-5", ("GpuXidError", "True", "Xid13")), T) == []
    (f,) = t.observe("MODIFIED", _node("gpu-5", ("GpuXidError", "True", "Xid79")), T + 1)
    assert finding_isolation(f).kind == "definitive"
    assert t.observe("ADDED", _node("gpu-6", ("KernelDeadlock", "True", "DockerHung")), T) == []  # not in the rules
    assert ConditionTracker.of(parse_config("conditions: {enabled: false}")).observe(
        "ADDED", _node("gpu-7", ("KernelDeadlock", "True", "DockerHung")), T) == []
    with pytest.raises(ConfigError, match=r"conditions\.rules\.0: `reason_regex` of X: not a regular expression"):
        parse_config('conditions: {rules: [{type: X, reason_regex: "(unclosed"}]}')
    with pytest.raises(ConfigError, match=r"conditions\.rules\.0\.kind"):
        parse_config("conditions: {rules: [{type: X, kind: sure}]}")


def test_conditions_patched_on_a_real_node_come_out_of_the_node_watch_as_findings(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    """NPD's KernelDeadlock and NVSentinel's GpuMemWatch written into a kwok node's status the way
    those tools write them (a strategic-merge patch of ``status.conditions``) on the real API server;
    the watcher's Node watch sees each change once; a heartbeat of the same condition makes nothing."""
    (node,) = make_fleet(1).nodes
    settings = Settings(jobwatch=JobWatchSettings(namespaces=[namespace], kinds=["Job"], watch_timeout_s=5))
    watcher = JobWatcher(kube_api, settings, CollectorRegistry())
    core = client.CoreV1Api(kube_api)
    got: list[Finding] = []

    def drain(until: Callable[[], bool], within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while not until() and time.monotonic() < deadline:
            item = watcher._next(0.2)
            if item is not None and item[0] == "Node" and item[2].get("metadata", {}).get("name") == node:
                got.extend(watcher.handle_node_conditions(item[1], item[2]))

    def set_condition(ctype: str, status: str, reason: str, message: str) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        core.patch_node_status(node, {"status": {"conditions": [
            {"type": ctype, "status": status, "reason": reason, "message": message, "lastHeartbeatTime": now,
             "lastTransitionTime": now}]}})

    try:
        watcher.start_watches(first_list_timeout=10)
        seen_at_start = time.monotonic()
        drain(lambda: time.monotonic() - seen_at_start > 1.0, within=2.0)  # the initial list: Ready only
        assert got == []
        set_condition("KernelDeadlock", "True", "DockerHung", f"task docker:7 blocked for more than 300 seconds. "
                                                                f"{uuid.uuid4().hex[:6]}")
        drain(lambda: len(got) >= 1)
        set_condition("GpuMemWatch", "True", "GpuMemWatchIsNotHealthy",
                      "ErrorCode:DCGM_FR_VOLATILE_DBE_DETECTED GPU:0 Recommended Action=COMPONENT_RESET;")
        drain(lambda: len(got) >= 2)
        set_condition("GpuMemWatch", "True", "GpuMemWatchIsNotHealthy", "the same, heartbeat")
        marker = time.monotonic()
        drain(lambda: time.monotonic() - marker > 1.5, within=2.0)
    finally:
        watcher.stop.set()
    assert [(f.node, f.evidence[0].metric, f.severity) for f in got] == [
        (node, "uncertain:KernelDeadlock", "critical"), (node, "uncertain:GpuMemWatch", "critical")]
    live = {c.type: c.status for c in core.read_node_status(node).status.conditions}
    assert live["KernelDeadlock"] == "True" and live["Ready"] == "True"  # kwok keeps the others' conditions


def test_a_condition_finding_drives_the_decision_engine_and_the_executors_class_condition() -> None:
    """NVSentinel's GPU-fallen-off condition: a definitive hardware incident, isolated outside the
    budgets; the cordon it issues names the class the executor writes as fleetmedic.io/GPUHardware."""
    from fleetmedic.executor.node import conditions as nc
    from fleetmedic.k8s_keys import CONDITION_GPU_HARDWARE
    from fleetmedic.sim.embedded import EmbeddedPipeline

    s = Settings()
    pipeline, t = EmbeddedPipeline(s, key=b"k" * 40), ConditionTracker.of(s)
    for i in range(20):
        assert t.observe("ADDED", _node(f"gpu-{i}", READY), T) == []
    (f,) = t.observe("MODIFIED", _node("gpu-3", READY, ("SysLogsGPUFallenOff", "True", "IsNotHealthy")), T + 5)
    pipeline.finding(f, T + 5)
    for k in range(1, 6):
        pipeline.tick(T + 5 + 10 * k)
    cmds = [c for c in pipeline.out.commands if c.node == "gpu-3"]
    assert [c.action for c in cmds] == ["cordon", "taint", "drain"]
    assert any("definitive evidence (node_condition:SysLogsGPUFallenOff)" in a.explanation for a in pipeline.out.audit)
    cls = nc.isolated(cmds[0])
    assert cls is not None and (cls[0], cls[1].reason) == (CONDITION_GPU_HARDWARE, "Hardware")
