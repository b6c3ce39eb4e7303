"""The pure placement core: domains of the surviving ranks, weighted preferences, isolation, capacity."""

from __future__ import annotations

from typing import Any

import pytest

from fleetmedic.config import PlacementSettings
from fleetmedic.executor.workload import placement_plan as pm
from fleetmedic.executor.workload.plan import excluded_nodes, with_node_exclusion
from fleetmedic.k8s_keys import (
    ANNOTATION_PLACEMENT,
    LABEL_LEAF,
    LABEL_NVLINK_DOMAIN,
    LABEL_POOL,
    LABEL_RACK,
    LABEL_SPINE,
    LABEL_STANDBY,
    TAINT_QUARANTINE,
    TAINT_STANDBY,
)

RACK, LEAF, NVL, POOL, SPINE = (LABEL_RACK, LABEL_LEAF, LABEL_NVLINK_DOMAIN,
                                LABEL_POOL, LABEL_SPINE)
KWOK = {"key": "kwok.x-k8s.io/node", "operator": "Equal", "value": "fake", "effect": "NoSchedule"}


def _node(i: int, free: int = 8, **kw: Any) -> pm.NodeState:
    """Node i: rack i//2, leaf i//4, NVLink domain i//2, spine i//8, pool h100."""
    labels = {RACK: f"rack-{i // 2}", LEAF: f"leaf-{i // 4}", NVL: f"nvl-{i // 2}", SPINE: f"spine-{i // 8}",
              POOL: "h100", "fleet": "f", **kw.pop("labels", {})}
    return pm.NodeState(name=f"n{i}", labels=labels, allocatable=8, requested=8 - free, **kw)


def _spec(gpus: int = 8, **kw: Any) -> dict[str, Any]:
    return {"nodeSelector": {"fleet": "f"}, "tolerations": [KWOK],
            "containers": [{"resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}], **kw}


def _topo(nodes: list[pm.NodeState], **settings: Any) -> pm.FleetTopology:
    return pm.FleetTopology(nodes, PlacementSettings(**settings))


def test_the_domain_is_what_most_surviving_ranks_share_and_ignores_the_suspect() -> None:
    nodes = [_node(i) for i in range(16)]
    topo = _topo(nodes)
    # ranks on n4, n5, n6 (leaf-1) and n8 (leaf-2); n4 is the suspect
    domain = pm.job_domain(topo, ["n4", "n5", "n6", "n8"], excluded=["n4"])
    assert domain["leaf"] == "leaf-1" and domain["pool"] == "h100" and domain["spine"] == "spine-0"
    assert domain["rack"] == "rack-2" and domain["nvlink_domain"] == "nvl-2"  # n5 alone; ties -> smallest
    # a one-pod job on the suspect keeps the suspect's neighbourhood
    assert pm.job_domain(topo, ["n4"], excluded=["n4"])["leaf"] == "leaf-1"


def test_preferences_are_weighted_nvlink_over_leaf_over_rack_over_spine_over_pool() -> None:
    topo = _topo([_node(i) for i in range(8)])
    terms = pm.preferred_terms(topo, {"nvlink_domain": "nvl-0", "leaf": "leaf-0", "rack": "rack-0",
                                      "spine": "spine-0", "pool": "h100"})
    weights = [(t["preference"]["matchExpressions"][0]["key"], t["weight"]) for t in terms]
    assert weights == [(NVL, 80), (LEAF, 40), (RACK, 20), (SPINE, 10), (POOL, 5)]
    # each level outweighs every level below it together (a node in the leaf beats a node in the rack alone)
    for i, (_, w) in enumerate(weights):
        assert w > sum(x for _, x in weights[i + 1:])
    # a label switched off ("") or a level without a value gives no term; the standby pool comes first
    topo = _topo([_node(0)], spine_label="", standby_label=LABEL_STANDBY)
    terms = pm.preferred_terms(topo, {"leaf": "leaf-0", "spine": "spine-0"})
    assert [t["preference"]["matchExpressions"][0]["key"] for t in terms] == [LABEL_STANDBY, LEAF]


def test_place_keeps_the_required_exclusion_and_replaces_only_fleetmedics_earlier_preference() -> None:
    owner_pref = {"weight": 7, "preference": {"matchExpressions": [{"key": "zone", "operator": "In",
                                                                    "values": ["a"]}]}}
    affinity = with_node_exclusion({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [owner_pref]}},
                                   ["n4"])
    old = [{"weight": 40, "preference": {"matchExpressions": [{"key": LEAF, "operator": "In",
                                                                 "values": ["leaf-9"]}]}}]
    affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] += old
    new = [{"weight": 40, "preference": {"matchExpressions": [{"key": LEAF, "operator": "In", "values": ["leaf-1"]}]}}]
    placed = pm.place(_spec(), affinity, new, [], {"preferences": old})
    assert placed.affinity is not None
    prefs = placed.affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert prefs == [owner_pref, *new]
    assert excluded_nodes(placed.affinity) == {"n4"}
    # the same placement again changes nothing
    assert pm.place(_spec(affinity=placed.affinity), placed.affinity, new, [], {"preferences": new}).affinity is None


def test_place_forces_the_exclusion_into_every_required_term_and_adds_standby_tolerations() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}}
    tol = pm.standby_tolerations(PlacementSettings(standby_label=LABEL_STANDBY))
    placed = pm.place(_spec(), affinity, [], tol, {}, force_exclude=["n3"])
    assert placed.affinity is not None and excluded_nodes(placed.affinity) == {"n3"}
    assert placed.tolerations == [KWOK, {"key": TAINT_STANDBY, "operator": "Exists",
                                         "effect": "NoSchedule"}]
    assert pm.standby_tolerations(PlacementSettings()) == []


