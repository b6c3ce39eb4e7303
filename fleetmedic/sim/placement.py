"""Where the simulated scheduler puts a gang, and what a re-placement is recorded as.

Two behaviours, as on a real cluster:

- **Plain Kubernetes** (the job controller's own restarts, a new job): keep the job's old nodes
  that may still run it, fill the rest from the scalable unit (SU) with the most free nodes. Nothing
  pulls the replacements toward the ranks that survived.
- **Topology-aware** (a fleetmedic ``restart_job``/``requeue_job``: the executor adds preferred node
  affinity toward the surviving ranks' leaf > rack and a required exclusion of the suspects, see
  docs/placement.md): keep the old nodes that may still run it, then fill from the surviving ranks'
  SU (in the simulated rail-optimised fabric a leaf is (SU, rail) and every node of an SU sits
  behind the same leaves, so "same leaf" is "same SU"), same rack first; then the rest as plain
  Kubernetes would.

The domain of the surviving ranks follows ``fleetmedic.executor.workload.placement_plan.job_domain``: per level
the value most surviving (non-excluded) old nodes share, ties to the smallest; the excluded nodes'
own domains when no rank survives. Excluded nodes are never eligible (the caller's ``ok`` mask).

Each placement of a job that ran before is a :class:`Replacement`: the old and new nodes, the
domain, and whether the domain had room (enough eligible free nodes for every replacement) at that
moment. :func:`count_replacements` sums them up for the closed loop's accounting (the leaf
locality and repeat placements on suspects that docs/placement.md measures on the real control
plane). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from msgspec import Struct

PREFERENCES = ("fleetmedic", "none", "all")


@dataclass(frozen=True)
class Domain:
    """The surviving ranks' scalable unit (= leaf) and rack; -1 where there is none."""

    su: int = -1
    rack: int = -1


@dataclass(frozen=True)
class Replacement:
    """A placement of a job that ran before (``before`` are its nodes then)."""

    t: float
    by: str  # "controller", "user" or the command id
    topology_aware: bool
    before: tuple[int, ...]
    nodes: tuple[int, ...]
    excluded: tuple[int, ...]
    domain: Domain
    room: bool  # the domain's SU had enough eligible free nodes for every replacement
    suspected: tuple[int, ...] = ()  # nodes of ``nodes`` fleetmedic suspected at that moment

    @property
    def replacements(self) -> tuple[int, ...]:
        """Nodes the job did not run on before."""
        old = set(self.before)
        return tuple(n for n in self.nodes if n not in old)


def _majority(values: list[int]) -> int:
    if not values:
        return -1
    counts = Counter(values)
    top = max(counts.values())
    return min(v for v, c in counts.items() if c == top)


def job_domain(before: Sequence[int], exclude: Collection[int], node_su: np.ndarray,
               node_rack: np.ndarray) -> Domain:
    """The SU and rack most surviving ranks share (the excluded nodes' own when none survives)."""
    survivors = [n for n in before if n not in exclude] or list(before)
    return Domain(su=_majority([int(node_su[n]) for n in survivors]),
                  rack=_majority([int(node_rack[n]) for n in survivors]))


def choose_nodes(n_nodes: int, ok: np.ndarray, prefer: Sequence[int], node_su: np.ndarray,
                 node_rack: np.ndarray, domain: Domain | None) -> list[int] | None:
    """``n_nodes`` eligible nodes (``ok``), or None if too few: the ``prefer``red old nodes that are
    eligible first, then, with a ``domain`` (topology-aware), its SU (its rack first), then the SU
    with the most eligible nodes (plain Kubernetes packing)."""
    if int(np.count_nonzero(ok)) < n_nodes:
        return None
    chosen = [int(i) for i in prefer if ok[i]][:n_nodes]
    if len(chosen) < n_nodes:
        taken = set(chosen)
        cand = [int(i) for i in np.flatnonzero(ok) if int(i) not in taken]
        by_su = Counter(int(node_su[i]) for i in cand)
        if domain is None:
            cand.sort(key=lambda i: (-by_su[int(node_su[i])], int(node_su[i]), i))
        else:
            cand.sort(key=lambda i: (int(node_su[i]) != domain.su, int(node_rack[i]) != domain.rack,
                                     -by_su[int(node_su[i])], int(node_su[i]), i))
        chosen += cand[: n_nodes - len(chosen)]
    return sorted(chosen)


