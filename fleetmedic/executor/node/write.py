"""Writing a :class:`~.plan.NodePlan` to its node through the :class:`~fleetmedic.executor.cluster.Cluster`:
the one write every node action ends in (quick actions once, long actions at each step).

One merge patch carries the changes and, when the command is to be recorded, its id (in
``fleetmedic.io/commands``); a patch made from a node read with a ``resourceVersion`` is guarded
by it, so two executors cannot both apply the same change. Then the condition(s) and the Event.
"""

from __future__ import annotations

import dataclasses

from fleetmedic.executor.cluster import Cluster
from fleetmedic.executor.node import plan as p
from fleetmedic.k8s_keys import ANNOTATION_COMMANDS
from fleetmedic.records import RemediationCommand


def write_plan(cluster: Cluster, node: p.NodeView, cmd: RemediationCommand, plan: p.NodePlan, now: float,
               record: bool = False) -> None:
    """Write ``plan`` to the node: one merge patch (guarded by ``node.resource_version`` when set)
    carrying the changes and, with ``record``, the command id; then the condition and the Event."""
    ann = dict(plan.annotations)
    if record:
        fresh = node if node.resource_version else cluster.read_node(node.name)
        ann[ANNOTATION_COMMANDS] = p.remember(fresh.annotations if fresh else {}, cmd, now)
    plan = dataclasses.replace(plan, annotations=ann)
    patch = p.merge_patch(plan, node)
    if patch.get("spec") or set(patch["metadata"]) - {"resourceVersion"}:
        cluster.patch_node(node.name, patch)
    if plan.condition is not None:
        cluster.set_condition(node.name, plan.condition)
    for ctype, cond in plan.class_conditions:
        cluster.set_condition(node.name, cond, ctype)
    if plan.event is not None:
        cluster.event(node.name, plan.event, cmd.action)
