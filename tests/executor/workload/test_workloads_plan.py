"""The pure restart planner: which pod templates a kind has, when node exclusion is needed and how it
is merged into the owner's affinity, in-place preference, attempts and the annotations recorded."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fleetmedic.executor.workload import plan as wp
from fleetmedic.k8s_keys import (
    ANNOTATION_EXCLUDED_NODES,
    ANNOTATION_IN_PLACE_NODES,
    ANNOTATION_LAST_RESTART,
    ANNOTATION_RESTART_ATTEMPTS,
    ANNOTATION_RESTART_IN_PROGRESS,
    TAINT_QUARANTINE,
)

NOW = 1_780_000_000.0


def pod(tolerations: list[dict[str, Any]] | None = None, affinity: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "i"}]}
    if tolerations is not None:
        spec["tolerations"] = tolerations
    if affinity is not None:
        spec["affinity"] = affinity
    return spec


def job(spec: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "train", "namespace": "ml", "uid": "u1", "resourceVersion": "7"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"template": {"spec": spec}}}


def plan(obj: dict[str, Any], kind: wp.WorkloadKind = wp.JOB, **kw: Any) -> wp.RestartPlan:
    args: dict[str, Any] = {"action": "restart_job", "exclude_nodes": ["bad"], "current_nodes": ["a", "bad"],
                            "params": {}, "now": NOW, "actor": "ex-0"}
    return wp.plan_restart(kind, obj, **{**args, **kw})


def test_kinds_and_job_refs_parse_or_name_the_field() -> None:
    assert wp.kind_named("pytorchjob") is wp.PYTORCHJOB and wp.kind_named("jobsets") is wp.JOBSET
    with pytest.raises(wp.WorkloadError, match=r"params\.kind"):
        wp.kind_named("Deployment")
    assert wp.parse_job_ref("ml/train") == ("ml", "train")
    for bad in ("train", "/train", "ml/", "a/b/c"):
        with pytest.raises(wp.WorkloadError, match="job: expected 'namespace/name'"):
            wp.parse_job_ref(bad)


def test_tolerations_that_let_pods_onto_a_quarantined_node() -> None:
    assert wp.tolerates([{"operator": "Exists"}], TAINT_QUARANTINE)
    assert wp.tolerates([{"key": TAINT_QUARANTINE, "operator": "Exists"}], TAINT_QUARANTINE)
    assert not wp.tolerates([{"operator": "Exists", "effect": "NoExecute"}], TAINT_QUARANTINE)
    assert not wp.tolerates([{"key": "kwok.x-k8s.io/node", "value": "fake"}], TAINT_QUARANTINE)
    assert wp.needs_node_exclusion(pod([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]),
                                   TAINT_QUARANTINE)


def test_node_exclusion_is_anded_into_every_required_term_and_merges_with_earlier_exclusions() -> None:
    owner = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["h100"]}]},
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a100"]}]}]}},
        "podAntiAffinity": {"x": 1}}
    once = wp.with_node_exclusion(owner, ["n2"])
    twice = wp.with_node_exclusion(once, ["n1", "n2"])
    terms = twice["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchExpressions"][-1]["values"] for t in terms] == [["n1", "n2"], ["n1", "n2"]]
    assert all(len(t["matchExpressions"]) == 2 for t in terms)
    assert twice["podAntiAffinity"] == {"x": 1} and wp.excluded_nodes(twice) == {"n1", "n2"}
    assert wp.excluded_nodes(owner) == set() and "n2" not in json.dumps(owner)  # input untouched
    assert wp.excluded_nodes(wp.with_node_exclusion(None, ["z"])) == {"z"}


def test_in_place_preference_replaces_only_fleetmedics_earlier_preference() -> None:
    theirs = {"weight": 5, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}
    aff = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [theirs]}}
    first = wp.with_preferred_nodes(aff, ["n2", "n1"])
    second = wp.with_preferred_nodes(first, ["n3"], previous=["n1", "n2"])
    prefs = second["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert prefs[0] == theirs and prefs[1]["preference"]["matchExpressions"][0]["values"] == ["n3"]
    assert len(prefs) == 2
    assert wp.with_preferred_nodes(wp.with_preferred_nodes(None, ["a"]), [], previous=["a"]) == {}


def test_job_whose_pods_the_taint_keeps_off_needs_no_template_change() -> None:
    p = plan(job(pod([{"key": "kwok.x-k8s.io/node", "operator": "Exists"}])))
    assert p.template_ops == [] and p.excluded == () and p.mechanism == "suspend_resume"
    assert "suspend, resume" in p.summary
    always = plan(job(pod()), params={"anti_affinity": "always"})
    assert always.template_ops[0]["path"] == "/spec/template/spec/affinity" and always.excluded == ("bad",)
    assert plan(job(pod([{"operator": "Exists"}])), params={"anti_affinity": "never"}).template_ops == []
    with pytest.raises(wp.WorkloadError, match=r"params\.anti_affinity"):
        plan(job(pod()), params={"anti_affinity": "maybe"})
    with pytest.raises(wp.WorkloadError, match="action:"):
        plan(job(pod()), action="reboot_node")


def test_job_tolerating_all_taints_gets_the_exclusion_and_the_restart_is_recorded() -> None:
    obj = job(pod([{"operator": "Exists"}]),
              annotations={ANNOTATION_RESTART_ATTEMPTS: "2", ANNOTATION_EXCLUDED_NODES: "old"})
    p = plan(obj, params={"command_id": "c-9"})
    value = p.template_ops[0]["value"]
    assert wp.excluded_nodes(value) == {"bad"}
    assert p.attempt == 3 and p.excluded == ("bad", "old")
    record = json.loads(p.annotations[ANNOTATION_LAST_RESTART])
    assert record == {"at": "2026-05-28T20:26:40Z", "action": "restart_job", "by": "ex-0", "command": "c-9",
                      "exclude": ["bad"], "attempt": 3}
    ops = p.annotation_ops(obj["metadata"]["annotations"], remove=[ANNOTATION_RESTART_IN_PROGRESS])
    assert {"op": "add", "path": "/metadata/annotations/fleetmedic.io~1restart-attempts", "value": "3"} in ops
    assert p.details()["excluded_nodes"] == "bad,old" and p.details()["template_changed"] == "true"


def test_retry_in_place_prefers_the_current_nodes_less_the_suspects_it_excludes() -> None:
    p = plan(job(pod([{"operator": "Exists"}])), action="retry_in_place")
    assert p.excluded == ("bad",) and p.preferred == ("a",)
    aff = p.template_ops[0]["value"]["nodeAffinity"]
    assert aff["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": wp.HOSTNAME_LABEL, "operator": "NotIn", "values": ["bad"]}]


def test_retry_in_place_with_nothing_suspected_prefers_the_current_nodes_and_excludes_nothing() -> None:
    p = plan(job(pod([{"operator": "Exists"}])), action="retry_in_place", exclude_nodes=[])
    assert p.excluded == () and p.preferred == ("a", "bad")
    aff = p.template_ops[0]["value"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in aff["nodeAffinity"]
    assert p.annotations[ANNOTATION_IN_PLACE_NODES] == "a,bad"
    # the next re-placement drops that preference again
    pref = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchExpressions": [
            {"key": wp.HOSTNAME_LABEL, "operator": "In", "values": ["a", "bad"]}]}}]}}
    later = plan(job(pod(affinity=pref), annotations={ANNOTATION_IN_PLACE_NODES: "a,bad"}))
    assert later.template_ops == [{"op": "add", "path": "/spec/template/spec/affinity", "value": {}}]
    ops = later.annotation_ops({ANNOTATION_IN_PLACE_NODES: "a,bad"})
    assert {"op": "remove", "path": "/metadata/annotations/fleetmedic.io~1in-place-nodes"} in ops


def test_pytorchjob_and_jobset_templates_are_all_patched() -> None:
    tol = [{"operator": "Exists"}]
    ptj = {"metadata": {"name": "p", "namespace": "ml"}, "spec": {"pytorchReplicaSpecs": {
        "Master": {"replicas": 1, "template": {"spec": pod(tol)}},
        "Worker": {"replicas": 3, "template": {"spec": pod(tol)}}}}}
    p = plan(ptj, kind=wp.PYTORCHJOB)
    assert [op["path"] for op in p.template_ops] == ["/spec/pytorchReplicaSpecs/Master/template/spec/affinity",
                                                     "/spec/pytorchReplicaSpecs/Worker/template/spec/affinity"]
    assert p.mechanism == "evict_pods" and "operator to recreate" in p.summary
    js = {"metadata": {"name": "j", "namespace": "ml"}, "spec": {"replicatedJobs": [
        {"name": "w", "replicas": 2, "template": {"spec": {"template": {"spec": pod(tol)}}}}]}}
    q = plan(js, kind=wp.JOBSET)
    assert [op["path"] for op in q.template_ops] == ["/spec/replicatedJobs/0/template/spec/template/spec/affinity"]
    with pytest.raises(wp.WorkloadError, match="no pod template"):
        plan({"metadata": {}, "spec": {}}, kind=wp.JOBSET)


def test_finished_workloads_are_recognised() -> None:
    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    assert wp.finished(wp.JOB, done) == "Job has finished (Complete)"
    assert wp.finished(wp.JOB, {"status": {"conditions": [{"type": "Suspended", "status": "True"}]}}) == ""
