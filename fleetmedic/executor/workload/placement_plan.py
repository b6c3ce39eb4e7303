"""Where a restarted job's replacement pods should go (pure; docs/placement.md).

No ``kubernetes`` import: nodes come in as :class:`NodeState` values (labels, allocatable and
already-requested GPUs, cordon, taints), the workload's pod specs as JSON dicts.

- :class:`FleetTopology`: each node's domains (NVLink domain, leaf, rack, spine, pool) from node
  labels whose keys :class:`~fleetmedic.config.PlacementSettings` names.
- :func:`job_domain`: the domains of the job's *surviving* ranks (the nodes it ran on, minus the
  excluded ones): per level, the value most of them share.
- :func:`preferred_terms`: preferred node-affinity terms toward that domain, weighted NVLink domain
  > leaf > rack > spine > pool (the weights add up on a node in every one of them), plus the
  warm-standby pool when configured. Preferences never weaken the required ``hostname NotIn``.
- :func:`capacity_verdict`: can healthy capacity (Ready, not cordoned, no taint the pods do not
  tolerate, not excluded, matching the pods' node selector and required affinity) hold every pod
  the restart recreates: in the preferred domain, in the standby pool, anywhere?
- :func:`unisolated`: excluded nodes the pods could still be scheduled onto (not cordoned, no
  untolerated NoSchedule taint, no required anti-affinity covering them).
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from fleetmedic.config import PlacementSettings
from fleetmedic.executor.workload.plan import (
    HOSTNAME_LABEL,
    UNSCHEDULABLE_TAINT_KEY,
    excluded_nodes,
    tolerates,
    with_node_exclusion,
    without_node_exclusion,
)
from fleetmedic.k8s_keys import ANNOTATION_PLACEMENT

LEVELS: Final = ("nvlink_domain", "leaf", "rack", "spine", "pool")
BLOCKING_EFFECTS: Final = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class NodeState:
    """What the capacity check needs to know of a node."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    allocatable: int = 0  # GPUs
    requested: int = 0  # GPUs requested by live pods that the restart does not recreate
    unschedulable: bool = False
    ready: bool = True
    taints: tuple[tuple[str, str], ...] = ()  # (key, effect)

    @property
    def free(self) -> int:
        return max(0, self.allocatable - self.requested)


class FleetTopology:
    """Node -> {level: value} from labels named by ``settings`` (``""`` where a label is missing)."""

    def __init__(self, nodes: Iterable[NodeState], settings: PlacementSettings) -> None:
        s = self.settings = settings
        self.label_of: dict[str, str] = {"nvlink_domain": s.nvlink_domain_label, "leaf": s.leaf_label,
                                         "rack": s.rack_label, "spine": s.spine_label, "pool": s.pool_label}
        self._weight = {"nvlink_domain": s.nvlink_weight, "leaf": s.leaf_weight, "rack": s.rack_weight,
                        "spine": s.spine_weight, "pool": s.pool_weight}
        self.domains: dict[str, dict[str, str]] = {
            n.name: {lvl: n.labels.get(key, "") if key else "" for lvl, key in self.label_of.items()}
            for n in nodes}

    def domain_of(self, node: str, level: str) -> str:
        return self.domains.get(node, {}).get(level, "")

    def weight(self, level: str) -> int:
        return self._weight[level]


def job_domain(topology: FleetTopology, current_nodes: Sequence[str], excluded: Iterable[str]) -> dict[str, str]:
    """Per level, the value most surviving nodes share (ties: the smallest); the excluded nodes'
    own domains when no rank survives (the job's neighbourhood is still theirs)."""
    gone = set(excluded)
    survivors = [n for n in current_nodes if n not in gone] or list(current_nodes)
    out: dict[str, str] = {}
    for level in LEVELS:
        counts = Counter(v for n in survivors if (v := topology.domain_of(n, level)))
        if counts:
            top = max(counts.values())
            out[level] = min(v for v, c in counts.items() if c == top)
    return out


def preferred_terms(topology: FleetTopology, domain: Mapping[str, str]) -> list[dict[str, Any]]:
    """Preferred node-affinity terms toward ``domain``, strongest first; the standby pool's term
    first when one is configured."""
    s = topology.settings
    terms = []
    if s.standby_label and s.standby_weight:
        terms.append(_term(s.standby_weight, s.standby_label, s.standby_value))
    for level in LEVELS:
        label, value, weight = topology.label_of[level], domain.get(level, ""), topology.weight(level)
        if label and value and weight:
            terms.append(_term(weight, label, value))
    return terms


