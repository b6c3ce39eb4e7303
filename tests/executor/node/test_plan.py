"""The executor's pure planning (fleetmedic.executor.node.plan), without a cluster: screening (a
command signed with an operator key, or addressed to another cluster, is refused) and idempotency
records, the node changes of each quick action and what they never undo, the drain plan per
namespace policy, the diagnostics Job and its minimal privileges, hook templates (values substituted
into parsed strings, never into YAML), verdicts from Job conditions."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from fleetmedic.config import ExecutorSettings, Settings, parse_config
from fleetmedic.executor.dispatch import CommandExecutor
from fleetmedic.executor.metrics import ExecutorMetrics
from fleetmedic.executor.node import long_plan as pl
from fleetmedic.executor.node import plan as p
from fleetmedic.k8s_keys import (
    ANNOTATION_COMMANDS,
    ANNOTATION_CORDONED_BY,
    ANNOTATION_DIAGNOSTICS,
    ANNOTATION_DRAIN,
    ANNOTATION_INFLIGHT,
    ANNOTATION_REASON,
    ANNOTATION_TAINTED_BY,
    LABEL_STATE,
    TAINT_QUARANTINE,
)
from fleetmedic.records import RemediationCommand
from fleetmedic.signing import sign

KEY = b"k" * 40
OPERATOR_KEY = b"o" * 40  # what `fleetmedic ctl` signs with: the executor never holds it
SKEW = Settings().streams.max_future_skew_s
CFG = ExecutorSettings(namespace_policies={"infer": "wait_for_completion", "batch": "evict_now"},
                       drain_evict_after_s=60.0, drain_timeout_s=300.0)


def cmd(action: str = "cordon", cid: str = "c1", **kw: object) -> RemediationCommand:
    fields: dict[str, object] = dict(id=cid, action=action, incident_id="inc-1", reason="xid 79", issued_at=1000.0,
                                     expires_at=1300.0, node="n1")
    fields.update(kw)
    return sign(RemediationCommand(**fields), KEY)  # type: ignore[arg-type]


def node(**kw: object) -> p.NodeView:
    return p.NodeView(name="n1", **kw)  # type: ignore[arg-type]


# --- screening ------------------------------------------------------------------------------------


def test_signed_fresh_command_is_accepted_tampered_or_expired_is_refused_with_reason() -> None:
    c = cmd()
    assert p.reject_reason(c, KEY, 1100.0, max_future_skew_s=SKEW) is None
    tampered = RemediationCommand(**{**{f: getattr(c, f) for f in c.__struct_fields__}, "node": "n2"})
    assert "signature" in (p.reject_reason(tampered, KEY, 1100.0, max_future_skew_s=SKEW) or "")
    assert "signature" in (p.reject_reason(c, b"x" * 40, 1100.0, max_future_skew_s=SKEW) or "")
    assert (p.reject_reason(c, KEY, 1301.0, max_future_skew_s=SKEW) or "").startswith("expired")


class _NoCluster:
    """A cluster that must not be touched."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the executor touched the cluster ({name}) for a command it must refuse")


def test_the_executor_refuses_a_command_signed_with_an_operator_key_before_touching_the_cluster() -> None:
    drain = RemediationCommand(id="c1", action="drain", incident_id="inc-1", reason="ctl user", issued_at=1000.0,
                               expires_at=1300.0, node="n1")
    assert "signature" in (p.reject_reason(sign(drain, OPERATOR_KEY), KEY, 1100.0, max_future_skew_s=SKEW) or "")
    ex = CommandExecutor(_NoCluster(), Settings(), KEY, identity="t", restarter=_NoCluster(),  # type: ignore[arg-type]
                         clock=lambda: 1100.0)
    out = ex.handle(sign(drain, OPERATOR_KEY))
    assert out.outcome == "skipped" and "signature rejected" in out.reason


def test_the_executor_refuses_a_command_for_another_cluster_before_touching_the_cluster() -> None:
    east = parse_config("cluster: {name: gpu-east-1}", env={})
    metrics = ExecutorMetrics(CollectorRegistry())
    ex = CommandExecutor(_NoCluster(), east, KEY, identity="t", restarter=_NoCluster(), clock=lambda: 1100.0,  # type: ignore[arg-type]
                         metrics=metrics)
    west = ex.handle(cmd("drain", cluster="gpu-west-2"))  # signed for cluster gpu-west-2: genuine, not ours
    assert west.outcome == "skipped" and "addressed to cluster 'gpu-west-2'" in west.reason
    unlabeled = ex.handle(cmd("drain"))
    assert unlabeled.outcome == "skipped" and "names no cluster" in unlabeled.reason
    assert metrics.rejected.labels(reason="cluster")._value.get() == 2


