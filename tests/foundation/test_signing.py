"""Command signing: a signed command verifies after a trip over the wire; any tampering, a wrong
key, a missing signature or an expired command is refused."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetmedic import records as r
from fleetmedic.signing import CommandExpired, SignatureError, load_key, sign, verify

KEY = load_key("0123456789abcdef0123456789abcdef")


def command(**over: object) -> r.RemediationCommand:
    base: dict[str, object] = dict(
        id="cmd-42", action="drain", incident_id="inc-7", reason="XID 79 on GPU 3", issued_at=1000,
        expires_at=1300, node="gpu-node-7", params={"grace_s": "30"}, exclude_nodes=["gpu-node-7"],
    )
    base.update(over)
    return r.RemediationCommand(**base)  # type: ignore[arg-type]


def test_a_signed_command_verifies_after_a_trip_over_the_wire() -> None:
    signed = sign(command(), KEY)
    received = r.decode(r.RemediationCommand, r.encode(signed))
    verify(received, KEY, now=1100.0)


def test_key_order_on_the_wire_does_not_matter() -> None:
    doc = json.loads(r.encode(sign(command(), KEY)))
    reordered = json.dumps(dict(reversed(list(doc.items()))))
    verify(r.decode(r.RemediationCommand, reordered), KEY, now=1100.0)


@settings(max_examples=100, deadline=None)
@given(
    field=st.sampled_from(["action", "node", "reason", "expires_at", "dry_run", "params", "exclude_nodes"]),
    data=st.data(),
)
def test_any_tampered_field_is_detected(field: str, data: st.DataObject) -> None:
    signed = sign(command(), KEY)
    replacements = {
        "action": st.sampled_from(["cordon", "uncordon", "reboot_node"]),
        "node": st.text(min_size=1, max_size=10).filter(lambda s: s != "gpu-node-7"),
        "reason": st.text(max_size=20).filter(lambda s: s != "XID 79 on GPU 3"),
        "expires_at": st.floats(min_value=1301, max_value=1e9),
        "dry_run": st.just(True),
        "params": st.just({"grace_s": "0"}),
        "exclude_nodes": st.just([]),
    }
    tampered = msgspec.structs.replace(signed, **{field: data.draw(replacements[field])})
    with pytest.raises(SignatureError, match="does not match"):
        verify(tampered, KEY, now=1100.0)


def test_a_wrong_key_is_refused() -> None:
    with pytest.raises(SignatureError):
        verify(sign(command(), KEY), load_key("x" * 40), now=1100.0)


def test_an_unsigned_command_is_refused() -> None:
    with pytest.raises(SignatureError, match="unsigned"):
        verify(command(), KEY, now=1100.0)


def test_an_expired_command_is_refused_even_with_a_good_signature() -> None:
    with pytest.raises(CommandExpired):
        verify(sign(command(), KEY), KEY, now=1300.5)


def test_short_keys_are_refused_and_whitespace_around_a_key_file_is_ignored() -> None:
    with pytest.raises(ValueError, match="at least 32 bytes"):
        load_key("short")
    assert load_key("  " + "k" * 32 + "\n") == b"k" * 32
