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
    DEFAULT_COMMAND_KEY_ID,
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
SKEW = Settings().streams.max_future_skew_s  # the configured value is the only source (streams.max_future_skew_s)
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
    verify(received, KEY, now=1100.0, max_future_skew_s=SKEW)


def test_key_order_on_the_wire_does_not_matter() -> None:
    doc = json.loads(r.encode(sign(command(), KEY)))
    reordered = json.dumps(dict(reversed(list(doc.items()))))
    verify(r.decode(r.RemediationCommand, reordered), KEY, now=1100.0, max_future_skew_s=SKEW)


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
        verify(tampered, KEY, now=1100.0, max_future_skew_s=SKEW)


def test_a_wrong_key_is_refused() -> None:
    with pytest.raises(SignatureError):
        verify(sign(command(), KEY), load_key("x" * 40), now=1100.0, max_future_skew_s=SKEW)


def test_an_unsigned_command_is_refused() -> None:
    with pytest.raises(SignatureError, match="unsigned"):
        verify(command(), KEY, now=1100.0, max_future_skew_s=SKEW)


def test_an_expired_command_is_refused_even_with_a_good_signature() -> None:
    with pytest.raises(CommandExpired):
        verify(sign(command(), KEY), KEY, now=1300.5, max_future_skew_s=SKEW)


def test_short_keys_are_refused_and_whitespace_around_a_key_file_is_ignored() -> None:
    with pytest.raises(ValueError, match="at least 32 bytes"):
        load_key("short")
    assert load_key("  " + "k" * 32 + "\n") == b"k" * 32


# --- unusable keys ----------------------------------------------------------------------------------


def test_the_empty_key_is_refused_for_signing_and_verifying() -> None:
    forged = msgspec.structs.replace(command(), signature=signature_of(command(), b""))
    with pytest.raises(UnusableKey, match="empty"):
        verify(forged, b"", now=1100.0, max_future_skew_s=SKEW)  # before: accepted
    with pytest.raises(UnusableKey, match="empty"):
        sign(command(), b"")
    with pytest.raises(UnusableKey, match="empty"):
        load_key("  \n")


def test_a_short_key_is_refused_at_load_time_and_by_verify_with_the_reason() -> None:
    with pytest.raises(UnusableKey, match=r"at least 32 bytes, got 16.*openssl rand"):
        load_key("k" * 16)
    short = b"k" * 16
    with pytest.raises(UnusableKey, match="at least 32 bytes"):
        verify(msgspec.structs.replace(command(), signature=signature_of(command(), short)), short, now=1100.0,
               max_future_skew_s=SKEW)


@pytest.mark.parametrize("key", sorted(DEMO_KEYS))
def test_demo_keys_are_refused_outside_the_demo_and_accepted_where_it_allows_them(key: bytes) -> None:
    with pytest.raises(UnusableKey, match=r"published demo key.*signing.allow_demo_keys"):
        load_key(key)
    signed = sign(command(), key)
    with pytest.raises(UnusableKey, match="demo key"):
        verify(signed, key, now=1100.0, max_future_skew_s=SKEW)
    assert load_key(key, allow_demo=True) == key
    verify(signed, key, now=1100.0, max_future_skew_s=SKEW, allow_demo=True)


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
        verify(r.decode(r.RemediationCommand, r.encode(drain)), KEY, now=1100.0, max_future_skew_s=SKEW)


def test_an_operator_command_signed_with_the_command_key_is_refused_by_the_operator_keys() -> None:
    keys = KeySet({"ops-1": OPERATOR_KEY})
    assert keys.verify(sign(operator_command(), OPERATOR_KEY), now=1100.0, max_future_skew_s=SKEW) == "ops-1"
    with pytest.raises(SignatureError, match="does not match any operator key"):
        keys.verify(sign(operator_command(), KEY), now=1100.0, max_future_skew_s=SKEW)


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
                                       operator_key_id="", allow_demo_keys=False, key_id="command", command_keys=[])
        return SimpleNamespace(**{**base, **kw})

    with pytest.raises(UnusableKey, match=r"'ops-1': cannot read .*missing"):
        operator_keys(src(operator_key_files={"ops-1": str(tmp_path / "missing")}), {})
    with pytest.raises(UnusableKey, match=r"operator key 'ops-1' .*at least 32 bytes"):
        operator_keys(src(operator_key_env={"ops-1": "K"}), {"K": "short"})
    with pytest.raises(UnusableKey, match=r"operator key 'demo' .*published demo key"):
        operator_keys(src(operator_key_env={"demo": "K"}), {"K": DEMO_OPERATOR_KEY.decode()})
    with pytest.raises(UnusableKey, match="id 'bad id'"):
        operator_keys(src(operator_key_env={"bad id": "K"}), {"K": "k" * 40})
    with pytest.raises(UnusableKey, match="no operator key is configured"):
        KeySet({}).verify(sign(operator_command(), OPERATOR_KEY), now=1100.0, max_future_skew_s=SKEW)


