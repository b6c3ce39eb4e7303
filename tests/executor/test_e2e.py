"""End to end on the real broker and control plane, the whole chain in subprocesses
(``fleetmedic worker`` and ``fleetmedic executor``):

- a hard fault: an Indexed batch Job of 4 ranks x 8 GPUs on a kwok GPU fleet; its placement is on
  ``jobs.events`` (as the job watcher publishes it); an XID 79 for one of its nodes arrives as GPU
  telemetry. The worker opens a hardware incident and issues signed commands; the executor cordons
  and taints the node, the job's pods are recreated and Running on healthy nodes, a pod watch sees
  no pod bound to the quarantined node afterwards, drain and diagnostics run there (the
  diagnostics Job on that node), and on pass the node returns to service.
- a transient software error (CUDA out of memory in the job's log): the pods are restarted in
  place, and no node is cordoned or tainted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from kubernetes import client

from fleetmedic import records as r
from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.chain import (
    PodWatch,
    chain_config,
    gpu_job,
    placement,
    running_ranks,
    start,
    stop_all,
    telemetry,
    wait_ready,
)
from fleetmedic.devenv.kafka import produce
from fleetmedic.devenv.waiting import wait
from fleetmedic.k8s_keys import ANNOTATION_CORDONED_BY, TAINT_QUARANTINE
from fleetmedic.streams.app import ensure_topics
from tests.streams.helpers_harness import collect_sync


def _quarantined(core: client.CoreV1Api, node: str) -> bool:
    n = core.read_node(node)
    return bool(n.spec.unschedulable) and any(t.key == TAINT_QUARANTINE for t in n.spec.taints or [])


def _back(core: client.CoreV1Api, node: str) -> bool:
    n = core.read_node(node)
    return not n.spec.unschedulable and not any(t.key == TAINT_QUARANTINE for t in n.spec.taints or [])


def test_hard_fault_isolates_the_node_replaces_the_job_diagnoses_and_returns_the_node(
    kube_api: client.ApiClient, kube_config: Path, kafka_bootstrap: str, namespace: str,
    make_fleet: Callable[..., fl.Fleet], tmp_path: Path
) -> None:
    core, batch = client.CoreV1Api(kube_api), client.BatchV1Api(kube_api)
    fleet = make_fleet(6)
    chain = chain_config(tmp_path, kafka_bootstrap, kube_config, namespace)
    asyncio.run(ensure_topics(chain.settings))
    batch.create_namespaced_job(namespace, gpu_job("train", fleet))
    ranks = wait("4 ranks Running", lambda: (x := running_ranks(core, namespace, "train")) and len(x) == 4 and x,
                 timeout=60)
    job_ref = f"{namespace}/train"
    sick = ranks[2].node
    before = {x.uid for x in ranks}
    now = time.time()
    asyncio.run(produce(kafka_bootstrap, [(chain.topic("jobs.events"), job_ref.encode(), r.encode(e))
                                          for e in placement(job_ref, ranks, now - 30)]))
    watch = PodWatch(kube_api, namespace)
    try:
        start(chain, "worker", "--datadir", str(tmp_path / "faust"))
        start(chain, "executor", "--identity", "e2e-executor")
        wait_ready(chain)
        msgs = telemetry([x.node for x in ranks], time.time(), 3, np.random.default_rng(5), xid_node=sick)
        fault_at = time.time()
        asyncio.run(produce(kafka_bootstrap, [(chain.topic("telemetry.gpu"), m.node.encode(), r.encode(m))
                                              for m in msgs]))
        wait("the sick node cordoned and tainted", lambda: _quarantined(core, sick), timeout=90, watch=chain)
        isolated_at = time.time()
        replaced = wait("4 new ranks Running off the sick node", lambda: (x := running_ranks(core, namespace, "train"))
                        and len(x) == 4 and not ({y.uid for y in x} & before) and x, timeout=90, watch=chain)
        recovered_at = time.time()
        assert sick not in {x.node for x in replaced}
        wait("the node back in service", lambda: _back(core, sick), timeout=120, watch=chain)
        returned_at = time.time()
        time.sleep(1.0)
    finally:
        watch.stop()
        stop_all(chain)

    # while it was held, no pod but fleetmedic's diagnostics was bound to the quarantined node
    held = [pod for t, pod, n in watch.bindings if n == sick and isolated_at <= t <= returned_at]
    assert [pod for pod in held if not pod.startswith("fleetmedic-diag-")] == []
    diag_pods = [pod for _, pod, n in watch.bindings if n == sick and pod.startswith("fleetmedic-diag-")]
    assert diag_pods, "the diagnostics Job never ran on the quarantined node"
    got = collect_sync(kafka_bootstrap, [chain.topic("remediation.results")], lambda c: False, timeout=5)
    results = [r.decode(r.RemediationResult, v) for v in got.values(chain.topic("remediation.results"))]
    by_action = {x.action: x for x in results if x.node == sick or x.job == job_ref}
    assert {"cordon", "taint", "drain", "run_diagnostics", "return_to_service", "restart_job"} <= set(by_action)
    assert by_action["run_diagnostics"].details["verdict"] == "pass"
    assert by_action["reboot_node"].outcome == "skipped" and "no reboot_node hook" in by_action["reboot_node"].reason
    assert all(x.outcome != "failed" for x in by_action.values()), [x for x in results if x.outcome == "failed"]
    node = core.read_node(sick)
    assert ANNOTATION_CORDONED_BY not in (node.metadata.annotations or {})
    print(f"fault -> isolated {isolated_at - fault_at:.1f}s, -> job Running again {recovered_at - fault_at:.1f}s")


def test_transient_software_error_restarts_the_pods_and_isolates_no_node(
    kube_api: client.ApiClient, kube_config: Path, kafka_bootstrap: str, namespace: str,
    make_fleet: Callable[..., fl.Fleet], tmp_path: Path
) -> None:
    core, batch = client.CoreV1Api(kube_api), client.BatchV1Api(kube_api)
    fleet = make_fleet(4)
    chain = chain_config(tmp_path, kafka_bootstrap, kube_config, namespace)
    asyncio.run(ensure_topics(chain.settings))
    batch.create_namespaced_job(namespace, gpu_job("train", fleet))
    ranks = wait("4 ranks Running", lambda: (x := running_ranks(core, namespace, "train")) and len(x) == 4 and x,
                 timeout=60)
    job_ref = f"{namespace}/train"
    before = {x.uid for x in ranks}
    now = time.time()
    failure = r.JobEvent(job=job_ref, event="failure", ts=now, workload_kind="Job", rank=1, node=ranks[1].node,
                         exit_code=1, reason="Error", log_excerpt=[
                             "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; "
                             "79.15 GiB total capacity; 77.80 GiB already allocated)"])
    events = [*placement(job_ref, ranks, now - 30), failure]
    try:
        start(chain, "worker", "--datadir", str(tmp_path / "faust"))
        start(chain, "executor", "--identity", "e2e-executor")
        wait_ready(chain)
        msgs = telemetry([x.node for x in ranks], now, 3, np.random.default_rng(6))
        asyncio.run(produce(kafka_bootstrap, [(chain.topic("telemetry.gpu"), m.node.encode(), r.encode(m))
                                              for m in msgs]
                            + [(chain.topic("jobs.events"), job_ref.encode(), r.encode(e)) for e in events]))
        again = wait("the job's pods restarted", lambda: (x := running_ranks(core, namespace, "train"))
                     and len(x) == 4 and not ({y.uid for y in x} & before) and x, timeout=90, watch=chain)
        time.sleep(2.0)
    finally:
        stop_all(chain)
    assert {x.node for x in again} <= set(fleet.nodes)
    for name in fleet.nodes:
        n = core.read_node(name)
        assert not n.spec.unschedulable and not any(t.key == TAINT_QUARANTINE for t in n.spec.taints or [])
    got = collect_sync(kafka_bootstrap, [chain.topic("remediation.results")], lambda c: False, timeout=5)
    results = [r.decode(r.RemediationResult, v) for v in got.values(chain.topic("remediation.results"))]
    assert [(x.action, x.outcome) for x in results] == [("retry_in_place", "applied")]
