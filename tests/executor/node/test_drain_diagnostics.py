"""Drain and diagnostics on the real control plane: evictions honour a PodDisruptionBudget (429 ->
retry -> give up naming the budget), DaemonSet pods stay, namespace policies hold pods back; a drain
interrupted half-way is resumed by another executor from the node's annotations (even when the
command has expired meanwhile: fleetmedic finishes what it started); the diagnostics
Job runs on the quarantined node and its verdict (kwok completes it = pass; the pod failed as a
kubelet reports it = fail) decides whether return to service is allowed."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pytest
from kubernetes import client

from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.waiting import wait
from fleetmedic.executor.cache import ClusterCache
from fleetmedic.executor.node import long_plan as pl
from fleetmedic.executor.node import plan as p
from fleetmedic.executor.node.long_apply import Interrupted
from fleetmedic.k8s_keys import (
    ANNOTATION_DRAIN,
    ANNOTATION_INFLIGHT,
    ANNOTATION_KWOK_COMPLETE,
    CONDITION_DIAGNOSTICS_FAILED,
    LABEL_FLEET,
    LABEL_STATE,
    TAINT_QUARANTINE,
)
from tests.executor.helpers_executor import command, executor, node_events, pinned_pod, running, settings


def _daemonset(name: str, fleet: fl.Fleet) -> client.V1DaemonSet:
    return client.V1DaemonSet.from_dict({
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"ds": name}},
                 "template": {"metadata": {"labels": {"ds": name}},
                              "spec": {"nodeSelector": {LABEL_FLEET: fleet.name},
                                       "tolerations": [{"operator": "Exists"}],
                                       "containers": [{"name": "c", "image": "example.invalid/ds:1"}]}}},
    })


def test_drain_is_held_by_a_pdb_gives_up_naming_it_then_evicts_once_allowed_and_leaves_daemonsets(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    core, apps, policy = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api), client.PolicyV1Api(kube_api)
    fleet = make_fleet(1)
    name = fleet.nodes[0]
    for pod in ("a-0", "a-1"):
        core.create_namespaced_pod(namespace, pinned_pod(pod, name, {"app": "trainer"}))
    apps.create_namespaced_daemon_set(namespace, _daemonset("agent", fleet))
    wait("pods Running", lambda: all(running(core, namespace, x) for x in ("a-0", "a-1")))
    wait("the DaemonSet pod", lambda: core.list_namespaced_pod(namespace, label_selector="ds=agent").items)
    policy.create_namespaced_pod_disruption_budget(namespace, client.V1PodDisruptionBudget.from_dict(
        {"metadata": {"name": "trainers"},
         "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "trainer"}}}}))
    wait("the budget", lambda: (b := policy.read_namespaced_pod_disruption_budget("trainers", namespace).status)
         and b.expected_pods == 2 and b.disruptions_allowed == 0)
    s = settings(namespace, extra=f"  drain_timeout_s: 3.0\n  namespace_policies: {{{namespace}: evict_now}}\n")
    ex = executor(kube_api, s)
    blocked = ex.handle(command("drain", name))
    assert blocked.outcome == "failed", blocked
    assert f"{namespace}/trainers" in blocked.reason and blocked.details["blocking_pdbs"] == f"{namespace}/trainers"
    n = core.read_node(name)
    assert n.spec.unschedulable and json.loads(n.metadata.annotations[ANNOTATION_DRAIN])["state"] == "failed"
    assert ANNOTATION_INFLIGHT not in n.metadata.annotations and "FleetmedicDrainFailed" in node_events(core, name)

    policy.patch_namespaced_pod_disruption_budget("trainers", namespace, {"spec": {"minAvailable": 0}})
    wait("the budget to allow", lambda: policy.read_namespaced_pod_disruption_budget(
        "trainers", namespace).status.disruptions_allowed == 2)
    done = ex.handle(command("drain", name))
    assert done.outcome == "applied", done
    assert set(done.details["evicted_pods"].split(",")) == {f"{namespace}/a-0", f"{namespace}/a-1"}
    left = [x.metadata.name for x in core.list_namespaced_pod(namespace, field_selector=f"spec.nodeName={name}").items
            if not x.metadata.deletion_timestamp]
    assert len(left) == 1 and left[0].startswith("agent-")  # the DaemonSet pod stays


def test_wait_for_completion_namespace_holds_the_drain_until_its_pod_finishes(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    core = client.CoreV1Api(kube_api)
    name = make_fleet(1).nodes[0]
    core.create_namespaced_pod(namespace, pinned_pod("serving", name))
    wait("Running", lambda: running(core, namespace, "serving"))
    extra = f"  drain_timeout_s: 2.0\n  namespace_policies: {{{namespace}: wait_for_completion}}\n"
    r = executor(kube_api, settings(namespace, extra=extra)).handle(command("drain", name))
    assert r.outcome == "failed" and f"{namespace}/serving" in r.details["remaining_pods"]
    assert not r.details["blocking_pdbs"]
    assert running(core, namespace, "serving")  # never evicted


def test_an_interrupted_drain_is_resumed_by_another_executor_from_the_annotations_even_once_expired(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    core = client.CoreV1Api(kube_api)
    name = make_fleet(1).nodes[0]
    core.create_namespaced_pod(namespace, pinned_pod("slow", name))
    wait("Running", lambda: running(core, namespace, "slow"))
    # evict_after_timeout with 3 s: the first executor waits, and is stopped while waiting
    s = settings(namespace, extra="  drain_evict_after_s: 3.0\n  drain_timeout_s: 60.0\n")
    first = executor(kube_api, s, identity="first")
    cmd = command("drain", name, ttl=2.0)  # expires before the second executor sees it: resumed anyway
    threading.Timer(1.0, first.stop.set).start()
    with pytest.raises(Interrupted):
        first.handle(cmd)
    ann = core.read_node(name).metadata.annotations
    assert json.loads(ann[ANNOTATION_INFLIGHT])["id"] == cmd.id
    assert json.loads(ann[ANNOTATION_DRAIN])["state"] == "in_progress"
    started = json.loads(ann[ANNOTATION_DRAIN])["started"]
    time.sleep(max(0.0, cmd.expires_at - time.time() + 0.1))
    t = time.time()
    second = executor(kube_api, s, identity="second").handle(cmd)
    assert second.outcome == "applied" and second.details["evicted_pods"] == f"{namespace}/slow"
    assert time.time() - t < 3.0 + 2.0  # the 3 s count from the first start, not from the resume
    ann = core.read_node(name).metadata.annotations
    assert json.loads(ann[ANNOTATION_DRAIN])["started"] == started and ANNOTATION_INFLIGHT not in ann
    assert "FleetmedicDrainResumed" in node_events(core, name)
    assert executor(kube_api, s).handle(cmd).outcome == "skipped"  # done now: expired (or a duplicate)
    assert executor(kube_api, s).handle(command("drain", name, ttl=0.0)).reason.startswith("expired")


def _quarantine(ex: object, name: str) -> None:
    for action in ("cordon", "taint"):
        assert ex.handle(command(action, name)).outcome == "applied"  # type: ignore[attr-defined]


def test_passing_diagnostics_on_the_quarantined_node_allow_return_to_service(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    core, batch = client.CoreV1Api(kube_api), client.BatchV1Api(kube_api)
    name = make_fleet(1).nodes[0]
    s = settings(namespace, extra=f"  diagnostics_pod_annotations: {{{ANNOTATION_KWOK_COMPLETE}: 'true'}}\n")
    ex = executor(kube_api, s)
    core.create_namespaced_pod(namespace, pinned_pod("still-here", name))
    wait("Running", lambda: running(core, namespace, "still-here"))
    _quarantine(ex, name)
    busy = ex.handle(command("run_diagnostics", name))
    assert busy.outcome == "failed" and "drain it first" in busy.reason
    core.delete_namespaced_pod("still-here", namespace, grace_period_seconds=0)
    wait("the pod gone", lambda: not core.list_namespaced_pod(namespace, field_selector=f"spec.nodeName={name}").items)
    r = ex.handle(command("run_diagnostics", name, params={"level": "2"}))
    assert r.outcome == "applied" and r.details["verdict"] == "pass" and r.details["diagnostics"] == "pass", r
    job_ns, job_name = r.details["job"].split("/")
    pod = core.list_namespaced_pod(job_ns, label_selector=f"job-name={job_name}").items[0]
    assert pod.spec.node_name == name and pod.spec.containers[0].command[-1] == "2"
    assert batch.read_namespaced_job(job_name, job_ns).status.succeeded == 1
    back = ex.handle(command("return_to_service", name, params={"uncordon": "true", "untaint": "true"}))
    assert back.outcome == "applied", back
    n = core.read_node(name)
    assert not n.spec.unschedulable and not any(t.key == TAINT_QUARANTINE for t in n.spec.taints or [])
    assert LABEL_STATE not in (n.metadata.labels or {})
    assert {"FleetmedicRunDiagnosticsStarted", "FleetmedicDiagnosticsPassed", "FleetmedicReturnedToService"} <= set(
        node_events(core, name))


def test_failing_diagnostics_report_the_failed_tests_and_block_return_to_service(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    core = client.CoreV1Api(kube_api)
    name = make_fleet(1).nodes[0]
    ex = executor(kube_api, settings(namespace))
    _quarantine(ex, name)
    cmd = command("run_diagnostics", name)
    job = pl.diagnostics_job(cmd, p.NodeView(name=name), ex.settings.executor)["metadata"]["name"]

    def fail_like_a_kubelet() -> None:  # no kubelet under kwok: report the failed container as one would
        pod = wait("the diagnostics pod Running", lambda: next(
            (x for x in core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items
             if x.status and x.status.phase == "Running"), None), timeout=30)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": {
            "phase": "Failed", "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}],
            "containerStatuses": [{"name": "diag", "image": pod.spec.containers[0].image, "imageID": "",
                                   "ready": False, "restartCount": 0, "started": False,
                                   "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "memory,pcie",
                                                            "startedAt": now, "finishedAt": now}}}]}})

    threading.Thread(target=fail_like_a_kubelet, daemon=True).start()
    r = ex.handle(cmd)
    assert r.outcome == "applied" and r.details["verdict"] == "fail" and r.details["failed_tests"] == "memory,pcie", r
    refused = ex.handle(command("return_to_service", name, params={"uncordon": "true", "untaint": "true"}))
    assert refused.outcome == "failed" and "diagnostics fail" in refused.reason
    assert core.read_node(name).spec.unschedulable and "FleetmedicDiagnosticsFailed" in node_events(core, name)
    failed = next(c for c in core.read_node_status(name).status.conditions if c.type == CONDITION_DIAGNOSTICS_FAILED)
    assert (failed.status, failed.reason) == ("True", "DiagnosticsFailed") and "memory,pcie" in failed.message


def test_a_drain_polls_the_cache_between_evictions_and_ends_only_on_the_api_servers_word(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    """The executor's cache replaces the per-poll list while the drain waits; what ends the drain (the
    node empty, the timeout) is read from the API: a cache that lags (here: stopped before the pod
    came, so it shows the node empty for good) must not make a drain of a busy node succeed."""
    core = client.CoreV1Api(kube_api)
    busy, waiting = make_fleet(2).nodes
    stale = ClusterCache(kube_api).start()
    assert stale.wait_synced(30)
    stale.close()  # synced, and frozen from here on: the worst lag there is
    time.sleep(0.5)
    core.create_namespaced_pod(namespace, pinned_pod("held", busy))
    wait("Running", lambda: running(core, namespace, "held"))
    assert stale.synced and stale.pods_on(busy) == []
    hold = settings(namespace, extra=f"  drain_timeout_s: 2.0\n  namespace_policies: {{{namespace}: "
                                     "wait_for_completion}\n")
    ex = executor(kube_api, hold, cache=stale)
    r = ex.handle(command("drain", busy))
    assert r.outcome == "failed" and f"{namespace}/held" in r.details["remaining_pods"], r
    assert running(core, namespace, "held")

    # a live cache: the polls while the pod may not be evicted yet read it, not the API
    live = ClusterCache(kube_api).start()
    try:
        core.create_namespaced_pod(namespace, pinned_pod("later", waiting))
        wait("Running", lambda: running(core, namespace, "later"))
        assert live.wait_synced(30)
        wait("the cache to see it", lambda: [x.name for x in live.pods_on(waiting)] == ["later"])
        later = settings(namespace, extra="  drain_evict_after_s: 2.0\n  drain_timeout_s: 30.0\n")
        ex = executor(kube_api, later, cache=live)
        r = ex.handle(command("drain", waiting))
        assert r.outcome == "applied" and r.details["evicted_pods"] == f"{namespace}/later", r
        # about 4 polls in the 2 s before the eviction: the first from the API, the others from the
        # cache; the poll after the eviction and the one that ends the drain from the API
        assert ex.node.ctx.pod_reads["cache"] >= 2 and ex.node.ctx.pod_reads["api"] >= 2, ex.node.ctx.pod_reads
    finally:
        live.close()