@pytest.mark.parametrize(("node", "spec", "exposed"), [
    (_node(1), _spec(), True),  # healthy, nothing keeps the pods off: not isolated yet
    (_node(1, unschedulable=True), _spec(), False),  # cordoned
    (_node(1, taints=((TAINT_QUARANTINE, "NoSchedule"),)), _spec(), False),  # tainted
    (_node(1, taints=((TAINT_QUARANTINE, "PreferNoSchedule"),)), _spec(), True),  # only a preference
    (_node(1, unschedulable=True, taints=((TAINT_QUARANTINE, "NoSchedule"),)),
     _spec(tolerations=[{"operator": "Exists"}]), True),  # the pods tolerate everything
    (_node(1), _spec(affinity=with_node_exclusion({}, ["n1"])), False),  # required anti-affinity
    (None, _spec(), False),  # the node is gone
])
def test_unisolated_names_the_excluded_nodes_pods_could_still_land_on(
        node: pm.NodeState | None, spec: dict[str, Any], exposed: bool) -> None:
    assert pm.unisolated(["n1"], {"n1": node}, [spec]) == (["n1"] if exposed else [])


def test_capacity_counts_free_gpus_on_healthy_nodes_in_the_domain_and_anywhere() -> None:
    nodes = [_node(i) for i in range(8)]
    nodes[5] = _node(5, free=4)  # half used by someone else
    nodes[6] = _node(6, unschedulable=True)  # cordoned
    nodes[7] = _node(7, taints=((TAINT_QUARANTINE, "NoSchedule"),))
    topo = _topo(nodes)
    domain = pm.job_domain(topo, ["n4", "n5"], excluded=["n4"])
    demands = [pm.Demand(8, _spec())] * 2
    v = pm.capacity_verdict(demands, nodes, ["n4"], topo, domain)
    # leaf-1 = n4..n7: n4 excluded, n5 has 4 free, n6 cordoned, n7 tainted -> nothing fits there
    assert v.sufficient and not v.fits_in_domain and v.placed_in_domain == 0
    assert v.domain_level == "nvlink_domain"
    assert v.details()["capacity"] == "sufficient"
    # 4-GPU pods fit n5's half
    v4 = pm.capacity_verdict([pm.Demand(4, _spec(4))], nodes, ["n4"], topo, {"leaf": "leaf-1"})
    assert v4.fits_in_domain
    # more than the fleet holds: insufficient, and says what is missing
    big = pm.capacity_verdict([pm.Demand(8, _spec())] * 6, nodes, ["n4"], topo, domain)
    assert not big.sufficient and big.placed_anywhere == 4
    assert big.details()["capacity"] == "insufficient"
    assert big.details()["capacity_missing"].startswith("2 of 6 pod(s) (48 GPU(s) in all) do not fit")


def test_capacity_honours_the_node_selector_required_affinity_and_standby_taint() -> None:
    standby = _node(3, labels={LABEL_STANDBY: "true"}, taints=((TAINT_STANDBY, "NoSchedule"),))
    nodes = [_node(0), _node(1, labels={"fleet": "other"}), _node(2), standby]
    spec = _spec(affinity=with_node_exclusion({}, ["n2"]))
    topo = _topo(nodes)
    v = pm.capacity_verdict([pm.Demand(8, spec)] * 3, nodes, [], topo, {})
    assert v.placed_anywhere == 1  # n1: other fleet, n2: excluded by the template, n3: standby taint
    with_pool = _topo(nodes, standby_label=LABEL_STANDBY)
    v = pm.capacity_verdict([pm.Demand(8, spec)] * 3, nodes, [], with_pool, {})
    assert v.placed_anywhere == 2 and v.placed_on_standby == 1


def test_pod_gpus_reads_requests_then_limits_and_init_containers() -> None:
    spec = {"containers": [{"resources": {"limits": {"nvidia.com/gpu": 4}}}, {"resources": {}}],
            "initContainers": [{"resources": {"requests": {"nvidia.com/gpu": "8"}}}]}
    assert pm.pod_gpus(spec, "nvidia.com/gpu") == 8
    assert pm.pod_gpus({"containers": [{"resources": {"requests": {"nvidia.com/gpu": "x"}}}]}, "nvidia.com/gpu") == 0


