"""A real Prometheus server for tests (no tests here): Debian's ``prometheus`` started on a free
loopback port, and a TSDB loaded from an OpenMetrics file with ``promtool tsdb create-blocks-from
openmetrics`` for it to serve as history. The ``prometheus`` fixture (tests/connectors/conftest.py)
and the held-out fleet's test (tests/evaluation/test_fleet32.py) start their servers here.

When the server cannot start, :func:`start_prometheus` fails the test under CI /
``FLEETMEDIC_REQUIRE_SERVICES=1`` with the log tail, and skips it with the reason otherwise."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from pathlib import Path

from fleetmedic.devenv import proc
from tests.conftest import require_tool, unavailable

PROMETHEUS = os.environ.get("FLEETMEDIC_PROMETHEUS", "/usr/bin/prometheus")
PROMTOOL = os.environ.get("FLEETMEDIC_PROMTOOL", "/usr/bin/promtool")


def start_prometheus(workdir: Path, targets: list[str]) -> tuple[str, subprocess.Popen[bytes]]:
    """A Prometheus server on ``workdir / "tsdb"`` scraping ``targets`` every second (none: it only
    serves what the TSDB holds); its base URL and process (:func:`stop_prometheus` ends it)."""
    server = require_tool(PROMETHEUS, why="apt-get install prometheus")
    (port,) = proc.free_ports(1)
    hostports = [t.split("//", 1)[1].split("/", 1)[0] for t in targets]
    config = workdir / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: fixture\n"
        f"    static_configs: [{{targets: [{', '.join(repr(h) for h in hostports)}]}}]\n"
    )
    log_path = workdir / "prometheus.log"
    with log_path.open("wb") as log:
        p = subprocess.Popen(
            [server, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if p.poll() is not None:
            break
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return url, p
        except OSError:
            time.sleep(0.3)
    stop_prometheus(p)
    tail = log_path.read_text(errors="replace")[-3000:]
    unavailable("Prometheus", f"did not become ready on {url}:\n{tail}")


def stop_prometheus(p: subprocess.Popen[bytes]) -> None:
    p.terminate()
    try:
        p.wait(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def load_openmetrics(om: Path, workdir: Path) -> None:
    """Write the history ``om`` holds into ``workdir / "tsdb"`` as TSDB blocks, for
    :func:`start_prometheus` on the same ``workdir`` to serve."""
    promtool = require_tool(PROMTOOL, why="apt-get install prometheus")
    done = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(workdir / "tsdb")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
