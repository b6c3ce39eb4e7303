"""TLS files a server follows as they change, so a rotated certificate takes effect without a
restart (the remote-write receiver's, the decision worker's bind-time check).

- :class:`WatchedFile`: a file's bytes, looked at (its ``stat``) at most every ``check_s`` (the
  clock is injected) and read again when its inode, size or modification time changed: Kubernetes
  updates a mounted Secret by swapping a symlink, and an editor or ``mv`` replaces the file.
- :class:`TlsFiles`: a server's certificate and key, and optionally a client CA whose certificates
  clients must present (mutual TLS). The server's context picks, at every handshake, a context
  built from the files as they are now (``sni_callback``; rebuilt when one of them changed): a new
  connection gets the new certificate or CA, those open keep theirs. Files that do not make a
  context (half written, a key that does not match) leave the last good one in use;
  :attr:`TlsFiles.error` says why.

Standard library only."""

from __future__ import annotations

import math
import os
import ssl
import time
from collections.abc import Callable


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


class TlsFiles:
    """A server's TLS context, following its files (see the module docstring). ``field``: the
    settings' path, which errors name (``exporters.remote_write.tls.``)."""

    def __init__(self, cert_file: str, key_file: str, check_s: float, *, client_ca_file: str = "",
                 min_version: str = "TLS1.2", field: str = "", clock: Callable[[], float] = time.monotonic) -> None:
        self.cert_file, self.key_file, self.client_ca_file = cert_file, key_file, client_ca_file
        self.min_version, self.field = min_version, field
        self.files = [WatchedFile(path, field + name, check_s, clock) for name, path in
                      (("cert_file", cert_file), ("key_file", key_file), ("client_ca_file", client_ca_file)) if path]
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
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3 if self.min_version == "TLS1.3" else ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file, password=b"")  # never a prompt
        except (OSError, ssl.SSLError) as exc:
            return ctx, f"{self.field}cert_file/key_file: not a certificate and its key: {exc}"
        if self.client_ca_file:
            try:
                ctx.load_verify_locations(cafile=self.client_ca_file)
            except (OSError, ssl.SSLError) as exc:
                return ctx, f"{self.field}client_ca_file: not a CA certificate: {exc}"
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx, ""
