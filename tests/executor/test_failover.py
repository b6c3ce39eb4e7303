"""Two ``fleetmedic executor`` processes on the real broker and API server; the leader is killed
(SIGKILL, no goodbye) in the middle of a drain held up by a PodDisruptionBudget. The standby takes
the Lease once it expires, gets the uncommitted drain again from the consumer group, resumes it from
the node's annotations (same start) and finishes it when the budget allows; the cordon the dead
leader applied is not applied again."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

from kubernetes import client

from fleetmedic import records as r
from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.chain import SIGNING_KEY, chain_config, start, stop_all
from fleetmedic.devenv.kafka import produce
from fleetmedic.devenv.waiting import wait
from fleetmedic.executor.node import plan as p
from fleetmedic.k8s_keys import ANNOTATION_DRAIN, ANNOTATION_INFLIGHT
from fleetmedic.signing import load_key, sign
from fleetmedic.streams.app import ensure_topics
from tests.executor.helpers_executor import node_events, pinned_pod, running
from tests.streams.helpers_harness import collect_sync


def _holder(coord: client.CoordinationV1Api, namespace: str, name: str) -> str:
    try:
        return str(coord.read_namespaced_lease(name, namespace).spec.holder_identity or "")
    except client.ApiException:
        return ""


def test_killed_leader_mid_drain_the_standby_resumes_it_and_applies_nothing_twice(
    kube_api: client.ApiClient, kube_config: Path, kafka_bootstrap: str, namespace: str,
    make_fleet: Callable[..., fl.Fleet], tmp_path: Path
) -> None:
    core, policy = client.CoreV1Api(kube_api), client.PolicyV1Api(kube_api)
    coord = client.CoordinationV1Api(kube_api)
    name = make_fleet(1).nodes[0]
    core.create_namespaced_pod(namespace, pinned_pod("guarded", name, {"app": "guarded"}))
    wait("Running", lambda: running(core, namespace, "guarded"), 60)
    policy.create_namespaced_pod_disruption_budget(namespace, client.V1PodDisruptionBudget.from_dict(
        {"metadata": {"name": "guard"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}}))
    wait("the budget", lambda: (b := policy.read_namespaced_pod_disruption_budget("guard", namespace).status)
         and b.expected_pods == 1, 60)
    chain = chain_config(tmp_path, kafka_bootstrap, kube_config, namespace)
    asyncio.run(ensure_topics(chain.settings))
    lease = chain.settings.executor.lease_name
    key, now = load_key(SIGNING_KEY), time.time()
    cmds = [sign(r.RemediationCommand(id=f"failover/{a}", action=a, incident_id="failover", reason="test",
                                      issued_at=now, expires_at=now + 600, node=name), key)
            for a in ("cordon", "drain")]
    try:
        a = start(chain, "executor-a", "--identity", "exec-a")
        wait("exec-a leading", lambda: _holder(coord, namespace, lease) == "exec-a", 30, chain)
        start(chain, "executor-b", "--identity", "exec-b")
        asyncio.run(produce(kafka_bootstrap, [(chain.topic("remediation.commands"), name.encode(), r.encode(c))
                                              for c in cmds]))
        ann = wait("the drain in flight", lambda: (x := core.read_node(name).metadata.annotations or {})
                   and ANNOTATION_INFLIGHT in x and x, 30, chain)
        started = json.loads(ann[ANNOTATION_DRAIN])["started"]
        a.send_signal(signal.SIGKILL)
        a.wait()
        del chain.procs["executor-a"]
        wait("exec-b leading", lambda: _holder(coord, namespace, lease) == "exec-b", 30, chain)
        wait("the drain resumed", lambda: "FleetmedicDrainResumed" in node_events(core, name), 40, chain)
        policy.patch_namespaced_pod_disruption_budget("guard", namespace, {"spec": {"minAvailable": 0}})
        results_topic = chain.topic("remediation.results")

        def drained(c: object) -> bool:
            return any(r.decode(r.RemediationResult, v).action == "drain"
                       for v in c.values(results_topic))  # type: ignore[attr-defined]

        got = collect_sync(kafka_bootstrap, [results_topic], drained, timeout=60)
    finally:
        stop_all(chain)
    results = [r.decode(r.RemediationResult, v) for v in got.values(results_topic)]
    applied = [(x.action, x.executor) for x in results if x.outcome == "applied"]
    assert applied == [("cordon", "exec-a"), ("drain", "exec-b")], results
    assert [x.reason for x in results if x.outcome == "skipped"] in ([], ["duplicate command id (already applied)"])
    node = core.read_node(name)
    state = json.loads(node.metadata.annotations[ANNOTATION_DRAIN])
    assert state["state"] == "done" and state["started"] == started and state["evicted"] == [f"{namespace}/guarded"]
    assert set(p.applied_ids(node.metadata.annotations)) == {c.id for c in cmds}
