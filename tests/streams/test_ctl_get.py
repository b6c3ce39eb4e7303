"""``fleetmedic ctl get nodes|incidents|breaker`` on the real broker, against a real worker run:
an XID-79 storm on half of an 8-node fleet trips the breaker (lost GPUs are isolated anyway); what
``ctl get`` folds from the decision stage's topics must agree with the engine's own gauges on the
worker's metrics page (nodes by lifecycle state, the breaker), name the incidents the nodes are held
for, and say why; after ``ctl resume-breaker`` it shows the breaker closed by the operator. The CLI
runs as a subprocess pointed at the run's broker and topic prefix by environment overrides, as an
operator would run it. (The pure folding is covered by the CLI tests' own cases below.)"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from fleetmedic import records as r
from fleetmedic.cli import main as cli
from fleetmedic.cli.ctl_get import fold_breaker, fold_nodes, format_breaker, format_nodes, held
from fleetmedic.devenv.kafka import produce
from fleetmedic.devenv.synth import gpu_message
from fleetmedic.streams.app import ensure_topics
from tests.streams.helpers_harness import OPERATOR_KEY, Run, collect_sync, new_run, wait_for_log, worker
from tests.streams.helpers_worker import scrape

N = 8
NODES = [f"gpu-node-{i}" for i in range(N)]
STORM = NODES[:4]  # trips the breaker: max(trip_min_nodes=3, 10% of 8)


def _ctl(run: Run, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETMEDIC")}
    env.update(FLEETMEDIC_OPERATOR_KEY=OPERATOR_KEY,
               FLEETMEDIC__KAFKA__BOOTSTRAP_SERVERS=run.settings.kafka.bootstrap_servers,
               FLEETMEDIC__TOPICS__PREFIX=run.settings.topics.prefix)
    return subprocess.run([sys.executable, "-m", "fleetmedic.cli.main", "ctl", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def _get(run: Run, what: str, *args: str) -> Any:
    """``ctl get WHAT --json`` through the CLI's entry point in this process (a subprocess costs
    seconds of interpreter start on a busy machine; `_ctl` runs the table views as one)."""
    env = {"FLEETMEDIC__KAFKA__BOOTSTRAP_SERVERS": run.settings.kafka.bootstrap_servers,
           "FLEETMEDIC__TOPICS__PREFIX": run.settings.topics.prefix}
    out = io.StringIO()
    with mock.patch.dict(os.environ, env), contextlib.redirect_stdout(out):
        rc = cli.main(["ctl", "get", what, "--json", *args])
    assert rc == 0
    return json.loads(out.getvalue())


def _engine_states(page: str) -> dict[str, int]:
    """fleetmedic_nodes{state} from the worker's metrics page, the states that are not healthy."""
    out = {}
    for line in page.splitlines():
        if line.startswith('fleetmedic_nodes{state="') and not line.startswith('fleetmedic_nodes{state="healthy"'):
            state = line.split('"')[1]
            if float(line.split()[-1]):
                out[state] = int(float(line.split()[-1]))
    return out


def _gauge(page: str, name: str) -> float | None:
    for line in page.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return None


