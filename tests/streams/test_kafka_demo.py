"""``fleetmedic demo --kafka``: the demo's simulated fleet through the real broker and a worker
subprocess; the simulator applies the commands it reads from the commands topic (closed loop)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetmedic.cli import main


def test_the_demo_runs_through_kafka_and_a_worker(kafka_bootstrap: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo.json"
    code = main(["demo", "--nodes", "16", "--duration", "90m", "--seed", "3", "--kafka", kafka_bootstrap,
                 "--faults", "xid79@30m,job_bug@40m", "--json", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "== xid79 [hardware" in text and "== summary" in text and "cordon" in text
    doc = json.loads(out.read_text())
    assert doc["fleet"]["kafka"]["bootstrap"] == kafka_bootstrap and doc["fleet"]["kafka"]["messages"] > 10_000
    kinds = {s["kind"]: s for s in doc["stories"]}
    assert kinds["xid79"]["detected"] and kinds["job_bug"]["detected"]
    steps = [s["what"] for s in kinds["xid79"]["steps"]]
    # the closed loop ran through Kafka: the simulator applied the commands and reported back
    assert steps[0] == "fault" and "incident" in steps and "command" in steps and "job recovered" in steps
    summary = doc["summary"]
    assert summary["software_faults_isolated"] == 0 and summary["recall"] == 1.0
    assert summary["commands"].get("cordon") == 1 and summary["node_states"]
