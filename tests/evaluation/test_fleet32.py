"""Held-out telemetry through every Prometheus path, with the shipped config and no topology.

The fleet (tests/evaluation/helpers_fleet32.py, written without fleetmedic's simulator): 32
DGX-H100-like nodes over 3 h at a 30 s scrape interval in stock dcgm-exporter and node-exporter
format, with 3 hard faults, 4 degradations and 4 healthy-but-odd nodes. ``fleetmedic backtest
--config deploy/config/fleetmedic.yaml`` (the file the README tells users to copy) reads it:

1. from a text file with timestamps (scrapes appended to a file, target labels added);
2. from a real Prometheus server's history (the same history loaded with ``promtool tsdb
   create-blocks-from openmetrics``; ``--prometheus URL --start --end``);
3. from raw scrapes: each exporter's answer in a file of its own without sample timestamps,
   stamped with the file's modification time, saved as ``<node>/<exporter>-<tick>.prom``.
   node-exporter's raw answer names no node (Prometheus adds ``instance``): ``--node-from-path
   dir`` names it after the directory.

Each path must isolate (cordon or taint) every hard-fault node, at least 3 of the 4 degraded nodes
and no healthy node, and the three must isolate the same nodes."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetmedic.cli.main import main
from tests.connectors.helpers_prometheus import load_openmetrics, start_prometheus, stop_prometheus
from tests.evaluation import helpers_fleet32 as fleet32

SHIPPED = Path(__file__).parents[2] / "deploy" / "config" / "fleetmedic.yaml"
ISOLATING = ("cordon", "taint")


def isolated(out: Path) -> dict[str, str]:
    """Nodes the backtest isolated (a cordon or taint command): node -> the rule and reason of the first."""
    nodes: dict[str, str] = {}
    for line in (out / "commands.jsonl").read_text().splitlines():
        c = json.loads(line)
        if c["action"] in ISOLATING and c.get("node"):
            nodes.setdefault(c["node"], c["reason"])
    return nodes


def judge(nodes: dict[str, str]) -> list[str]:
    """What is wrong with an isolation outcome on the fleet (empty: nothing)."""
    problems = [f"hard fault not isolated: {n} ({what})" for n, what in fleet32.HARD.items() if n not in nodes]
    caught = [n for n in fleet32.DEGRADED if n in nodes]
    if len(caught) < 3:
        problems.append(f"only {len(caught)} of 4 degraded nodes isolated: {caught}")
    faulty = {*fleet32.HARD, *fleet32.DEGRADED}
    problems += [f"healthy node isolated: {n} ({fleet32.TRAPS.get(n, 'no fault')}): {why}"
                 for n, why in sorted(nodes.items()) if n not in faulty]
    return problems


def _refusals(out: Path, node: str) -> list[str]:
    return [a["explanation"] for a in map(json.loads, (out / "audit.jsonl").read_text().splitlines())
            if a.get("node") == node and a["decision"] == "blocked"][:2]


def _explain(out: Path, nodes: dict[str, str]) -> str:
    """The isolations and, for each degraded node left out, why (the audit's refusals)."""
    lines = [f"{n}: {why[:160]}" for n, why in sorted(nodes.items())]
    lines += [f"{n} not isolated ({fleet32.DEGRADED[n]}): {_refusals(out, n)}" for n in fleet32.DEGRADED
              if n not in nodes]
    return "\n".join(lines)


class Fleet32:
    """The fleet's files in ``workdir``, and each path's backtest (run once, on first use)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        span = fleet32.TICKS * fleet32.STEP
        # history ending an hour ago: a Prometheus server serves it, and no record is in the future
        self.start = (int(time.time()) - span - 3600) // fleet32.STEP * fleet32.STEP
        self.end = self.start + span - fleet32.STEP
        self.fleet = fleet32.build(self.start)
        self.outcomes: dict[str, tuple[Path, dict[str, str]]] = {}

    def backtest(self, path: str) -> tuple[Path, dict[str, str]]:
        """The backtest of ``path`` (``text``, ``prometheus``, ``raw``): its output directory and
        the nodes it isolated. Its input is written for it and removed after it."""
        if path not in self.outcomes:
            out = self.workdir / f"out-{path}"
            data = self.workdir / f"in-{path}"
            data.mkdir()
            args = ["backtest", "--config", str(SHIPPED), "--out", str(out)]
            server = None
            try:
                if path == "text":
                    args += ["--input", str(fleet32.write_exposition(self.fleet, data / "fleet.prom"))]
                elif path == "prometheus":
                    load_openmetrics(fleet32.write_openmetrics(self.fleet, data / "fleet.om"), data)
                    url, server = start_prometheus(data, [])
                    args += ["--prometheus", url, "--start", str(self.start), "--end", str(self.end),
                             "--step", "30s"]
                else:
                    raw = fleet32.write_raw_scrapes(self.fleet, data / "raw")  # <node>/<exporter>-<tick>.prom
                    args += ["--input", str(raw), "--node-from-path", "dir"]
                assert main(args) == 0
            finally:
                if server is not None:
                    stop_prometheus(server)
                shutil.rmtree(data, ignore_errors=True)
            self.outcomes[path] = out, isolated(out)
        return self.outcomes[path]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet32]:
    workdir = tmp_path_factory.mktemp("fleet32")
    yield Fleet32(workdir)
    shutil.rmtree(workdir, ignore_errors=True)


def _check(fleet: Fleet32, path: str) -> dict[str, str]:
    out, nodes = fleet.backtest(path)
    problems = judge(nodes)
    assert not problems, "\n".join(problems) + "\n" + _explain(out, nodes)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["records"]["GpuTelemetry"] > 11_000 and summary["records"]["PortTelemetry"] > 11_000
    return nodes


def test_text_files_with_timestamps_isolate_every_hard_fault_and_no_healthy_node(fleet: Fleet32) -> None:
    _check(fleet, "text")


@pytest.mark.promtool
def test_a_real_prometheus_history_isolates_every_hard_fault_and_no_healthy_node(fleet: Fleet32) -> None:
    _check(fleet, "prometheus")


def test_raw_scrapes_isolate_every_hard_fault_and_no_healthy_node(fleet: Fleet32) -> None:
    out, _ = fleet.backtest("raw")
    stamped = json.loads((out / "summary.json").read_text())["timestamps"]
    assert len(stamped) > 11_000 and {s["stamped_with"] for s in stamped.values()} == {"file modification time"}
    _check(fleet, "raw")


@pytest.mark.promtool
def test_the_three_paths_isolate_the_same_nodes(fleet: Fleet32) -> None:
    text, served, raw = (set(fleet.backtest(p)[1]) for p in ("text", "prometheus", "raw"))
    assert text == served == raw, {"text": sorted(text), "prometheus": sorted(served), "raw": sorted(raw)}


def test_the_judgement_fails_on_a_missed_fault_or_a_healthy_node_isolated() -> None:
    everything = {n: "rule" for n in (*fleet32.HARD, *fleet32.DEGRADED)}
    assert judge(everything) == []
    port_down = fleet32.node_name(15)
    missed = {n: why for n, why in everything.items() if n != port_down}
    assert judge(missed) == [f"hard fault not isolated: {port_down} ({fleet32.HARD[port_down]})"]
    two = {n: why for n, why in everything.items() if n not in list(fleet32.DEGRADED)[:2]}
    assert judge(two)[0].startswith("only 2 of 4 degraded nodes isolated")
    hot = fleet32.node_name(6)
    assert judge({**everything, hot: "rule"}) == [f"healthy node isolated: {hot} ({fleet32.TRAPS[hot]}): rule"]
