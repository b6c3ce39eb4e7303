"""Topology: nodes placed by plain dicts or by Kubernetes labels, leaf and rack indexes, switch
names told apart from node names, and label updates that keep what was known."""

from __future__ import annotations

from fleetmedic.remediation.topology import Placement, Topology


def test_a_topology_from_labels_indexes_racks_and_leaves() -> None:
    topo = Topology.from_labels({
        "a": {"fleetmedic.io/rack": "r1", "fleetmedic.io/leaf": "leaf-1", "fleetmedic.io/pool": "h100"},
        "b": {"fleetmedic.io/rack": "r1", "fleetmedic.io/leaf": "leaf-2"},
        "c": {"kubernetes.io/hostname": "c"},
    })
    assert topo.behind_leaf("leaf-1") == {"a"} and topo.in_rack("r1") == {"a", "b"}
    assert topo.rack_of("c") == "" and topo.pool_of("a") == "h100" and len(topo) == 3
    assert topo.is_switch("leaf-2") and not topo.is_switch("a") and not topo.is_switch("nowhere")


def test_label_updates_return_a_new_topology_and_keep_unlabelled_facts() -> None:
    topo = Topology.from_dict({"a": {"rack": "r1", "leaf": "leaf-1"}})
    moved = topo.with_labels("a", {"fleetmedic.io/leaf": "leaf-9"})
    assert moved.nodes["a"] == Placement(rack="r1", leaf="leaf-9")
    assert topo.leaf_of("a") == "leaf-1"
    assert topo.with_labels("a", {}) is topo


def test_rails_put_a_node_behind_every_leaf_its_nics_are_cabled_to() -> None:
    topo = Topology.from_dict({
        "n0": {"rack": "r0", "rails": {"mlx5_0": "leaf-su0-r0", "mlx5_1": "leaf-su0-r1"}},
        "n1": {"rack": "r0", "rails": {"mlx5_0": "leaf-su0-r0", "mlx5_1": "leaf-su0-r1"}},
    })
    assert topo.behind_leaf("leaf-su0-r1") == {"n0", "n1"} and topo.leaf_of("n0") == ""
    assert topo.leaf_for_port("n0", "n0/mlx5_1") == "leaf-su0-r1"  # host side of the cable
    assert topo.leaf_for_port("n0", "leaf-su0-r0/17") == "leaf-su0-r0"  # switch side
    assert topo.leaf_for_port("n0", "mlx5_0") == "leaf-su0-r0"
    labelled = Topology().with_labels("n2", {"rails.fleetmedic.io/mlx5_0": "leaf-9"})
    assert labelled.behind_leaf("leaf-9") == {"n2"}
