"""The executor's action vocabulary: every :data:`fleetmedic.records.Action`, by the route it takes (pure).

The actions themselves are declared once, in :mod:`fleetmedic.records`; here each one is put on one
route, and the three routes partition ``Action`` (``tests/executor/test_vocabulary.py`` checks that
every action has exactly one; mypy checks that every name here is an ``Action``):

- quick node actions: one patch of the Node (:func:`fleetmedic.executor.node.plan.plan_node_action`);
- long node actions: a drain, diagnostics or a hook Job (:mod:`fleetmedic.executor.node.long_apply`),
  resumable from the Node's annotations;
- job actions: a workload restart (:mod:`fleetmedic.executor.workload`), recorded on the ledger.

:func:`route` is the rule that sends a command down the node or the job track; only
:mod:`fleetmedic.executor.dispatch` calls it.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

from fleetmedic.records import Action, RemediationCommand

QuickNodeAction = Literal["cordon", "uncordon", "taint", "untaint", "label", "return_to_service", "escalate"]
LongNodeAction = Literal["drain", "run_diagnostics", "reset_gpu", "reboot_node"]
JobAction = Literal["restart_job", "requeue_job", "retry_in_place"]

ACTIONS: Final[frozenset[Action]] = frozenset(get_args(Action))
NODE_QUICK: Final[frozenset[Action]] = frozenset(get_args(QuickNodeAction))
NODE_LONG: Final[frozenset[Action]] = frozenset(get_args(LongNodeAction))
JOB_ACTIONS: Final[frozenset[Action]] = frozenset(get_args(JobAction))


def _routed(action: QuickNodeAction | LongNodeAction | JobAction) -> Action:
    """Never called: mypy refuses it if a route names something that is not a ``records.Action``."""
    return action


def route(cmd: RemediationCommand) -> Literal["node", "job"]:
    """The track a command takes: a node action naming a node goes to the node track, everything
    else (job actions, and an ``escalate`` about a job) to the job track."""
    return "node" if cmd.node and cmd.action not in JOB_ACTIONS else "job"
