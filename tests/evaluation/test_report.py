"""The backtest's HTML report renders its plots in a real browser (headless Chromium) without
script errors, and the harness would notice a script error if there were one."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from fleetmedic.cli.main import main
from tests.evaluation.test_backtest import prom_lines, write_jsonl


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI") == "true" or os.environ.get("FLEETMEDIC_REQUIRE_SERVICES") == "1":
            pytest.fail("chromium is not installed (scripts/test installs Debian's chromium package)")
        pytest.skip("chromium is not installed")
    return exe


def rendered_body(page: Path) -> str:
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [
                chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                "--dump-dom",
                page.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    body = re.search(r"<body[^>]*>", proc.stdout)
    assert body, proc.stdout[:500]
    return body.group(0)


def test_the_report_renders_every_plot_without_script_errors(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    write_jsonl(inputs / "gpu.jsonl")
    (inputs / "dcgm.prom").write_text("\n".join(prom_lines()) + "\n")
    page = tmp_path / "report.html"
    assert main(["backtest", "--input", str(inputs), "--out", str(tmp_path / "out"), "--report", str(page)]) == 0
    html = page.read_text()
    plots = len(re.findall(r"id='plot-\d+'", html))
    assert plots >= 1
    body = rendered_body(page)
    assert f'data-rendered="{plots}"' in body
    assert 'data-errors="0"' in body


def test_a_script_error_in_the_page_is_reported(tmp_path: Path) -> None:
    page = tmp_path / "broken.html"
    page.write_text(
        "<!doctype html><body data-rendered='0'><pre id='errors'></pre>"
        "<script>window.onerror=function(m){document.body.setAttribute('data-errors','1')};</script>"
        "<script>undefinedFunction();</script></body>"
    )
    assert 'data-errors="1"' in rendered_body(page)