def test_previous_placement_reads_what_placement_record_wrote() -> None:
    terms = [{"weight": 40, "preference": {"matchExpressions": [{"key": LEAF, "operator": "In", "values": ["l"]}]}}]
    record = pm.placement_record(terms, [], {"leaf": "l"})
    assert pm.previous_placement({ANNOTATION_PLACEMENT: record}) == {"preferences": terms, "tolerations": []}
    assert pm.previous_placement({ANNOTATION_PLACEMENT: "not json"}) == {}


def test_exclusions_of_nodes_back_in_service_are_lifted_so_a_job_never_runs_out_of_nodes() -> None:
    """A job that failed on n1 and then n2 carries NotIn [n1, n2]; once n1 is back (Ready, uncordoned,
    untainted) the next restart (for n3) lifts n1 and keeps n2 (still quarantined) and n3."""
    taint = TAINT_QUARANTINE
    nodes = {"n1": _node(1), "n2": _node(2, unschedulable=True, taints=((taint, "NoSchedule"),)),
             "n3": _node(3), "n4": _node(4, ready=False)}
    assert pm.back_in_service(["n1", "n2", "n4", "gone"], ["n3"], nodes, taint) == ["n1"]
    assert pm.back_in_service(["n1"], ["n1"], nodes, taint) == []  # excluded again by this command
    owner_term = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}
    affinity = with_node_exclusion({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [owner_term]}}}, ["n1", "n2"])
    placed = pm.place(_spec(), affinity, [], [], {}, force_exclude=["n3"], release=["n1"])
    assert placed.affinity is not None and excluded_nodes(placed.affinity) == {"n2", "n3"}
    (term,) = placed.affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert owner_term["matchExpressions"][0] in term["matchExpressions"]  # the owner's own terms stay
    only_ours = with_node_exclusion({}, ["n1"])
    assert pm.place(_spec(), only_ours, [], [], {}, release=["n1"]).affinity == {}  # nothing of ours is left


def test_a_jobset_child_job_gets_its_exclusion_and_the_preference_in_one_patch() -> None:
    """A suspended child Job of a JobSet: the ops its own plan made (the NotIn) are merged with the
    restart's recipe: fleetmedic's earlier preference replaced, a node back in service released,
    the standby toleration added; the owner's own preference kept."""
    topo = _topo([_node(i) for i in range(8)], standby_label=LABEL_STANDBY)
    old_term = {"weight": 40, "preference": {"matchExpressions": [{"key": LEAF, "operator": "In", "values": ["x"]}]}}
    owners = {"weight": 1, "preference": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a"]}]}}
    affinity = with_node_exclusion({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution":
                                                     [owners, old_term]}}, ["n7"])
    child = {"spec": {"suspend": True, "template": {"spec": _spec(affinity=affinity)}}}
    planned = [{"op": "add", "path": "/spec/template/spec/affinity", "value": with_node_exclusion(affinity, ["n1"])},
               {"op": "add", "path": "/spec/template/metadata/labels", "value": {"a": "b"}}]
    terms = pm.preferred_terms(topo, pm.job_domain(topo, ["n0", "n1", "n2"], ["n1"]))
    recipe = pm.Recipe(tuple(terms), tuple(pm.standby_tolerations(topo.settings)), {"preferences": [old_term]},
                       keep_off=("n1",), release=("n7",))

    ops = pm.child_job_ops(child, planned, recipe)

    by_path = {op["path"]: op["value"] for op in ops}
    assert by_path["/spec/template/metadata/labels"] == {"a": "b"}  # the child plan's other ops stay
    after = by_path["/spec/template/spec/affinity"]
    assert excluded_nodes(after) == {"n1"}  # the new suspect in, the repaired n7 out
    prefs = after["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert prefs[0] == owners and old_term not in prefs and prefs[1:] == terms
    leaf_terms = [p for p in prefs if p["preference"]["matchExpressions"][0]["key"] == LEAF]
    assert [t["preference"]["matchExpressions"][0]["values"] for t in leaf_terms] == [["leaf-0"]]
    assert by_path["/spec/template/spec/tolerations"] == [KWOK, *pm.standby_tolerations(topo.settings)]
    assert [op["path"] for op in ops].count("/spec/template/spec/affinity") == 1
    # nothing to add: no ops at all (the child is left as it is)
    same = {"spec": {"template": {"spec": _spec()}}}
    assert pm.child_job_ops(same, [], pm.Recipe()) == []


def test_a_restart_only_if_waiting_leaves_a_placed_workload_alone() -> None:
    """Exclusions added to a restart waiting for capacity never restart a job already placed."""

    from fleetmedic.executor.workload.placement_apply import not_waiting

    def pod(node: str | None) -> dict[str, Any]:
        return {"metadata": {"name": "p"}, "spec": {"containers": [], "nodeName": node}}

    assert not_waiting([pod("n1"), pod("n2")]) == "all 2 pod(s) are placed already"
    assert not_waiting([pod("n1"), pod(None)]) == ""  # one waits: the exclusions are added
    assert not_waiting([]) == ""  # the controller is recreating them: they wait too
