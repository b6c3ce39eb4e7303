"""NodeTracker (pure): Node JSON -> NodeObservation only when the cordon, its owner or a relevant
label changed; deleted nodes; malformed objects counted by reason."""

from __future__ import annotations

from typing import Any

from fleetmedic.config import Settings
from fleetmedic.connectors.kube.nodes_map import NodeTracker
from fleetmedic.k8s_keys import ANNOTATION_CORDONED_BY
from fleetmedic.records import NodeObservation, decode, encode

T = 1_700_000_000.0


def node(name: str = "gpu-1", *, unschedulable: bool = False, labels: dict[str, Any] | None = None,
         annotations: dict[str, str] | None = None, rv: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv, "labels": labels or {},
                         "annotations": annotations or {}},
            "spec": {"unschedulable": True} if unschedulable else {},
            "status": {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": rv}]}}


PLACED = {"fleetmedic.io/rack": "r1", "fleetmedic.io/leaf": "leaf-1", "fleetmedic.io/pool": "h100",
          "rails.fleetmedic.io/mlx5_0": "leaf-r0", "kubernetes.io/hostname": "gpu-1", "team": "ml"}


def test_the_first_sight_of_a_node_gives_its_relevant_labels_only() -> None:
    t = NodeTracker.of(Settings())
    obs = t.observe("ADDED", node(labels=PLACED), T)
    assert obs == NodeObservation(node="gpu-1", ts=T, labels={
        "fleetmedic.io/rack": "r1", "fleetmedic.io/leaf": "leaf-1", "fleetmedic.io/pool": "h100",
        "rails.fleetmedic.io/mlx5_0": "leaf-r0"})
    assert decode(NodeObservation, encode(obs)) == obs


def test_status_heartbeats_and_irrelevant_labels_give_nothing() -> None:
    t = NodeTracker.of(Settings())
    assert t.observe("ADDED", node(labels=PLACED), T) is not None
    assert t.observe("MODIFIED", node(labels=PLACED, rv="2"), T + 10) is None
    assert t.observe("MODIFIED", node(labels={**PLACED, "team": "infra"}, rv="3"), T + 20) is None
    assert t.observe("MODIFIED", node(labels=PLACED, annotations={"other": "x"}, rv="4"), T + 30) is None


def test_a_cordon_by_someone_else_and_by_fleetmedic_are_told_apart() -> None:
    t = NodeTracker.of(Settings())
    t.observe("ADDED", node(labels=PLACED), T)
    foreign = t.observe("MODIFIED", node(labels=PLACED, unschedulable=True), T + 1)
    assert foreign is not None and foreign.cordoned and not foreign.cordoned_by_fleetmedic
    ours = t.observe("MODIFIED", node(labels=PLACED, unschedulable=True,
                                      annotations={ANNOTATION_CORDONED_BY: "fleetmedic"}), T + 2)
    assert ours is not None and ours.cordoned and ours.cordoned_by_fleetmedic
    lifted = t.observe("MODIFIED", node(labels=PLACED), T + 3)
    assert lifted is not None and not lifted.cordoned and not lifted.cordoned_by_fleetmedic
    # the annotation alone (no cordon) is not a cordon
    assert t.observe("MODIFIED", node(labels=PLACED, annotations={ANNOTATION_CORDONED_BY: "fleetmedic"}), T + 4) is None


def test_placement_rail_and_opt_out_label_changes_are_reported() -> None:
    s = Settings()
    t = NodeTracker.of(s)
    t.observe("ADDED", node(labels=PLACED), T)
    moved = t.observe("MODIFIED", node(labels={**PLACED, "fleetmedic.io/rack": "r2"}), T + 1)
    assert moved is not None and moved.labels["fleetmedic.io/rack"] == "r2"
    rail = t.observe("MODIFIED", node(labels={**PLACED, "fleetmedic.io/rack": "r2",
                                              "rails.fleetmedic.io/mlx5_1": "leaf-r1"}), T + 2)
    assert rail is not None and rail.labels["rails.fleetmedic.io/mlx5_1"] == "leaf-r1"
    opted = t.observe("MODIFIED", node(labels={**PLACED, "fleetmedic.io/rack": "r2",
                                               "rails.fleetmedic.io/mlx5_1": "leaf-r1",
                                               s.safety.opt_out_label: "true"}), T + 3)
    assert opted is not None and opted.labels[s.safety.opt_out_label] == "true"


def test_configured_label_names_are_the_ones_watched() -> None:
    t = NodeTracker(rack_label="example.com/rack", leaf_label="example.com/tor", pool_label="example.com/sku",
                    opt_out_label="example.com/hands-off")
    obs = t.observe("ADDED", node(labels={**PLACED, "example.com/tor": "tor-7", "example.com/hands-off": "yes"}), T)
    assert obs is not None
    assert obs.labels == {"example.com/tor": "tor-7", "example.com/hands-off": "yes",
                          "rails.fleetmedic.io/mlx5_0": "leaf-r0"}


def test_a_deleted_node_is_reported_and_forgotten() -> None:
    t = NodeTracker.of(Settings())
    t.observe("ADDED", node(labels=PLACED), T)
    gone = t.observe("DELETED", node(labels=PLACED), T + 5)
    assert gone is not None and gone.deleted and gone.node == "gpu-1" and gone.ts == T + 5
    assert "gpu-1" not in t.nodes
    again = t.observe("ADDED", node(labels=PLACED), T + 6)  # re-registered: reported again
    assert again is not None and not again.deleted


def test_malformed_nodes_are_counted_by_reason_and_skipped() -> None:
    t = NodeTracker.of(Settings())
    assert t.observe("ADDED", ["not", "a", "node"], T) is None
    assert t.observe("ADDED", {"metadata": {}}, T) is None
    assert t.observe("ADDED", {"metadata": {"name": "gpu-2", "labels": "rack=r1"}}, T) is None
    assert t.observe("ADDED", node("gpu-3", labels={"fleetmedic.io/rack": 7}), T) is None
    assert t.observe("ADDED", node("gpu-4", labels={"fleetmedic.io/rack": "x" * 64}), T) is None
    assert dict(t.skipped) == {"not_an_object": 1, "no_metadata": 1, "bad_metadata": 1, "bad_label": 2}
    assert "metadata.labels.fleetmedic.io/rack" in t.last_skip and t.last_code == "bad_label"
    assert t.nodes == {}
    assert t.observe("ADDED", node("gpu-3", labels={"team": 7}), T) is not None  # irrelevant labels are not read