def test_recorded_command_id_is_a_duplicate_inflight_id_resumes_and_expired_ids_are_forgotten() -> None:
    c = cmd()
    assert p.screen(c, {}) == "act"
    ann = {ANNOTATION_COMMANDS: p.remember({}, c, 1000.0)}
    assert p.screen(c, ann) == "duplicate"
    assert p.screen(cmd(cid="c2"), ann) == "act"
    assert p.screen(cmd(cid="c3"), {ANNOTATION_INFLIGHT: json.dumps({"id": "c3"})}) == "resume"
    later = p.remember(ann, cmd(cid="c2", issued_at=1400.0, expires_at=1700.0), 1400.0)
    assert set(p.applied_ids({ANNOTATION_COMMANDS: later})) == {"c2"}  # c1 expired at 1300: refused anyway
    assert p.applied_ids({ANNOTATION_COMMANDS: "not json"}) == {}


def test_the_record_of_applied_ids_is_bounded() -> None:
    ann: dict[str, str] = {}
    for i in range(p.MAX_REMEMBERED + 50):
        ann = {ANNOTATION_COMMANDS: p.remember(ann, cmd(cid=f"c{i}", expires_at=1300.0 + i), 1000.0)}
    ids = p.applied_ids(ann)
    assert len(ids) == p.MAX_REMEMBERED and f"c{p.MAX_REMEMBERED + 49}" in ids and "c0" not in ids


# --- quick node actions ---------------------------------------------------------------------------


def test_cordon_of_a_schedulable_node_is_owned_and_explained() -> None:
    plan = p.plan_node_action(cmd(), node(), CFG, 1000.0)
    assert plan.outcome == "applied" and plan.unschedulable is True
    assert plan.annotations[ANNOTATION_CORDONED_BY] == "fleetmedic" and plan.details["already_cordoned"] == "false"
    assert plan.labels == {LABEL_STATE: "quarantined"}
    assert plan.condition and plan.condition.status == "True" and plan.event and "xid 79" in plan.event.message
    assert ANNOTATION_REASON in plan.annotations


def test_cordon_of_a_node_someone_else_cordoned_reports_it_and_takes_no_ownership() -> None:
    plan = p.plan_node_action(cmd(), node(unschedulable=True), CFG, 1000.0)
    assert plan.outcome == "applied" and plan.details["already_cordoned"] == "true"
    assert plan.unschedulable is None and ANNOTATION_CORDONED_BY not in plan.annotations


def test_uncordon_and_return_to_service_never_lift_a_cordon_or_taint_fleetmedic_did_not_make() -> None:
    foreign = node(unschedulable=True, taints=(p.Taint(TAINT_QUARANTINE, "x", "NoSchedule"),),
                   annotations={ANNOTATION_DIAGNOSTICS: json.dumps({"verdict": "pass"})})
    assert p.plan_node_action(cmd("uncordon"), foreign, CFG, 1000.0).outcome == "skipped"
    assert p.plan_node_action(cmd("untaint"), foreign, CFG, 1000.0).outcome == "skipped"
    back = p.plan_node_action(cmd("return_to_service"), foreign, CFG, 1000.0)
    assert back.outcome == "applied" and back.unschedulable is None and back.taints is None
    assert "cordon (not fleetmedic's)" in back.reason and "taint (not fleetmedic's)" in back.reason


def test_taint_adds_the_configured_key_with_effect_from_params_and_keeps_other_taints() -> None:
    other = p.Taint("kwok.x-k8s.io/node", "fake", "NoSchedule")
    plan = p.plan_node_action(cmd("taint", params={"effect": "NoExecute"}), node(taints=(other,)), CFG, 1000.0)
    assert plan.taints == (other, p.Taint(TAINT_QUARANTINE, "true", "NoExecute"))
    assert plan.annotations[ANNOTATION_TAINTED_BY] == "NoExecute"
    assert p.plan_node_action(cmd("taint", params={"effect": "Bogus"}), node(), CFG, 1000.0).outcome == "failed"
    untaint = p.plan_node_action(cmd("untaint"), node(taints=(other, *plan.taints[1:]),
                                                      annotations={ANNOTATION_TAINTED_BY: "NoExecute"}), CFG, 1000.0)
    assert untaint.taints == (other,) and untaint.annotations[ANNOTATION_TAINTED_BY] is None


