"""Kubernetes Node objects -> ``NodeObservation`` records, emitted only on change (pure: dicts in,
records out).

:class:`NodeTracker` is fed the watch events of Nodes as JSON dicts, with the time from an
injected clock, and returns the :class:`~fleetmedic.records.NodeObservation` a change produces, or
``None``. What counts as a change is only what the decision stage uses:

- the cordon (``spec.unschedulable``) and who made it: fleetmedic when the node carries the
  ``fleetmedic.io/cordoned-by`` annotation the executor writes with its cordons, someone else
  otherwise;
- the labels that place the node or opt it out: the triage rack, leaf and pool labels of the
  config, every ``rails.fleetmedic.io/<nic>`` label, and ``safety.opt_out_label``. Other labels,
  status heartbeats, conditions and resource versions are ignored (a 5000-node fleet updates its
  Node leases and statuses constantly: none of that reaches Kafka).

A deleted node gives an observation with ``deleted=True`` and its relevant labels (and is
forgotten; the watch reports the nodes a re-list no longer finds as deleted, by name: their labels
are those the tracker kept). The first sight of a node (the initial list)
always gives one: a restarted watcher republishes the fleet, which the
compacted ``cluster.nodes`` topic absorbs. A malformed object is counted in ``skipped`` under its
reason and ignored.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from fleetmedic.config import Settings
from fleetmedic.k8s_keys import ANNOTATION_CORDONED_BY, LABEL_RAIL_PREFIX
from fleetmedic.records import NodeObservation

MAX_LABEL_VALUE: Final = 63  # Kubernetes' limit on a label value
#: The fields of a Node the tracker reads (a ``fleetmedic.kube_watch.Fields`` tree)
NODE_FIELDS: Final[dict[str, Any]] = {
    "metadata": {"name": True, "labels": True, "annotations": {ANNOTATION_CORDONED_BY: True}},
    "spec": {"unschedulable": True},
}


@dataclass(frozen=True)
class NodeView:
    """What the decision stage is told about one node."""

    cordoned: bool
    cordoned_by_fleetmedic: bool
    labels: tuple[tuple[str, str], ...]  # the relevant labels, sorted


class BadNode(ValueError):
    """A Node object the tracker cannot read: ``code`` (a metric label) and the detail."""

    def __init__(self, code: str, detail: str) -> None:
        self.code = code
        super().__init__(f"{code}: {detail}")


class NodeTracker:
    """Node watch events in; a :class:`NodeObservation` out when what matters changed."""

    def __init__(self, *, rack_label: str, leaf_label: str, pool_label: str, opt_out_label: str) -> None:
        self.watched = frozenset({rack_label, leaf_label, pool_label, opt_out_label})
        self.nodes: dict[str, NodeView] = {}
        self.skipped: Counter[str] = Counter()
        self.last_skip = self.last_code = ""

    @classmethod
    def of(cls, settings: Settings) -> NodeTracker:
        t = settings.triage
        return cls(rack_label=t.rack_label, leaf_label=t.leaf_label, pool_label=t.pool_label,
                   opt_out_label=settings.safety.opt_out_label)

    def relevant(self, labels: Mapping[str, Any]) -> dict[str, str]:
        """The labels the decision stage uses (placement, rails, opt-out)."""
        return {k: v for k, v in labels.items() if k in self.watched or k.startswith(LABEL_RAIL_PREFIX)}

    def observe(self, etype: str, obj: Any, now: float) -> NodeObservation | None:
        """One watch event (``ADDED``, ``MODIFIED``, ``DELETED``) of a Node."""
        try:
            name, view = self._read(obj)
        except BadNode as exc:
            self.skip(exc.code, str(exc))
            return None
        if etype == "DELETED":
            known = self.nodes.pop(name, None)  # its labels, when the deletion came without them (a re-list's)
            labels = view.labels or (known.labels if known is not None else ())
            return NodeObservation(node=name, ts=now, deleted=True, labels=dict(labels))
        if self.nodes.get(name) == view:
            return None
        self.nodes[name] = view
        return NodeObservation(node=name, ts=now, cordoned=view.cordoned,
                               cordoned_by_fleetmedic=view.cordoned_by_fleetmedic, labels=dict(view.labels))

    def skip(self, code: str, detail: str) -> None:
        self.skipped[code] += 1
        self.last_skip, self.last_code = detail, code

    def _read(self, obj: Any) -> tuple[str, NodeView]:
        if not isinstance(obj, Mapping):
            raise BadNode("not_an_object", f"a {type(obj).__name__}, not a JSON object")
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta["name"]:
            raise BadNode("no_metadata", "metadata.name missing")
        name = meta["name"]
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        spec = obj.get("spec") or {}
        if not isinstance(labels, Mapping) or not isinstance(annotations, Mapping) or not isinstance(spec, Mapping):
            raise BadNode("bad_metadata", f"node {name}: metadata.labels, metadata.annotations or spec "
                                          "is not an object")
        relevant = self.relevant(labels)
        for key, value in relevant.items():
            if not isinstance(value, str) or len(value) > MAX_LABEL_VALUE:
                raise BadNode("bad_label", f"node {name}: metadata.labels.{key}: not a label value: {value!r:.80}")
        cordoned = spec.get("unschedulable") is True
        return name, NodeView(cordoned, cordoned and ANNOTATION_CORDONED_BY in annotations,
                              tuple(sorted(relevant.items())))
