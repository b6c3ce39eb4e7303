"""``fleetmedic backtest`` and the Prometheus exposition reader: JSONL records and dcgm-exporter /
node-exporter text with timestamps give the same findings as the live path, bad lines are skipped
and counted (never fatal), and the outputs and summary are written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fleetmedic import records as r
from fleetmedic.cli.main import main
from fleetmedic.config import Settings, parse_config
from fleetmedic.connectors.prometheus.text import ExpositionReader
from fleetmedic.devenv.synth import gpu_message
from tests.evaluation.helpers_inputs import T0, prom_lines, write_jsonl


class TestExpositionReader:
    def test_groups_samples_per_node_and_timestamp_into_records(self) -> None:
        reader = ExpositionReader(Settings().ingest)
        recs = list(reader.read(prom_lines(3)))
        gpu = [x for x in recs if isinstance(x, r.GpuTelemetry)]
        ports = [x for x in recs if isinstance(x, r.PortTelemetry)]
        assert [x.ts for x in gpu] == [T0, T0 + 10, T0 + 20]
        assert gpu[0].node == "dgx-1" and gpu[0].gpus == list(range(8)) and gpu[0].sku == "NVIDIA H100 80GB HBM3"
        assert gpu[0].metrics.gpu_temp == [55 + g * 0.5 for g in range(8)]
        assert gpu[0].uuids[3] == "GPU-3"
        assert ports[0].device == "dgx-1" and ports[0].ports[0].port == "mlx5_0/1"
        assert ports[0].ports[0].link_state == "up" and ports[2].ports[0].symbol_error_counter == 100
        assert not reader.skipped

    def test_bad_lines_are_skipped_and_counted_by_reason(self) -> None:
        reader = ExpositionReader(Settings().ingest)
        lines = [
            *prom_lines(1),
            "what is this",
            'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 50 1000',
            'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="a"} NaN 1000',
            'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="a"} 9999 1000',
            "unknown_metric 1 1",
        ]
        recs = list(reader.read(lines))
        assert len([x for x in recs if isinstance(x, r.GpuTelemetry)]) == 1
        reasons = " | ".join(reader.skipped)
        assert "unparsable line" in reasons and "no node label" in reasons and "value is NaN" in reasons
        assert "DCGM_FI_DEV_GPU_TEMP: value out of range" in reasons and "unknown series unknown_metric" in reasons

    def test_the_node_label_is_configurable(self) -> None:
        ingest = parse_config("ingest: {node_labels: [node]}").ingest
        lines = ['DCGM_FI_DEV_GPU_TEMP{gpu="0",node="k8s-node-9",Hostname="pod-xyz"} 50 1000']
        assert [x.node for x in ExpositionReader(ingest).read(lines)] == ["k8s-node-9"]


def test_backtest_over_jsonl_and_prometheus_text_writes_findings_and_summary(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    write_jsonl(inputs / "gpu.jsonl")
    (inputs / "dcgm.prom").write_text("\n".join(prom_lines()) + "\n")
    out = tmp_path / "out"
    assert main(["backtest", "--input", str(inputs), "--out", str(out)]) == 0
    findings = [r.decode(r.Finding, line) for line in (out / "findings.jsonl").read_bytes().splitlines()]
    got = {(f.node, f.detector, f.gpu) for f in findings}
    assert ("node-4", "hard_rules", 6) in got  # DBE in JSONL
    assert ("dgx-1", "hard_rules", 2) in got  # DBE in exposition
    assert ("dgx-1", "xid_rules", 5) in got  # XID gauge change in exposition
    assert any(f.node == "dgx-1" and f.kind == "network" for f in findings)
    assert not any(f.node.startswith("node-") and f.node != "node-4" for f in findings)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["records"]["GpuTelemetry"] == 6 * 160 + 40
    assert summary["skipped_total"] == 2
    for name in ("incidents.jsonl", "commands.jsonl"):
        assert (out / name).exists()


def test_gzip_inputs_give_the_same_findings_and_the_other_files_of_a_directory_are_counted_as_ignored(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import gzip

    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    write_jsonl(plain / "gpu.jsonl")
    (plain / "dcgm.prom").write_text("\n".join(prom_lines()) + "\n")
    for f in plain.iterdir():
        (packed / (f.name + ".gz")).write_bytes(gzip.compress(f.read_bytes()))
    (packed / "notes.csv").write_text("a,b\n")
    (packed / "README").write_text("recorded on dgx-1\n")
    for where in (plain, packed):
        assert main(["backtest", "--input", str(where), "--out", str(tmp_path / f"out-{where.name}")]) == 0
    read = {name: json.loads((tmp_path / f"out-{name}" / "summary.json").read_text()) for name in ("plain", "packed")}
    assert read["packed"]["records"] == read["plain"]["records"]
    assert read["packed"]["findings_by_detector"] == read["plain"]["findings_by_detector"]
    assert read["plain"]["ignored_files"] == {"count": 0, "by_reason": {}}
    ignored = read["packed"]["ignored_files"]
    assert ignored["count"] == 2
    reasons = " | ".join(ignored["by_reason"])
    assert "suffix '.csv' is no input kind" in reasons and "no suffix" in reasons
    assert "note: 2 file(s) of the input directories ignored" in capsys.readouterr().err


def test_a_binary_or_non_utf8_file_among_good_ones_is_named_and_the_good_results_are_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    write_jsonl(inputs / "gpu.jsonl")
    (inputs / "dcgm.prom").write_text("\n".join(prom_lines()) + "\n")
    core = inputs / "core.prom"  # binary: not UTF-8, NULs, lines of any length
    core.write_bytes(np.random.default_rng(1).integers(0, 256, 300_000, dtype=np.uint8).tobytes())
    latin1 = inputs / "latin1.jsonl"  # one line in Latin-1, one good
    latin1.write_bytes(b'{"type":"job_event","job":"ml/caf\xe9","event":"start","ts":1790000001.0}\n'
                       + r.encode(r.JobEvent(job="ml/b", event="start", ts=T0 + 6)) + b"\n")
    out = tmp_path / "out"
    with caplog.at_level("WARNING", "fleetmedic.backtest"):
        assert main(["backtest", "--input", str(inputs), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["records"] == {"GpuTelemetry": 6 * 160 + 40, "PortTelemetry": 40, "JobEvent": 2}
    findings = {(f.node, f.detector, f.gpu) for f in map(
        lambda line: r.decode(r.Finding, line), (out / "findings.jsonl").read_bytes().splitlines())}
    assert {("node-4", "hard_rules", 6), ("dgx-1", "hard_rules", 2), ("dgx-1", "xid_rules", 5)} <= findings
    problems = summary["input_problems"]
    assert set(problems) == {str(core), str(latin1), str(inputs / "gpu.jsonl")}  # gpu.jsonl: its 2 bad lines
    assert problems[str(core)]["records"] == 0 and problems[str(core)]["problems"]["line is not UTF-8"] > 100
    assert problems[str(core)]["problems_total"] >= problems[str(core)]["lines"] - 10  # a few are blank or "#..."
    assert problems[str(latin1)] == {"lines": 2, "records": 1, "problems_total": 1,
                                     "problems": {"not valid JSON": 1}}
    assert str(inputs / "dcgm.prom") not in problems
    assert any(str(core) in m and "lines skipped" in m for m in caplog.messages)


def test_a_missing_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backtest", "--input", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_backtest_of_a_simulation_triages_decides_and_scores_against_the_truth(tmp_path: Path) -> None:
    sim = tmp_path / "sim"
    assert main(["simulate", "--nodes", "16", "--duration", "80m", "--seed", "5", "--faults",
                 "xid79@30m,xid48@40m/gpu-node-0003", "--out", str(sim)]) == 0
    out = tmp_path / "bt"
    assert main(["backtest", "--input", str(sim / "gpu.jsonl"), "--input", str(sim / "jobs.jsonl"),
                 "--input", str(sim / "ports.jsonl"), "--topology", str(sim / "meta.json"),
                 "--truth", str(sim / "truth.jsonl"), "--out", str(out)]) == 0
    incidents = [r.decode(r.Incident, x) for x in (out / "incidents.jsonl").read_bytes().splitlines()]
    commands = [r.decode(r.RemediationCommand, x) for x in (out / "commands.jsonl").read_bytes().splitlines()]
    assert {i.incident_class for i in incidents} >= {"hardware"}
    assert {"cordon", "restart_job"} <= {c.action for c in commands}
    assert any(c.node == "gpu-node-0003" for c in commands)
    score = json.loads((out / "score.json").read_text())
    assert score["recall"] == 1.0 and score["top1_accuracy"] == 1.0


def test_the_backtest_fleet_is_every_node_its_telemetry_names_as_in_production() -> None:
    """Not only the nodes that produced findings: budgets in a backtest are as strict as in production."""
    from fleetmedic.evaluation.backtest import Backtest

    rng = np.random.default_rng(1)
    bt = Backtest(Settings())
    for k in range(3):
        for i in range(32):
            bt.feed(gpu_message(f"gpu-node-{i:04d}", 1000.0 + 10 * k, rng))
    bt.feed(r.PortTelemetry(device="gpu-node-0040", device_kind="host", ts=1030.0, ports=[]))
    bt.finish()
    assert bt.engine.fleet_size == 33 and bt.engine.fleet_source == "telemetry"
    with_topology = Backtest(Settings(), topology={f"gpu-node-{i:04d}": {"rack": "r0"} for i in range(16)})
    with_topology.feed(gpu_message("gpu-node-0099", 1000.0, rng))
    assert with_topology.engine.fleet_size == 16
