"""Operator commands to the decision engine (``fleetmedic ctl``): verified, applied once.

An :class:`~fleetmedic.records.OperatorCommand` arrives on ``remediation.operator``. It is signed
with an *operator key* (:mod:`fleetmedic.signing`): the decision stage accepts any key of its
operator :class:`~fleetmedic.signing.KeySet`, never the command key, and the executor never holds an
operator key, so whoever may run ``ctl`` steers the engine (which still applies its policy and
budgets) but cannot sign a command for the executor. The signature and the expiry are checked
first; a rejected command changes nothing and the stage dead-letters it with the reason. Accepted
commands go to the engine's audited entry points, with the operator as the actor:

- ``resume_breaker``: close an open circuit breaker (``safety.breaker.resume: command``);
- ``clear_node``: the operator vouches for a node: return it to service now, without diagnostics;
- ``node_repaired``: a node that waits in ``repair_needed`` was repaired: validate it with
  diagnostics, then return it.

Replays are refused: the id of every applied command is remembered in the engine state
(``EngineState.operator_ids``, in the snapshot) until the command expires, and a command whose id
was applied is not applied again but audited (``skipped``, "replay"). Without this a ``clear-node``
captured off the topic could be sent again within its TTL and return a node that was quarantined
again in the meantime. A command valid for more than :data:`MAX_OPERATOR_TTL_S` is refused, which
bounds how long an id must be remembered.
"""

from __future__ import annotations

from typing import Final

from fleetmedic.records import OperatorCommand
from fleetmedic.remediation.engine import DecisionEngine, Decisions
from fleetmedic.signing import CommandExpired, KeySet

MAX_OPERATOR_TTL_S: Final = 86_400.0  # `fleetmedic ctl` signs for 600 s


def is_replay(engine: DecisionEngine, command: OperatorCommand) -> bool:
    """Whether ``command``'s id was applied before (and has not expired since)."""
    return command.id in engine.state.operator_ids


def apply_operator_command(engine: DecisionEngine, command: OperatorCommand, keys: KeySet, now: float, *,
                           verified_key_id: str = "") -> Decisions:
    """Verify ``command`` against the operator ``keys`` (raises :class:`~fleetmedic.signing.SignatureError`
    or :class:`~fleetmedic.signing.CommandExpired`) and apply it to ``engine``, once: a replayed id
    changes nothing and is audited. ``verified_key_id``: the caller verified the record's signature
    header over its bytes (:func:`~fleetmedic.signing.verify_record`) with that key; the expiry is
    still checked here."""
    if verified_key_id:
        if now > command.expires_at:
            raise CommandExpired(f"command {command.id}: expired at {command.expires_at:.3f}, now {now:.3f}")
        key_id = verified_key_id
    else:
        key_id = keys.verify(command, now, max_future_skew_s=engine.settings.streams.max_future_skew_s)
    if command.expires_at - command.issued_at > MAX_OPERATOR_TTL_S:
        raise CommandExpired(f"command {command.id}: valid for {command.expires_at - command.issued_at:.0f}s, more "
                             f"than the {MAX_OPERATOR_TTL_S:.0f}s an operator command may be")
    actor = f"operator:{command.actor}"
    seen = engine.state.operator_ids
    for gone in [i for i, expires in seen.items() if expires < now]:
        del seen[gone]
    if command.id in seen:
        out = Decisions()
        target = f" {command.node}" if command.node else ""
        engine.issuer.audit(out, max(now, engine.state.clock), "skipped",
                            f"operator command {command.id} ({command.action}{target}) refused: a replay of a "
                            f"command already applied (its id is remembered until it expires at "
                            f"{seen[command.id]:.3f})", node=command.node, actor=actor)
        return out
    seen[command.id] = command.expires_at
    reason = f"{command.reason} (operator command {command.id}, operator key {key_id})"
    if command.action == "resume_breaker":
        return engine.resume_breaker(actor=actor, reason=reason, now=now)
    if command.action == "clear_node":
        return engine.clear_node(command.node, actor=actor, reason=reason, now=now)
    return engine.node_repaired(command.node, actor=actor, reason=reason, now=now)