def test_ctl_get_shows_what_the_decision_stage_holds_and_agrees_with_the_engine(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    run = new_run(kafka_bootstrap, tmp_path, extra="safety: {max_quarantined_fraction: 0.5, max_per_rack: 8}\n")
    asyncio.run(ensure_topics(run.settings))
    t0 = time.time()
    audit = run.topic("remediation.audit")
    observations = [r.NodeObservation(node=n, ts=t0 - 60, labels={"fleetmedic.io/rack": f"r{i // 4}"})
                    for i, n in enumerate(NODES)]
    asyncio.run(produce(kafka_bootstrap, [(run.topic("cluster.nodes"), o.node.encode(), r.encode(o))
                                          for o in observations]))
    with worker(run) as proc:
        wait_for_log(run, proc, "[^Worker]: Ready", timeout=60)
        rng = np.random.default_rng(3)
        storm = [gpu_message(n, t0 + k, rng, xids=[r.XidEvent(gpu=1, xid=79, ts=t0 + k)]) for k, n in enumerate(STORM)]
        gpu = run.topic("telemetry.gpu")
        asyncio.run(produce(kafka_bootstrap, [(gpu, m.node.encode(), r.encode(m)) for m in storm]))
        collect_sync(kafka_bootstrap, [audit], lambda c: any(
            r.decode(r.AuditRecord, v).decision == "breaker_tripped" for v in c.values(audit)), timeout=60)

        # the CLI's view and the engine's gauges agree (both move at the engine's ticks: wait for it)
        deadline = time.monotonic() + 40
        while True:
            page = scrape(run.log.read_text())
            nodes = _get(run, "nodes")
            mine = Counter(v["state"] for v in nodes)
            if dict(mine) == _engine_states(page) and _gauge(page, "fleetmedic_breaker_open") == 1.0:
                break
            assert time.monotonic() < deadline, f"ctl get nodes {dict(mine)}, the engine {_engine_states(page)}"
            time.sleep(0.5)
        breaker = _get(run, "breaker")
        incidents = _get(run, "incidents")
        table = _ctl(run, "get", "nodes")
        assert table.returncode == 0, table.stderr

        resume = _ctl(run, "resume-breaker", "--actor", "carol", "--reason", "exporter rollout fixed")
        assert resume.returncode == 0, resume.stderr
        collect_sync(kafka_bootstrap, [audit], lambda c: any(
            r.decode(r.AuditRecord, v).decision == "breaker_resumed" for v in c.values(audit)), timeout=60)
        closed = _get(run, "breaker")

    # every storm node is held (the lost GPUs pass the open breaker), none of the others
    by_node = {v["node"]: v for v in nodes}
    assert set(by_node) == set(STORM), sorted(by_node)
    for v in nodes:
        assert v["state"] in ("suspect", "quarantined", "diagnosing", "repair_needed"), v
        assert v["incident_id"] and v["why"] and v["since"] >= t0 - 1, v
    # the incidents they are held for are open incidents naming them
    open_ids = {i["id"]: i for i in incidents}
    for v in nodes:
        inc = open_ids[v["incident_id"]]
        assert inc["status"] in ("open", "mitigating")
        assert {"kind": "node", "name": v["node"]} in inc["suspects"], inc
    # the breaker: open, and why (the rule that tripped)
    assert breaker["open"] is True and breaker["trips"] == 1 and breaker["actor"] == "fleetmedic"
    assert "circuit breaker open" in breaker["why"] and breaker["budget"]["fleet_size"] == N
    # the table: a header and one line per held node, with its state and incident
    lines = table.stdout.splitlines()
    assert lines[0].split()[:4] == ["NODE", "STATE", "SINCE", "INCIDENT"]
    for v in nodes:
        (line,) = [ln for ln in lines if ln.startswith(v["node"] + " ")]
        assert v["state"] in line and v["incident_id"] in line
    # after the operator resumed it: closed, by whom and why
    assert closed["open"] is False and closed["trips"] == 1
    assert closed["actor"] == "operator:carol" and "exporter rollout fixed" in closed["why"]


def _get_error(bootstrap: str, prefix: str, what: str) -> tuple[int, str]:
    env = {"FLEETMEDIC__KAFKA__BOOTSTRAP_SERVERS": bootstrap, "FLEETMEDIC__TOPICS__PREFIX": prefix}
    err = io.StringIO()
    with mock.patch.dict(os.environ, env), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(["ctl", "get", what])
    return rc, err.getvalue()


def test_ctl_get_names_a_missing_topic_and_an_unreachable_broker(kafka_bootstrap: str, tmp_path: Path) -> None:
    run = new_run(kafka_bootstrap, tmp_path)  # a fresh prefix: nothing has written its topics
    rc, err = _get_error(kafka_bootstrap, run.settings.topics.prefix, "nodes")
    assert rc == 3 and err.count("\n") == 1, err
    assert f"topic {run.topic('remediation.audit')} does not exist" in err
    rc, err = _get_error("127.0.0.1:1", "x.", "breaker")
    assert rc == 1 and err.startswith("error: could not read x.remediation.audit from Kafka") and err.count("\n") == 1


def _audit(i: int, decision: r.AuditDecision, node: str = "", **kw: Any) -> r.AuditRecord:
    return r.AuditRecord(id=f"audit-{i:04d}", ts=1000.0 + i, decision=decision, explanation=f"{decision} {i}",
                         node=node, **kw)


def test_folding_the_audit_log_keeps_the_last_state_the_incident_and_the_refusal() -> None:
    budget = r.BudgetSnapshot(held=1, max_held=4, new_in_window=1, max_new_in_window=8, fleet_size=16,
                              breaker_open=True)
    log = [
        _audit(1, "state_change", "a", state_from="healthy", state_to="suspect", incident_id="inc-1"),
        _audit(2, "incident", "a", incident_id="inc-1", incident_class="hardware_gpu"),
        _audit(3, "state_change", "a", state_from="suspect", state_to="quarantined", incident_id="inc-1"),
        _audit(4, "state_change", "b", state_from="healthy", state_to="suspect", incident_id="inc-2"),
        _audit(5, "breaker_tripped", budget=budget),
        _audit(6, "blocked", "b", incident_id="inc-2", budget=budget),
        _audit(6, "blocked", "b", incident_id="inc-2", budget=budget),  # rebuilt after a restart: once
        _audit(7, "state_change", "c", state_from="healthy", state_to="suspect", incident_id="inc-3"),
        _audit(8, "command", "c", state_from="suspect", state_to="healthy", incident_id="inc-3"),
    ]
    nodes = fold_nodes(log)
    assert [v.node for v in held(nodes)] == ["a", "b"]  # c is healthy again; the quarantined one first
    a, b = nodes["a"], nodes["b"]
    assert (a.state, a.since, a.incident_id, a.incident_class, a.refused) == ("quarantined", 1003.0, "inc-1",
                                                                               "hardware_gpu", False)
    assert (b.state, b.refused, b.decision, b.why) == ("suspect", True, "blocked", "blocked 6")
    assert nodes["c"].incident_id == "" and [v.node for v in held(nodes, everything=True)] == ["a", "b", "c"]
    breaker = fold_breaker(log)
    assert breaker.open and breaker.trips == 1 and breaker.since == 1005.0 and breaker.refused == ["b"]
    # b isolated after all: no longer refused; the breaker resumed by an operator
    log += [_audit(9, "state_change", "b", state_from="suspect", state_to="quarantined"),
            _audit(10, "breaker_resumed", actor="operator:carol")]
    assert not fold_nodes(log)["b"].refused
    breaker = fold_breaker(log)
    assert not breaker.open and breaker.actor == "operator:carol" and breaker.refused == []
    text = format_breaker(breaker, now=1070.0)
    assert text.startswith("breaker:  closed since 1970-01-01 00:16:50 (60s ago)") and "operator:carol" in text
    assert "budget:   1/4 held on preventive or uncertain evidence, 1/8 new in the window, fleet of 16" in text
    table = format_nodes(held(fold_nodes(log)), now=1070.0).splitlines()
    assert table[0].split() == ["NODE", "STATE", "SINCE", "INCIDENT", "CLASS", "LAST", "DECISION", "WHY"]
    assert table[1].split()[:2] == ["a", "quarantined"] and "inc-1" in table[1] and "hardware_gpu" in table[1]
