"""Operator commands to the decision engine (``fleetmedic ctl``): verified, then applied.

An :class:`~fleetmedic.records.OperatorCommand` arrives on ``remediation.operator``. It is signed
with the same key as remediation commands (whoever may write that topic and holds the key may
steer fleetmedic), so the decision stage checks the signature and the expiry first; a rejected
command changes nothing and the stage dead-letters it with the reason. Accepted commands go to
the engine's audited entry points, with the operator as the actor:

- ``resume_breaker``: close an open circuit breaker (``safety.breaker.resume: command``);
- ``clear_node``: the operator vouches for a node: return it to service now, without diagnostics;
- ``node_repaired``: a node that waits in ``repair_needed`` was repaired: validate it with
  diagnostics, then return it.

Replays are harmless: resuming a closed breaker and clearing a healthy node change nothing, and
the engine never issues a command id twice; expiry bounds how late a command may act.
"""

from __future__ import annotations

from fleetmedic.records import OperatorCommand
from fleetmedic.remediation.engine import DecisionEngine, Decisions
from fleetmedic.signing import verify


def apply_operator_command(engine: DecisionEngine, command: OperatorCommand, key: bytes, now: float) -> Decisions:
    """Verify ``command`` (raises :class:`~fleetmedic.signing.SignatureError` or
    :class:`~fleetmedic.signing.CommandExpired`) and apply it to ``engine``."""
    verify(command, key, now)
    actor, reason = f"operator:{command.actor}", f"{command.reason} (operator command {command.id})"
    if command.action == "resume_breaker":
        return engine.resume_breaker(actor=actor, reason=reason, now=now)
    if command.action == "clear_node":
        return engine.clear_node(command.node, actor=actor, reason=reason, now=now)
    return engine.node_repaired(command.node, actor=actor, reason=reason, now=now)
