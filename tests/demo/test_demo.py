"""``fleetmedic demo``: a small simulated fleet runs through the whole pipeline with the closed loop;
it prints a timeline per fault and a summary, and writes the same as JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetmedic.cli.main import main


def test_the_demo_prints_a_timeline_and_a_summary_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "demo.json"
    code = main(["demo", "--nodes", "16", "--duration", "90m", "--seed", "3",
                 "--faults", "xid79@30m,job_bug@40m,nccl_timeout@50m", "--json", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "== xid79 [hardware" in text and "== summary" in text
    assert "fault " in text and "incident " in text and "cordon" in text
    doc = json.loads(out.read_text())
    kinds = {s["kind"]: s for s in doc["stories"]}
    assert set(kinds) == {"xid79", "job_bug", "nccl_timeout"}
    assert kinds["xid79"]["detected"]
    steps = [s["what"] for s in kinds["xid79"]["steps"]]
    assert steps[0] == "fault" and "incident" in steps and "command" in steps
    summary = doc["summary"]
    assert summary["software_faults_isolated"] == 0
    assert summary["recall"] is not None and summary["recall"] > 0
    assert "mttr" in summary["mttr_phases_p50_s"]
    # re-placements: the xid79 job is restarted by fleetmedic away from its node, inside its leaf
    placed = summary["re_placements"]
    fm = placed["fleetmedic"]
    assert fm["re_placements"] >= 1 and fm["on_suspect"] == 0 and placed["all"]["on_excluded"] == 0
    assert 0 <= fm["in_leaf"] <= fm["replacements"]
    assert placed["all"]["placements"] == sum(g["placements"] for k, g in placed.items() if k != "all")
    wait = summary["capacity_wait_s"]
    assert wait["n"] >= 1 and wait["max_s"] >= wait["p50_s"] >= 0
    assert (f"re-placements in the original leaf     fleetmedic {fm['in_leaf']}/{fm['replacements']} nodes"
            in text)
    assert f"placements on suspect nodes            {placed['all']['on_suspect']} (" in text
