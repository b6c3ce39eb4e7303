"""Command signing: a signed command verifies after a trip over the wire; any tampering, a wrong
key, a missing signature or an expired command is refused. Keys by role: an empty, short or
published demo key is refused (outside the demo); an operator key never verifies a command for the
executor and the command key never verifies an operator command; operator keys are a set by id."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetmedic import records as r
from fleetmedic.config import Settings, parse_config
from fleetmedic.signing import (
    DEMO_COMMAND_KEY,
    DEMO_KEYS,
    DEMO_OPERATOR_KEY,
    KEY_ID_HEADER,
    SIGNATURE_HEADER,
    CommandExpired,
    KeySet,
    SignatureError,
    UnusableKey,
    load_key,
    operator_keys,
    sign,
    sign_bytes,
    signature_of,
    verify,
    verify_bytes,
    verify_record,
)

KEY = load_key("0123456789abcdef0123456789abcdef")
OPERATOR_KEY = load_key("operator-key-0123456789abcdef-0123456789")
ROOT = Path(__file__).resolve().parents[2]


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


# --- unusable keys ----------------------------------------------------------------------------------


def test_the_empty_key_is_refused_for_signing_and_verifying() -> None:
    forged = msgspec.structs.replace(command(), signature=signature_of(command(), b""))
    with pytest.raises(UnusableKey, match="empty"):
        verify(forged, b"", now=1100.0)  # before: accepted
    with pytest.raises(UnusableKey, match="empty"):
        sign(command(), b"")
    with pytest.raises(UnusableKey, match="empty"):
        load_key("  \n")


def test_a_short_key_is_refused_at_load_time_and_by_verify_with_the_reason() -> None:
    with pytest.raises(UnusableKey, match=r"at least 32 bytes, got 16.*openssl rand"):
        load_key("k" * 16)
    short = b"k" * 16
    with pytest.raises(UnusableKey, match="at least 32 bytes"):
        verify(msgspec.structs.replace(command(), signature=signature_of(command(), short)), short, now=1100.0)


@pytest.mark.parametrize("key", sorted(DEMO_KEYS))
def test_demo_keys_are_refused_outside_the_demo_and_accepted_where_it_allows_them(key: bytes) -> None:
    with pytest.raises(UnusableKey, match=r"published demo key.*signing.allow_demo_keys"):
        load_key(key)
    signed = sign(command(), key)
    with pytest.raises(UnusableKey, match="demo key"):
        verify(signed, key, now=1100.0)
    assert load_key(key, allow_demo=True) == key
    verify(signed, key, now=1100.0, allow_demo=True)


def test_every_key_published_in_the_repository_is_a_known_demo_key() -> None:
    """The demo's and the compose file's keys (and any added later) are in DEMO_KEYS."""
    published = set()
    for path in [ROOT / "fleetmedic" / "cli" / "demo.py", ROOT / "fleetmedic" / "signing.py",
                 *sorted((ROOT / "deploy").rglob("*.yaml")), *sorted((ROOT / "fleetmedic" / "sim").rglob("*.py"))]:
        published |= set(re.findall(r"[\w-]*not-for-production[\w!-]*", path.read_text()))
    assert published and {k.encode() for k in published} <= DEMO_KEYS, published


def test_the_command_key_loaded_from_the_config_refuses_a_demo_key_unless_allowed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetmedic.cli.common import signing_key

    monkeypatch.setenv("FLEETMEDIC_SIGNING_KEY", DEMO_COMMAND_KEY.decode())
    with pytest.raises(ValueError, match="command key \\$FLEETMEDIC_SIGNING_KEY: this is a published demo key"):
        signing_key(Settings())
    assert signing_key(parse_config("signing: {allow_demo_keys: true}", env={})) == DEMO_COMMAND_KEY


# --- keys by role -----------------------------------------------------------------------------------


def operator_command(**over: object) -> r.OperatorCommand:
    base: dict[str, object] = dict(id="op-1", action="clear_node", actor="carol", reason="replaced the riser",
                                   issued_at=1000, expires_at=1600, node="gpu-node-7")
    base.update(over)
    return r.OperatorCommand(**base)  # type: ignore[arg-type]


def test_a_command_signed_with_an_operator_key_is_refused_by_the_executors_verification() -> None:
    drain = sign(command(), OPERATOR_KEY)  # what a `ctl` user could try: a drain straight for the executor
    with pytest.raises(SignatureError, match="does not match"):
        verify(r.decode(r.RemediationCommand, r.encode(drain)), KEY, now=1100.0)


def test_an_operator_command_signed_with_the_command_key_is_refused_by_the_operator_keys() -> None:
    keys = KeySet({"ops-1": OPERATOR_KEY})
    assert keys.verify(sign(operator_command(), OPERATOR_KEY), now=1100.0) == "ops-1"
    with pytest.raises(SignatureError, match="does not match any operator key"):
        keys.verify(sign(operator_command(), KEY), now=1100.0)


def test_operator_keys_equal_to_the_command_key_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    source = parse_config("signing: {operator_key_env: {ops-1: FLEETMEDIC_SIGNING_KEY}}", env={}).signing
    env = {"FLEETMEDIC_SIGNING_KEY": KEY.decode()}
    with pytest.raises(UnusableKey, match=r"'ops-1' .* is the command key"):
        operator_keys(source, env, command_key=KEY)


def test_operator_keys_come_by_id_from_files_a_folder_and_variables(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("a" * 40 + "\n")
    folder = tmp_path / "mounted"
    folder.mkdir()
    (folder / "ops-2025").write_bytes(b"b" * 40)
    (folder / "..data").mkdir()  # a mounted Secret's bookkeeping: skipped
    (folder / "..2025_01_01").write_text("x")
    source = parse_config(f"signing: {{operator_key_files: {{ops-a: {tmp_path / 'a'}}}, operator_key_dir: {folder}, "
                          "operator_key_env: {ops-env: OPS_KEY, unset: NOT_SET}}", env={}).signing
    keys = operator_keys(source, {"OPS_KEY": "c" * 40})
    assert dict(keys.keys) == {"ops-a": b"a" * 40, "ops-2025": b"b" * 40, "ops-env": b"c" * 40}
    with pytest.raises(UnusableKey, match=r"3 configured .*operator_key_id"):
        keys.signer()
    assert KeySet(keys.keys, "ops-2025").signer() == ("ops-2025", b"b" * 40)
    with pytest.raises(UnusableKey, match=r"'nope' .*not configured"):
        KeySet(keys.keys, "nope").signer()


def test_operator_key_problems_name_the_key_and_the_reason(tmp_path: Path) -> None:
    def src(**kw: object) -> SimpleNamespace:
        base: dict[str, object] = dict(operator_key_files={}, operator_key_dir="", operator_key_env={},
                                       operator_key_id="", allow_demo_keys=False)
        return SimpleNamespace(**{**base, **kw})

    with pytest.raises(UnusableKey, match=r"'ops-1': cannot read .*missing"):
        operator_keys(src(operator_key_files={"ops-1": str(tmp_path / "missing")}), {})  # type: ignore[arg-type]
    with pytest.raises(UnusableKey, match=r"operator key 'ops-1' .*at least 32 bytes"):
        operator_keys(src(operator_key_env={"ops-1": "K"}), {"K": "short"})  # type: ignore[arg-type]
    with pytest.raises(UnusableKey, match=r"operator key 'demo' .*published demo key"):
        operator_keys(src(operator_key_env={"demo": "K"}), {"K": DEMO_OPERATOR_KEY.decode()})  # type: ignore[arg-type]
    with pytest.raises(UnusableKey, match="id 'bad id'"):
        operator_keys(src(operator_key_env={"bad id": "K"}), {"K": "k" * 40})  # type: ignore[arg-type]
    with pytest.raises(UnusableKey, match="no operator key is configured"):
        KeySet({}).verify(sign(operator_command(), OPERATOR_KEY), now=1100.0)


def test_rotation_old_and_new_operator_keys_overlap_then_the_old_is_refused() -> None:
    old, new = b"o" * 40, b"n" * 40
    by_old = sign(operator_command(), old)
    overlap = KeySet({"ops-2024": old, "ops-2025": new}, "ops-2025")
    assert overlap.verify(by_old, now=1100.0) == "ops-2024"
    assert overlap.verify(overlap.sign(operator_command(id="op-2")), now=1100.0) == "ops-2025"
    with pytest.raises(SignatureError, match="does not match any operator key \\(ops-2025\\)"):
        KeySet({"ops-2025": new}).verify(by_old, now=1100.0)


def test_ctl_signs_with_an_operator_key_never_the_command_key(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from fleetmedic.cli.main import main

    monkeypatch.delenv("FLEETMEDIC_OPERATOR_KEY", raising=False)
    monkeypatch.setenv("FLEETMEDIC_SIGNING_KEY", KEY.decode())  # holding the command key is not enough
    assert main(["ctl", "clear-node", "gpu-node-7", "--reason", "r"]) == 2
    assert "operator key: none configured" in capsys.readouterr().err
    monkeypatch.setenv("FLEETMEDIC_OPERATOR_KEY", KEY.decode())  # the command key under the operator's name
    assert main(["ctl", "clear-node", "gpu-node-7", "--reason", "r"]) == 2
    assert "is the command key" in capsys.readouterr().err
    monkeypatch.setenv("FLEETMEDIC_OPERATOR_KEY", OPERATOR_KEY.decode())
    assert main(["ctl", "clear-node", "gpu-node-7", "--reason", "r", "--key-id", "ops-9"]) == 2
    assert "'ops-9' (signing.operator_key_id, the one to sign with) is not configured" in capsys.readouterr().err


# --- signatures over the bytes that travel (Kafka headers, issue #25) -------------------------------

NEW_KEY = load_key("new-command-key-0123456789abcdef-0123456789")


def test_the_header_is_an_hmac_of_the_exact_value_bytes_that_any_language_can_recompute() -> None:
    import hashlib
    import hmac

    value = r.encode(sign(command(), KEY))
    headers = sign_bytes(value, "2026-12", KEY)
    assert dict(headers) == {SIGNATURE_HEADER: b"sha256=" + hmac.new(KEY, value, hashlib.sha256).hexdigest().encode(),
                             KEY_ID_HEADER: b"2026-12"}
    assert verify_bytes(value, headers, KeySet({"2026-12": KEY})) == "2026-12"


def test_one_changed_byte_anywhere_in_the_value_is_refused() -> None:
    value = r.encode(sign(command(), KEY))
    headers = sign_bytes(value, "k1", KEY)
    keys = KeySet({"k1": KEY})
    for i in range(len(value)):
        tampered = value[:i] + bytes([value[i] ^ 0x01]) + value[i + 1:]
        with pytest.raises(SignatureError):
            verify_bytes(tampered, headers, keys)


def test_a_reencoding_that_means_the_same_is_refused_too() -> None:
    """Bytes, not meaning: the same command with its keys reordered (or 1.0 printed as 1) is other
    bytes; the header signs what was produced, nothing is re-encoded to compare."""
    value = r.encode(sign(command(), KEY))
    headers = sign_bytes(value, "k1", KEY)
    doc = json.loads(value)
    for other in (json.dumps(dict(reversed(list(doc.items())))).encode(), json.dumps(doc).encode()):
        assert r.decode(r.RemediationCommand, other) == r.decode(r.RemediationCommand, value)
        with pytest.raises(SignatureError):
            verify_bytes(other, headers, KeySet({"k1": KEY}))


@pytest.mark.parametrize("headers", [
    [],
    [(SIGNATURE_HEADER, b"sha256=" + b"0" * 64)],
    [(KEY_ID_HEADER, b"k1")],
    [(SIGNATURE_HEADER, b"sha1=abc"), (KEY_ID_HEADER, b"k1")],
    [(SIGNATURE_HEADER, b"sha256=" + b"0" * 64), (KEY_ID_HEADER, b"k1")],
    [(SIGNATURE_HEADER, b"sha256=zz"), (KEY_ID_HEADER, b"k1")],
    [(SIGNATURE_HEADER, b"\xff\xfe"), (KEY_ID_HEADER, b"\xff")],
])
def test_missing_or_malformed_headers_are_refused(headers: list[tuple[str, bytes]]) -> None:
    with pytest.raises(SignatureError):
        verify_bytes(b"{}", headers, KeySet({"k1": KEY}))


def test_a_header_naming_another_key_than_the_one_that_signed_is_refused() -> None:
    value = r.encode(sign(command(), KEY))
    [(sig_name, sig), _] = sign_bytes(value, "k1", KEY)
    keys = KeySet({"k1": KEY, "k2": NEW_KEY})
    with pytest.raises(SignatureError, match="does not match"):
        verify_bytes(value, [(sig_name, sig), (KEY_ID_HEADER, b"k2")], keys)


def test_signing_with_an_unusable_key_or_id_is_refused() -> None:
    with pytest.raises(UnusableKey):
        sign_bytes(b"{}", "k1", b"short")
    with pytest.raises(UnusableKey):
        sign_bytes(b"{}", "../etc", KEY)


def test_migration_the_header_decides_when_present_and_the_body_only_when_not() -> None:
    keys = KeySet({"k1": KEY})
    signed = sign(command(), KEY)
    value = r.encode(signed)
    # both (what producers write during the migration)
    assert verify_record(signed, value, sign_bytes(value, "k1", KEY), keys, now=1100.0) == "k1"
    # no header: a record from before the headers, verified by its body signature
    assert verify_record(signed, value, [], keys, now=1100.0) == "k1"
    # header only (a producer past the migration): the body signature is not consulted
    bare = command()
    bare_value = r.encode(bare)
    assert verify_record(bare, bare_value, sign_bytes(bare_value, "k1", KEY), keys, now=1100.0) == "k1"
    # a header that does not verify is refused, even though the body signature is good
    with pytest.raises(SignatureError):
        verify_record(signed, value, sign_bytes(value, "k1", NEW_KEY), keys, now=1100.0)
    # and the expiry is checked either way
    with pytest.raises(CommandExpired):
        verify_record(signed, value, sign_bytes(value, "k1", KEY), keys, now=1400.0)
    with pytest.raises(CommandExpired):
        verify_record(signed, value, [], keys, now=1400.0)


def test_key_rotation_old_and_new_accepted_during_the_overlap_the_old_refused_after() -> None:
    """The documented rotation: add the new key to the verifiers, switch the signer, remove the old."""
    before = KeySet({"2026-11": KEY}, "2026-11")
    overlap = KeySet({"2026-11": KEY, "2026-12": NEW_KEY}, "2026-12")
    after = KeySet({"2026-12": NEW_KEY}, "2026-12")

    def produced(keys: KeySet) -> tuple[r.RemediationCommand, bytes, list[tuple[str, bytes]]]:
        kid, key = keys.signer()
        cmd = sign(command(), key)
        value = r.encode(cmd)
        return cmd, value, sign_bytes(value, kid, key)

    old, new = produced(before), produced(overlap)
    assert dict(old[2])[KEY_ID_HEADER] == b"2026-11" and dict(new[2])[KEY_ID_HEADER] == b"2026-12"
    # during the overlap both are accepted, by the header and by the body
    assert verify_record(*old, overlap, now=1100.0) == "2026-11"
    assert verify_record(*new, overlap, now=1100.0) == "2026-12"
    assert verify_record(old[0], old[1], [], overlap, now=1100.0) == "2026-11"
    # before the new key is rolled out to a verifier, what it signs is refused there
    with pytest.raises(SignatureError):
        verify_record(*new, before, now=1100.0)
    # after: the old key is gone and what it signed is refused (header and body alike)
    assert verify_record(*new, after, now=1100.0) == "2026-12"
    with pytest.raises(SignatureError, match=r"2026-11.*not an accepted"):
        verify_record(*old, after, now=1100.0)
    with pytest.raises(SignatureError):
        verify_record(old[0], old[1], [], after, now=1100.0)
    # an old-key record relabelled with the new id does not pass either
    relabelled = [(n, b"2026-12" if n == KEY_ID_HEADER else v) for n, v in old[2]]
    with pytest.raises(SignatureError):
        verify_record(old[0], old[1], relabelled, after, now=1100.0)


def test_the_executor_screen_takes_a_header_verified_command_without_its_body_signature() -> None:
    """executor/service.py verifies the header over the bytes received; then the in-body signature
    is not consulted (a producer past the migration leaves it empty), the key and the expiry still are."""
    from fleetmedic.executor.node import plan

    bare = command()  # no in-body signature
    assert plan.reject_reason(bare, KEY, 1100.0, verified_by_header=True) is None
    assert "signature" in (plan.reject_reason(bare, KEY, 1100.0) or "")  # no header: the body decides
    assert "expired" in (plan.reject_reason(bare, KEY, 1400.0, verified_by_header=True) or "")
    assert "signature" in (plan.reject_reason(bare, DEMO_COMMAND_KEY, 1100.0, verified_by_header=True) or "")


@pytest.mark.parametrize("signature", ["é" * 64, "\udcff", "\uff46" * 64])
def test_a_signature_that_is_not_ascii_is_a_mismatch_not_a_crash(signature: str) -> None:
    """Schema-valid operator commands with such signatures made verify raise TypeError (found by the
    stages' fuzz); they are refused like any other mismatch."""
    forged = msgspec.structs.replace(sign(command(), KEY), signature=signature)
    with pytest.raises(SignatureError):
        verify(forged, KEY, now=1100.0)
    with pytest.raises(SignatureError):
        KeySet({"operator": KEY}).verify(forged, now=1100.0)


def test_a_command_issued_beyond_the_clock_skew_is_refused() -> None:
    from fleetmedic.signing import MAX_FUTURE_SKEW_S, CommandFromTheFuture

    far = sign(command(issued_at=1000 + MAX_FUTURE_SKEW_S + 60, expires_at=4_000_000_000), KEY)
    with pytest.raises(CommandFromTheFuture, match="ahead of this clock"):
        verify(far, KEY, now=1000.0)
    verify(sign(command(issued_at=1100, expires_at=1400), KEY), KEY, now=1000.0)  # within the skew
