"""The backtest's HTML report in a real browser (headless Chromium): it renders its plots without
script errors (and the harness would notice one), the overview is in the first screen, the axes
are readable, marker labels do not overlap, the actions show once, and the page stays small."""

from __future__ import annotations

import html
import json
import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fleetmedic.cli.main import main
from fleetmedic.evaluation.backtest_report import planned
from fleetmedic.evaluation.report import BUCKETS, bucket
from fleetmedic.records import RemediationCommand
from tests.evaluation.helpers_browser import chromium, dump_dom
from tests.evaluation.helpers_inputs import prom_lines, write_jsonl


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


@pytest.mark.chromium
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


@pytest.mark.chromium
def test_a_script_error_in_the_page_is_reported(tmp_path: Path) -> None:
    page = tmp_path / "broken.html"
    page.write_text(
        "<!doctype html><body data-rendered='0'><pre id='errors'></pre>"
        "<script>window.onerror=function(m){document.body.setAttribute('data-errors','1')};</script>"
        "<script>undefinedFunction();</script></body>"
    )
    assert 'data-errors="1"' in rendered_body(page)


# --- the report as a person opens it: a small simulated run with its truth ------------------------------

SIM_FAULTS = "xid79@10m,fan_failure@12m,ib_ber@15m"


@pytest.fixture(scope="module")
def sim_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], Path]:
    """4 nodes x 40 min with a lost GPU, a fan failure and a bad link; node actions time out after
    300 s (there is no executor in a backtest), so the engine re-issues them and gives up."""
    d = tmp_path_factory.mktemp("simreport")
    sim = d / "sim"
    assert main(["simulate", "--nodes", "4", "--duration", "40m", "--seed", "0", "--faults", SIM_FAULTS,
                 "--noise", "none", "--out", str(sim)]) == 0
    page = d / "report.html"
    mp = pytest.MonkeyPatch()
    mp.setenv("FLEETMEDIC__POLICY__ACTION_TIMEOUT_S", "300")
    try:
        assert main(["backtest", "--input", str(sim / "gpu.jsonl"), "--input", str(sim / "ports.jsonl"),
                     "--input", str(sim / "jobs.jsonl"), "--out", str(d / "out"), "--truth", str(sim / "truth.jsonl"),
                     "--topology", str(sim / "meta.json"), "--report", str(page)]) == 0
    finally:
        mp.undo()
    summary = json.loads((d / "out" / "summary.json").read_text())
    return page, summary, d / "out"


@pytest.fixture(scope="module")
def sim_dom(sim_report: tuple[Path, dict[str, Any], Path]) -> str:
    return dump_dom(sim_report[0], 800)


def body_attrs(dom: str) -> dict[str, str]:
    body = re.search(r"<body([^>]*)>", dom)
    assert body, dom[:500]
    return dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1)))


def test_the_overview_with_links_and_score_is_in_the_first_screen(sim_report: tuple[Path, dict[str, Any], Path],
                                                                   sim_dom: str) -> None:
    """What a 1280 x 800 window shows first: the browser lays the page out and the page records
    where the overview ends (``getBoundingClientRect``) and the window's inner height."""
    _, summary, _ = sim_report
    assert summary["incidents"] >= 2
    dom = sim_dom
    attrs = body_attrs(dom)
    assert attrs["data-errors"] == "0"
    # a 1280 x 800 window leaves the page about 650 px (headless Chromium keeps room for its own bars):
    # a small laptop's first screen
    viewport = int(attrs["data-viewport-height"])
    assert 600 <= viewport <= 800
    assert 0 < int(attrs["data-overview-bottom"]) <= viewport
    # the overview comes before every section and plot, and links to each incident's section
    overview = dom.index('id="overview"')
    assert overview < dom.index("<h2") and overview < dom.index('id="plot-0"')
    box = dom[overview:dom.index("<h2")]
    for k in range(1, summary["incidents"] + 1):
        assert f'href="#incident-{k}"' in box and f'id="incident-{k}"' in dom
    score = summary["score"]
    assert "Score against the truth" in box and f"precision <b>{100 * score['precision']:.0f} %" in box
    assert f"incidents: <b>{summary['incidents']}" in box


