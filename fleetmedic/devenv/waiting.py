"""Waiting for a condition in tests and benches that drive real processes and servers: the one
``wait`` they use, never a sleep.

:func:`wait` polls ``check`` until it returns something truthy and returns that; on timeout it
fails the test naming what it waited for. A ``watch`` (the processes a test started) is asked every
round whether they still run, so a dead process fails the test at once rather than at the
deadline, and its logs explain a timeout."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol


class Watched(Protocol):
    def alive(self) -> None:
        """Fail the test (AssertionError) when a process it needs has exited."""

    def context(self) -> str:
        """What explains a timeout: the processes' latest log lines."""


def wait(what: str, check: Callable[[], Any], timeout: float = 60.0, watch: Watched | None = None,
         every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if watch is not None:
            watch.alive()
        if time.monotonic() > deadline:
            extra = f"\n{watch.context()}" if watch is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
        time.sleep(every)
