"""Alert rules, scrape config and Grafana dashboard (deploy/prometheus, deploy/grafana): promtool
accepts them, and every metric they query is one that fleetmedic really exports (collected from
the metric classes of the worker, the engine gauges, the executor, the connectors and the job
watcher, registered on a fresh registry); several clusters on one Prometheus and one Grafana: every
alert groups by `cluster`, and every dashboard query filters by its `cluster` variable."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from tests.conftest import require_tool

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
METRIC = re.compile(r"\bfleetmedic_[a-z0-9_]+\b")


def exported_metric_names() -> set[str]:
    from fleetmedic.config import Settings
    from fleetmedic.connectors.kube.jobs import JobWatchMetrics
    from fleetmedic.connectors.runtime import ConnectorMetrics
    from fleetmedic.executor.metrics import ExecutorMetrics
    from fleetmedic.remediation.engine import DecisionEngine
    from fleetmedic.streams.engine_metrics import EngineMetrics
    from fleetmedic.streams.metrics import PipelineMetrics

    # one registry per process kind: a worker and the executor both export
    # fleetmedic_record_errors_total{stage}, as each process exports its own process_* series
    registries = [CollectorRegistry() for _ in range(4)]
    PipelineMetrics(registries[0])
    engine = DecisionEngine(Settings())
    # the engine's counters are exported from its first report on (tick)
    EngineMetrics(registries[0]).update(engine.report(0.0), [], engine.accounting.recoveries())
    ExecutorMetrics(registries[1])
    ConnectorMetrics(registries[2], "test")
    JobWatchMetrics(registries[3])
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "summary": ("_count", "_sum")}
    names: set[str] = set()
    for registry in registries:
        for family in registry.collect():
            names.add(family.name)
            names.update(family.name + s for s in suffixes.get(family.type, ()))
    return names


def promtool() -> str:
    return require_tool("promtool", why="Debian's prometheus package; scripts/test installs it")


def _alert_exprs() -> list[tuple[str, str]]:
    doc = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    return [(rule["alert"], rule["expr"]) for group in doc["groups"] for rule in group["rules"]]


def _dashboard_exprs() -> list[tuple[str, str]]:
    dash: dict[str, Any] = json.loads((DEPLOY / "grafana" / "fleetmedic-dashboard.json").read_text())
    out = []
    for panel in dash["panels"]:
        assert panel["targets"], panel["title"]
        out += [(panel["title"], t["expr"]) for t in panel["targets"]]
    return out


@pytest.mark.promtool
def test_promtool_accepts_the_rules_and_the_scrape_config(tmp_path: Path) -> None:
    tool = promtool()
    rules = subprocess.run([tool, "check", "rules", str(DEPLOY / "prometheus" / "alerts.yml")],
                           capture_output=True, text=True, timeout=60)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert f"SUCCESS: {len(_alert_exprs())} rules found" in rules.stdout + rules.stderr
    # Debian's Prometheus build leaves out the Kubernetes service discovery plugin, so its promtool
    # cannot parse `kubernetes_sd_configs`: check the scrape config with that block swapped for a
    # file_sd block (everything else - relabelling, rule files - is checked as shipped).
    doc = yaml.safe_load((DEPLOY / "prometheus" / "scrape.yml").read_text())
    for job in doc["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
        job["file_sd_configs"] = [{"files": [str(tmp_path / "targets.json")]}]
    doc["rule_files"] = [str(DEPLOY / "prometheus" / f) for f in doc["rule_files"]]
    checked = tmp_path / "scrape.yml"
    checked.write_text(yaml.safe_dump(doc))
    config = subprocess.run([tool, "check", "config", str(checked)], capture_output=True, text=True, timeout=60)
    assert config.returncode == 0, config.stdout + config.stderr


def test_the_alerts_cover_what_an_operator_must_know() -> None:
    alerts = {name for name, _ in _alert_exprs()}
    assert {"FleetmedicBreakerOpen", "FleetmedicQuarantineBudgetNearlyUsed", "FleetmedicConsumerLagGrowing",
            "FleetmedicExecutorFailures", "FleetmedicNodeStuckInQuarantine"} <= alerts


@pytest.mark.parametrize("source", ["alerts", "dashboard"])
def test_every_queried_metric_is_exported(source: str) -> None:
    exported = exported_metric_names()
    exprs = _alert_exprs() if source == "alerts" else _dashboard_exprs()
    missing = {(where, m) for where, expr in exprs for m in METRIC.findall(expr) if m not in exported}
    assert not missing, f"queried but not exported: {sorted(missing)}"
    used = {m for _, expr in exprs for m in METRIC.findall(expr)}
    assert len(used) >= (8 if source == "alerts" else 15)


def test_dashboard_shows_the_issue_panels() -> None:
    dash = json.loads((DEPLOY / "grafana" / "fleetmedic-dashboard.json").read_text())
    titles = " | ".join(p["title"] for p in dash["panels"]).lower()
    for needle in ("lifecycle state", "incidents by class", "commands", "results", "lag", "mttr",
                   "dangerous but schedulable"):
        assert needle in titles, needle
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.promtool
def test_every_alert_fires_and_stays_quiet_as_its_unit_test_says() -> None:
    """``promtool test rules`` over deploy/prometheus/alerts.test.yml: input series, the alerts
    expected (labels and rendered annotations) and the moments none is expected, for every alert."""
    tests = yaml.safe_load((DEPLOY / "prometheus" / "alerts.test.yml").read_text())
    covered = {case["alertname"] for t in tests["tests"] for case in t["alert_rule_test"]
               if case["exp_alerts"]}
    assert covered == {name for name, _ in _alert_exprs()}, "every alert needs a case where it fires"
    run = subprocess.run([promtool(), "test", "rules", "alerts.test.yml"], cwd=DEPLOY / "prometheus",
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_scrape_config_keeps_fleetmedics_own_node_label() -> None:
    doc = yaml.safe_load((DEPLOY / "prometheus" / "scrape.yml").read_text())
    for job in doc["scrape_configs"]:
        assert job.get("honor_labels") is True, job["job_name"]
        assert "node" not in {r.get("target_label") for r in job["relabel_configs"]}, job["job_name"]


def _operations_alert_table() -> set[str]:
    text = (DEPLOY.parent / "docs" / "operations.md").read_text()
    section = text.split("## 5. When an alert fires", 1)[1].split("\n### ", 1)[0]
    return set(re.findall(r"^\| `(Fleetmedic[A-Za-z]+)` \|", section, flags=re.M))


def test_the_operators_guide_has_one_row_per_alert_rule_and_no_other() -> None:
    assert _operations_alert_table() == {name for name, _ in _alert_exprs()}


def test_the_charts_alert_rules_are_the_shipped_ones() -> None:
    shipped = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    assert (DEPLOY / "helm" / "fleetmedic" / "files" / "alerts.yml").read_text() == shipped


# --- several clusters: the `cluster` label (cluster.name) -----------------------------------------

SELECTOR = re.compile(r"\b(fleetmedic_[a-z0-9_]+)(\{[^}]*\})?")
AGGREGATION = re.compile(r"\b(sum|max|min|avg|count)\s*(?:by\s*\(([^)]*)\))?\s*\(")


def test_the_dashboard_has_a_cluster_variable_over_an_exported_metric_with_all_matching_unlabelled_series() -> None:
    dash = json.loads((DEPLOY / "grafana" / "fleetmedic-dashboard.json").read_text())
    (var,) = [v for v in dash["templating"]["list"] if v["name"] == "cluster"]
    assert var["type"] == "query" and var["includeAll"] and var["multi"]
    assert var["allValue"] == ".*"  # All matches a fleetmedic without cluster.name (no label) too
    m = re.fullmatch(r"label_values\((fleetmedic_[a-z0-9_]+), cluster\)", var["query"]["query"])
    assert m and m.group(1) in exported_metric_names() and var["definition"] == var["query"]["query"]
    assert var["datasource"]["uid"] == "${datasource}"


def test_every_dashboard_query_filters_every_metric_by_the_cluster_variable() -> None:
    unfiltered = [(where, m.group(0)) for where, expr in _dashboard_exprs() for m in SELECTOR.finditer(expr)
                  if 'cluster=~"$cluster"' not in (m.group(2) or "")]
    assert not unfiltered, unfiltered
    assert len(_dashboard_exprs()) >= 20


def test_every_alert_aggregates_by_cluster() -> None:
    """Several clusters on one Prometheus alert apart (alerts.test.yml has the case)."""
    for name, expr in _alert_exprs():
        groupings = AGGREGATION.findall(expr)
        assert groupings, name
        for op, by in groupings:
            assert "cluster" in [label.strip() for label in by.split(",")], f"{name}: {op} by ({by})"