def test_axes_have_time_ticks_rounded_values_and_units(sim_dom: str) -> None:
    svgs = re.findall(r"<svg.*?</svg>", sim_dom, re.S)
    assert svgs
    for svg in svgs:
        texts = [html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg)]
        times = [t for t in texts if re.fullmatch(r"(\d{4}-\d\d-\d\d )?\d\d:\d\d", t)]
        assert len(times) >= 3, texts  # more than the two ends
        assert any(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", t) for t in times)  # the date, once
        numbers = [t for t in texts if re.fullmatch(r"-?\d+(\.\d+)?", t)]
        assert len(numbers) >= 3 and all(len(n.partition(".")[2]) <= 2 for n in numbers), numbers
        assert any(u in texts for u in ("°C vs node median", "MHz vs node median", "per minute",
                                        "increase per sample (~10 s)")), texts


def test_marker_labels_do_not_overlap(sim_dom: str) -> None:
    """Each label's box (position and the width the browser measured for its text) is clear of the
    others' in its plot."""
    labels = 0
    for svg in re.findall(r"<svg.*?</svg>", sim_dom, re.S):
        boxes = [(float(x), float(y), float(w)) for x, y, w in re.findall(
            r'<text x="([\d.-]+)" y="([\d.-]+)" text-anchor="start" fill="[^"]*" class="mlabel" data-w="([\d.]+)"',
            svg)]
        labels += len(boxes)
        for i, (x, y, w) in enumerate(boxes):
            for x2, y2, w2 in boxes[i + 1:]:
                assert y != y2 or x + w <= x2 or x2 + w2 <= x, (x, y, w, x2, y2, w2)
    assert labels >= 4


def test_what_would_be_done_is_shown_once_without_the_executor_timeouts(
        sim_report: tuple[Path, dict[str, Any], Path]) -> None:
    page, _, out = sim_report
    cmds = [json.loads(line) for line in (out / "commands.jsonl").read_text().splitlines()]
    gave_up = [c for c in cmds if c["action"] == "escalate" and c["reason"].startswith("no result for ")]
    cordons = Counter(c["node"] for c in cmds if c["action"] == "cordon")
    assert gave_up and max(cordons.values()) > 1  # the raw commands do repeat (no executor answered)
    text = page.read_text()
    assert "no result for" not in text.replace("\"no result ... gave up\"", "")
    for node in cordons:
        assert len(re.findall(rf"<td>would cordon</td><td>{re.escape(node)}</td>", text)) == 1
    assert "escalated " in text and "commands.jsonl has every command" in text


def test_no_plot_is_repeated_and_the_page_stays_small(sim_report: tuple[Path, dict[str, Any], Path]) -> None:
    page, _, _ = sim_report
    text = page.read_text()
    data = json.loads(re.search(r"<script id='report-data' type='application/json'>(.*?)</script>", text,
                                re.S).group(1).replace("<\\/", "</"))  # type: ignore[union-attr]
    titles = [p["title"] for p in data["plots"]]
    assert titles and len(titles) == len(set(titles))
    for p in data["plots"]:  # every series cut to the plot's width, 2 characters a value
        assert all(len(a) == 2 * BUCKETS for a in p["a"].values())
    assert len(text) < 120_000


def test_series_are_cut_to_the_plot_width_whatever_the_samples() -> None:
    """A day of 1 s samples and ten of them give plots of the same size; a one-sample spike survives."""
    t0, t1 = 0.0, 86400.0
    for n in (10, 86400):
        t = [t0 + k * (t1 - t0) / n for k in range(n)]
        v: list[float | None] = [0.0] * n
        v[n // 2] = 50.0
        hi = bucket(t, v, t0, t1, "max")
        assert len(hi) == BUCKETS and max(x for x in hi if x is not None) == 50.0
        assert sum(x is not None for x in hi) == min(n, BUCKETS)


def test_planned_folds_reissues_and_give_ups() -> None:
    def cmd(i: int, action: str, at: float, reason: str = "rule hardware") -> RemediationCommand:
        return RemediationCommand(id=f"c{i}", action=action, incident_id="i", reason=reason, issued_at=at,  # type: ignore[arg-type]
                                  expires_at=at + 60, node="n1")

    plans, again, gave_up = planned([
        cmd(1, "cordon", 10), cmd(2, "drain", 10), cmd(3, "cordon", 1810), cmd(4, "drain", 1810),
        cmd(5, "escalate", 3610, "no result for cordon within 1800s; gave up after 3 attempts"),
        cmd(6, "escalate", 3620, "isolation refused (max_held)")])
    assert [(p.action, p.first, p.issued) for p in plans] == [("cordon", 10, 2), ("drain", 10, 2),
                                                               ("escalate", 3620, 1)]
    assert (again, gave_up) == (2, 1)
