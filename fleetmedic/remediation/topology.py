"""Where each node sits: its rack, the leaf switch(es) its NICs hang off, and its pool.

Built from plain dicts (``{"node-1": {"rack": "r1", "leaf": "leaf-1", "pool": "h100"}}``) or from
Kubernetes node labels (``fleetmedic.io/rack``, ``fleetmedic.io/leaf``, ``fleetmedic.io/pool``).
Rail-optimised fabrics cable each NIC of a node to a different leaf: ``rails`` maps a NIC name to
its leaf (``{"mlx5_0": "leaf-su0-r0", ...}``; labels ``rails.fleetmedic.io/<nic>: <leaf>``), and a
node is *behind* every leaf one of its NICs is cabled to.
Triage uses it to see that errors on every node behind one leaf are one switch problem; safety uses
it to cap isolations per rack and per switch, and its breaker to see suspicion gather in one failure
domain (:meth:`Topology.domains_of`).

The decision engine holds its own topology and updates it in place as nodes are observed
(:meth:`place`, :meth:`place_labels`, :meth:`remove`: each costs O(1) in the fleet's size; rebuilding
the indexes per observation would make the first sight of 20,000 nodes take minutes).
:meth:`with_node` and :meth:`with_labels` leave the topology they are called on as it was and return a
changed copy, for callers that share one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from fleetmedic.k8s_keys import LABEL_LEAF, LABEL_POOL, LABEL_RACK, LABEL_RAIL_PREFIX


class Placement(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One node's place in the fleet; ``""`` means unknown."""

    rack: str = ""
    leaf: str = ""
    pool: str = ""
    rails: dict[str, str] = {}  # NIC -> leaf, for rail-optimised fabrics

    def leaves(self) -> frozenset[str]:
        return frozenset({self.leaf, *self.rails.values()} - {""})