def test_rotation_old_and_new_operator_keys_overlap_then_the_old_is_refused() -> None:
    old, new = b"o" * 40, b"n" * 40
    by_old = sign(operator_command(), old)
    overlap = KeySet({"ops-2024": old, "ops-2025": new}, "ops-2025")
    assert overlap.verify(by_old, now=1100.0, max_future_skew_s=SKEW) == "ops-2024"
    assert overlap.verify(overlap.sign(operator_command(id="op-2")), now=1100.0, max_future_skew_s=SKEW) == "ops-2025"
    with pytest.raises(SignatureError, match="does not match any operator key \\(ops-2025\\)"):
        KeySet({"ops-2025": new}).verify(by_old, now=1100.0, max_future_skew_s=SKEW)


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


# --- signatures over the bytes that travel (Kafka headers) -------------------------------

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
    assert verify_record(signed, value, sign_bytes(value, "k1", KEY), keys, now=1100.0, max_future_skew_s=SKEW) == "k1"
    # no header: a record from before the headers, verified by its body signature
    assert verify_record(signed, value, [], keys, now=1100.0, max_future_skew_s=SKEW) == "k1"
    # header only (a producer past the migration): the body signature is not consulted
    bare = command()
    bare_value = r.encode(bare)
    bare_headers = sign_bytes(bare_value, "k1", KEY)
    assert verify_record(bare, bare_value, bare_headers, keys, now=1100.0, max_future_skew_s=SKEW) == "k1"
    # a header that does not verify is refused, even though the body signature is good
    with pytest.raises(SignatureError):
        verify_record(signed, value, sign_bytes(value, "k1", NEW_KEY), keys, now=1100.0, max_future_skew_s=SKEW)
    # and the expiry is checked either way
    with pytest.raises(CommandExpired):
        verify_record(signed, value, sign_bytes(value, "k1", KEY), keys, now=1400.0, max_future_skew_s=SKEW)
    with pytest.raises(CommandExpired):
        verify_record(signed, value, [], keys, now=1400.0, max_future_skew_s=SKEW)


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
    assert verify_record(*old, overlap, now=1100.0, max_future_skew_s=SKEW) == "2026-11"
    assert verify_record(*new, overlap, now=1100.0, max_future_skew_s=SKEW) == "2026-12"
    assert verify_record(old[0], old[1], [], overlap, now=1100.0, max_future_skew_s=SKEW) == "2026-11"
    # before the new key is rolled out to a verifier, what it signs is refused there
    with pytest.raises(SignatureError):
        verify_record(*new, before, now=1100.0, max_future_skew_s=SKEW)
    # after: the old key is gone and what it signed is refused (header and body alike)
    assert verify_record(*new, after, now=1100.0, max_future_skew_s=SKEW) == "2026-12"
    with pytest.raises(SignatureError, match=r"2026-11.*not an accepted"):
        verify_record(*old, after, now=1100.0, max_future_skew_s=SKEW)
    with pytest.raises(SignatureError):
        verify_record(old[0], old[1], [], after, now=1100.0, max_future_skew_s=SKEW)
    # an old-key record relabelled with the new id does not pass either
    relabelled = [(n, b"2026-12" if n == KEY_ID_HEADER else v) for n, v in old[2]]
    with pytest.raises(SignatureError):
        verify_record(old[0], old[1], relabelled, after, now=1100.0, max_future_skew_s=SKEW)