def standby_tolerations(settings: PlacementSettings) -> list[dict[str, Any]]:
    if not (settings.standby_label and settings.standby_taint_key):
        return []
    return [{"key": settings.standby_taint_key, "operator": "Exists", "effect": "NoSchedule"}]


def _term(weight: int, key: str, value: str) -> dict[str, Any]:
    return {"weight": weight, "preference": {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}}


# --- applying the preference to pod templates --------------------------------------------------------


@dataclass(frozen=True)
class Placed:
    """A pod spec's new ``affinity`` / ``tolerations`` (None: unchanged) and what was added."""

    affinity: dict[str, Any] | None
    tolerations: list[dict[str, Any]] | None


def previous_placement(annotations: Mapping[str, str]) -> dict[str, list[dict[str, Any]]]:
    """What fleetmedic added last time (``fleetmedic.io/placement``, ``ANNOTATION_PLACEMENT``), so it
    can be replaced."""
    try:
        doc = json.loads(annotations.get(ANNOTATION_PLACEMENT) or "{}")
    except ValueError:
        return {}
    return {k: list(v) for k, v in doc.items() if k in ("preferences", "tolerations") and isinstance(v, list)}


def placement_record(terms: Sequence[Mapping[str, Any]], tolerations: Sequence[Mapping[str, Any]],
                     domain: Mapping[str, str]) -> str:
    return json.dumps({"preferences": list(terms), "tolerations": list(tolerations), "domain": dict(domain)},
                      separators=(",", ":"), sort_keys=True)


def place(pod_spec: Mapping[str, Any], affinity: Mapping[str, Any] | None, terms: Sequence[Mapping[str, Any]],
          tolerations: Sequence[Mapping[str, Any]], previous: Mapping[str, Sequence[Mapping[str, Any]]],
          force_exclude: Sequence[str] = (), release: Sequence[str] = ()) -> Placed:
    """``affinity`` (the planner's, else the pod spec's) with fleetmedic's earlier placement terms
    replaced by ``terms``, the nodes in ``release`` taken out of the required ``hostname NotIn`` and
    ``force_exclude`` ANDed into it; the pod spec's tolerations with ``tolerations`` in place of the
    earlier ones."""
    before = copy.deepcopy(dict(affinity or {}))
    after = without_node_exclusion(before, release) if release else copy.deepcopy(before)
    after = with_node_exclusion(after, force_exclude) if force_exclude else after
    node_aff = after.setdefault("nodeAffinity", {})
    old_terms = list(previous.get("preferences") or [])
    prefs = [p for p in node_aff.get("preferredDuringSchedulingIgnoredDuringExecution") or [] if p not in old_terms]
    prefs += [dict(t) for t in terms if t not in prefs]
    if prefs:
        node_aff["preferredDuringSchedulingIgnoredDuringExecution"] = prefs
    else:
        node_aff.pop("preferredDuringSchedulingIgnoredDuringExecution", None)
    if not node_aff:
        after.pop("nodeAffinity")
    old_tol = list(previous.get("tolerations") or [])
    tol_before = list(pod_spec.get("tolerations") or [])
    tol_after = [t for t in tol_before if t not in old_tol] + [dict(t) for t in tolerations]
    return Placed(affinity=after if after != before else None,
                  tolerations=tol_after if tol_after != tol_before else None)


@dataclass(frozen=True)
class Recipe:
    """What one restart adds to every pod template: the preferred ``terms`` and ``tolerations``
    (replacing fleetmedic's ``previous`` ones), the nodes to ``keep_off`` (required NotIn) and the
    exclusions to ``release`` (nodes back in service)."""

    terms: tuple[dict[str, Any], ...] = ()
    tolerations: tuple[dict[str, Any], ...] = ()
    previous: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    keep_off: tuple[str, ...] = ()
    release: tuple[str, ...] = ()


