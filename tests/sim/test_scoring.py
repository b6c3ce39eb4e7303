"""The scorer's arithmetic on a hand-made case: matching (window, strict blame before mere
relatedness, duplicates), precision/recall/F1 overall, per class and per kind (false incidents
charged by class), detection delays, top-1/top-3 attribution, negative controls blamed on the
infrastructure, isolation episodes (justified, healthy, software faults isolated), false positives
per node-day, and node-hours estimated from the command timeline."""

from __future__ import annotations

import msgspec
import pytest

from fleetmedic.evaluation.scoring import format_report, isolation_episodes, names_fault, score
from fleetmedic.evaluation.truth import Blame, RunMeta, TruthRecord
from fleetmedic.records import Incident, RemediationCommand, Suspect


def _t(id: str, kind: str, cls: str, comp: str, onset: float, end: float, exp: str, blame: list[tuple[str, str]],
       nodes: list[str], isolate: list[str] | None = None, jobs: list[str] | None = None, job: str = "") -> TruthRecord:
    return TruthRecord(id=id, kind=kind, fault_class=cls, component=comp, onset=onset, end=end,  # type: ignore[arg-type]
                       expected_response=exp, blame=[Blame(kind=k, name=n) for k, n in blame],  # type: ignore[arg-type]
                       nodes=nodes, isolate_nodes=isolate or [], affected_jobs=jobs or [], job=job)


TRUTH = [
    _t("F1", "xid79", "hardware", "gpu", 1000, 5000, "isolate_node", [("gpu", "node-a/3"), ("node", "node-a")],
       ["node-a"], ["node-a"], ["ns/j1"]),
    _t("F2", "leaf_switch", "network", "switch", 2000, 3000, "isolate_switch", [("switch", "leaf-1")],
       ["node-b", "node-c"], ["node-b", "node-c"], ["ns/j2"]),
    _t("F3", "nccl_timeout", "transient_software", "job", 4000, 4600, "retry_in_place", [("job", "ns/j3")],
       ["node-d"], [], ["ns/j3"], "ns/j3"),
    _t("F4", "xid13", "negative_control", "gpu", 6000, 6001, "no_action", [("gpu", "node-e/1"), ("node", "node-e")],
       ["node-e"]),
    _t("F5", "straggler", "degradation", "gpu", 7000, 20000, "isolate_node", [("gpu", "node-f/2"), ("node", "node-f")],
       ["node-f"], ["node-f"]),
]


def _i(id: str, cls: str, first_seen: float, suspects: list[tuple[str, str]],
       jobs: list[str] | None = None) -> Incident:
    return Incident(id=id, incident_class=cls, suspects=[Suspect(kind=k, name=n) for k, n in suspects],  # type: ignore[arg-type]
                    confidence=0.9, evidence=[], first_seen=first_seen, status="open", jobs=jobs or [])


INCIDENTS = [
    _i("I1", "hardware", 1030, [("gpu", "node-a/3")]),
    _i("I2", "hardware", 1100, [("node", "node-a")]),  # duplicate of I1
    _i("I3", "network", 2060, [("node", "node-b"), ("node", "node-c"), ("switch", "leaf-1")]),
    _i("I4", "transient_software", 4610, [("job", "ns/j3")], ["ns/j3"]),
    _i("I5", "hardware", 6005, [("node", "node-e")]),  # a negative control blamed on hardware
    _i("I6", "hardware", 8000, [("node", "node-z")]),  # nothing there
    _i("I7", "degradation", 100, [("node", "node-f")]),  # long before the straggler
]


def _c(id: str, action: str, node: str, t: float) -> RemediationCommand:
    return RemediationCommand(id=id, action=action, incident_id="x", reason="r", issued_at=t, expires_at=t + 60,  # type: ignore[arg-type]
                              node=node)


COMMANDS = [
    _c("c1", "cordon", "node-a", 1040),
    _c("c2", "cordon", "node-b", 2100),
    _c("c3", "uncordon", "node-b", 3500),
    _c("c4", "cordon", "node-d", 4200),
    _c("c5", "drain", "node-d", 4300),
    _c("c6", "cordon", "node-z", 8000),
]
META = RunMeta(seed=0, start=0.0, end=86_400.0, nodes=[f"node-{c}" for c in "abcdefghyz"], gpus_per_node=8)


