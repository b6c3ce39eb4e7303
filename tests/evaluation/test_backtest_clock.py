"""``backtest`` judges each record against the wall clock as the live stages do: a record stamped
more than ``streams.max_future_skew_s`` ahead of it (a sample stamped in 2096) is refused and
counted; it moves no clock, so the commands of the run expire when they would without it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from fleetmedic import records as r
from fleetmedic.cli.main import main
from fleetmedic.config import Settings
from fleetmedic.devenv.synth import gpu_message
from fleetmedic.evaluation.backtest import Backtest
from tests.evaluation.helpers_inputs import T0, prom_lines, write_jsonl

FAR = 3_990_000_000.0  # 2096-06


def test_a_sample_stamped_in_2096_is_refused_counted_and_moves_no_clock(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    write_jsonl(inputs / "gpu.jsonl")
    rng = np.random.default_rng(5)
    (inputs / "future.jsonl").write_bytes(r.encode(gpu_message("node-1", FAR, rng)) + b"\n")
    out = tmp_path / "out"
    assert main(["backtest", "--input", str(inputs), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    reason = "GpuTelemetry: stamped more than streams.max_future_skew_s (300 s) ahead of the wall clock"
    assert summary["skipped"][reason] == 1 and summary["records"]["GpuTelemetry"] == 6 * 160
    commands = [r.decode(r.RemediationCommand, line) for line in (out / "commands.jsonl").read_bytes().splitlines()]
    assert commands and all(c.expires_at < time.time() for c in commands)  # not in 2096
    assert all(c.issued_at < T0 + 3600 for c in commands)


def test_an_exposition_sample_stamped_in_2096_is_refused_and_the_rest_is_read(tmp_path: Path) -> None:
    lines = prom_lines()
    future = f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",Hostname="dgx-1"}} 55 {int(FAR * 1000)}'
    (tmp_path / "dcgm.prom").write_text("\n".join([lines[0], lines[1], future, *lines[2:]]) + "\n")
    out = tmp_path / "out"
    assert main(["backtest", "--input", str(tmp_path / "dcgm.prom"), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["records"]["GpuTelemetry"] == 40  # every scrape of the file
    assert sum(k for reason, k in summary["skipped"].items() if "ahead of the wall clock" in reason) == 1


def test_the_backtest_takes_its_clock_from_the_caller() -> None:
    bt = Backtest(Settings(), clock=lambda: T0)
    assert bt.feed(gpu_message("n", T0 + 299, np.random.default_rng(1)))
    assert not bt.feed(gpu_message("n", T0 + 301, np.random.default_rng(1)))
    assert sum(bt.ahead.values()) == 1 and bt.counts["GpuTelemetry"] == 1
