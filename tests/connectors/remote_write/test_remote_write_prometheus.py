"""End to end: Debian's real Prometheus scrapes fixture exporters serving field-corpus text
(tests/data/field: two gpu-operator dcgm-exporters and node-exporter's infiniband output) and
remote-writes to ``fleetmedic exporter remote-write`` (the CLI, in its own process), which
publishes to the real broker. The remote_write block is the one docs/operations.md shows: HTTPS
with a Bearer token (the test's own CA, certificate and token), so the receiver's TLS and
credentials are checked by the real sender."""

from __future__ import annotations

import itertools
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.connectors.prometheus.text import ExpositionReader
from fleetmedic.devenv import proc, tls
from tests.conftest import unavailable
from tests.connectors.helpers_prometheus import PROMETHEUS
from tests.streams.helpers_harness import collect_sync

FIELD = Path(__file__).parents[2] / "data" / "field"
KOPS = (FIELD / "dcgm-exporter" / "kops-l4-gpu-operator.prom").read_text()
LKE = (FIELD / "dcgm-exporter" / "lke-rtx4000-gpu-operator-v25.10.0.prom").read_text()
IB = (FIELD / "node-exporter" / "e2e-output-infiniband-v1.12.1.prom").read_text()
DOCS = Path(__file__).parents[3] / "docs" / "operations.md"

pytestmark = [pytest.mark.kafka, pytest.mark.promtool]


def documented_remote_write_block() -> str:
    """The ``remote_write:`` block of docs/operations.md's tested snippet (between its markers)."""
    text = DOCS.read_text(encoding="utf-8")
    m = re.search(r"<!-- remote-write-config -->\s*```yaml\n(.*?)```", text, re.S)
    assert m, "docs/operations.md: the remote_write snippet (<!-- remote-write-config -->) is missing"
    return m.group(1)