def domain_had_room(n_nodes: int, ok: np.ndarray, prefer: Sequence[int], node_su: np.ndarray,
                    domain: Domain) -> bool:
    """Whether the domain's SU held enough eligible nodes for every node the job needs beyond the
    old nodes it keeps."""
    kept = {int(i) for i in prefer if ok[i]}
    need = max(0, n_nodes - min(len(kept), n_nodes))
    if need == 0:
        return True
    if domain.su < 0:
        return False
    free_in_su = sum(1 for i in np.flatnonzero(ok & (node_su == domain.su)) if int(i) not in kept)
    return free_in_su >= need


def topology_aware(preference: str, by: str) -> bool:
    """Does a restart requested ``by`` get the topology preference under ``preference``?
    ``fleetmedic``: only fleetmedic's commands (not the job controller, not a person); ``none``:
    nobody (the executor with ``placement.enabled: false``); ``all``: every restart (a cluster
    whose scheduler is topology-aware by itself)."""
    if preference == "all":
        return True
    if preference == "none":
        return False
    return by not in ("controller", "user", "")


class PlacementCounts(Struct, frozen=True, kw_only=True):
    """Re-placements after failures, summed (``Accounting.placement``).

    ``in_leaf``/``replacements`` count replacement nodes (nodes the job did not run on before) of
    the re-placements whose leaf had room (``with_room`` of ``re_placements``), as the executor's
    bench does; ``leaf_fraction`` is their ratio. ``on_suspect`` counts nodes of any placement after
    a failure (kept old nodes too) that were a suspect of that outage when it was placed: the node of
    a fault behind one of the outage's failures so far that is still active and whose truth says
    isolate the node or its link (a leaf-switch fault has no suspect node; a fault that strikes a
    node only after the job was placed there is a new failure, not a repeat placement).
    ``on_excluded`` counts placements on nodes the restart excluded. ``in_leaf_any``/``replacements_any``
    count over every re-placement, room or not. ``on_suspect`` splits into ``on_suspect_known``, the
    nodes fleetmedic already suspected when the job was placed (held, settling, refused, not yet
    cordoned, evidence being confirmed: a restart must exclude them, target 0), and
    ``on_suspect_undetected``, those it had not found yet (a detection delay), per fault kind in
    ``undetected_by_kind``. ``on_flagged`` counts placements on any node fleetmedic suspected then,
    faulty or not."""

    placements: int = 0
    re_placements: int = 0
    with_room: int = 0
    replacements: int = 0
    in_leaf: int = 0
    leaf_fraction: float | None = None
    on_suspect: int = 0
    on_excluded: int = 0
    replacements_any: int = 0
    in_leaf_any: int = 0
    on_suspect_known: int = 0
    on_suspect_undetected: int = 0
    on_flagged: int = 0
    undetected_by_kind: dict[str, int] = {}


def restarter(by: str) -> str:
    """The group a restart belongs to: ``fleetmedic`` (a command), ``job_controller`` or ``user``."""
    return {"controller": "job_controller", "user": "user"}.get(by, "fleetmedic")


def count_replacements(records: Iterable[tuple[Replacement, Mapping[int, str]]], node_su: np.ndarray
                       ) -> PlacementCounts:
    """Sum ``(re-placement, the outage's suspect nodes at that moment -> their fault's kind)`` pairs."""
    placements = re_placements = with_room = replacements = in_leaf = on_suspect = on_excluded = 0
    replacements_any = in_leaf_any = known = flagged = 0
    undetected: Counter[str] = Counter()
    for rec, suspects in records:
        placements += 1
        hit = [n for n in rec.nodes if n in suspects]
        on_suspect += len(hit)
        known += sum(1 for n in hit if n in rec.suspected)
        undetected.update(suspects[n] for n in hit if n not in rec.suspected)
        flagged += len(rec.suspected)
        on_excluded += sum(1 for n in rec.nodes if n in rec.excluded)
        new = rec.replacements
        if not new:
            continue
        re_placements += 1
        stayed = sum(1 for n in new if int(node_su[n]) == rec.domain.su)
        replacements_any += len(new)
        in_leaf_any += stayed
        if rec.room:
            with_room += 1
            replacements += len(new)
            in_leaf += stayed
    return PlacementCounts(placements=placements, re_placements=re_placements, with_room=with_room,
                           replacements=replacements, in_leaf=in_leaf,
                           leaf_fraction=round(in_leaf / replacements, 4) if replacements else None,
                           on_suspect=on_suspect, on_excluded=on_excluded, replacements_any=replacements_any,
                           in_leaf_any=in_leaf_any, on_suspect_known=known,
                           on_suspect_undetected=on_suspect - known, on_flagged=flagged,
                           undetected_by_kind=dict(sorted(undetected.items())))
