"""Node actions on the in-memory cluster (tests/executor/test_cluster_contract.py holds it to the
real API server): cordon and taint with annotations, condition and Events; the command id recorded
on the node so any executor skips a repeat; a node that changed under the patch is read again; dry
run and opt-out change nothing; a cordon someone else made is never lifted; return to service only
after passing diagnostics. On the real API server: what ``kubectl describe node`` shows."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client

from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv import settings as devenv_settings
from fleetmedic.executor.fake_cluster import FakeCluster
from fleetmedic.executor.node import plan as p
from fleetmedic.executor.node.conditions import Condition
from fleetmedic.k8s_keys import (
    ANNOTATION_COMMANDS,
    ANNOTATION_CORDONED_BY,
    ANNOTATION_TAINTED_BY,
    CONDITION_QUARANTINE,
    LABEL_OPT_OUT,
    LABEL_STATE,
    TAINT_QUARANTINE,
)
from tests.conftest import require_tool
from tests.executor.helpers_executor import command, executor, fake_executor, settings


def _quarantine(cluster: FakeCluster, name: str) -> Condition | None:
    return cluster.nodes[name].conditions.get(CONDITION_QUARANTINE)


def test_cordon_and_taint_are_applied_once_explained_and_recorded_for_every_executor() -> None:
    cluster = FakeCluster()
    name = cluster.add_node("n1").name
    s = settings("fm")
    ex = fake_executor(cluster, s)
    cordon, taint = command("cordon", name), command("taint", name)
    r1, r2 = ex.handle(cordon), ex.handle(taint)
    assert (r1.outcome, r1.details["already_cordoned"], r2.outcome) == ("applied", "false", "applied")
    n = cluster.nodes[name]
    assert n.unschedulable is True
    assert {(t.key, t.effect) for t in n.taints} >= {(TAINT_QUARANTINE, "NoSchedule")}
    ann = n.annotations
    assert ann[ANNOTATION_CORDONED_BY] == "fleetmedic" and ann[ANNOTATION_TAINTED_BY] == "NoSchedule"
    assert set(p.applied_ids(n.annotations)) == {cordon.id, taint.id} and n.labels[LABEL_STATE] == "quarantined"
    cond = _quarantine(cluster, name)
    assert cond is not None and cond.status == "True" and "test taint" in cond.message
    assert {"FleetmedicCordoned", "FleetmedicTainted"} <= set(cluster.node_events(name))
    # the same command again, here or on a fresh executor (a second replica, a restart): skipped
    again = fake_executor(cluster, s, identity="other").handle(cordon)
    assert again.outcome == "skipped" and "duplicate" in again.reason
    assert ex.handle(taint).outcome == "skipped"


def test_dry_run_and_opt_out_change_nothing_and_say_why() -> None:
    cluster = FakeCluster()
    a, b = cluster.add_node("a").name, cluster.add_node("b", labels={LABEL_OPT_OUT: "true"}).name
    ex = fake_executor(cluster, settings("fm"))
    dry = ex.handle(command("taint", a, dry_run=True))
    assert dry.outcome == "skipped" and dry.dry_run
    assert "would" in dry.reason and TAINT_QUARANTINE in dry.reason
    n = cluster.nodes[a]
    assert not n.unschedulable and not any(t.key == TAINT_QUARANTINE for t in n.taints)
    assert ANNOTATION_COMMANDS not in n.annotations and not cluster.events
    whole = fake_executor(cluster, settings("fm", extra="safety: {dry_run: true}\n"))
    assert whole.handle(command("cordon", a)).reason.startswith("dry run: would cordon")
    assert not cluster.nodes[a].unschedulable
    out = ex.handle(command("cordon", b))
    assert out.outcome == "skipped" and "opts out" in out.reason and not cluster.nodes[b].unschedulable


def test_someone_elses_cordon_is_reported_and_survives_return_to_service() -> None:
    cluster = FakeCluster()
    name = cluster.add_node("n1").name
    cluster.patch_node(name, {"spec": {"unschedulable": True}})  # an operator's kubectl cordon
    ex = fake_executor(cluster, settings("fm"))
    r = ex.handle(command("cordon", name))
    assert r.outcome == "applied" and r.details["already_cordoned"] == "true"
    assert ex.handle(command("taint", name)).outcome == "applied"
    assert ex.handle(command("uncordon", name)).outcome == "skipped"
    refused = ex.handle(command("return_to_service", name, params={"uncordon": "true", "untaint": "true"}))
    assert refused.outcome == "failed" and "diagnostics" in refused.reason
    cleared = ex.handle(command("return_to_service", name, params={"actor": "alice"}))
    assert cleared.outcome == "applied" and "cordon (not fleetmedic's)" in cleared.reason
    n = cluster.nodes[name]
    assert n.unschedulable is True  # still the operator's
    assert not any(t.key == TAINT_QUARANTINE for t in n.taints)
    cond = _quarantine(cluster, name)
    assert LABEL_STATE not in n.labels and cond is not None and cond.status == "False"


def test_bad_signature_expired_and_unknown_node_are_refused_with_reasons() -> None:
    import msgspec

    cluster = FakeCluster()
    ex = fake_executor(cluster, settings("fm"))
    forged = msgspec.structs.replace(command("cordon", "some-node"), node="other-node")
    assert "signature" in ex.handle(forged).reason
    assert ex.handle(command("cordon", "n", ttl=0.0)).reason.startswith("expired")
    missing = ex.handle(command("cordon", "no-such-node-x"))
    assert missing.outcome == "failed" and "unknown node" in missing.reason


def test_a_node_that_changes_between_read_and_patch_is_read_again() -> None:
    cluster = FakeCluster()
    name = cluster.add_node("n1").name
    patch = cluster.patch_node
    moved = []

    def racing(node: str, body: dict[str, Any]) -> None:
        if not moved:  # someone else writes the node first: our resourceVersion is stale
            moved.append(node)
            patch(node, {"metadata": {"labels": {"other": "writer"}}})
        patch(node, body)

    cluster.patch_node = racing  # type: ignore[method-assign]
    r = fake_executor(cluster, settings("fm")).handle(command("cordon", name))
    assert r.outcome == "applied" and moved == [name]
    assert cluster.nodes[name].unschedulable and cluster.nodes[name].labels["other"] == "writer"


def test_kubectl_describe_node_shows_the_condition_and_the_event(
    kube_api: client.ApiClient, kube_config: Path, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    kubectl = require_tool("kubectl", devenv_settings.layout().k8s_bin / "kubectl",
                           why="`fleetmedic dev build` builds it")
    name = make_fleet(1).nodes[0]
    assert executor(kube_api, settings(namespace)).handle(command("cordon", name)).outcome == "applied"
    out = subprocess.run([kubectl, "--kubeconfig", str(kube_config), "describe", "node", name],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert re.search(r"FleetmedicQuarantine\s+True\s.*Cordoned\s+fleetmedic cordon \(incident inc-test\)", out), out
    assert re.search(r"Warning\s+FleetmedicCordoned\s+.*fleetmedic-executor\s+cordoned by fleetmedic", out), out
    assert f"{ANNOTATION_CORDONED_BY}: fleetmedic" in out
