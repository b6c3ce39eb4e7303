"""The hard-fault chain for a Kubeflow PyTorchJob and a JobSet: XID 79 telemetry for one of the
workload's nodes -> ``fleetmedic worker`` -> ``fleetmedic executor`` -> node cordoned and tainted, the
workload's pods recreated Running off that node (no pod bound there while it is held), diagnostics,
the node returned. No training-operator or JobSet controller runs in the test cluster: the test plays
their part with the reconcilers of tests/executor/workload/helpers_played_operators.py (documented there). The
PyTorchJob tolerates every taint, so only the node anti-affinity the executor adds keeps it off."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kubernetes import client

from fleetmedic import records as r
from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.chain import PodWatch, chain_config, start, stop_all, telemetry, wait_ready
from fleetmedic.devenv.waiting import wait
from fleetmedic.devenv.workloads import running
from fleetmedic.k8s_keys import TAINT_QUARANTINE
from fleetmedic.streams.app import ensure_topics
from tests.executor.workload.helpers_played_operators import (
    JS,
    PT,
    jobset_manifest,
    played_operator,
    pytorchjob_manifest,
    reconcile_jobset,
    reconcile_pytorchjob,
)

KINDS: dict[str, tuple[str, str, str, Callable[..., dict[str, Any]], Callable[..., None], str]] = {
    # kind: (group, version, plural, manifest, operator, pod label naming the workload)
    "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs", pytorchjob_manifest, reconcile_pytorchjob, f"{PT}/job-name"),
    "JobSet": ("jobset.x-k8s.io", "v1alpha2", "jobsets", jobset_manifest, reconcile_jobset, f"{JS}/jobset-name"),
}


def _held(core: client.CoreV1Api, node: str) -> bool:
    n = core.read_node(node)
    return bool(n.spec.unschedulable) and any(t.key == TAINT_QUARANTINE for t in n.spec.taints or [])


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_hard_fault_on_a_node_of_a_crd_workload_replaces_it_and_returns_the_node(
    kind: str, kube_api: client.ApiClient, kube_config: Path, kafka_bootstrap: str, namespace: str, crds: list[str],
    make_fleet: Callable[..., fl.Fleet], tmp_path: Path
) -> None:
    group, version, plural, manifest, operator, label = KINDS[kind]
    core = client.CoreV1Api(kube_api)
    fleet = make_fleet(6)
    name = "llm"
    client.CustomObjectsApi(kube_api).create_namespaced_custom_object(group, version, namespace, plural,
                                                                      manifest(name, fleet))
    selector = f"{label}={name}"
    chain = chain_config(tmp_path, kafka_bootstrap, kube_config, namespace)
    asyncio.run(ensure_topics(chain.settings))
    job_ref = f"{namespace}/{name}"
    with played_operator(operator, kube_api, namespace, name):
        pods = wait("4 Running pods", lambda: running(kube_api, namespace, selector, 4), 60)
        nodes = sorted({p.spec.node_name for p in pods})
        sick = nodes[0]
        old = {p.metadata.uid for p in pods}
        now = time.time()
        place = r.JobEvent(job=job_ref, event="placement", ts=now - 30, workload_kind=kind, world_size=4,
                           placement=[r.RankPlacement(rank=i, node=p.spec.node_name, gpus=list(range(8)))
                                      for i, p in enumerate(sorted(pods, key=lambda p: p.metadata.name))])
        events = [place, r.JobEvent(job=job_ref, event="start", ts=now - 30, workload_kind=kind)]
        watch = PodWatch(kube_api, namespace)
        try:
            from fleetmedic.devenv.kafka import produce

            asyncio.run(produce(kafka_bootstrap, [(chain.topic("jobs.events"), job_ref.encode(), r.encode(e))
                                                  for e in events]))
            start(chain, "worker", "--datadir", str(tmp_path / "faust"))
            start(chain, "executor", "--identity", "e2e-executor")
            wait_ready(chain)
            msgs = telemetry(nodes, time.time(), 3, np.random.default_rng(9), xid_node=sick)
            asyncio.run(produce(kafka_bootstrap, [(chain.topic("telemetry.gpu"), m.node.encode(), r.encode(m))
                                                  for m in msgs]))
            wait("the node held", lambda: _held(core, sick), 90, chain)
            held_at = time.time()
            after = wait("4 new Running pods", lambda: running(kube_api, namespace, selector, 4, old), 90, chain)
            assert sick not in {p.spec.node_name for p in after}
            wait("the node back", lambda: not _held(core, sick), 120, chain)
            back_at = time.time()
        finally:
            watch.stop()
            stop_all(chain)
    strays = [pod for t, pod, n in watch.bindings
              if n == sick and held_at <= t <= back_at and not pod.startswith("fleetmedic-diag-")]
    assert strays == []
    assert any(n == sick and pod.startswith("fleetmedic-diag-") for _, pod, n in watch.bindings)