def _wait_port(port: int, p: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.poll() is not None:
            break
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    pytest.fail(f"the receiver did not listen on {port}:\n{log.read_text(errors='replace')[-3000:]}")


def _direct(text: str, target: dict[str, str]) -> list[r.GpuTelemetry | r.PortTelemetry]:
    reader = ExpositionReader.for_settings(Settings(), ignore_unknown=True, source="prometheus-remote-write")
    return list(reader.read(text.splitlines(), default_ts=0.0, extra_labels=target))


def test_prometheus_remote_writes_field_corpus_scrapes_that_arrive_on_kafka_one_record_per_scrape(
    fixture_exporter: Callable[[Callable[[int], str]], str], kafka_bootstrap: str, tmp_path: Path
) -> None:
    if not Path(PROMETHEUS).exists():
        unavailable("Prometheus", f"{PROMETHEUS} not found (apt-get install prometheus)")
    kops, lke, ib = (fixture_exporter(lambda n, t=t: t) for t in (KOPS, LKE, IB))
    rx_port, metrics_port, prom_port = proc.free_ports(3)
    prefix = f"t{uuid.uuid4().hex[:8]}."
    ca = tls.make_ca(tmp_path / "ca")
    server = tls.issue(ca, tmp_path / "ca", "receiver")
    secrets = tmp_path / "prometheus-secrets"
    secrets.mkdir()
    token = uuid.uuid4().hex
    (secrets / "token").write_text(token + "\n")
    (secrets / "ca.crt").write_text(ca.cert.read_text())
    (tmp_path / "tokens").write_text(f"an-older-token\n{token}\n")
    config = tmp_path / "fleetmedic.yaml"
    config.write_text(f"kafka: {{bootstrap_servers: '{kafka_bootstrap}', client_id: rw-{prefix}}}\n"
                      f"topics: {{prefix: '{prefix}'}}\n"
                      "exporters: {remote_write: {assemble_s: 4.0, "
                      f"tls: {{cert_file: '{server.cert}', key_file: '{server.key}'}}, "
                      f"auth: {{bearer_tokens_file: '{tmp_path / 'tokens'}'}}}}}}\n")
    rx_log = tmp_path / "receiver.log"
    with rx_log.open("wb") as out:
        rx = subprocess.Popen([sys.executable, "-m", "fleetmedic.cli.main", "exporter", "remote-write", "--config",
                               str(config), "--listen", f"127.0.0.1:{rx_port}", "--metrics-port", str(metrics_port)],
                              stdout=out, stderr=subprocess.STDOUT)
    prom: subprocess.Popen[bytes] | None = None
    try:
        _wait_port(rx_port, rx, rx_log)
        hostport = {name: url.split("//", 1)[1].split("/", 1)[0] for name, url in
                    (("kops", kops), ("lke", lke), ("ib", ib))}
        block = documented_remote_write_block().replace("fleetmedic-remote-write:9201", f"127.0.0.1:{rx_port}")
        block = block.replace("/etc/prometheus/secrets/fleetmedic-remote-write/", f"{secrets}/")
        assert "https://" in block and "credentials_file" in block
        prom_config = tmp_path / "prometheus.yml"
        prom_config.write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: dcgm\n"
            f"    static_configs: [{{targets: ['{hostport['kops']}', '{hostport['lke']}']}}]\n"
            "  - job_name: node\n"
            f"    static_configs: [{{targets: ['{hostport['ib']}'], labels: {{node: gpu-node-1}}}}]\n"
            + block)
        prom_log = tmp_path / "prometheus.log"
        with prom_log.open("wb") as out:
            prom = subprocess.Popen([PROMETHEUS, f"--config.file={prom_config}",
                                     f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                     f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
                                    stdout=out, stderr=subprocess.STDOUT)
        topics = [f"{prefix}telemetry.gpu", f"{prefix}telemetry.port"]

        def enough(c: object) -> bool:
            gpu = [r.decode(r.GpuTelemetry, v) for v in c.values(topics[0])]  # type: ignore[attr-defined]
            nodes = defaultdict(int)
            for g in gpu:
                nodes[g.node] += 1
            return min(nodes.get(n, 0) for n in ("i-030791dc5a37cd257", "lke529760-766837-0a634ab30000")) >= 3 \
                and len(c.values(topics[1])) >= 3  # type: ignore[attr-defined]

        got = collect_sync(kafka_bootstrap, topics, enough, 45)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(timeout=20)
        rx.send_signal(signal.SIGTERM)
        try:
            rc = rx.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rx.kill()
            rc = rx.wait()
    log = rx_log.read_text(errors="replace")
    if prom is not None and not got.values(topics[0]):
        pytest.fail(f"nothing arrived.\nreceiver:\n{log[-2000:]}\nprometheus:\n{prom_log.read_text()[-2000:]}")
    assert rc == 0, log[-2000:]
    gpu = [r.decode(r.GpuTelemetry, v) for v in got.values(topics[0])]
    ports = [r.decode(r.PortTelemetry, v) for v in got.values(topics[1])]
    want = {rec.node: rec for rec in _direct(KOPS, {"instance": hostport["kops"], "job": "dcgm"})
            + _direct(LKE, {"instance": hostport["lke"], "job": "dcgm"}) if isinstance(rec, r.GpuTelemetry)}
    (want_port,) = [x for x in _direct(IB, {"instance": hostport["ib"], "job": "node", "node": "gpu-node-1"})
                    if isinstance(x, r.PortTelemetry)]
    by_node: dict[str, list[r.GpuTelemetry]] = defaultdict(list)
    for g in gpu:
        by_node[g.node].append(g)
    assert set(by_node) == set(want) == {"i-030791dc5a37cd257", "lke529760-766837-0a634ab30000"}
    for node, recs in by_node.items():
        stamps = [g.ts for g in recs]
        assert len(set(stamps)) == len(stamps), f"{node}: a scrape published twice or in parts: {stamps}"
        assert all(b - a >= 0.5 for a, b in itertools.pairwise(stamps)), stamps  # one per 1 s scrape
        for g in recs:  # each record is a whole scrape: what the exposition reader makes of the text
            assert g.source == "prometheus-remote-write" and abs(g.ts - time.time()) < 120
            assert r.encode(r.convert(r.GpuTelemetry, {**r.to_builtins(g), "ts": 0.0})) == r.encode(want[node])
    assert by_node["i-030791dc5a37cd257"][0].metrics.gpu_temp == [31.0]
    assert by_node["i-030791dc5a37cd257"][0].metrics.power_usage == [16.365]
    assert by_node["lke529760-766837-0a634ab30000"][0].metrics.power_usage == [40.979]
    for p in ports:
        assert p.device == "gpu-node-1" and len(p.ports) == 3  # the `node` label of the scrape config
        assert r.encode(r.convert(r.PortTelemetry, {**r.to_builtins(p), "ts": 0.0})) == r.encode(want_port)
    # the scrapes reached the receiver in more requests than scrapes (max_samples_per_send is small)
    requests = float(re.search(r'fleetmedic_remote_write_requests_total\{code="204"\} (\S+)', metrics).group(1))  # type: ignore[union-attr]
    assert requests > len(gpu) + len(ports)
    assert 'fleetmedic_remote_write_requests_total{code="400"}' not in metrics
    assert 'fleetmedic_remote_write_requests_total{code="401"}' not in metrics  # the documented credentials
    # write_relabel_configs kept only the series fleetmedic reads (those dcgm-exporter serves but
    # fleetmedic does not map, e.g. DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, pass it and are ignored)
    assert re.search(r'fleetmedic_remote_write_samples_total\{outcome="ignored"\} [1-9]', metrics)
    assert re.search(r'fleetmedic_connector_records_out_total\{connector="remote-write",topic="'
                     + re.escape(topics[0]) + r'"\} [1-9]', metrics)
