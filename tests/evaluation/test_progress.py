"""Progress bars of ``backtest`` and ``simulate``: on stderr, with a total, only on a terminal or
with ``--progress``, no blank line on a short run, and stdout (the JSON summary) untouched."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tqdm import tqdm

from fleetmedic.cli.main import main
from tests.evaluation.helpers_inputs import write_jsonl


def lines_of(err: str) -> list[str]:
    """What a terminal would have shown: the text between carriage returns and newlines."""
    return [part for line in err.split("\n") for part in line.split("\r")]


def test_backtest_progress_goes_to_stderr_with_totals_and_no_blank_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_jsonl(tmp_path / "gpu.jsonl", nodes=3, ticks=40)  # a short run: well under a second
    size = (tmp_path / "gpu.jsonl").stat().st_size
    assert main(["backtest", "--input", str(tmp_path / "gpu.jsonl"), "--out", str(tmp_path / "out"), "--progress",
                 "--report", str(tmp_path / "r.html")]) == 0
    out, err = capsys.readouterr()
    summary = json.loads(out)  # stdout: the summary alone
    assert summary["records"]["GpuTelemetry"] == 120 and "\r" not in out and "%|" not in out
    records = sum(summary["records"].values())
    shown = lines_of(err)
    # the input pass and the report pass, each at 100 % of the input's bytes (in 1024-based units)
    total = tqdm.format_sizeof(size, divisor=1024)
    for phase in ("backtest", "report"):
        final = [s for s in shown if s.startswith(f"{phase}: 100%")]
        assert final and f"| {total}/{total} [" in final[-1] and f"{records} records" in final[-1], shown
    assert not err.startswith("\n") and "\n\n" not in err
    assert all(s.strip() for s in err.rstrip("\n").split("\n")), repr(err)  # no blank line


def test_no_progress_when_stderr_is_not_a_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_jsonl(tmp_path / "gpu.jsonl", nodes=3, ticks=40)
    assert main(["backtest", "--input", str(tmp_path / "gpu.jsonl"), "--out", str(tmp_path / "out")]) == 0
    out, err = capsys.readouterr()
    json.loads(out)
    assert "%|" not in err and "\r" not in err


def test_on_a_terminal_the_bar_shows_and_piped_stdout_stays_json(tmp_path: Path) -> None:
    """stderr on a real pseudo-terminal, stdout a pipe: the bar on the terminal, JSON on the pipe."""
    write_jsonl(tmp_path / "gpu.jsonl", nodes=3, ticks=40)
    leader, follower = os.openpty()
    try:
        proc = subprocess.run([sys.executable, "-m", "fleetmedic.cli", "backtest", "--input",
                               str(tmp_path / "gpu.jsonl"), "--out", str(tmp_path / "out")],
                              stdout=subprocess.PIPE, stderr=follower, timeout=120, check=False)
        os.close(follower)
        tty = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other end is closed and drained
                break
            if not chunk:
                break
            tty += chunk
    finally:
        os.close(leader)
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["records"]["GpuTelemetry"] == 120
    assert b"backtest: 100%" in tty and b"\r" not in proc.stdout
    # a pseudo-terminal nobody sized (0 x 0, as under some CI runners): still a bar, and no empty line
    assert b"\r\n\r\n" not in tty and not tty.startswith(b"\r\n"), tty


def test_simulate_progress_counts_simulated_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--nodes", "2", "--duration", "10m", "--out", str(tmp_path / "sim"), "--progress"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("simulated 2 nodes for 10m") and "%|" not in out
    final = [s for s in lines_of(err) if s.startswith("simulated time: 100%")]
    assert final and re.search(r"\b600/600\b", final[-1]), err
    assert all(s.strip() for s in err.rstrip("\n").split("\n"))