def test_the_executor_screen_takes_a_header_verified_command_without_its_body_signature() -> None:
    """executor/service.py verifies the header over the bytes received; then the in-body signature
    is not consulted (a producer past the migration leaves it empty), the key and the expiry still are."""
    from fleetmedic.executor.node import plan

    def reason(key: bytes, now: float, by_header: bool = True) -> str:
        return plan.reject_reason(bare, key, now, max_future_skew_s=SKEW, verified_by_header=by_header) or ""

    bare = command()  # no in-body signature
    assert reason(KEY, 1100.0) == ""
    assert "signature" in reason(KEY, 1100.0, by_header=False)  # no header: the body decides
    assert "expired" in reason(KEY, 1400.0)
    assert "signature" in reason(DEMO_COMMAND_KEY, 1100.0)


@pytest.mark.parametrize("signature", ["é" * 64, "\udcff", "\uff46" * 64])
def test_a_signature_that_is_not_ascii_is_a_mismatch_not_a_crash(signature: str) -> None:
    """Schema-valid operator commands with such signatures made verify raise TypeError (found by the
    stages' fuzz); they are refused like any other mismatch."""
    forged = msgspec.structs.replace(sign(command(), KEY), signature=signature)
    with pytest.raises(SignatureError):
        verify(forged, KEY, now=1100.0, max_future_skew_s=SKEW)
    with pytest.raises(SignatureError):
        KeySet({"operator": KEY}).verify(forged, now=1100.0, max_future_skew_s=SKEW)


def test_a_command_issued_beyond_the_clock_skew_is_refused() -> None:
    from fleetmedic.signing import CommandFromTheFuture

    far = sign(command(issued_at=1000 + SKEW + 60, expires_at=4_000_000_000), KEY)
    with pytest.raises(CommandFromTheFuture, match="ahead of this clock"):
        verify(far, KEY, now=1000.0, max_future_skew_s=SKEW)
    within = sign(command(issued_at=1100, expires_at=1400), KEY)
    verify(within, KEY, now=1000.0, max_future_skew_s=SKEW)  # within the skew


def test_the_skew_is_the_configured_one_everywhere_a_command_is_verified() -> None:
    """streams.max_future_skew_s is the only source: signing has no default of its own, and the
    executor's screen, the decision stage's operator path and verify_record take the configured value."""
    import inspect

    import fleetmedic.signing as signing
    from fleetmedic.executor.dispatch import CommandExecutor
    from fleetmedic.executor.node import plan
    from fleetmedic.remediation.engine import DecisionEngine
    from fleetmedic.remediation.operator import apply_operator_command

    assert not hasattr(signing, "MAX_FUTURE_SKEW_S")
    for fn in (signing.check_times, signing.verify, signing.verify_record, signing.KeySet.verify,
               signing.verify_unheaded, plan.reject_reason):
        assert inspect.signature(fn).parameters["max_future_skew_s"].default is inspect.Parameter.empty, fn
    issued_ahead = sign(command(action="cordon", issued_at=1000 + 100, expires_at=4_000_000_000), KEY)  # 100 s ahead
    tight = parse_config("streams: {max_future_skew_s: 30}", env={})
    assert plan.reject_reason(issued_ahead, KEY, 1000.0, max_future_skew_s=SKEW) is None
    assert "ahead of this clock" in (plan.reject_reason(issued_ahead, KEY, 1000.0, max_future_skew_s=30.0) or "")
    ex = CommandExecutor(None, tight, KEY, identity="t", restarter=None,  # type: ignore[arg-type]
                         clock=lambda: 1000.0)
    out = ex.handle(issued_ahead)  # refused before the cluster (None here) is touched
    assert out.outcome == "skipped" and "more than 30s of skew" in out.reason
    op = sign(operator_command(issued_at=1100, expires_at=1600), OPERATOR_KEY)
    with pytest.raises(signing.CommandFromTheFuture, match="more than 30s of skew"):
        apply_operator_command(DecisionEngine(tight), op, KeySet({"ops-1": OPERATOR_KEY}), 1000.0)
    apply_operator_command(DecisionEngine(Settings()), op, KeySet({"ops-1": OPERATOR_KEY}), 1000.0)


# --- command keys by id: the executor's key set, the decision stage's active key (rotation) ---------

OLD_TEXT, NEW_TEXT = "old-command-key-0123456789abcdef-0123456789", "new-command-key-0123456789abcdef-0123456789"


