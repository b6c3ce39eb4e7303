"""Who may send to the remote-write receiver (:mod:`fleetmedic.connectors.remote_write.server`):
what a Prometheus ``remote_write`` block can present, checked against files that are read again
when they change, so a rotated secret takes effect without a restart.

- **TLS** (:func:`tls_files`, a :class:`~fleetmedic.tls_files.TlsFiles`): the server's certificate
  and key, and optionally a client CA whose certificates senders must present (mutual TLS; a
  sender's ``tls_config.cert_file``), followed as they change.
- **Credentials** (:class:`Credentials`): ``Authorization: Bearer <token>`` (a sender's
  ``authorization: {credentials_file}``), one accepted token per line of
  ``auth.bearer_tokens_file``; ``Authorization: Basic`` (a sender's ``basic_auth``), one accepted
  ``user:password`` per line of ``auth.basic_auth_file``. Either kind is accepted where both are
  configured; a rotation lists the old and the new secret until every sender has the new one.
- **Exposure** (:func:`check_exposure`): the receiver refuses to listen beyond loopback with no
  way for a sender to prove who it is, unless ``allow_unauthenticated`` says so.

A file is looked at at most every ``files_check_s`` (:class:`~fleetmedic.tls_files.WatchedFile`,
the clock injected). Pure: no adapter library.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import time
from collections.abc import Callable

from fleetmedic.config import RemoteWriteAuthSettings, RemoteWriteSettings, RemoteWriteTlsSettings
from fleetmedic.tls_files import TlsFiles, WatchedFile


class Credentials:
    """The ``Authorization`` a request must carry; :meth:`check` says whether it does."""

    def __init__(self, auth: RemoteWriteAuthSettings, check_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        prefix = "exporters.remote_write.auth."
        self._tokens = (WatchedFile(auth.bearer_tokens_file, prefix + "bearer_tokens_file", check_s, clock)
                        if auth.bearer_tokens_file else None)
        self._users = (WatchedFile(auth.basic_auth_file, prefix + "basic_auth_file", check_s, clock)
                       if auth.basic_auth_file else None)
        self._accepted_tokens: list[bytes] = []
        self._accepted_users: list[bytes] = []
        self._versions: dict[str, int] = {}  # the file versions the accepted credentials are of
        self.refresh()
        for watched, accepted in ((self._tokens, self._accepted_tokens), (self._users, self._accepted_users)):
            if watched is not None and not accepted:
                raise ValueError(f"{watched.field}: {watched.path} holds no credentials (one a line)")
        if self._users is not None and any(b":" not in u for u in self._accepted_users):
            raise ValueError(f"{self._users.field}: every line must be user:password")

    @property
    def required(self) -> bool:
        return self._tokens is not None or self._users is not None

    @property
    def error(self) -> str:
        """Why a file could not be read again (its last content is in use); "" when it could."""
        return "; ".join(f"{w.field}: {w.error}" for w in (self._tokens, self._users) if w is not None and w.error)

    def refresh(self) -> None:
        """Reads the files again where they changed (at most every ``check_s``)."""
        for watched, accepted in ((self._tokens, self._accepted_tokens), (self._users, self._accepted_users)):
            if watched is None:
                continue
            watched.refresh()
            if self._versions.get(watched.field) != watched.version:
                self._versions[watched.field] = watched.version
                lines = [line.strip() for line in watched.content.splitlines()]
                fresh = [line for line in lines if line and not line.startswith(b"#")]
                if fresh or not accepted:  # an emptied file (mid-write) keeps the credentials in use
                    accepted[:] = fresh

    def check(self, authorization: str | None) -> str:
        """"" when the request may send; otherwise a short reason (a metric label): ``missing``
        (no Authorization header), ``scheme`` (one not configured), ``credentials`` (wrong)."""
        if not self.required:
            return ""
        if not authorization:
            return "missing"
        self.refresh()
        scheme, _, value = authorization.strip().partition(" ")
        scheme, given = scheme.lower(), value.strip().encode("utf-8", "surrogateescape")
        if scheme == "bearer" and self._tokens is not None:
            accepted = self._accepted_tokens
        elif scheme == "basic" and self._users is not None:
            accepted = self._accepted_users
            try:
                given = base64.b64decode(given, validate=True)
            except (binascii.Error, ValueError):
                return "credentials"
        else:
            return "scheme"
        ok = False
        for secret in accepted:  # every entry compared, each in constant time
            ok |= hmac.compare_digest(given, secret)
        return "" if ok else "credentials"

    def challenge(self) -> str:
        """The WWW-Authenticate of a 401."""
        return ", ".join(kind for kind, on in (('Bearer realm="fleetmedic"', self._tokens is not None),
                                               ('Basic realm="fleetmedic"', self._users is not None)) if on)


def tls_files(tls: RemoteWriteTlsSettings, check_s: float, clock: Callable[[], float] = time.monotonic) -> TlsFiles:
    """The receiver's TLS context, following ``exporters.remote_write.tls``'s files."""
    return TlsFiles(tls.cert_file, tls.key_file, check_s, client_ca_file=tls.client_ca_file,
                    min_version=tls.min_version, field="exporters.remote_write.tls.", clock=clock)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, rw: RemoteWriteSettings) -> None:
    """Raises ValueError (naming the settings) when the receiver would listen on ``host``, beyond
    loopback, with no way for senders to prove who they are."""
    if rw.authenticated or rw.allow_unauthenticated or _loopback(host):
        return
    raise ValueError(
        f"exporters.remote_write: listening on {host or 'every interface'} with no authentication, anyone who "
        "reaches the port could send telemetry that cordons nodes: set tls.client_ca_file (client certificates), "
        "auth.bearer_tokens_file or auth.basic_auth_file, or allow_unauthenticated: true")
