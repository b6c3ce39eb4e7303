"""Signing and verifying commands (HMAC-SHA256 over a canonical encoding): the decision stage's
:class:`~fleetmedic.records.RemediationCommand` and an operator's
:class:`~fleetmedic.records.OperatorCommand`.

The canonical encoding is the command's JSON with ``signature`` set to ``""``, values normalised to
their schema types and every object's keys sorted, so any implementation that can sort keys and
print JSON numbers like msgspec can verify it. Executors call :func:`verify` before acting: it
checks the signature in constant time,
then the times against the injected ``now`` (:func:`check_times`: the expiry, and an ``issued_at``
no more than ``streams.max_future_skew_s`` ahead; every caller passes the configured value).

**Keys by role.** The *command keys*, by id: the decision stage signs remediation commands with the
active one (``signing.key_file`` / ``signing.key_env``, under the id ``signing.key_id``, default
:data:`DEFAULT_COMMAND_KEY_ID`; :func:`command_key`) and the executor verifies them with the key the
record's header names, from a :class:`KeySet` of the active key and ``signing.command_keys``
(:func:`command_keys`). The *operator keys*
(``signing.operator_key_files`` / ``operator_key_dir`` / ``operator_key_env``, each with an id):
``fleetmedic ctl`` signs an operator command with one of them, the decision stage accepts any of
them (a :class:`KeySet`), and never a command key; the executor never holds them. So whoever may
run ``ctl`` cannot sign a command for the executor, past the policy and the safety budgets. An id
names one role's key only: a command key id that is also an operator key id is refused (by the
config, and by :func:`operator_keys` for the ids of ``operator_key_dir``).

**Unusable keys are refused, loudly.** An empty key, one shorter than :data:`MIN_KEY_BYTES`, and the
published demo keys (:data:`DEMO_KEYS`, accepted only where ``allow_demo`` is set: the demo) raise
:class:`UnusableKey` (a :class:`SignatureError`, so a verifier handed one refuses the command
instead of acting on it), at load time with the reason.

Key material comes from files or environment variables. :func:`load_key` takes the already-read
text and stays pure; :func:`operator_keys` is the one function here that reads files (the key
files named in the config, re-read at each call so a rotated Secret is picked up).

**Signatures over the bytes that travel.** Each record on ``remediation.commands`` and
``remediation.operator`` carries two Kafka headers: :data:`SIGNATURE_HEADER`
(``sha256=<hex HMAC-SHA256 of the record's value bytes, exactly as produced>``, the convention of
webhook signatures) and :data:`KEY_ID_HEADER` (the id of the key). A subscriber in any language
verifies it with an HMAC over the bytes it received: nothing is decoded or re-encoded first
(:func:`sign_bytes`, :func:`verify_bytes`, :func:`verify_record`). The record itself is unchanged
(``schema_version`` stays 1).

*Migration.* Producers set both the headers and the in-body ``signature`` (the canonical encoding
above). Verifiers (:func:`verify_record`) check the header when it is present and then refuse a
record whose header does not verify, whatever its body says; they fall back to the body signature
only when a record has no signature header (one produced before the headers existed). A later
release will stop writing and accepting the body signature; new subscribers should use the header.

*Rotation.* Verifiers hold a :class:`KeySet` (keys by id) and signers use one id. To rotate: add the
new key to every verifier's set, switch the signer to the new id, wait until no record signed with
the old key can still arrive (its ``expires_at`` has passed), then remove the old key: records
signed with it are refused from then on. For the command key, each step changes one process's
keys at a time (the executor's ``signing.command_keys``, then decide's ``signing.key_id``), so
nothing needs restarting together. A record without the header (from before the headers) was
signed with the one command key there was: it is verified with the key of id
:data:`DEFAULT_COMMAND_KEY_ID` (:func:`verify_unheaded`).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol, TypeVar

import msgspec

from fleetmedic.records import OperatorCommand, RemediationCommand

C = TypeVar("C", RemediationCommand, OperatorCommand)

MIN_KEY_BYTES: Final = 32

#: Keys that are published (in this repository, its demo and its compose file): anyone can sign
#: with them. Accepted only where ``allow_demo`` is set (``fleetmedic demo``, ``signing.allow_demo_keys``).
DEMO_COMMAND_KEY: Final = b"fleetmedic-demo-signing-key-not-for-production-use!"
DEMO_OPERATOR_KEY: Final = b"fleetmedic-demo-operator-key-not-for-production-use!"
DEMO_KEYS: Final = frozenset({
    DEMO_COMMAND_KEY,
    DEMO_OPERATOR_KEY,
    b"compose-demo-signing-key-not-for-production-use",  # deploy/compose.yaml before the keys were split
})

KEY_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")

#: Kafka headers of a signed record: ``sha256=<hex>`` over the value bytes, and the key's id.
SIGNATURE_HEADER: Final = "fleetmedic-signature"
KEY_ID_HEADER: Final = "fleetmedic-key-id"
SIGNATURE_PREFIX: Final = "sha256="
#: The topics whose records carry the signature headers (names without the prefix).
SIGNED_TOPICS: Final = frozenset({"remediation.commands", "remediation.operator"})
#: The command key's id in its :class:`KeySet` when the config names none.
DEFAULT_COMMAND_KEY_ID: Final = "command"


class SignatureError(ValueError):
    """The command's signature is missing or does not match: never act on it."""