def _key_files(tmp_path: Path) -> tuple[Path, Path]:
    old, new = tmp_path / "2026-11", tmp_path / "2026-12"
    old.write_text(OLD_TEXT + "\n")  # a trailing newline, as in a mounted Secret: stripped
    new.write_text(NEW_TEXT + "\n")
    return old, new


def test_the_command_keys_come_by_id_the_active_one_and_each_of_command_keys(tmp_path: Path) -> None:
    from fleetmedic.signing import command_key, command_keys

    old, new = _key_files(tmp_path)
    s = parse_config(f"signing: {{key_id: '2026-12', key_file: {new}, command_keys: "
                     f"[{{id: '2026-11', key_file: {old}}}, {{id: from-env, key_env: FM_OTHER_KEY}}]}}", env={}).signing
    env = {"FM_OTHER_KEY": "env-command-key-0123456789abcdef-0123456789"}
    assert command_key(s, env) == ("2026-12", NEW_TEXT.encode())
    ring = command_keys(s, env)
    assert dict(ring.keys) == {"2026-12": NEW_TEXT.encode(), "2026-11": OLD_TEXT.encode(),
                               "from-env": env["FM_OTHER_KEY"].encode()}
    assert ring.signer() == ("2026-12", NEW_TEXT.encode()) and ring.what == "command key"
    # the default: one key, id `command`, from $FLEETMEDIC_SIGNING_KEY
    default = command_keys(Settings().signing, {"FLEETMEDIC_SIGNING_KEY": OLD_TEXT})
    assert dict(default.keys) == {DEFAULT_COMMAND_KEY_ID: OLD_TEXT.encode()}


def test_command_key_problems_name_the_entry_and_the_reason(tmp_path: Path) -> None:
    from fleetmedic.signing import command_keys

    old, new = _key_files(tmp_path)

    def load(entries: str, env: dict[str, str] | None = None, head: str = f"key_file: {new}") -> KeySet:
        return command_keys(parse_config(f"signing: {{{head}, command_keys: [{entries}]}}", env={}).signing, env or {})

    with pytest.raises(UnusableKey, match=r"command_keys\[0\] \(id 'a'\): cannot read .*missing"):
        load(f"{{id: a, key_file: {tmp_path / 'missing'}}}")
    with pytest.raises(UnusableKey, match=r"command_keys\[0\] \(id 'a'\): the environment variable FM_UNSET is not"):
        load("{id: a, key_env: FM_UNSET}")
    with pytest.raises(UnusableKey, match=r"command_keys\[0\] \(id 'a'\).*at least 32 bytes"):
        load("{id: a, key_env: K}", {"K": "short"})
    with pytest.raises(UnusableKey, match=r"command_keys\[0\] \(id 'a'\).*published demo key"):
        load("{id: a, key_env: K}", {"K": DEMO_COMMAND_KEY.decode()})
    with pytest.raises(UnusableKey, match=r"command_keys\[0\] \(id 'bad id'\): the id must be"):
        load("{id: 'bad id', key_env: K}", {"K": "k" * 40})
    with pytest.raises(UnusableKey, match=r"command_keys\[0\] \(id 'a'\): the same key as the active key"):
        load(f"{{id: a, key_file: {new}}}")  # a switch half done: key_id changed, key_file not
    with pytest.raises(UnusableKey, match=r"signing.key_id '\.x': must be"):
        load(f"{{id: a, key_file: {old}}}", head=f"key_file: {new}, key_id: '.x'")
    with pytest.raises(UnusableKey, match=r"signing key: set signing\.key_file or the environment variable FM_NONE"):
        load(f"{{id: a, key_file: {old}}}", head="key_env: FM_NONE")  # the executor needs the active key too
    with pytest.raises(UnusableKey, match=r"cannot read signing.key_file .*missing"):
        load(f"{{id: a, key_file: {old}}}", head=f"key_file: {tmp_path / 'missing'}")


