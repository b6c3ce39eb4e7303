"""The action vocabulary, in one place (pure; imports nothing of fleetmedic): every action a
remediation command can carry, the classes each falls in, the target a command acts on, and the
command id.

:data:`Action` is the ``action`` of :class:`fleetmedic.records.RemediationCommand` and
:class:`~fleetmedic.records.RemediationResult`; :data:`RuleAction` is what a policy rule may name
(:class:`fleetmedic.config.ActionStep`). The classes:

- the executor's three routes, which partition :data:`Action` (``tests/foundation/test_vocabulary.py``
  checks it; mypy checks that each route names only actions):

  - :data:`NODE_QUICK`: one patch of the Node (:func:`fleetmedic.executor.node.plan.plan_node_action`);
  - :data:`NODE_LONG`: a drain, diagnostics or a hook Job (:mod:`fleetmedic.executor.node.long_apply`),
    resumable from the Node's annotations; the node lifecycle waits for its result before the next step;
  - :data:`JOB_ACTIONS`: a workload restart (:mod:`fleetmedic.executor.workload`), recorded on the ledger;

- the two tracks of a policy rule: :data:`JOB_TRACK_ACTIONS` and :data:`NODE_TRACK_ACTIONS`
  (``escalate`` is on both);
- :data:`ISOLATING`: takes a node out of service (the node is quarantined); :data:`RELEASING`: lifts
  that; :data:`DISRUPTIVE`: a rung of the remediation ladder that interrupts the whole node;
- :data:`TRACKED`: the node actions whose result the node lifecycle waits for, up to a deadline;
- :data:`MOVING`: the job actions that move a job off its nodes.

A command acts on its node when it names one and is not a job action (:func:`targets_node`), on its
job otherwise: an ``escalate`` goes to whichever it names.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

Action = Literal[
    "cordon",
    "uncordon",
    "taint",
    "untaint",
    "drain",
    "label",
    "restart_job",
    "requeue_job",
    "retry_in_place",
    "run_diagnostics",
    "reset_gpu",
    "reboot_node",
    "return_to_service",
    "escalate",
]

QuickNodeAction = Literal["cordon", "uncordon", "taint", "untaint", "label", "return_to_service", "escalate"]
LongNodeAction = Literal["drain", "run_diagnostics", "reset_gpu", "reboot_node"]
JobAction = Literal["restart_job", "requeue_job", "retry_in_place"]

#: what a policy rule may name on its job and node tracks
RuleAction = Literal[
    "cordon",
    "taint",
    "drain",
    "label",
    "run_diagnostics",
    "reset_gpu",
    "reboot_node",
    "restart_job",
    "requeue_job",
    "retry_in_place",
    "escalate",
]

ACTIONS: Final[frozenset[Action]] = frozenset(get_args(Action))
NODE_QUICK: Final[frozenset[Action]] = frozenset(get_args(QuickNodeAction))
NODE_LONG: Final[frozenset[Action]] = frozenset(get_args(LongNodeAction))
JOB_ACTIONS: Final[frozenset[Action]] = frozenset(get_args(JobAction))

JOB_TRACK_ACTIONS: Final[frozenset[Action]] = JOB_ACTIONS | {"escalate"}
NODE_TRACK_ACTIONS: Final[frozenset[Action]] = frozenset(get_args(RuleAction)) - JOB_ACTIONS

ISOLATING: Final[frozenset[Action]] = frozenset({"cordon", "taint", "drain"})
RELEASING: Final[frozenset[Action]] = frozenset({"uncordon", "untaint", "return_to_service"})
DISRUPTIVE: Final[frozenset[Action]] = frozenset({"reset_gpu", "reboot_node"})
TRACKED: Final[frozenset[Action]] = ISOLATING | NODE_LONG
MOVING: Final[frozenset[Action]] = frozenset({"restart_job", "requeue_job"})


def targets_node(action: str, node: str) -> bool:
    """Whether a command with this action and ``node`` field acts on the node (else on its job)."""
    return bool(node) and action not in JOB_ACTIONS


def command_id(incident: str, action: str, target: str, attempt: str | int | None) -> str:
    """A command's id, ``<incident>/<action>/<target>/<attempt>``: its idempotency key (the engine
    issues an id once, an executor applies it once). The attempt says what may repeat: the node
    lifecycle's ``e<episode>.<n>`` per action, a job's attempt, or a named occasion; without one
    (``None``) the command is issued once per incident, action and target."""
    return f"{incident}/{action}/{target}" + ("" if attempt is None else f"/{attempt}")


def _routed(action: QuickNodeAction | LongNodeAction | JobAction | RuleAction) -> Action:
    """Never called: mypy refuses it if a route or a rule names something that is not an ``Action``."""
    return action
