"""Fixtures for the connector tests.

- ``fixture_exporter``: ``fixture_exporter(render)`` serves ``render(n)`` (n = 0, 1, 2... per request)
  as a text exposition on a free loopback port, like dcgm-exporter or node-exporter; returns its URL.
  ``render`` may return bytes (served as they are: garbage, not UTF-8).
- ``prometheus``: ``prometheus(targets)`` starts Debian's real Prometheus server on a free loopback
  port with a temp config scraping ``targets`` every second; returns its base URL. When it cannot
  start, the test fails under CI / ``FLEETMEDIC_REQUIRE_SERVICES=1`` with the log tail, and is
  skipped with the reason otherwise (as tests/conftest.py does for Kafka and Kubernetes);
  tests/connectors/helpers_prometheus.py starts and stops it.
- ``connector_settings``: ``connector_settings(**sections)`` -> Settings on the test broker with a
  unique topic prefix.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fleetmedic.config import Settings, parse_config
from tests.connectors.helpers_prometheus import start_prometheus, stop_prometheus


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
        url, p = start_prometheus(tmp_path, targets)
        started.append(p)
        return url

    yield start
    for p in started:
        stop_prometheus(p)
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