@pytest.mark.parametrize(("text", "message"), [
    ("command_keys: [{id: a}]", "give exactly one of `key_file` and `key_env`"),
    ("command_keys: [{id: a, key_file: x, key_env: Y}]", "give exactly one of `key_file` and `key_env`"),
    ("command_keys: [{id: command, key_file: x}]", "`command_keys[0].id` 'command': the active key"),
    ("command_keys: [{id: a, key_file: x}, {id: a, key_env: Y}]", "`command_keys[1].id` 'a': given twice"),
    ("key_id: operator", "`operator_key_env` id 'operator' is a command key id (`key_id`)"),
    ("{command_keys: [{id: ops, key_file: x}], operator_key_files: {ops: f}}",
     "`operator_key_files` id 'ops' is a command key id (`command_keys[0].id`)"),
])
def test_a_command_key_id_that_collides_or_an_entry_without_one_source_is_a_config_error(text: str,
                                                                                         message: str) -> None:
    from fleetmedic.config import ConfigError

    body = text if text.startswith("{") else "{" + text + "}"
    with pytest.raises(ConfigError) as err:
        parse_config(f"signing: {body}", env={})
    assert any(message in m and m.startswith("config: signing") for m in err.value.messages()), err.value.messages()


def test_an_operator_key_id_from_a_folder_that_is_a_command_key_id_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "operator-keys"
    folder.mkdir()
    (folder / "2026-12").write_bytes(b"o" * 40)  # the Secret's key named like the active command key
    s = parse_config(f"signing: {{key_id: '2026-12', operator_key_dir: {folder}, operator_key_env: {{}}}}",
                     env={}).signing
    with pytest.raises(UnusableKey, match=r"operator key '2026-12' .*is a command key id"):
        operator_keys(s, {})


def test_rotating_the_command_key_decide_signs_with_b_the_executor_holds_a_and_b_then_b(tmp_path: Path) -> None:
    """The documented procedure, each step one process's config: 1. the executor adds B to
    `command_keys` (holds {A, B}); 2. decide switches `key_id`/`key_file` to B (what it signs carries
    id B); commands A signed, still in flight, verify; 3. once they have expired, A leaves the
    executor's config: what A signed is refused, naming the id."""
    from fleetmedic.executor.node import plan
    from fleetmedic.signing import command_key, command_keys

    old, new = _key_files(tmp_path)
    decide_before = parse_config(f"signing: {{key_id: '2026-11', key_file: {old}}}", env={}).signing
    executor_overlap = parse_config(f"signing: {{key_id: '2026-11', key_file: {old}, command_keys: "
                                    f"[{{id: '2026-12', key_file: {new}}}]}}", env={}).signing
    decide_after = parse_config(f"signing: {{key_id: '2026-12', key_file: {new}, command_keys: "
                                f"[{{id: '2026-11', key_file: {old}}}]}}", env={}).signing
    executor_after = parse_config(f"signing: {{key_id: '2026-12', key_file: {new}}}", env={}).signing

    def produce(source: object, cid: str) -> tuple[r.RemediationCommand, bytes, list[tuple[str, bytes]]]:
        kid, key = command_key(source, {})  # type: ignore[arg-type]
        cmd = sign(command(id=cid), key)  # as the decision stage: the body and the header, by the active id
        value = r.encode(cmd)
        return cmd, value, sign_bytes(value, kid, key)

    in_flight = produce(decide_before, "by-a")
    by_b = produce(decide_after, "by-b")
    assert dict(in_flight[2])[KEY_ID_HEADER] == b"2026-11" and dict(by_b[2])[KEY_ID_HEADER] == b"2026-12"
    overlap = command_keys(executor_overlap, {})
    assert command_keys(decide_after, {}).keys == overlap.keys  # the executor's set is the same in steps 1 and 2
    for cmd, value, headers in (in_flight, by_b):
        assert verify_bytes(value, headers, overlap) == dict(headers)[KEY_ID_HEADER].decode()
        assert plan.reject_reason(cmd, overlap, 1100.0, max_future_skew_s=SKEW, verified_by_header=True) is None
    after = command_keys(executor_after, {})
    assert verify_bytes(by_b[1], by_b[2], after) == "2026-12"
    with pytest.raises(SignatureError, match=r"fleetmedic-key-id '2026-11': not an accepted command key \(2026-12\): "
                                             r"retired, or never configured"):
        verify_bytes(in_flight[1], in_flight[2], after)
    relabelled = [(n, b"2026-12" if n == KEY_ID_HEADER else v) for n, v in in_flight[2]]
    with pytest.raises(SignatureError, match="does not match"):
        verify_bytes(in_flight[1], relabelled, after)