def placed_ops(pointer: str, pod_spec: Mapping[str, Any], affinity: Mapping[str, Any] | None,
               recipe: Recipe) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """JSON-patch ops that give the pod spec at ``pointer`` the recipe's placement on top of
    ``affinity`` (the planner's, else the spec's own), and the pod spec as it will be."""
    placed = place(pod_spec, affinity, recipe.terms, recipe.tolerations, recipe.previous, recipe.keep_off,
                   recipe.release)
    final_aff = placed.affinity if placed.affinity is not None else (dict(affinity) if affinity else None)
    ops: list[dict[str, Any]] = []
    if final_aff != pod_spec.get("affinity"):
        ops.append({"op": "add", "path": pointer + "/affinity", "value": final_aff or {}})
    if placed.tolerations is not None:
        ops.append({"op": "add", "path": pointer + "/tolerations", "value": placed.tolerations})
    tolerations = placed.tolerations if placed.tolerations is not None else pod_spec.get("tolerations")
    return ops, {**pod_spec, "affinity": final_aff, "tolerations": tolerations}


CHILD_POD_SPEC: Final = "/spec/template/spec"


def child_job_ops(child_job: Mapping[str, Any], planned_ops: Sequence[Mapping[str, Any]],
                  recipe: Recipe) -> list[dict[str, Any]]:
    """The one patch for a suspended child Job of a JobSet: its own plan's ops (the exclusion) with
    the affinity replaced by one that also carries the recipe (preference, release, tolerations)."""
    spec = ((child_job.get("spec") or {}).get("template") or {}).get("spec") or {}
    affinity_path = CHILD_POD_SPEC + "/affinity"
    planned = next((op["value"] for op in planned_ops if op.get("path") == affinity_path), spec.get("affinity"))
    keep = [dict(op) for op in planned_ops if op.get("path") not in (affinity_path, CHILD_POD_SPEC + "/tolerations")]
    ops, _ = placed_ops(CHILD_POD_SPEC, spec, planned, recipe)
    return keep + ops


# --- isolation of the excluded nodes -----------------------------------------------------------------


def back_in_service(previously_excluded: Iterable[str], excluded: Iterable[str],
                    nodes: Mapping[str, NodeState], quarantine_taint_key: str) -> list[str]:
    """Nodes fleetmedic excluded from a workload earlier that are healthy again: Ready, not
    cordoned, without the quarantine taint, and not excluded by this command. Their exclusion is
    lifted, so a job that failed often does not run out of nodes (unknown nodes stay excluded)."""
    now = set(excluded)
    out = []
    for name in sorted(set(previously_excluded) - now):
        node = nodes.get(name)
        if node is not None and node.ready and not node.unschedulable and \
                not any(key == quarantine_taint_key for key, _ in node.taints):
            out.append(name)
    return out