def test_overall_precision_recall_f1_and_delays() -> None:
    rep = score(TRUTH, INCIDENTS, COMMANDS, META)
    assert rep.faults == 5 and rep.incidents == 7
    assert rep.false_incidents == 3  # I5 (negative control blamed on hardware), I6, I7
    assert rep.recall == pytest.approx(3 / 4)
    assert rep.precision == pytest.approx(3 / 6)
    assert rep.f1 == pytest.approx(0.6)
    assert rep.delay_p50_s == pytest.approx(60)
    assert rep.delay_p90_s == pytest.approx(500)  # numpy's linear percentile of 30, 60, 610
    assert rep.matches["F1"] == ["I1", "I2"] and rep.matches["F5"] == []
    assert rep.false_positives_per_node_day == pytest.approx(0.3)


def test_attribution_top1_top3_and_class() -> None:
    rep = score(TRUTH, INCIDENTS, COMMANDS, META)
    assert rep.top1_accuracy == pytest.approx(2 / 3, abs=1e-4)  # the leaf failure's first suspect is a node behind it
    assert rep.top3_accuracy == pytest.approx(1.0)
    assert rep.class_accuracy == pytest.approx(1.0)


def test_per_kind_and_per_class_rows() -> None:
    rep = score(TRUTH, INCIDENTS, COMMANDS, META)
    k = {r.kind: r for r in rep.by_kind}
    assert k["xid79"].detected == 1 and k["xid79"].duplicates == 1
    assert k["xid79"].false_positives == pytest.approx(2.0)  # I5 and I6 are hardware, the only hardware kind
    assert k["xid79"].precision == pytest.approx(1 / 3, abs=1e-4) and k["xid79"].recall == 1.0
    assert k["straggler"].precision == 0.0 and k["straggler"].recall == 0.0 and k["straggler"].f1 == 0.0
    assert k["leaf_switch"].precision == 1.0 and k["leaf_switch"].delay_p50_s == pytest.approx(60)
    assert k["nccl_timeout"].delay_p50_s == pytest.approx(610)
    assert k["xid13"].recall is None and k["xid13"].infra_blamed == 1
    c = {r.kind: r for r in rep.by_class}
    assert c["hardware"].false_positives == 2 and c["degradation"].false_positives == 1
    assert rep.unattributed_false_positives == 0


def test_isolation_episodes_justified_healthy_and_software() -> None:
    eps = isolation_episodes(COMMANDS)
    assert [(n, s) for n, s, _ in eps] == [("node-a", 1040), ("node-b", 2100), ("node-d", 4200), ("node-z", 8000)]
    rep = score(TRUTH, INCIDENTS, COMMANDS, META)
    iso = rep.isolation
    assert iso.episodes == 4 and iso.justified == 2 and iso.healthy_isolated == 2
    assert iso.healthy_isolated_per_fault == pytest.approx(0.5)
    assert iso.software_faults_isolated == 1 and iso.software_fault_ids == ["F3"]
    k = {r.kind: r for r in rep.by_kind}
    assert k["nccl_timeout"].isolations == 1


def test_node_hours_estimated_from_the_command_timeline() -> None:
    cl = score(TRUTH, INCIDENTS, COMMANDS, META).closed_loop
    assert cl is not None and cl.source == "estimated"
    assert cl.dangerous_schedulable_node_h == pytest.approx((40 + 100 + 1000 + 13000) / 3600, abs=1e-4)
    assert cl.healthy_unschedulable_node_h == pytest.approx((81400 + 500 + 82200 + 78400) / 3600, abs=1e-4)


def test_accounting_figures_are_taken_as_given() -> None:
    acc = {"dangerous_schedulable_node_h": 1.5, "healthy_unschedulable_node_h": 0.25, "repeat_failures": 2,
           "repeat_failures_same_node": 1, "effective_training_time_ratio": 0.9, "job_failures": 7,
           "phases": {"mttr": {"n": 3, "mean_s": 100.0, "p50_s": 90.0, "p90_s": 150.0}}}
    rep = score(TRUTH, INCIDENTS, COMMANDS, META, acc)
    cl = rep.closed_loop
    assert cl is not None and cl.source == "accounting" and cl.repeat_failures == 2
    assert cl.mttr["mttr"]["p50_s"] == 90.0
    text = format_report(rep)
    assert "software faults that led to node isolation: 1" in text and "MTTR" in text