def test_a_record_without_the_header_is_verified_with_the_default_id_only() -> None:
    from fleetmedic.executor.node import plan

    by_default, by_other = sign(command(id="c1"), KEY), sign(command(id="c2"), NEW_KEY)
    both = KeySet({DEFAULT_COMMAND_KEY_ID: KEY, "2026-12": NEW_KEY}, "2026-12", what="command key")
    assert plan.reject_reason(by_default, both, 1100.0, max_future_skew_s=SKEW) is None
    # a body-only record signed with another id's key: only the default id is tried, so it is refused
    assert "signature does not match" in (plan.reject_reason(by_other, both, 1100.0, max_future_skew_s=SKEW) or "")
    retired = KeySet({"2026-12": NEW_KEY}, "2026-12", what="command key")
    why = plan.reject_reason(by_default, retired, 1100.0, max_future_skew_s=SKEW) or ""
    assert why.startswith("signature rejected") and "no command key has the id 'command'" in why, why


def test_the_executor_never_accepts_an_operator_key_whatever_the_header_says(tmp_path: Path) -> None:
    """A ctl user holding an operator key signs a drain for the executor: under the operator key's own
    id the executor holds no such key; under a command key id the signature does not match."""
    from fleetmedic.signing import command_keys

    old, new = _key_files(tmp_path)
    s = parse_config(f"signing: {{key_file: {new}, command_keys: [{{id: '2026-11', key_file: {old}}}], "
                     "operator_key_env: {ops-1: FLEETMEDIC_OPERATOR_KEY}}", env={}).signing
    ring = command_keys(s, {"FLEETMEDIC_OPERATOR_KEY": OPERATOR_KEY.decode()})
    assert set(ring.keys) == {DEFAULT_COMMAND_KEY_ID, "2026-11"} and OPERATOR_KEY not in ring.keys.values()
    value = r.encode(sign(command(), OPERATOR_KEY))
    with pytest.raises(SignatureError, match="'ops-1': not an accepted command key"):
        verify_bytes(value, sign_bytes(value, "ops-1", OPERATOR_KEY), ring)
    for kid in ring.keys:
        with pytest.raises(SignatureError, match="does not match"):
            verify_bytes(value, sign_bytes(value, kid, OPERATOR_KEY), ring)


def test_the_executor_refuses_to_start_with_a_command_key_it_cannot_load(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from fleetmedic.cli.main import main

    monkeypatch.setenv("FLEETMEDIC_SIGNING_KEY", NEW_TEXT)
    config = tmp_path / "c.yaml"
    config.write_text(f"signing: {{command_keys: [{{id: '2026-11', key_file: {tmp_path / 'gone'}}}]}}\n")
    assert main(["executor", "--config", str(config)]) == 2
    assert "signing.command_keys[0] (id '2026-11'): cannot read" in capsys.readouterr().err


def test_an_operator_key_equal_to_a_retired_command_key_is_refused(tmp_path: Path) -> None:
    """A retired command key the executor still accepts (``signing.command_keys``) signs drains: an
    operator holding it could send one straight to the executor."""
    retired = tmp_path / "retired"
    retired.write_bytes(OPERATOR_KEY)
    source = parse_config("signing: {key_id: k2, command_keys: [{id: k1, key_file: " + str(retired) + "}], "
                          "operator_key_env: {ops-1: OPS}}", env={}).signing
    with pytest.raises(UnusableKey, match=r"operator key 'ops-1' \(\$OPS\) is the command key "
                                          r"signing.command_keys\[0\] \(id 'k1'\)"):
        operator_keys(source, {"OPS": OPERATOR_KEY.decode()}, command_key=KEY)
    env_source = parse_config("signing: {key_id: k2, command_keys: [{id: k1, key_env: OLD}], "
                              "operator_key_env: {ops-1: OPS}}", env={}).signing
    with pytest.raises(UnusableKey, match="id 'k1'"):
        operator_keys(env_source, {"OPS": OPERATOR_KEY.decode(), "OLD": OPERATOR_KEY.decode()}, command_key=KEY)
    # a retired key this machine does not hold is not compared; another operator key is fine
    assert list(operator_keys(env_source, {"OPS": OPERATOR_KEY.decode()}, command_key=KEY).keys) == ["ops-1"]