class UnusableKey(SignatureError):
    """The key itself may not be used (empty, too short, a published demo key, missing, or a key of
    the wrong role): nothing signed with it is acted on."""


class CommandExpired(ValueError):
    """The command is past its ``expires_at``: it describes a world that may have changed."""


class CommandFromTheFuture(CommandExpired):
    """The command says it was issued further ahead of the verifier's clock than the configured
    ``streams.max_future_skew_s``: a skewed or forged clock, whose ``expires_at`` cannot be trusted."""


def check_times(command: RemediationCommand | OperatorCommand, now: float, max_future_skew_s: float) -> None:
    """:class:`CommandExpired` past ``expires_at``; :class:`CommandFromTheFuture` when issued more
    than ``max_future_skew_s`` (the configured ``streams.max_future_skew_s``: there is no default
    here, so the config is its only source) after ``now``."""
    if now > command.expires_at:
        raise CommandExpired(f"command {command.id}: expired at {command.expires_at:.3f}, now {now:.3f}")
    if command.issued_at > now + max_future_skew_s:
        raise CommandFromTheFuture(f"command {command.id}: issued at {command.issued_at:.3f}, "
                                   f"{command.issued_at - now:.0f}s ahead of this clock (more than "
                                   f"{max_future_skew_s:g}s of skew)")


