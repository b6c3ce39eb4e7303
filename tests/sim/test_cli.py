"""``fleetmedic simulate`` writes the records, truth, meta and accounting (and Prometheus exposition
on request) that ``fleetmedic score`` and the backtest read; ``score`` prints the table and writes
JSON; bad input exits 2 with a message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetmedic.cli.main import main
from fleetmedic.evaluation.truth import read_meta, read_truth
from fleetmedic.records import (
    GpuTelemetry,
    Incident,
    JobEvent,
    PortTelemetry,
    RemediationCommand,
    Suspect,
    decode,
    encode,
)


def test_simulate_writes_records_truth_and_exposition(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    rc = main(["simulate", "--nodes", "4", "--duration", "20m", "--seed", "3", "--faults", "xid79@5m,straggler@6m",
               "--format", "both", "--prom-every", "5m", "--out", str(out)])
    assert rc == 0
    assert "GPU records" in capsys.readouterr().out
    for name in ("gpu.jsonl", "ports.jsonl", "jobs.jsonl", "results.jsonl", "truth.jsonl", "meta.json",
                 "accounting.json", "prom/gpu.prom", "prom/ports.prom"):
        assert (out / name).is_file(), name
    first = (out / "gpu.jsonl").read_bytes().splitlines()[0]
    assert decode(GpuTelemetry, first).node.startswith("gpu-node-")
    decode(PortTelemetry, (out / "ports.jsonl").read_bytes().splitlines()[0])
    decode(JobEvent, (out / "jobs.jsonl").read_bytes().splitlines()[0])
    truth = read_truth(out / "truth.jsonl")
    assert [t.kind for t in truth] == ["xid79", "straggler"]
    meta = read_meta(out / "meta.json")
    assert len(meta.nodes) == 4 and meta.end - meta.start == 1200
    assert "effective_training_time_ratio" in json.loads((out / "accounting.json").read_text())


def test_score_prints_a_table_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["simulate", "--nodes", "4", "--duration", "20m", "--seed", "1", "--faults", "xid48@5m/gpu-node-0002/1",
                 "--out", str(out)]) == 0
    (t,) = read_truth(out / "truth.jsonl")
    inc = Incident(id="i1", incident_class="hardware", suspects=[Suspect(kind="gpu", name="gpu-node-0002/1")],
                   confidence=0.9, evidence=[], first_seen=t.onset + 12, status="open")
    cmd = RemediationCommand(id="c1", action="cordon", incident_id="i1", reason="dbe", issued_at=t.onset + 15,
                             expires_at=t.onset + 300, node="gpu-node-0002")
    mixed = tmp_path / "decisions.jsonl"
    mixed.write_bytes(encode(inc) + b"\n" + encode(cmd) + b"\n")
    capsys.readouterr()
    rc = main(["score", "--truth", str(out / "truth.jsonl"), "--incidents", str(mixed), "--commands", str(mixed),
               "--out", str(tmp_path / "score")])
    assert rc == 0
    text = capsys.readouterr().out
    assert "xid48" in text and "top-1 100.0%" in text and "software faults that led to node isolation: 0" in text
    rep = json.loads((tmp_path / "score" / "score.json").read_text())
    assert rep["recall"] == 1.0 and rep["delay_p50_s"] == 12.0 and rep["isolation"]["justified"] == 1


def test_commands_replay_changes_the_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmds = tmp_path / "cmds.jsonl"
    cmds.write_bytes(encode(RemediationCommand(id="c1", action="cordon", incident_id="x", reason="r",
                                               issued_at=1_767_225_600 + 60, expires_at=1_767_225_600 + 600,
                                               node="gpu-node-0001")) + b"\n")
    assert main(["simulate", "--nodes", "4", "--duration", "5m", "--faults", "none", "--commands", str(cmds),
                 "--out", str(out)]) == 0
    results = (out / "results.jsonl").read_text().splitlines()
    assert len(results) == 1 and json.loads(results[0])["outcome"] == "applied"


@pytest.mark.parametrize("args", [["--faults", "nosuchkind"], ["--duration", "soon"], ["--sku", "v100"]])
def test_bad_input_exits_2(tmp_path: Path, args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(["simulate", "--nodes", "2", "--out", str(tmp_path), *args])
    except SystemExit as exc:  # argparse refuses unparsable values itself
        code = int(exc.code or 0)
    assert code == 2
    assert "error" in capsys.readouterr().err


def test_list_kinds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--list-kinds"]) == 0
    text = capsys.readouterr().out
    assert "leaf_switch" in text and "negative_control" in text
