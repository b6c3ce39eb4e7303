"""Fixtures for the connector tests.

- ``fixture_exporter``: ``fixture_exporter(render)`` serves ``render(n)`` (n = 0, 1, 2... per request)
  as a text exposition on a free loopback port, like dcgm-exporter or node-exporter; returns its URL.
  ``render`` may return bytes (served as they are: garbage, not UTF-8).
- ``prometheus``: ``prometheus(targets)`` starts Debian's real Prometheus server on a free loopback
  port with a temp config scraping ``targets`` every second; returns its base URL. When it cannot
  start, the test fails under CI / ``FLEETMEDIC_REQUIRE_SERVICES=1`` with the log tail, and is
  skipped with the reason otherwise (as tests/conftest.py does for Kafka and Kubernetes).
- ``connector_settings``: ``connector_settings(**sections)`` -> Settings on the test broker with a
  unique topic prefix.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fleetmedic.config import Settings, parse_config
from fleetmedic.devenv import proc
from tests.conftest import require_tool, unavailable

PROMETHEUS = os.environ.get("FLEETMEDIC_PROMETHEUS", "/usr/bin/prometheus")


@pytest.fixture
def fixture_exporter() -> Iterator[Callable[[Callable[[int], str | bytes]], str]]:
    servers: list[ThreadingHTTPServer] = []

    def start(render: Callable[[int], str | bytes]) -> str:
        calls = [0]
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with lock:
                    n = calls[0]
                    calls[0] += 1
                out = render(n)
                body = out if isinstance(out, bytes) else out.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/metrics"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[list[str]], str]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(targets: list[str]) -> str:
        server = require_tool(PROMETHEUS, why="apt-get install prometheus")
        (port,) = proc.free_ports(1)
        hostports = [t.split("//", 1)[1].split("/", 1)[0] for t in targets]
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: fixture\n"
            f"    static_configs: [{{targets: [{', '.join(repr(h) for h in hostports)}]}}]\n"
        )
        log_path = tmp_path / "prometheus.log"
        with log_path.open("wb") as log:
            p = subprocess.Popen(
                [server, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT)
        started.append(p)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if p.poll() is not None:
                break
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return url
            except OSError:
                time.sleep(0.3)
        tail = log_path.read_text(errors="replace")[-3000:]
        unavailable("Prometheus", f"did not become ready on {url}:\n{tail}")

    yield start
    for p in started:
        p.terminate()
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    shutil.rmtree(tmp_path / "tsdb", ignore_errors=True)


@pytest.fixture
def connector_settings(kafka_bootstrap: str) -> Callable[..., Settings]:
    prefix = f"t{uuid.uuid4().hex[:8]}."

    def make(yaml_text: str = "") -> Settings:
        s = parse_config(yaml_text, {})
        import msgspec

        return msgspec.structs.replace(
            s,
            kafka=msgspec.structs.replace(s.kafka, bootstrap_servers=kafka_bootstrap, client_id=f"t-{prefix}"),
            topics=msgspec.structs.replace(s.topics, prefix=prefix),
        )

    return make
