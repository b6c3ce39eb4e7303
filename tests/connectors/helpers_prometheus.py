"""A real Prometheus server for tests (no tests here): :mod:`fleetmedic.devenv.prometheus` started
on a free loopback port, with a TSDB loaded from an OpenMetrics file for it to serve as history.
The ``prometheus`` fixture (tests/connectors/conftest.py) and the held-out fleet's test
(tests/evaluation/test_fleet32.py) start their servers here.

When the server or promtool cannot run, the test fails under CI / ``FLEETMEDIC_REQUIRE_SERVICES=1``
with the log tail, and is skipped with the reason otherwise."""

from __future__ import annotations

import subprocess
from pathlib import Path

from fleetmedic.devenv import proc, prometheus
from tests.conftest import require_tool, unavailable

PROMETHEUS = prometheus.PROMETHEUS
PROMTOOL = prometheus.PROMTOOL


def start_prometheus(workdir: Path, targets: list[str]) -> tuple[str, subprocess.Popen[bytes]]:
    """A Prometheus server on ``workdir / "tsdb"`` scraping ``targets`` every second (none: it only
    serves what the TSDB holds); its base URL and process (:func:`stop_prometheus` ends it)."""
    require_tool(PROMETHEUS, why=prometheus.WHY)
    try:
        return prometheus.start(workdir, targets, ready_timeout_s=60.0)
    except proc.ServiceError as e:
        unavailable("Prometheus", str(e))


def stop_prometheus(p: subprocess.Popen[bytes]) -> None:
    prometheus.stop(p)


def load_openmetrics(om: Path, workdir: Path) -> None:
    """Write the history ``om`` holds into ``workdir / "tsdb"`` as TSDB blocks, for
    :func:`start_prometheus` on the same ``workdir`` to serve."""
    require_tool(PROMTOOL, why=prometheus.WHY)
    try:
        prometheus.load_openmetrics(om, workdir, timeout_s=300.0)
    except proc.ServiceError as e:
        unavailable("promtool", str(e))
