"""Start, watch and stop the background processes behind each service.

Each process runs in its own session (so ``down`` can signal the whole group), writes stdout and
stderr to one log file and has a pidfile. Stopping checks that the pid still runs the expected
program before signalling, so a stale pidfile never kills an unrelated process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

# Popen objects of children started by this process, so they can be reaped (no zombies, no
# "subprocess still running" ResourceWarnings).
_children: dict[int, subprocess.Popen[bytes]] = {}
# how each reaped child ended (pid -> returncode: negative = the signal that killed it), for the
# "exited while waiting" report
_ended: dict[int, int] = {}


class ServiceError(RuntimeError):
    """A service failed to start or to become ready; the message carries its log tail."""


def tail(path: Path, lines: int = 40) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(no log at {path}: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def failure(what: str, log: Path, detail: str = "") -> ServiceError:
    msg = f"{what}{': ' + detail if detail else ''}\n--- last lines of {log} ---\n{tail(log)}"
    return ServiceError(msg)


@dataclass(frozen=True)
class Proc:
    """One background process of a service."""

    name: str
    argv: Sequence[str]
    log: Path
    pidfile: Path
    cwd: Path | None = None
    env: dict[str, str] | None = None

    def start(self) -> int:
        """Start the process detached from our terminal; return its pid."""
        if self.pid() is not None:
            raise ServiceError(f"{self.name} already runs (pid {self.pid()}, pidfile {self.pidfile})")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(self.env or {})
        with self.log.open("ab") as out:
            out.write(f"\n=== {time.strftime('%F %T')} starting: {' '.join(self.argv)}\n".encode())
            out.flush()
            try:
                p = subprocess.Popen(
                    list(self.argv),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=self.cwd,
                    env=env,
                    start_new_session=True,
                )
            except OSError as exc:
                raise failure(f"cannot run {self.argv[0]}", self.log, str(exc)) from exc
        _children[p.pid] = p
        self.pidfile.write_text(f"{p.pid}\n")
        return p.pid

    def pid(self) -> int | None:
        """The pid from the pidfile if that process is alive and runs our program."""
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid, Path(self.argv[0]).name) else None

    def how_it_ended(self) -> str:
        """The exit status of the process the pidfile names, as far as it is known (a report)."""
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError) as exc:
            return f"no pid ({exc})"
        code = _ended.get(pid)
        if code is None:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                return f"pid {pid} still exists, running {cmdline[:200]!r}"
            except OSError:
                return f"pid {pid} is gone, exit status unknown (not reaped here)"
        if code < 0:
            try:
                return f"pid {pid} was killed by {signal.Signals(-code).name}"
            except ValueError:  # a signal without a name (real-time)
                return f"pid {pid} was killed by signal {-code}"
        return f"pid {pid} exited with status {code}"

    def exited(self) -> bool:
        """True once a process we started has exited (or its pidfile names no live process)."""
        return self.pid() is None

    def stop(self, timeout: float = 15.0) -> bool:
        """SIGTERM the process group, SIGKILL after ``timeout``; True if something was stopped."""
        pid = self.pid()
        if pid is None:
            self.pidfile.unlink(missing_ok=True)
            return False
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _alive(pid, None):
            time.sleep(0.05)
        if _alive(pid, None):
            _signal_group(pid, signal.SIGKILL)
            while _alive(pid, None):
                time.sleep(0.05)
        self.pidfile.unlink(missing_ok=True)
        return True


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _alive(pid: int, program: str | None) -> bool:
    child = _children.get(pid)
    if child is not None:
        if child.poll() is None:
            return True  # a child this process started and has not reaped: it runs what we started
        _ended[pid] = int(child.returncode)
        del _children[pid]
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
        return False
    return program is None or Path(cmdline[0].decode(errors="replace")).name == program


def wait_until(
    check: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    log: Path,
    procs: Sequence[Proc] = (),
    interval: float = 0.25,
) -> float:
    """Poll ``check`` until true; raise with the log tail on timeout or if a process died.

    Returns the seconds waited. ``check`` may raise; that counts as not ready yet.
    """
    start = time.monotonic()
    last = ""
    while True:
        for p in procs:
            if p.exited():
                raise failure(f"{p.name} exited while waiting for {what}", p.log, p.how_it_ended())
        try:
            if check():
                return time.monotonic() - start
        except Exception as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() - start > timeout:
            raise failure(f"timed out after {timeout:.0f}s waiting for {what}", log, last)
        time.sleep(interval)


def free_ports(count: int) -> list[int]:
    """``count`` distinct, currently free loopback TCP ports (for services the fixtures start)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0
