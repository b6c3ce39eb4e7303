"""``fleetmedic backtest --prometheus URL --start T --end T``: the history a real Prometheus server
holds (Debian's prometheus, loaded through ``promtool tsdb create-blocks-from openmetrics``, never a
mock), read through chunked range queries, gives the same records and findings as the same
telemetry read from a file; retries ride over a server that fails for a while; a query the server
refuses is an error naming its reason."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fleetmedic import records as r
from fleetmedic.cli.main import main
from fleetmedic.config import parse_config
from fleetmedic.connectors.prometheus.history import History
from tests.connectors.helpers_prometheus import load_openmetrics

STEP = 30
SPAN = 2 * 3600  # two hours of history: two TSDB blocks
NODES = ("gpu-node-1", "gpu-node-2")
SICK = ("gpu-node-2", 5)  # a double-bit ECC error from the second hour on


def history_om(start: int) -> str:
    """dcgm-exporter and node-exporter series, as Prometheus stores them after scraping (target
    labels ``instance``/``job`` added), every 30 s over two hours, in OpenMetrics."""
    out: list[str] = []
    for series, kind in (("DCGM_FI_DEV_GPU_TEMP", "gauge"), ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter"),
                         ("DCGM_FI_DEV_XID_ERRORS", "gauge")):
        out.append(f"# TYPE {series} {'unknown' if kind == 'counter' else kind}")  # dcgm's names have no _total
        for node in NODES:
            for g in range(8):
                lab = (f'gpu="{g}",UUID="GPU-{node}-{g}",device="nvidia{g}",modelName="NVIDIA H100 80GB HBM3",'
                       f'Hostname="{node}",instance="{node}:9400",job="dcgm-exporter"')
                if series.endswith("XID_ERRORS"):
                    lab += ',err_code="0",err_msg="No Error"'
                for k in range(0, SPAN, STEP):
                    if series.endswith("TEMP"):
                        value: float = 55 + g + (k % 300) / 300
                    elif series.endswith("DBE_VOL_TOTAL"):
                        value = 2 if (node, g) == SICK and k >= SPAN // 2 else 0
                    else:
                        value = 0
                    out.append(f"{series}{{{lab}}} {value} {start + k}")
    out.append("# TYPE node_infiniband_symbol_error counter")
    for node in NODES:
        for k in range(0, SPAN, STEP):
            out.append(f'node_infiniband_symbol_error_total{{device="mlx5_0",port="1",instance="{node}:9100",'
                       f'job="node-exporter"}} 0 {start + k}')
    out.append("# TYPE node_infiniband_state_id gauge")
    for node in NODES:
        for k in range(0, SPAN, STEP):
            out.append(f'node_infiniband_state_id{{device="mlx5_0",port="1",instance="{node}:9100",'
                       f'job="node-exporter"}} 4 {start + k}')
    out.append("# EOF")
    return "\n".join(out) + "\n"


@pytest.fixture
def loaded_prometheus(tmp_path: Path, prometheus: Callable[[list[str]], str],
                      fixture_exporter: Callable[[Callable[[int], str]], str]) -> Iterator[tuple[str, int, Path]]:
    """A real Prometheus server whose TSDB holds :func:`history_om` (ending an hour ago); also
    returns the OpenMetrics file it was made from."""
    start = (int(time.time()) - SPAN - 3600) // STEP * STEP
    om = tmp_path / "history.om"
    om.write_text(history_om(start))
    load_openmetrics(om, tmp_path)
    url = prometheus([fixture_exporter(lambda n: "")])  # the fixture's server, on the TSDB made above
    yield url, start, om


def _findings(out: Path) -> set[tuple[str, str, int | None]]:
    return {(f.node, f.detector, f.gpu) for f in
            (r.decode(r.Finding, line) for line in (out / "findings.jsonl").read_bytes().splitlines())}


def test_history_from_a_real_prometheus_gives_the_same_records_and_findings_as_the_file(
        loaded_prometheus: tuple[str, int, Path], tmp_path: Path) -> None:
    url, start, om = loaded_prometheus
    end = start + SPAN - STEP
    from_server, from_file = tmp_path / "server", tmp_path / "file"
    assert main(["backtest", "--prometheus", url, "--start", str(start),
                 "--end", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end)),  # RFC 3339 and Unix seconds
                 "--step", "30s", "--out", str(from_server)]) == 0
    assert main(["backtest", "--input", str(om), "--out", str(from_file)]) == 0
    served = json.loads((from_server / "summary.json").read_text())
    filed = json.loads((from_file / "summary.json").read_text())
    steps = SPAN // STEP
    assert served["records"] == filed["records"] == {"GpuTelemetry": 2 * steps, "PortTelemetry": 2 * steps}
    assert served["skipped_total"] == 0 and served["prometheus"]["queries"] == 2  # an hour a query
    assert served["prometheus"]["points"] == steps * (2 * 8 * 3 + 2 * 2)
    found = _findings(from_server)
    assert ("gpu-node-2", "hard_rules", 5) in found, found
    assert found == _findings(from_file)
    assert not any(node == "gpu-node-1" for node, _, _ in found)


def test_range_queries_are_chunked_under_the_points_limit(loaded_prometheus: tuple[str, int, Path]) -> None:
    url, start, _ = loaded_prometheus
    settings = parse_config("exporters: {prometheus: {range_max_points: 50}}")
    h = History(settings, url, start, start + SPAN - STEP, STEP)
    recs = list(h.records())
    assert h.queries == len(h.chunks) == 5  # 240 steps, 50 points a query
    assert [x.ts for x in recs if isinstance(x, r.GpuTelemetry) and x.node == "gpu-node-1"] == [
        float(start + k) for k in range(0, SPAN, STEP)]
    gpu = next(x for x in recs if isinstance(x, r.GpuTelemetry))
    assert gpu.gpus == list(range(8)) and gpu.sku == "NVIDIA H100 80GB HBM3" and gpu.metrics.xid_errors == [0] * 8


class _Flaky:
    """A proxy in front of the real server that answers 503 to the first ``failures`` requests."""

    def __init__(self, upstream: str, failures: int) -> None:
        self.left = failures
        self.seen = 0
        flaky = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                flaky.seen += 1
                if flaky.left > 0:
                    flaky.left -= 1
                    self.send_response(503)
                    self.end_headers()
                    return
                with urllib.request.urlopen(upstream + self.path, timeout=30) as resp:
                    body = resp.read()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


def test_a_failing_server_is_retried_and_a_refused_query_names_the_servers_reason(
        loaded_prometheus: tuple[str, int, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, start, _ = loaded_prometheus
    flaky = _Flaky(url, failures=3)
    try:
        slept: list[float] = []
        h = History(parse_config(""), flaky.url, start, start + SPAN - STEP, STEP, sleep=slept.append)
        assert len([x for x in h.records() if isinstance(x, r.GpuTelemetry)]) == 2 * SPAN // STEP
        assert h.retries == 3 and slept == [1.0, 2.0, 4.0] and flaky.seen == 3 + h.queries
    finally:
        flaky.server.shutdown()
        flaky.server.server_close()
    assert main(["backtest", "--prometheus", url, "--start", str(start), "--end", str(start + 60),
                 "--match", "DCGM_FI_DEV_GPU_TEMP{", "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "HTTP 400" in err and "bad_data" in err


def test_a_range_with_no_data_exits_1(loaded_prometheus: tuple[str, int, Path], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    url, start, _ = loaded_prometheus
    assert main(["backtest", "--prometheus", url, "--start", str(start - 86400), "--end", str(start - 80000),
                 "--out", str(tmp_path / "o")]) == 1
    assert "the input yielded no records" in capsys.readouterr().err


def _answer(entries: list[tuple[dict[str, str], list[list[Any]]]]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": metric, "values": values} for metric, values in entries]}}).encode()


def _general_path(body: bytes) -> tuple[list[Any], dict[str, int]]:
    """What History did before the typed decode: json.loads, api_samples, the samples sorted by
    time through read_samples (the oracle)."""
    from fleetmedic.connectors.prometheus.api import api_samples
    from fleetmedic.connectors.prometheus.text import ExpositionReader

    reader = ExpositionReader.for_settings(parse_config(""), source="prometheus-history", ignore_unknown=True)
    samples = sorted(api_samples(json.loads(body), reader.skipped), key=lambda s: s[3] or 0.0)
    return list(reader.read_samples(samples)), dict(reader.skipped)


def _column_path(body: bytes) -> tuple[list[Any], dict[str, int]]:
    from fleetmedic.connectors.prometheus.history import matrix_columns
    from fleetmedic.connectors.prometheus.text import ExpositionReader

    reader = ExpositionReader.for_settings(parse_config(""), source="prometheus-history", ignore_unknown=True)
    return list(reader.read_columns(matrix_columns(body, reader.skipped))), dict(reader.skipped)


@pytest.mark.parametrize("odd", ["", "NaN", "+Inf", "label", "no_name", "out_of_range"])
def test_an_answer_gives_the_same_records_and_counts_through_the_typed_decode_as_through_json_loads(
        odd: str) -> None:
    """matrix_columns + read_columns (the typed msgspec decode, series by series) against the
    general reader on answers with bad points, unread series and shapes the typed decode leaves to it."""
    from collections import Counter

    from fleetmedic.connectors.prometheus.history import _typed_columns

    t0 = 1_767_000_000
    entries: list[tuple[dict[str, str], list[list[Any]]]] = []
    for node in NODES:
        for g in range(8):
            base = {"gpu": str(g), "UUID": f"GPU-{node}-{g}", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": node,
                    "instance": f"{node}:9400", "job": "dcgm-exporter"}
            for series, value in (("DCGM_FI_DEV_GPU_TEMP", "55"), ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "0"),
                                  ("DCGM_FI_DEV_XID_ERRORS", "0"), ("DCGM_FI_PROF_SM_ACTIVE", "0.5"),
                                  ("node_load1", "3")):
                entries.append(({"__name__": series, **base}, [[t0 + STEP * k, value] for k in range(6)]))
        port = {"device": "mlx5_0", "port": "1", "instance": f"{node}:9100", "job": "node-exporter"}
        for series, value in (("node_infiniband_state_id", "4"), ("node_infiniband_physical_state_id", "5"),
                              ("node_infiniband_port_data_received_bytes_total", "4096"),
                              ("node_infiniband_legacy_data_received_bytes_total", "1024")):
            entries.append(({"__name__": series, **port}, [[t0 + STEP * k, value] for k in range(6)]))
    bad_points = {"NaN": [t0 + STEP, "NaN"], "+Inf": [t0 + STEP, "+Inf"], "out_of_range": [1e12, "1"]}
    if odd in bad_points:
        entries[3][1][1] = bad_points[odd]
        entries[4][1][2] = bad_points[odd]  # an unread series' bad point: counted as "other series"
    elif odd == "label":
        entries[7][0]["job"] = "x" * 5000
    elif odd == "no_name":
        del entries[9][0]["__name__"]
    body = _answer(entries)
    got, skipped = _column_path(body)
    assert (got, skipped) == _general_path(body)
    assert len([x for x in got if isinstance(x, r.GpuTelemetry)]) == 2 * 6
    assert (_typed_columns(body, Counter()) is None) == (odd in ("label", "no_name")), \
        "the typed decode reads clean answers and bad points itself"
    assert bool(skipped) == bool(odd)
