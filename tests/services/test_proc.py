"""The background processes behind the services: a process that ends while we wait is reported
with how it ended (the report a CI run keeps when a service does not start)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from fleetmedic.devenv import proc


def _start(tmp_path: Path, name: str, code: str) -> proc.Proc:
    p = proc.Proc(name, [sys.executable, "-c", code], tmp_path / f"{name}.log", tmp_path / f"{name}.pid")
    p.start()
    return p


def _wait_exited(p: proc.Proc) -> None:
    deadline = time.monotonic() + 20
    while not p.exited():
        assert time.monotonic() < deadline, f"{p.name} still runs"
        time.sleep(0.05)


def test_a_killed_process_is_reported_with_the_signal(tmp_path: Path) -> None:
    p = _start(tmp_path, "sleeper", "import time; time.sleep(60)")
    pid = int(p.pidfile.read_text())
    assert p.pid() == pid and not p.exited()
    os.kill(pid, signal.SIGKILL)
    report = rf"sleeper exited while waiting for never: pid {pid} was killed by SIGKILL"
    with pytest.raises(proc.ServiceError, match=report):
        proc.wait_until(lambda: False, timeout=20, what="never", log=p.log, procs=[p])


def test_an_exit_status_is_reported(tmp_path: Path) -> None:
    p = _start(tmp_path, "quitter", "import sys; sys.exit(3)")
    _wait_exited(p)
    assert p.how_it_ended() == f"pid {int(p.pidfile.read_text())} exited with status 3"
