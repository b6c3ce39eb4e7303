"""A real Prometheus server on loopback, for the tests and benchmarks that read from one: Debian's
``prometheus`` (or ``$FLEETMEDIC_PROMETHEUS``) started on a free port over a TSDB folder, which
either scrapes the given targets every second or serves only what the folder holds: a history
written into it by :func:`load_openmetrics` (``promtool tsdb create-blocks-from openmetrics``;
``$FLEETMEDIC_PROMTOOL``). A server that cannot start raises :class:`~.proc.ServiceError` with
its log tail."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from fleetmedic.devenv import proc

PROMETHEUS = os.environ.get("FLEETMEDIC_PROMETHEUS", "/usr/bin/prometheus")
PROMTOOL = os.environ.get("FLEETMEDIC_PROMTOOL", "/usr/bin/promtool")
WHY = "apt-get install prometheus, or set FLEETMEDIC_PROMETHEUS and FLEETMEDIC_PROMTOOL"


def load_openmetrics(om: Path, workdir: Path, timeout_s: float = 3600.0) -> Path:
    """Write the history ``om`` holds into ``workdir / "tsdb"`` as TSDB blocks (for :func:`start`
    on the same ``workdir`` to serve); the TSDB folder."""
    tsdb = workdir / "tsdb"
    done = subprocess.run([_tool(PROMTOOL), "tsdb", "create-blocks-from", "openmetrics", str(om), str(tsdb)],
                          capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise proc.ServiceError(f"promtool tsdb create-blocks-from openmetrics failed:\n{done.stderr[-3000:]}")
    return tsdb


def start(workdir: Path, targets: Sequence[str] = (), retention: str = "",
          ready_timeout_s: float = 120.0) -> tuple[str, subprocess.Popen[bytes]]:
    """A server on ``workdir / "tsdb"`` scraping ``targets`` (URLs) every second, or nothing when
    none is given; ``retention`` (``100y``) keeps an old history from being dropped. Its base URL
    and process (:func:`stop` ends it)."""
    server = _tool(PROMETHEUS)
    (port,) = proc.free_ports(1)
    config = workdir / "prometheus.yml"
    if targets:
        hostports = [t.split("//", 1)[-1].split("/", 1)[0] for t in targets]
        config.write_text("global: {scrape_interval: 1s, scrape_timeout: 1s}\nscrape_configs:\n"
                          "  - job_name: fixture\n"
                          f"    static_configs: [{{targets: [{', '.join(repr(h) for h in hostports)}]}}]\n",
                          encoding="utf-8")
    else:
        config.write_text("global: {scrape_interval: 1h}\nscrape_configs: []\n", encoding="utf-8")
    args = [server, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    if retention:
        args.append(f"--storage.tsdb.retention.time={retention}")
    log_path = workdir / "prometheus.log"
    with log_path.open("wb") as log:
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline and p.poll() is None:
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return url, p
        except OSError:
            time.sleep(0.3)
    stop(p)
    raise proc.ServiceError(f"Prometheus did not become ready on {url}:\n{proc.tail(log_path)}")


def stop(p: subprocess.Popen[bytes]) -> None:
    p.terminate()
    try:
        p.wait(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def _tool(path: str) -> str:
    if not (Path(path).is_file() and os.access(path, os.X_OK)):
        raise proc.ServiceError(f"{path} not found ({WHY})")
    return path