def test_re_placement_counts_reach_the_report() -> None:
    fm = {"placements": 4, "re_placements": 3, "with_room": 2, "replacements": 2, "in_leaf": 2, "leaf_fraction": 1.0,
          "on_suspect": 3, "on_excluded": 0, "replacements_any": 3, "in_leaf_any": 2, "on_suspect_known": 1,
          "on_suspect_undetected": 2, "on_flagged": 1, "undetected_by_kind": {"xid79": 2}}
    acc = {"phases": {}, "placement": {"all": fm, "fleetmedic": fm}}
    rep = score(TRUTH, INCIDENTS, COMMANDS, META, acc)
    assert rep.closed_loop is not None and rep.closed_loop.placement["fleetmedic"]["in_leaf"] == 2
    assert rep.closed_loop.undetected_by_kind["fleetmedic"] == {"xid79": 2}
    assert "undetected_by_kind" not in rep.closed_loop.placement["fleetmedic"]
    assert ("re-placements (fleetmedic): 3, replacements in the original leaf 2/2 (leaf had room in 2), "
            "on suspect nodes 3 (already suspected by fleetmedic 1, not yet detected 2), on excluded nodes 0"
            ) in format_report(rep)


def test_no_incidents_means_zero_recall_and_undefined_precision() -> None:
    rep = score(TRUTH, [], [], META)
    assert rep.recall == 0.0 and rep.precision is None and rep.top1_accuracy is None


@pytest.mark.parametrize(("kind", "name", "ok"), [
    ("gpu", "node-a/3", True), ("gpu", "node-a:3", True), ("gpu", "node-a/gpu3", True), ("gpu", "node-a/2", False),
    ("node", "node-a", True), ("node", "node-b", False), ("switch", "leaf-1", False),
])
def test_suspect_name_forms(kind: str, name: str, ok: bool) -> None:
    assert names_fault(kind, name, TRUTH[0]) is ok


def test_link_suspects_match_either_end() -> None:
    t = _t("L", "ib_ber", "network", "link", 0, 10, "isolate_link",
           [("link", "leaf-su0-r2:4"), ("link", "node-d:mlx5_2"), ("node", "node-d")], ["node-d"], ["node-d"])
    assert names_fault("link", "leaf-su0-r2:4", t) and names_fault("link", "leaf-su0-r2/4", t)
    assert names_fault("link", "node-d:mlx5_2", t) and not names_fault("link", "node-d:mlx5_3", t)


def test_a_republished_incident_counts_once_by_its_latest_record() -> None:
    once = score(TRUTH, INCIDENTS, COMMANDS, META)
    republished = [*INCIDENTS, msgspec.structs.replace(INCIDENTS[5], status="resolved")]
    again = score(TRUTH, republished, COMMANDS, META)
    assert (again.incidents, again.false_incidents) == (once.incidents, once.false_incidents)


def test_only_a_repair_escalation_isolates_a_node() -> None:
    notify = RemediationCommand(id="e1", action="escalate", incident_id="x", reason="r", issued_at=9000,
                                expires_at=9060, node="node-y", params={"escalation": "notify"})
    switch = msgspec.structs.replace(notify, id="e2", node="leaf-9",
                                     params={"escalation": "repair", "target_kind": "switch"})
    repair = msgspec.structs.replace(notify, id="e3", params={"escalation": "repair"})
    assert [e[0] for e in isolation_episodes([notify, switch])] == []
    assert [e[0] for e in isolation_episodes([repair])] == ["node-y"]


def test_an_incident_naming_an_active_faults_gpu_is_that_fault_not_a_planned_reboot_just_before() -> None:
    # XID 64 on node-a's GPU 0 hours after onset (the isolation was refused by the budget), minutes
    # after an operator's planned reboot of the same node: the incident is about the GPU's fault
    truth = [
        _t("F1", "xid64", "hardware", "gpu", 1000, 90_000, "isolate_node", [("gpu", "node-a/0"), ("node", "node-a")],
           ["node-a"], ["node-a"]),
        _t("F2", "planned_reboot", "negative_control", "node", 30_000, 30_500, "no_action", [("node", "node-a")],
           ["node-a"]),
    ]
    late = _i("I2", "hardware", 31_000, [("node", "node-a"), ("gpu", "node-a/gpu0")])
    rep = score(truth, [_i("I1", "hardware", 1005, [("gpu", "node-a/0")]), late], [], META)
    assert rep.matches == {"F1": ["I1", "I2"], "F2": []} and rep.false_incidents == 0
    # an incident that names only the node right after its planned reboot is still the reboot's
    rep = score(truth, [_i("I3", "hardware", 31_000, [("node", "node-a")])], [], META)
    assert rep.matches["F2"] == ["I3"] and rep.false_incidents == 1