class Topology:
    """Node -> placement, with leaf and rack indexes. Serialise with :attr:`nodes`."""

    __slots__ = ("_by_leaf", "_by_rack", "_domains", "changes", "nodes")

    def __init__(self, nodes: Mapping[str, Placement] | None = None) -> None:
        self.nodes: dict[str, Placement] = {}
        self._by_leaf: dict[str, set[str]] = {}
        self._by_rack: dict[str, set[str]] = {}
        #: node -> the placement its failure domains were made from, and those domains
        self._domains: dict[str, tuple[Placement, frozenset[str]]] = {}
        self.changes = 0  # moves on with every node placed, moved or removed
        for node, p in (nodes or {}).items():
            self.place(node, p)

    def place(self, node: str, placement: Placement) -> bool:
        """Put ``node`` at ``placement`` in this topology; False if it was there already."""
        old = self.nodes.get(node)
        if old == placement:
            return False
        if old is not None:
            self._unindex(node, old)
        self.nodes[node] = placement
        self.changes += 1
        for leaf in placement.leaves():
            self._by_leaf.setdefault(leaf, set()).add(node)
        if placement.rack:
            self._by_rack.setdefault(placement.rack, set()).add(node)
        return True

    def remove(self, node: str) -> bool:
        """Take ``node`` out of this topology; False if it was not in it."""
        old = self.nodes.pop(node, None)
        if old is None:
            return False
        self._unindex(node, old)
        self.changes += 1
        return True

    def _unindex(self, node: str, old: Placement) -> None:
        for leaf in old.leaves():
            members = self._by_leaf.get(leaf)
            if members is not None:
                members.discard(node)
                if not members:
                    del self._by_leaf[leaf]
        if old.rack:
            members = self._by_rack.get(old.rack)
            if members is not None:
                members.discard(node)
                if not members:
                    del self._by_rack[old.rack]

    def copy(self) -> Topology:
        return Topology(self.nodes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Topology) and self.nodes == other.nodes

    def __repr__(self) -> str:
        return f"Topology({len(self.nodes)} nodes, {len(self._by_leaf)} leaves, {len(self._by_rack)} racks)"

    @classmethod
    def from_dict(cls, table: Mapping[str, Mapping[str, Any]]) -> Topology:
        """``{"node-1": {"rack": "r1", "leaf": "leaf-1", "pool": "h100", "rails": {...}}}`` (keys optional)."""
        return cls({n: Placement(rack=str(d.get("rack", "")), leaf=str(d.get("leaf", "")), pool=str(d.get("pool", "")),
                                 rails=dict(d.get("rails", {})))
                    for n, d in table.items()})

    @classmethod
    def from_labels(
        cls,
        node_labels: Mapping[str, Mapping[str, str]],
        rack_label: str = LABEL_RACK,
        leaf_label: str = LABEL_LEAF,
        pool_label: str = LABEL_POOL,
    ) -> Topology:
        topo = cls()
        for node, labels in node_labels.items():
            topo.place_labels(node, labels, rack_label, leaf_label, pool_label)
        return topo

    def placement_from_labels(
        self,
        node: str,
        labels: Mapping[str, str],
        rack_label: str = LABEL_RACK,
        leaf_label: str = LABEL_LEAF,
        pool_label: str = LABEL_POOL,
    ) -> Placement:
        """Where ``node``'s labels put it (labels it lacks keep what was known)."""
        old = self.nodes.get(node, Placement())
        rails = {k[len(LABEL_RAIL_PREFIX):]: v for k, v in labels.items() if k.startswith(LABEL_RAIL_PREFIX)}
        return Placement(
            rack=labels.get(rack_label, old.rack),
            leaf=labels.get(leaf_label, old.leaf),
            pool=labels.get(pool_label, old.pool),
            rails=rails or old.rails,
        )

    def place_labels(
        self,
        node: str,
        labels: Mapping[str, str],
        rack_label: str = LABEL_RACK,
        leaf_label: str = LABEL_LEAF,
        pool_label: str = LABEL_POOL,
    ) -> bool:
        """Place ``node`` in this topology by its labels; False if nothing changed."""
        return self.place(node, self.placement_from_labels(node, labels, rack_label, leaf_label, pool_label))

    def with_labels(
        self,
        node: str,
        labels: Mapping[str, str],
        rack_label: str = LABEL_RACK,
        leaf_label: str = LABEL_LEAF,
        pool_label: str = LABEL_POOL,
    ) -> Topology:
        """A copy of this topology with ``node`` placed by its labels (labels it lacks keep what was
        known), or this one if nothing changes."""
        return self.with_node(node, self.placement_from_labels(node, labels, rack_label, leaf_label, pool_label))

    def with_node(self, node: str, placement: Placement) -> Topology:
        """A copy with ``node`` at ``placement``, or this topology if it is there already."""
        if self.nodes.get(node) == placement:
            return self
        copy = self.copy()
        copy.place(node, placement)
        return copy

    def __contains__(self, node: object) -> bool:
        return node in self.nodes

    def __len__(self) -> int:
        return len(self.nodes)

    def rack_of(self, node: str) -> str:
        p = self.nodes.get(node)
        return p.rack if p else ""

    def leaf_of(self, node: str) -> str:
        """The node's (primary) leaf: its ``leaf``, else its only rail's leaf."""
        p = self.nodes.get(node)
        if p is None:
            return ""
        return p.leaf or (next(iter(p.rails.values())) if len(set(p.rails.values())) == 1 else "")

    def leaves_of(self, node: str) -> frozenset[str]:
        p = self.nodes.get(node)
        return p.leaves() if p else frozenset()

    def leaf_for_port(self, node: str, port: str) -> str:
        """The leaf behind a port as findings name it: ``<switch>/<port>`` (the switch side of the
        cable), ``<node>/<nic>`` or ``<nic>`` (the host side: the NIC's rail), else the node's leaf."""
        device, _, rest = port.rpartition("/")
        if device and device != node and self.is_switch(device):
            return device
        nic = rest or port
        p = self.nodes.get(node)
        if p is not None and nic in p.rails:
            return p.rails[nic]
        return self.leaf_of(node)

    def pool_of(self, node: str) -> str:
        p = self.nodes.get(node)
        return p.pool if p else ""

    def behind_leaf(self, leaf: str) -> frozenset[str]:
        """Nodes whose NICs hang off ``leaf`` (empty for an unknown leaf)."""
        return frozenset(self._by_leaf.get(leaf, ()))

    def in_rack(self, rack: str) -> frozenset[str]:
        return frozenset(self._by_rack.get(rack, ()))

    def leaves(self) -> frozenset[str]:
        return frozenset(self._by_leaf)

    def is_switch(self, name: str) -> bool:
        """True if ``name`` is a leaf switch (a finding may name the switch instead of a host)."""
        return name not in self.nodes and name in self._by_leaf

    def domains_of(self, node: str) -> frozenset[str]:
        """The failure domains ``node`` shares with others, as the safety breaker counts them:
        ``rack:<rack>`` and ``leaf:<leaf>`` for each leaf it is cabled to."""
        p = self.nodes.get(node)
        if p is None:
            return frozenset()
        made = self._domains.get(node)
        if made is not None and made[0] is p:  # (a placement is immutable: the same one, the same domains)
            return made[1]
        domains = frozenset({f"leaf:{leaf}" for leaf in p.leaves()} | ({f"rack:{p.rack}"} if p.rack else set()))
        self._domains[node] = (p, domains)
        return domains

    def domain_size(self, domain: str) -> int:
        """How many nodes a failure domain (``rack:<rack>``, ``leaf:<leaf>``) holds."""
        kind, _, name = domain.partition(":")
        table = self._by_rack if kind == "rack" else self._by_leaf if kind == "leaf" else {}
        return len(table.get(name, ()))

    def nodes_named(self, names: Iterable[str]) -> frozenset[str]:
        return frozenset(n for n in names if n in self.nodes)
