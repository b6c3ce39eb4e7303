"""The real workload controllers (training operator, JobSet, Kueue) the controller tests run: where
the binary is, and the module's marks when it is missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleetmedic.devenv import settings


def real_controller(env: str, built: Path, what: str) -> tuple[str, list[pytest.MarkDecorator]]:
    """The binary of a real workload controller (``$env``, else what ``fleetmedic dev build``
    built) and the module's marks: skip where it is missing; in CI a missing one fails the run."""
    binary = os.environ.get(env) or str(built)
    if Path(binary).is_file():
        return binary, []
    why = f"no {what} binary at {binary} (`fleetmedic dev build` builds it; or set {env})"
    if settings.services_required():
        raise RuntimeError(why)  # CI: a missing real controller fails the run, never skips it
    return binary, [pytest.mark.skip(reason=why)]


def jobset_manager() -> tuple[str, list[pytest.MarkDecorator]]:
    """The real JobSet controller (sigs.k8s.io/jobset): :func:`real_controller` for it."""
    return real_controller("FLEETMEDIC_JOBSET_MANAGER", settings.layout().jobset_manager, "JobSet controller")