def test_return_to_service_is_refused_without_passing_diagnostics_unless_an_operator_clears() -> None:
    owned = node(unschedulable=True, taints=(p.Taint(TAINT_QUARANTINE, "true", "NoSchedule"),),
                 annotations={ANNOTATION_CORDONED_BY: "fleetmedic", ANNOTATION_TAINTED_BY: "NoSchedule"})
    refused = p.plan_node_action(cmd("return_to_service"), owned, CFG, 1000.0)
    assert refused.outcome == "failed" and "no diagnostics" in refused.reason
    failed = replace(owned, annotations={**owned.annotations, ANNOTATION_DIAGNOSTICS: json.dumps({"verdict": "fail"})})
    assert "diagnostics fail" in p.plan_node_action(cmd("return_to_service"), failed, CFG, 1000.0).reason
    cleared = p.plan_node_action(cmd("return_to_service", params={"actor": "alice"}), owned, CFG, 1000.0)
    assert cleared.outcome == "applied" and cleared.unschedulable is False and cleared.taints == ()
    passed = replace(owned, annotations={**owned.annotations, ANNOTATION_DIAGNOSTICS: json.dumps({"verdict": "pass"})})
    back = p.plan_node_action(cmd("return_to_service", params={"uncordon": "false"}), passed, CFG, 1000.0)
    assert back.outcome == "applied" and back.unschedulable is None and back.taints == ()
    assert back.labels == {LABEL_STATE: None} and back.condition and back.condition.status == "False"


def test_escalate_and_hooks_without_configuration_are_skipped_with_a_reason_and_an_event() -> None:
    esc = p.plan_node_action(cmd("escalate", params={"escalation": "repair"}), node(), CFG, 1000.0)
    assert esc.outcome == "skipped" and "no escalate hook" in esc.reason and esc.event and esc.event.warning
    reset = p.no_hook_plan(cmd("reset_gpu"))
    assert reset.outcome == "skipped" and "no reset_gpu hook" in reset.reason


def test_merge_patch_carries_the_resource_version_guard_and_only_what_changes() -> None:
    plan = p.plan_node_action(cmd(), node(), CFG, 1000.0)
    patch = p.merge_patch(plan, node(resource_version="42"))
    assert patch["metadata"]["resourceVersion"] == "42" and patch["spec"] == {"unschedulable": True}
    undo = p.merge_patch(p.NodePlan("applied", unschedulable=False), node())
    assert undo["spec"] == {"unschedulable": None}  # merge patch null: the field goes, as kubectl uncordon


def test_dry_run_description_lists_the_changes() -> None:
    text = ", ".join(p.plan_node_action(cmd("taint"), node(), CFG, 1000.0).changes())
    assert f"{TAINT_QUARANTINE}=true:NoSchedule" in text and f"label {LABEL_STATE}=quarantined" in text


# --- drain ------------------------------------------------------------------------------------------


def pods() -> list[pl.PodView]:
    return [pl.PodView("batch", "train-0", owner_kind="Job"), pl.PodView("infer", "srv-0", owner_kind="ReplicaSet"),
            pl.PodView("other", "web-0", owner_kind="ReplicaSet"),
            pl.PodView("kube-system", "ds-0", owner_kind="DaemonSet"),
            pl.PodView("kube-system", "static", mirror=True), pl.PodView("batch", "done", phase="Succeeded"),
            pl.PodView("batch", "going", deleting=True)]


def test_drain_plan_follows_namespace_policies_and_leaves_daemonset_mirror_and_finished_pods() -> None:
    step = pl.plan_drain(pods(), CFG, started_at=0.0, now=10.0)
    assert [x.name for x in step.evict] == ["train-0"]
    assert {x.name for x in step.wait} == {"srv-0", "web-0", "going"}
    assert {x.name: why for x, why in step.skipped} == {"ds-0": "DaemonSet pod", "static": "mirror (static) pod",
                                                       "done": "already Succeeded"}
    later = pl.plan_drain(pods(), CFG, started_at=0.0, now=61.0)  # evict_after_timeout: web-0 goes after 60 s
    assert {x.name for x in later.evict} == {"train-0", "web-0"} and not later.timed_out
    assert pl.plan_drain(pods(), CFG, 0.0, 300.0).timed_out
    assert pl.plan_drain([x for x in pods() if x.owner_kind == "DaemonSet"], CFG, 0.0, 1.0).done


def test_a_resumed_drain_keeps_its_original_start() -> None:
    c = cmd("drain")
    ann = {ANNOTATION_DRAIN: json.dumps({"command": "c1", "started": 500.0})}
    assert pl.drain_started(ann, c, 900.0) == 500.0
    assert pl.drain_started(ann, cmd("drain", cid="other"), 900.0) == 900.0


# --- diagnostics --------------------------------------------------------------------------------------