def unisolated(excluded: Iterable[str], nodes: Mapping[str, NodeState | None],
               pod_specs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Excluded nodes some pod template could still be scheduled onto: the node exists, and neither
    its cordon, nor a NoSchedule/NoExecute taint the pods do not tolerate, nor a required
    ``hostname NotIn`` in the template keeps the pods off it."""
    out = []
    for name in sorted(set(excluded)):
        node = nodes.get(name)
        if node is None:
            continue  # gone: nothing can be scheduled there
        for spec in pod_specs:
            if name in excluded_nodes(spec.get("affinity")):
                continue
            if not _keeps_off(node, spec.get("tolerations") or []):
                out.append(name)
                break
    return out


def _keeps_off(node: NodeState, tolerations: Sequence[Mapping[str, Any]]) -> bool:
    if node.unschedulable and not tolerates(tolerations, UNSCHEDULABLE_TAINT_KEY):
        return True
    return any(effect in BLOCKING_EFFECTS and not tolerates(tolerations, key, effect) for key, effect in node.taints)


# --- capacity -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Demand:
    """One pod the restart recreates: its GPU request and the pod spec that constrains it."""

    gpus: int
    spec: Mapping[str, Any]


@dataclass(frozen=True)
class CapacityVerdict:
    pods: int
    gpus: int
    placed_anywhere: int  # pods that fit on healthy nodes
    placed_in_domain: int  # pods that fit on healthy nodes of the preferred domain
    placed_on_standby: int
    domain_level: str = ""
    domain_value: str = ""
    healthy_nodes: int = 0

    @property
    def sufficient(self) -> bool:
        return self.placed_anywhere >= self.pods

    @property
    def fits_in_domain(self) -> bool:
        return self.placed_in_domain >= self.pods

    def missing(self) -> str:
        short = self.pods - self.placed_anywhere
        if short <= 0:
            return ""
        return f"{short} of {self.pods} pod(s) ({self.gpus} GPU(s) in all) do not fit on the {self.healthy_nodes} " \
               "healthy node(s) that may run them"

    def details(self) -> dict[str, str]:
        out = {"capacity": "sufficient" if self.sufficient else "insufficient",
               "capacity_pods": str(self.pods), "capacity_fit_anywhere": str(self.placed_anywhere),
               "capacity_fit_in_domain": str(self.placed_in_domain)}
        if self.domain_level:
            out["preferred_domain"] = f"{self.domain_level}={self.domain_value}"
        if self.placed_on_standby:
            out["capacity_fit_on_standby"] = str(self.placed_on_standby)
        if not self.sufficient:
            out["capacity_missing"] = self.missing()
        return out


def capacity_verdict(demands: Sequence[Demand], nodes: Sequence[NodeState], excluded: Iterable[str],
                     topology: FleetTopology, domain: Mapping[str, str]) -> CapacityVerdict:
    """Bin-pack ``demands`` (largest first, best fit) onto healthy nodes three times: the preferred
    domain's (its narrowest level with a value), the standby pool's, and all of them."""
    gone = set(excluded)
    s = topology.settings
    level = next((lvl for lvl in LEVELS if domain.get(lvl) and topology.label_of[lvl]), "")
    value = domain.get(level, "") if level else ""
    healthy = [n for n in nodes if n.name not in gone and n.ready and not n.unschedulable]
    in_domain = [n for n in healthy if level and topology.domain_of(n.name, level) == value]
    standby = [n for n in healthy if s.standby_label and n.labels.get(s.standby_label) == s.standby_value]
    eligible_any = [n for n in healthy if any(may_run(d.spec, n, s) for d in demands)]
    return CapacityVerdict(
        pods=len(demands), gpus=sum(d.gpus for d in demands),
        placed_anywhere=_pack(demands, healthy, s), placed_in_domain=_pack(demands, in_domain, s),
        placed_on_standby=_pack(demands, standby, s), domain_level=level, domain_value=value,
        healthy_nodes=len(eligible_any))


def _pack(demands: Sequence[Demand], nodes: Sequence[NodeState], settings: PlacementSettings) -> int:
    free = {n.name: n.free for n in nodes}
    placed = 0
    for d in sorted(demands, key=lambda x: -x.gpus):
        fits = [n for n in nodes if free[n.name] >= d.gpus and may_run(d.spec, n, settings)]
        if not fits:
            continue
        best = min(fits, key=lambda n: (free[n.name], n.name))
        free[best.name] -= d.gpus
        placed += 1
    return placed


def may_run(spec: Mapping[str, Any], node: NodeState, settings: PlacementSettings) -> bool:
    """The pod spec's node selector, required node affinity and tolerations allow ``node``; the
    standby taint counts as tolerated when the standby pool is configured (replacements get it)."""
    labels = {**node.labels, HOSTNAME_LABEL: node.labels.get(HOSTNAME_LABEL, node.name)}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    tol = list(spec.get("tolerations") or []) + standby_tolerations(settings)
    if any(effect in BLOCKING_EFFECTS and not tolerates(tol, key, effect) for key, effect in node.taints):
        return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    return not required or any(_term_matches(t, labels) for t in required)


def _term_matches(term: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    for e in term.get("matchExpressions") or []:
        key, op, values = e.get("key", ""), e.get("operator", ""), list(e.get("values") or [])
        have = labels.get(key)
        if op == "In" and have not in values:
            return False
        if op == "NotIn" and have in values:
            return False
        if op == "Exists" and have is None:
            return False
        if op == "DoesNotExist" and have is not None:
            return False
        if op in ("Gt", "Lt") and not _compare(have, values, op):
            return False
    return True


def _compare(have: str | None, values: Sequence[str], op: str) -> bool:
    try:
        a, b = int(have or ""), int(values[0])
    except (ValueError, IndexError):
        return False
    return a > b if op == "Gt" else a < b


def gpu_request(container_resources: Mapping[str, Any] | None, resource: str) -> int:
    """GPUs a container asks for (requests, else limits); unparsable values count as 0."""
    res = container_resources or {}
    for part in ("requests", "limits"):
        value = (res.get(part) or {}).get(resource)
        if value is not None:
            try:
                return int(str(value))
            except ValueError:
                return 0
    return 0


def pod_gpus(spec: Mapping[str, Any], resource: str) -> int:
    """A pod's effective GPU request: the sum over containers, or the largest init container's."""
    main = sum(gpu_request(c.get("resources"), resource) for c in spec.get("containers") or [])
    init = max((gpu_request(c.get("resources"), resource) for c in spec.get("initContainers") or []), default=0)
    return max(main, init)
