"""Signing and verifying commands (HMAC-SHA256 over a canonical encoding): the decision stage's
:class:`~fleetmedic.records.RemediationCommand` and an operator's
:class:`~fleetmedic.records.OperatorCommand`.

The canonical encoding is the command's JSON with ``signature`` set to ``""``, values normalised to
their schema types and every object's keys sorted, so any implementation that can sort keys and
print JSON numbers like msgspec can verify it. Executors call :func:`verify` before acting: it
checks the signature in constant time,
then the expiry against the injected ``now``.

Key material comes from a file or an environment variable (see ``signing`` in the config); the
reading is the caller's job (:func:`load_key` takes the already-read text), keeping this pure.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import TypeVar

import msgspec

from fleetmedic.records import OperatorCommand, RemediationCommand

C = TypeVar("C", RemediationCommand, OperatorCommand)

MIN_KEY_BYTES = 32


class SignatureError(ValueError):
    """The command's signature is missing or does not match: never act on it."""


class CommandExpired(ValueError):
    """The command is past its ``expires_at``: it describes a world that may have changed."""


def load_key(text: str | bytes) -> bytes:
    """Turn key material (the content of a key file or env var) into HMAC key bytes."""
    raw = text.encode() if isinstance(text, str) else text
    key = raw.strip()
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"signing key: must be at least {MIN_KEY_BYTES} bytes, got {len(key)}")
    return key


def canonical_bytes(command: RemediationCommand | OperatorCommand) -> bytes:
    unsigned = msgspec.structs.replace(command, signature="")
    # Normalise through the wire types first, so a command built in Python with ``issued_at=1``
    # signs the same bytes as the one a consumer decodes from ``"issued_at":1`` (as ``1.0``).
    normalised = msgspec.convert(msgspec.to_builtins(unsigned), type(command))
    return msgspec.json.encode(normalised, order="sorted")


def signature_of(command: RemediationCommand | OperatorCommand, key: bytes) -> str:
    return hmac.new(key, canonical_bytes(command), hashlib.sha256).hexdigest()


def sign(command: C, key: bytes) -> C:
    return msgspec.structs.replace(command, signature=signature_of(command, key))


def verify(command: RemediationCommand | OperatorCommand, key: bytes, now: float) -> None:
    """Raise :class:`SignatureError` or :class:`CommandExpired`; return ``None`` if it may be acted on."""
    if not command.signature:
        raise SignatureError(f"command {command.id}: unsigned")
    if not hmac.compare_digest(command.signature, signature_of(command, key)):
        raise SignatureError(f"command {command.id}: signature does not match (tampered or wrong key)")
    if now > command.expires_at:
        raise CommandExpired(f"command {command.id}: expired at {command.expires_at:.3f}, now {now:.3f}")
