"""Fixtures for the job-track tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetmedic.devenv.jobset import jobset_controller as run_jobset_controller
from tests.executor.workload.helpers_controllers import jobset_manager


@pytest.fixture
def jobset_controller(kube_config: Path, crds: list[str], tmp_path: Path) -> Iterator[Path]:
    """The real JobSet controller run out of cluster (its log; its webhooks are the test's business).
    A module using it takes :func:`jobset_manager`'s marks, which skip it where the binary is missing."""
    manager, _ = jobset_manager()
    with run_jobset_controller(manager, kube_config, tmp_path) as log:
        yield log