def test_diagnostics_job_is_pinned_tolerates_the_quarantine_and_uses_the_configured_command() -> None:
    cfg = ExecutorSettings(diagnostics_tolerations=[{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                           diagnostics_pod_annotations={"a": "b"})
    job = pl.diagnostics_job(cmd("run_diagnostics", params={"level": "1"}), node(gpus=8), cfg)
    spec = job["spec"]["template"]["spec"]
    assert spec["nodeName"] == "n1" and job["spec"]["backoffLimit"] == 0
    keys = [t["key"] for t in spec["tolerations"]]
    assert keys == [TAINT_QUARANTINE, "node.kubernetes.io/unschedulable", "kwok.x-k8s.io/node"]
    assert spec["containers"][0]["command"] == ["dcgmi", "diag", "-r", "1"]
    assert spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert job["spec"]["template"]["metadata"]["annotations"]["a"] == "b"
    assert job["metadata"]["name"] == pl.diagnostics_job(cmd("run_diagnostics"), node(), cfg)["metadata"]["name"]


def test_diagnostics_job_has_the_least_privileges_dcgmi_needs() -> None:
    spec = pl.diagnostics_job(cmd("run_diagnostics"), node(gpus=8), CFG)["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert not {"hostPID", "hostNetwork", "hostIPC", "volumes"} & set(spec)
    (container,) = spec["containers"]
    sc = container["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}  # one capability, documented why
    assert sc["privileged"] is False and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "volumeMounts" not in container


@pytest.mark.parametrize(("conditions", "passed"), [
    ([], None), ([("Complete", "True", "")], True), ([("Failed", "True", "BackoffLimitExceeded")], False),
    ([("Failed", "False", ""), ("SuccessCriteriaMet", "True", "")], True)])
def test_job_outcome_from_conditions(conditions: list[tuple[str, str, str]], passed: bool | None) -> None:
    assert pl.job_outcome(conditions).passed is passed


def test_failed_tests_come_from_the_termination_message() -> None:
    assert pl.failed_tests("memory, pcie\nmore text") == "memory,pcie"
    assert pl.failed_tests("") == "diagnostics"


def test_hook_template_is_substituted_and_must_be_a_job() -> None:
    tpl = "kind: Job\napiVersion: batch/v1\nmetadata: {name: '${name}'}\nspec: {template: {spec: {nodeName: ${node}}}}"
    doc = pl.hook_job(tpl, cmd("reset_gpu", params={"gpu": "3"}), node(), CFG)
    assert doc["spec"]["template"]["spec"]["nodeName"] == "n1" and doc["metadata"]["namespace"] == "fleetmedic-system"
    with pytest.raises(ValueError, match=r"action_hooks\.reset_gpu"):
        pl.hook_job("kind: Pod", cmd("reset_gpu"), node(), CFG)
    with pytest.raises(ValueError, match=r"action_hooks\.reset_gpu: the template is not valid YAML"):
        pl.hook_job("kind: Job\n  bad: [", cmd("reset_gpu"), node(), CFG)


HOOK = """\
kind: Job
apiVersion: batch/v1
metadata:
  name: ${name}
  labels: {fleetmedic.io/node: ${node}}
spec:
  template:
    spec:
      nodeName: ${node}
      restartPolicy: Never
      containers:
        - name: reset
          image: example.invalid/reset:1
          args: [--node, "${node}", --command, '${command_id}', --gpu, $gpu, --reason, ${reason}, --cost, $$5]
          env:
            - {name: REASON, value: "${reason}"}
"""


@pytest.mark.parametrize("evil", [
    "n1\n      hostPID: true\n      serviceAccountName: cluster-admin",  # a new line: new keys
    "n1}, hostNetwork: true, x: {",  # closing the flow mapping
    "n1\", privileged: \"true", "'n1', x: 'y'", "!!python/object:os.system", "&a [*a, *a]", "true", "1e3",
])
def test_a_hook_value_cannot_inject_yaml_it_stays_the_string_it_was(evil: str) -> None:
    c = cmd("reset_gpu", cid=f"inc-1/reset_gpu/{evil}/1", reason=evil, params={"gpu": evil})
    doc = pl.hook_job(HOOK, c, p.NodeView(name=evil), CFG)
    spec = doc["spec"]["template"]["spec"]
    assert set(spec) == {"nodeName", "restartPolicy", "containers"} and spec["nodeName"] == evil
    (container,) = spec["containers"]
    assert container["args"] == ["--node", evil, "--command", c.id, "--gpu", evil, "--reason", evil, "--cost", "$5"]
    assert container["env"] == [{"name": "REASON", "value": evil}]
    assert doc["metadata"]["labels"] == {"fleetmedic.io/node": evil, "app.kubernetes.io/managed-by": "fleetmedic"}
    assert set(doc) == {"kind", "apiVersion", "metadata", "spec"}


def test_a_placeholder_in_a_key_is_refused() -> None:
    with pytest.raises(ValueError, match="placeholders go in values only"):
        pl.hook_job("kind: Job\nmetadata: {labels: {${node}: x}}", cmd("reset_gpu"), node(), CFG)