def _same(given: str, expected: str) -> bool:
    """Constant-time comparison of two hex signatures; any text (a schema-valid but non-ASCII
    signature included) compares as bytes, so it is a mismatch, never a ``TypeError``."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode("ascii"))


def check_key(key: bytes, *, allow_demo: bool = False, what: str = "signing key") -> bytes:
    """``key`` if it may sign or verify; :class:`UnusableKey` with the reason otherwise."""
    if not key:
        raise UnusableKey(f"{what}: empty (refused: anyone could sign with it)")
    if len(key) < MIN_KEY_BYTES:
        raise UnusableKey(f"{what}: must be at least {MIN_KEY_BYTES} bytes, got {len(key)} "
                          f"(e.g. `openssl rand -base64 48`)")
    if key in DEMO_KEYS and not allow_demo:
        raise UnusableKey(f"{what}: this is a published demo key (in fleetmedic's own repository: anyone can "
                          f"sign with it); it is accepted only by the demo (signing.allow_demo_keys). "
                          f"Generate one: `openssl rand -base64 48`")
    return key


def load_key(text: str | bytes, *, allow_demo: bool = False, what: str = "signing key") -> bytes:
    """Turn key material (the content of a key file or env var) into HMAC key bytes; refuse an
    unusable key (:func:`check_key`) with the reason."""
    raw = text.encode() if isinstance(text, str) else text
    return check_key(raw.strip(), allow_demo=allow_demo, what=what)


def canonical_bytes(command: RemediationCommand | OperatorCommand) -> bytes:
    unsigned = msgspec.structs.replace(command, signature="")
    # Normalise through the wire types first, so a command built in Python with ``issued_at=1``
    # signs the same bytes as the one a consumer decodes from ``"issued_at":1`` (as ``1.0``).
    normalised = msgspec.convert(msgspec.to_builtins(unsigned), type(command))
    return msgspec.json.encode(normalised, order="sorted")


def signature_of(command: RemediationCommand | OperatorCommand, key: bytes) -> str:
    return hmac.new(key, canonical_bytes(command), hashlib.sha256).hexdigest()


def sign(command: C, key: bytes) -> C:
    if len(key) < MIN_KEY_BYTES:
        check_key(key)  # raises: never produce a signature anyone could forge
    return msgspec.structs.replace(command, signature=signature_of(command, key))


def verify(command: RemediationCommand | OperatorCommand, key: bytes, now: float, *, max_future_skew_s: float,
           allow_demo: bool = False) -> None:
    """Raise :class:`SignatureError` (:class:`UnusableKey` for an empty, short or demo key) or
    :class:`CommandExpired` (:func:`check_times`); return ``None`` if it may be acted on."""
    check_key(key, allow_demo=allow_demo)
    if not command.signature:
        raise SignatureError(f"command {command.id}: unsigned")
    if not _same(command.signature, signature_of(command, key)):
        raise SignatureError(f"command {command.id}: signature does not match (tampered or wrong key)")
    check_times(command, now, max_future_skew_s)


def cluster_refusal(command: RemediationCommand | OperatorCommand, cluster: str, *,
                    accept_unlabeled: bool = False) -> str | None:
    """Why a verifier serving ``cluster`` (its ``cluster.name``) must not act on ``command``, or
    ``None``. ``cluster`` is inside the signature, so it is what the signer addressed: a command for
    another cluster is refused, and one that names no cluster only where the verifier has no name
    either, or ``accept_unlabeled`` (``cluster.accept_unlabeled_commands``) allows it."""
    if command.cluster == cluster or (not command.cluster and accept_unlabeled):
        return None
    if not command.cluster:
        return (f"command {command.id}: names no cluster, and this one is {cluster!r} "
                f"(cluster.accept_unlabeled_commands is false)")
    here = f"this one is {cluster!r}" if cluster else "this one has no cluster.name"
    return f"command {command.id}: addressed to cluster {command.cluster!r}, and {here}"


# --- a set of keys by id (command keys, operator keys) -------------------------------------------


@dataclass(frozen=True)
class KeySet:
    """Keys by id: a verifier accepts a command signed with any of them; a signer uses
    :attr:`signing_id` (the only key when there is one)."""

    keys: Mapping[str, bytes]
    signing_id: str = ""
    what: str = "operator key"

    def __post_init__(self) -> None:
        for kid in self.keys:
            if not KEY_ID.fullmatch(kid):
                raise UnusableKey(f"{self.what} id {kid!r}: must be 1-63 of [A-Za-z0-9._-], starting alphanumeric")

    def signer(self) -> tuple[str, bytes]:
        """(id, key) to sign with."""
        if self.signing_id:
            if self.signing_id not in self.keys:
                raise UnusableKey(f"{self.what} {self.signing_id!r} (signing.operator_key_id, the one to sign with) "
                                  f"is not configured; configured: {', '.join(sorted(self.keys)) or 'none'}")
            return self.signing_id, self.keys[self.signing_id]
        if len(self.keys) == 1:
            return next(iter(self.keys.items()))
        raise UnusableKey(f"{self.what}: " + ("none configured" if not self.keys else
                          f"{len(self.keys)} configured ({', '.join(sorted(self.keys))}): "
                          f"name the one to sign with (signing.operator_key_id)"))

    def sign(self, command: C) -> C:
        return sign(command, self.signer()[1])

    def verify(self, command: RemediationCommand | OperatorCommand, now: float, *, max_future_skew_s: float) -> str:
        """The id of the key that signed ``command``; :class:`SignatureError` (none did, or no key is
        configured) or :class:`CommandExpired` otherwise. Every key is tried (constant time each)."""
        if not self.keys:
            raise UnusableKey(f"command {command.id}: no {self.what} is configured, so none is accepted")
        if not command.signature:
            raise SignatureError(f"command {command.id}: unsigned")
        matched = ""
        for kid, key in self.keys.items():
            if _same(command.signature, signature_of(command, key)) and not matched:
                matched = kid
        if not matched:
            raise SignatureError(f"command {command.id}: signature does not match any {self.what} "
                                 f"({', '.join(sorted(self.keys))}): tampered or signed with another key")
        check_times(command, now, max_future_skew_s)
        return matched


def as_command_keys(keys: KeySet | bytes) -> KeySet:
    """``keys`` as a :class:`KeySet` of command keys: one bare key is the key of id
    :data:`DEFAULT_COMMAND_KEY_ID` (the one command key there was before key ids)."""
    if isinstance(keys, KeySet):
        return keys
    return KeySet({DEFAULT_COMMAND_KEY_ID: keys}, DEFAULT_COMMAND_KEY_ID, what="command key")


def verify_unheaded(command: RemediationCommand, keys: KeySet, now: float, *, max_future_skew_s: float,
                    allow_demo: bool = False) -> str:
    """Verify a command that came without a :data:`SIGNATURE_HEADER` (a record produced before the
    headers existed) by its in-body signature. Such a record was signed with the one command key
    there was, which a key set holds under :data:`DEFAULT_COMMAND_KEY_ID`: only that key is tried,
    and a set without it refuses the record, saying so. Returns that id."""
    key = keys.keys.get(DEFAULT_COMMAND_KEY_ID)
    if key is None:
        raise SignatureError(f"command {command.id}: no {SIGNATURE_HEADER} header, and no {keys.what} has the id "
                             f"{DEFAULT_COMMAND_KEY_ID!r} (a record without the header was signed before key ids, "
                             f"with the key of that id); held: {', '.join(sorted(keys.keys)) or 'none'}")
    verify(command, key, now, max_future_skew_s=max_future_skew_s, allow_demo=allow_demo)
    return DEFAULT_COMMAND_KEY_ID


# --- signatures over the bytes that travel (Kafka headers) ---------------------------------------

Headers = list[tuple[str, bytes]]


def sign_bytes(value: bytes, key_id: str, key: bytes) -> Headers:
    """The Kafka headers that sign ``value`` (the record's value bytes, exactly as they will be
    produced) with ``key`` under ``key_id``."""
    if len(key) < MIN_KEY_BYTES:
        check_key(key)  # raises: never produce a signature anyone could forge
    if not KEY_ID.fullmatch(key_id):
        raise UnusableKey(f"key id {key_id!r}: must be 1-63 of [A-Za-z0-9._-], starting alphanumeric")
    digest = hmac.new(key, value, hashlib.sha256).hexdigest()
    return [(SIGNATURE_HEADER, (SIGNATURE_PREFIX + digest).encode()), (KEY_ID_HEADER, key_id.encode())]


def header(headers: Sequence[tuple[str, bytes]] | None, name: str) -> bytes | None:
    """The value of header ``name`` (the last one if given twice: Kafka keeps them in order)."""
    found = None
    for k, v in headers or ():
        if k == name:
            found = v
    return found


def verify_bytes(value: bytes, headers: Sequence[tuple[str, bytes]] | None, keys: KeySet) -> str:
    """The id of the key that signed ``value``, by the signature headers; :class:`SignatureError`
    if they are missing or malformed, name a key not in ``keys`` (a retired one) or do not match.
    Only the key the header names is tried (constant-time compare)."""
    sig, kid_raw = header(headers, SIGNATURE_HEADER), header(headers, KEY_ID_HEADER)
    if sig is None:
        raise SignatureError(f"no {SIGNATURE_HEADER} header")
    if kid_raw is None:
        raise SignatureError(f"no {KEY_ID_HEADER} header")
    kid = kid_raw.decode("utf-8", "replace")
    text = sig.decode("ascii", "replace")
    if not text.startswith(SIGNATURE_PREFIX):
        raise SignatureError(f"{SIGNATURE_HEADER}: expected {SIGNATURE_PREFIX}<hex>, got {text[:20]!r}")
    key = keys.keys.get(kid)
    if key is None:
        raise SignatureError(f"{KEY_ID_HEADER} {kid[:64]!r}: not an accepted {keys.what} "
                             f"({', '.join(sorted(keys.keys)) or 'none'}): retired, or never configured")
    want = SIGNATURE_PREFIX + hmac.new(key, value, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(text.encode(), want.encode()):
        raise SignatureError(f"{SIGNATURE_HEADER} does not match the value bytes (tampered or wrong key {kid!r})")
    return kid


def verify_record(command: C, value: bytes, headers: Sequence[tuple[str, bytes]] | None, keys: KeySet,
                  now: float, *, max_future_skew_s: float) -> str:
    """Verify a received record (``command`` decoded from ``value``) during the migration: by the
    header over ``value`` when a :data:`SIGNATURE_HEADER` is present (and then only by it), by the
    in-body signature (:meth:`KeySet.verify`) when none is. Then the times (:func:`check_times`).
    Returns the key id."""
    if header(headers, SIGNATURE_HEADER) is None:
        return keys.verify(command, now, max_future_skew_s=max_future_skew_s)
    try:
        kid = verify_bytes(value, headers, keys)
    except SignatureError as exc:
        raise SignatureError(f"command {command.id}: {exc}") from None
    check_times(command, now, max_future_skew_s)
    return kid


class CommandKeyEntry(Protocol):
    """One entry of ``signing.command_keys``: an id and a file or an environment variable."""

    @property
    def id(self) -> str: ...
    @property
    def key_file(self) -> str: ...
    @property
    def key_env(self) -> str: ...


class CommandKeySource(Protocol):
    """Where the command keys are (the ``signing`` section of the config has these fields)."""

    @property
    def key_file(self) -> str: ...
    @property
    def key_env(self) -> str: ...
    @property
    def key_id(self) -> str: ...
    @property
    def command_keys(self) -> Sequence[CommandKeyEntry]: ...
    @property
    def allow_demo_keys(self) -> bool: ...


def command_key(source: CommandKeySource, environ: Mapping[str, str]) -> tuple[str, bytes]:
    """The active command key, the one the decision stage signs with: ``(signing.key_id, the key
    from signing.key_file, else from the variable signing.key_env)``. Raises :class:`UnusableKey`
    (a ``ValueError``) naming the setting: none given, a file that cannot be read, an unusable key."""
    kid = source.key_id
    if not KEY_ID.fullmatch(kid):
        raise UnusableKey(f"signing.key_id {kid!r}: must be 1-63 of [A-Za-z0-9._-], starting alphanumeric")
    if source.key_file:
        where = source.key_file
        try:
            text = Path(where).read_bytes()
        except OSError as exc:
            raise UnusableKey(f"command key {kid!r}: cannot read signing.key_file {where}: "
                              f"{exc.strerror or exc}") from None
    else:
        where = f"${source.key_env}"
        if not environ.get(source.key_env):
            raise UnusableKey(f"signing key: set signing.key_file or the environment variable {source.key_env} "
                              f"(the active command key, id {kid!r})")
        text = environ[source.key_env].encode()
    return kid, load_key(text, allow_demo=source.allow_demo_keys, what=f"command key {where}")


def command_keys(source: CommandKeySource, environ: Mapping[str, str]) -> KeySet:
    """The command keys the executor accepts, by id: the active one (:func:`command_key`) and each
    of ``signing.command_keys`` (the other side of a rotation's overlap). Every key must be there
    and usable: an entry whose file cannot be read or whose variable is unset is an error, as is an
    id given twice or one key under two ids (:class:`UnusableKey`, naming the entry)."""
    kid, key = command_key(source, environ)
    keys, where = {kid: key}, {kid: "the active key"}
    for i, entry in enumerate(source.command_keys):
        name = f"signing.command_keys[{i}] (id {entry.id!r})"
        if not KEY_ID.fullmatch(entry.id):
            raise UnusableKey(f"{name}: the id must be 1-63 of [A-Za-z0-9._-], starting alphanumeric")
        if entry.id in keys:
            raise UnusableKey(f"{name}: the id is given twice (also {where[entry.id]})")
        if entry.key_file:
            try:
                text = Path(entry.key_file).read_bytes()
            except OSError as exc:
                raise UnusableKey(f"{name}: cannot read {entry.key_file}: {exc.strerror or exc}") from None
        elif environ.get(entry.key_env):
            text = environ[entry.key_env].encode()
        else:
            raise UnusableKey(f"{name}: the environment variable {entry.key_env} is not set")
        loaded = load_key(text, allow_demo=source.allow_demo_keys, what=name)
        for other, k in keys.items():
            if hmac.compare_digest(k, loaded):
                raise UnusableKey(f"{name}: the same key as {where[other]} (id {other!r}): one key, one id")
        keys[entry.id], where[entry.id] = loaded, name
    return KeySet(keys, kid, what="command key")


class OperatorKeySource(Protocol):
    """Where the operator keys are (the ``signing`` section of the config has these fields, and the
    command key ids, which no operator key id may take)."""

    @property
    def key_id(self) -> str: ...
    @property
    def command_keys(self) -> Sequence[CommandKeyEntry]: ...
    @property
    def operator_key_files(self) -> Mapping[str, str]: ...
    @property
    def operator_key_dir(self) -> str: ...
    @property
    def operator_key_env(self) -> Mapping[str, str]: ...
    @property
    def operator_key_id(self) -> str: ...
    @property
    def allow_demo_keys(self) -> bool: ...


def operator_keys(source: OperatorKeySource, environ: Mapping[str, str], *, command_key: bytes = b"") -> KeySet:
    """The operator keys: each of ``operator_key_files`` (id -> file), every file of
    ``operator_key_dir`` (the file name is the id; names starting with ``.`` are skipped, as the
    bookkeeping of a mounted Secret is), and each variable of ``operator_key_env`` (id -> variable
    name) that is set. Raises :class:`UnusableKey` naming the key for a missing file, an unusable key,
    an id given twice, an id that is a command key id (``signing.key_id``, ``signing.command_keys``),
    or an operator key equal to ``command_key`` or to any key of ``signing.command_keys`` this
    machine can read (the roles would collapse: a retired command key the executor still accepts
    would let an operator sign a drain)."""
    texts: dict[str, tuple[str, bytes]] = {}
    command_ids = {source.key_id, *(k.id for k in source.command_keys)}

    def add(kid: str, where: str, text: bytes) -> None:
        if kid in texts:
            raise UnusableKey(f"operator key {kid!r}: given twice ({texts[kid][0]} and {where})")
        if kid in command_ids:
            raise UnusableKey(f"operator key {kid!r} ({where}): the id is a command key id (signing.key_id or "
                              f"signing.command_keys); give the operator key another id")
        texts[kid] = (where, text)

    for kid, path in source.operator_key_files.items():
        add(kid, path, _read(Path(path), kid))
    if source.operator_key_dir:
        folder = Path(source.operator_key_dir)
        try:
            entries = sorted(p for p in folder.iterdir() if not p.name.startswith(".") and p.is_file())
        except OSError as exc:
            raise UnusableKey(f"signing.operator_key_dir {folder}: {exc.strerror or exc}") from None
        for p in entries:
            add(p.name, str(p), _read(p, p.name))
    for kid, var in source.operator_key_env.items():
        if environ.get(var):
            add(kid, f"${var}", environ[var].encode())
    keys = {kid: load_key(text, allow_demo=source.allow_demo_keys, what=f"operator key {kid!r} ({where})")
            for kid, (where, text) in texts.items()}
    commands = ([("the command key", command_key)] if command_key else []) + _readable_command_keys(source, environ)
    for kid, key in keys.items():
        for name, other in commands:
            if hmac.compare_digest(key, other):
                raise UnusableKey(f"operator key {kid!r} ({texts[kid][0]}) is {name}: operators could sign "
                                  f"commands for the executor. Give operators keys of their own")
    return KeySet(keys, source.operator_key_id)


def _readable_command_keys(source: OperatorKeySource, environ: Mapping[str, str]) -> list[tuple[str, bytes]]:
    """The keys of ``signing.command_keys`` this machine holds, named for an error (an entry whose
    file or variable is not here is the executor's: not this machine's to compare)."""
    out: list[tuple[str, bytes]] = []
    for i, entry in enumerate(source.command_keys):
        try:
            text = (Path(entry.key_file).read_bytes() if entry.key_file
                    else environ[entry.key_env].encode() if environ.get(entry.key_env) else None)
            if text is not None:
                out.append((f"the command key signing.command_keys[{i}] (id {entry.id!r})",
                            load_key(text, allow_demo=True, what="command key")))
        except (OSError, UnusableKey):
            continue
    return out


def _read(path: Path, kid: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UnusableKey(f"operator key {kid!r}: cannot read {path}: {exc.strerror or exc}") from None
