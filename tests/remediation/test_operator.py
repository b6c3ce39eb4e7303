"""Operator commands (``fleetmedic ctl``): only a command signed with an operator key (never the
command key), unexpired and not applied before steers the engine, and what it does, or refuses as
a replay, is audited with the operator as the actor."""

from __future__ import annotations

import msgspec
import pytest

from fleetmedic.records import InvalidRecord, OperatorCommand, decode, encode
from fleetmedic.remediation.engine import DecisionEngine
from fleetmedic.remediation.operator import apply_operator_command, is_replay
from fleetmedic.signing import CommandExpired, KeySet, SignatureError, sign
from tests.remediation.helpers_world import World

KEY = b"k" * 32  # an operator key
KEYS = KeySet({"ops-1": KEY})
COMMAND_KEY = b"c" * 40  # the decision stage's own key: never accepted for an operator command


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
    w._take(apply_operator_command(w.engine, cmd, KEYS, w.now))
    assert not w.engine.breaker_open
    (audit,) = w.decisions("breaker_resumed")
    assert audit.actor == "operator:carol" and "op-resume_breaker-fleet" in audit.explanation
    assert "operator key ops-1" in audit.explanation
    w.finding("node-35", kind="hard_fault", severity="critical", hint="isolate")
    assert "node-35" in w.isolated()


@pytest.mark.parametrize("tamper", ["unsigned", "forged", "wrong_key", "command_key", "expired"])
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
    elif tamper == "command_key":
        cmd = sign(_cmd(w, ttl=60.0), COMMAND_KEY)
    else:
        now += 61.0
    with pytest.raises(CommandExpired if tamper == "expired" else SignatureError):
        apply_operator_command(w.engine, cmd, KEYS, now)
    assert w.engine.breaker_open and not w.decisions("breaker_resumed")


def test_clearing_a_quarantined_node_returns_it_and_node_commands_need_a_node() -> None:
    w = World(n=16)
    w.finding("node-3", kind="hard_fault", severity="critical", hint="isolate", detector="hard_rules")
    assert "node-3" in w.isolated()
    w._take(apply_operator_command(w.engine, sign(_cmd(w, "clear_node", "node-3"), KEY), KEYS, w.now))
    assert w.engine.state.nodes.get("node-3") is None or w.engine.state.nodes["node-3"].state in ("healthy",
                                                                                                    "probation")
    assert any(a.actor == "operator:carol" and a.node == "node-3" for a in w.audit)
    with pytest.raises(InvalidRecord, match="`node` is required for clear_node"):
        decode(OperatorCommand, encode(_cmd(w, "resume_breaker")).replace(b'"resume_breaker"', b'"clear_node"'))


def test_a_replayed_clear_node_is_refused_and_audited_and_the_node_stays_quarantined() -> None:
    w = World(n=16, auto_execute=False)
    w.finding("node-3", kind="hard_fault", severity="critical", hint="isolate", detector="hard_rules")
    assert w.engine.node_state("node-3") == "quarantined"
    clear = sign(_cmd(w, "clear_node", "node-3"), KEY)
    w._take(apply_operator_command(w.engine, clear, KEYS, w.now))
    assert w.engine.node_state("node-3") in ("healthy", "probation")
    w.advance(120.0)
    w.finding("node-3", kind="hard_fault", severity="critical", hint="isolate", detector="hard_rules")
    assert w.engine.node_state("node-3") == "quarantined"  # quarantined again meanwhile
    # the same signed command, captured off the topic and sent again within its TTL
    assert is_replay(w.engine, clear)
    before = w.engine.to_bytes()
    out = w._take(apply_operator_command(w.engine, decode(OperatorCommand, encode(clear)), KEYS, w.now))
    assert w.engine.node_state("node-3") == "quarantined" and not out.commands
    (refused,) = out.audit
    assert refused.decision == "skipped" and refused.node == "node-3" and refused.actor == "operator:carol"
    assert "refused" in refused.explanation and "replay" in refused.explanation and clear.id in refused.explanation
    # without the memory of applied ids the replay would have returned the node
    forgetful = DecisionEngine.from_bytes(before, w.settings)
    forgetful.state.operator_ids.clear()
    apply_operator_command(forgetful, clear, KEYS, w.now)
    assert forgetful.node_state("node-3") in ("healthy", "probation")


def test_applied_ids_survive_a_snapshot_round_trip_and_are_forgotten_once_expired() -> None:
    w = _storm()
    cmd = sign(_cmd(w, ttl=60.0), KEY)
    w._take(apply_operator_command(w.engine, cmd, KEYS, w.now))
    restored = DecisionEngine.from_bytes(w.engine.to_bytes(), w.settings)
    assert restored.state.operator_ids == {cmd.id: cmd.expires_at}
    out = apply_operator_command(restored, cmd, KEYS, w.now + 1.0)
    assert [a.decision for a in out.audit] == ["skipped"] and "replay" in out.audit[0].explanation
    # past its expiry the id is dropped (the command itself is refused as expired from then on)
    later = sign(_cmd(w, "resume_breaker", ttl=600.0), KEY)
    later = msgspec.structs.replace(later, id="op-later", issued_at=w.now + 100.0, expires_at=w.now + 700.0)
    apply_operator_command(restored, sign(later, KEY), KEYS, w.now + 100.0)
    assert set(restored.state.operator_ids) == {"op-later"}
    with pytest.raises(CommandExpired):
        apply_operator_command(restored, cmd, KEYS, w.now + 100.0)


def test_an_operator_command_valid_for_too_long_is_refused() -> None:
    w = _storm()
    with pytest.raises(CommandExpired, match="more than the 86400s"):
        apply_operator_command(w.engine, sign(_cmd(w, ttl=30 * 86_400.0), KEY), KEYS, w.now)
    assert w.engine.breaker_open and not w.engine.state.operator_ids
