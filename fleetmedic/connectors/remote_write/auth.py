"""Who may send to the remote-write receiver (:mod:`fleetmedic.connectors.remote_write.server`):
what a Prometheus ``remote_write`` block can present, checked against files that are read again
when they change, so a rotated secret takes effect without a restart.

- **TLS** (:class:`TlsFiles`): the server's certificate and key, and optionally a client CA whose
  certificates senders must present (mutual TLS; a sender's ``tls_config.cert_file``). The
  server's context picks, at every handshake, a context built from the files as they are now
  (``sni_callback``; rebuilt when one of them changed): a new connection gets the new certificate
  or CA, those open keep theirs. Files that do not make a context (half written, a key that does
  not match) leave the last good one in use; :attr:`TlsFiles.error` says why.
- **Credentials** (:class:`Credentials`): ``Authorization: Bearer <token>`` (a sender's
  ``authorization: {credentials_file}``), one accepted token per line of
  ``auth.bearer_tokens_file``; ``Authorization: Basic`` (a sender's ``basic_auth``), one accepted
  ``user:password`` per line of ``auth.basic_auth_file``. Either kind is accepted where both are
  configured; a rotation lists the old and the new secret until every sender has the new one.
- **Exposure** (:func:`check_exposure`): the receiver refuses to listen beyond loopback with no
  way for a sender to prove who it is, unless ``allow_unauthenticated`` says so.

A file is looked at (its ``stat``) at most every ``files_check_s`` (the clock is injected), and
read again when its inode, size or modification time changed: Kubernetes updates a mounted Secret
by swapping a symlink, and an editor or ``mv`` replaces the file. Pure: no adapter library.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import math
import os
import ssl
import time
from collections.abc import Callable

from fleetmedic.config import RemoteWriteAuthSettings, RemoteWriteSettings, RemoteWriteTlsSettings


class WatchedFile:
    """A file's bytes, read again when its stat changed (checked at most every ``check_s``). The
    first read raises ValueError naming ``field``; a later failure keeps the last content and sets
    :attr:`error`."""

    def __init__(self, path: str, field: str, check_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.field = field
        self.check_s = check_s
        self.clock = clock
        self.content = b""
        self.version = 0  # how many times the content was read
        self.error = ""
        self._stat: tuple[int, ...] | None = None
        self._checked = -math.inf
        if not self.refresh():
            raise ValueError(f"{field}: {self.error}")

    def refresh(self) -> bool:
        """Looks again (if ``check_s`` has passed); True when the content was (re)read."""
        now = self.clock()
        if now - self._checked < self.check_s:
            return False
        self._checked = now
        try:
            st = os.stat(self.path)
            signature = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if signature == self._stat:
                return False
            with open(self.path, "rb") as fh:
                content = fh.read(1 << 20)
        except OSError as exc:
            self.error = f"cannot read {self.path}: {exc.strerror or exc}"
            return False
        self._stat, self.content, self.error = signature, content, ""
        self.version += 1
        return True


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


class TlsFiles:
    """The receiver's TLS context, following its files (see the module docstring)."""

    def __init__(self, tls: RemoteWriteTlsSettings, check_s: float, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        prefix = "exporters.remote_write.tls."
        self.tls = tls
        self.files = [WatchedFile(path, prefix + name, check_s, clock) for name, path in
                      (("cert_file", tls.cert_file), ("key_file", tls.key_file), ("client_ca_file", tls.client_ca_file))
                      if path]
        self.reloads = 0  # contexts built from changed files
        self.current, self._unusable = self._build()
        self.error = self._unusable
        if self.error:
            raise ValueError(self.error)

    def server_context(self) -> ssl.SSLContext:
        """The context to listen with: each handshake is served by :attr:`current`."""
        ctx, _ = self._build()
        ctx.sni_callback = self._pick
        return ctx

    def _pick(self, conn: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext) -> None:
        self.refresh()
        conn.context = self.current

    def refresh(self) -> None:
        """Builds :attr:`current` again when a file changed; :attr:`error` says why the files in
        use are not the ones on disk ("" when they are)."""
        if any([f.refresh() for f in self.files]):  # every file looked at
            fresh, self._unusable = self._build()
            if not self._unusable:
                self.current = fresh
                self.reloads += 1
        self.error = "; ".join([*(f"{f.field}: {f.error}" for f in self.files if f.error),
                                *([self._unusable] if self._unusable else [])])

    def _build(self) -> tuple[ssl.SSLContext, str]:
        """A server context loaded from the files, and why it cannot be used ("" when it can)."""
        tls = self.tls
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3 if tls.min_version == "TLS1.3" else ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(tls.cert_file, tls.key_file, password=b"")  # never a prompt
        except (OSError, ssl.SSLError) as exc:
            return ctx, f"exporters.remote_write.tls.cert_file/key_file: not a certificate and its key: {exc}"
        if tls.client_ca_file:
            try:
                ctx.load_verify_locations(cafile=tls.client_ca_file)
            except (OSError, ssl.SSLError) as exc:
                return ctx, f"exporters.remote_write.tls.client_ca_file: not a CA certificate: {exc}"
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx, ""


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
