"""Operator commands (``fleetmedic ctl``): only a correctly signed, unexpired command steers the
engine, and what it does is audited with the operator as the actor."""

from __future__ import annotations

import msgspec
import pytest

from fleetmedic.records import InvalidRecord, OperatorCommand, decode, encode
from fleetmedic.remediation.operator import apply_operator_command
from fleetmedic.signing import CommandExpired, SignatureError, sign
from tests.remediation.world import World

KEY = b"k" * 32


def _storm() -> World:
    w = World(n=64, auto_execute=False, config="safety: {max_quarantined_fraction: 0.25}")
    for i in range(0, 64, 2):
        w.finding(f"node-{i}", kind="hard_fault", severity="critical", hint="reset_gpu", detector="hard_rules")
    assert w.engine.breaker_open
    return w


def _cmd(w: World, action: str = "resume_breaker", node: str = "", ttl: float = 600.0) -> OperatorCommand:
    return OperatorCommand(id=f"op-{action}-{node or 'fleet'}", action=action, actor="carol",  # type: ignore[arg-type]
                           reason="exporter fixed", issued_at=w.now, expires_at=w.now + ttl, node=node)


def test_a_signed_resume_closes_the_breaker_and_is_audited_with_the_operator() -> None:
    w = _storm()
    cmd = decode(OperatorCommand, encode(sign(_cmd(w), KEY)))  # as it comes off the topic
    w._take(apply_operator_command(w.engine, cmd, KEY, w.now))
    assert not w.engine.breaker_open
    (audit,) = w.decisions("breaker_resumed")
    assert audit.actor == "operator:carol" and "op-resume_breaker-fleet" in audit.explanation
    w.finding("node-35", kind="hard_fault", severity="critical", hint="isolate")
    assert "node-35" in w.isolated()


@pytest.mark.parametrize("tamper", ["unsigned", "forged", "wrong_key", "expired"])
def test_an_unsigned_forged_or_expired_command_changes_nothing(tamper: str) -> None:
    w = _storm()
    cmd = sign(_cmd(w, ttl=60.0), KEY)
    now = w.now
    if tamper == "unsigned":
        cmd = msgspec.structs.replace(cmd, signature="")
    elif tamper == "forged":
        cmd = msgspec.structs.replace(cmd, actor="mallory")
    elif tamper == "wrong_key":
        cmd = sign(_cmd(w, ttl=60.0), b"x" * 32)
    else:
        now += 61.0
    with pytest.raises(CommandExpired if tamper == "expired" else SignatureError):
        apply_operator_command(w.engine, cmd, KEY, now)
    assert w.engine.breaker_open and not w.decisions("breaker_resumed")


def test_clearing_a_quarantined_node_returns_it_and_node_commands_need_a_node() -> None:
    w = World(n=16)
    w.finding("node-3", kind="hard_fault", severity="critical", hint="isolate", detector="hard_rules")
    assert "node-3" in w.isolated()
    w._take(apply_operator_command(w.engine, sign(_cmd(w, "clear_node", "node-3"), KEY), KEY, w.now))
    assert w.engine.state.nodes.get("node-3") is None or w.engine.state.nodes["node-3"].state in ("healthy",
                                                                                                    "probation")
    assert any(a.actor == "operator:carol" and a.node == "node-3" for a in w.audit)
    with pytest.raises(InvalidRecord, match="`node` is required for clear_node"):
        decode(OperatorCommand, encode(_cmd(w, "resume_breaker")).replace(b'"resume_breaker"', b'"clear_node"'))
