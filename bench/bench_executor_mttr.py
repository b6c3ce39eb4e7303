"""Control-plane MTTR of the whole chain: fault event on Kafka -> all job pods Running again.

    FLEETMEDIC_KAFKA_BOOTSTRAP=127.0.0.1:19092 FLEETMEDIC_KUBECONFIG=/tmp/fleetmedic-dev/kube/kubeconfig \\
        .venv/bin/python bench/bench_executor_mttr.py [--trials 20] [--baseline-trials 10]

On a fresh 8-node kwok GPU fleet, ``fleetmedic worker`` and ``fleetmedic executor`` run as
subprocesses on the real broker. Each trial starts a fresh 4-rank x 8-GPU Indexed batch Job (a job
keeps the nodes it was moved off in its anti-affinity, so one job faulted 20 times would run out
of nodes), publishes its placement (as the job watcher does), then one GPU telemetry message with
an XID 79 for one of the job's nodes, and times from that message until 4 new pods of the job are Running, none on
that node (MTTR), and until the node is cordoned and tainted (isolation). Between trials the chain
finishes the node track (drain, diagnostics on the node, return to service; not timed).

Baseline, measured in the same run: the executor alone, fed the commands the worker would issue
(cordon, taint, restart_job) straight on the command topic at the fault time: what is left of the
MTTR without detection and decision. Prints p50/p99 of both, the ratio of the p50s, and the goal
(p50 < 10 s). Needs the dev services (``fleetmedic dev up``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
from kubernetes import client

from fleetmedic import records as r
from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.chain import (
    SIGNING_KEY,
    Chain,
    chain_config,
    gpu_job,
    placement,
    running_ranks,
    start,
    stop_all,
    tail,
    telemetry,
    wait_ready,
)
from fleetmedic.devenv.kafka import produce
from fleetmedic.devenv.kclient import connect
from fleetmedic.devenv.waiting import wait
from fleetmedic.signing import load_key, sign
from fleetmedic.streams.app import ensure_topics

JOB = "train"


def _state(core: client.CoreV1Api, node: str) -> tuple[bool, bool]:
    n = core.read_node(node)
    tainted = any(t.key == "fleetmedic.io/quarantine" for t in n.spec.taints or [])
    return bool(n.spec.unschedulable), tainted


def _trial(chain: Chain, api: client.ApiClient, fleet: fl.Fleet, ns: str, bootstrap: str, attempt: int, *,
           direct: bool, rng: np.random.Generator) -> tuple[float, float]:
    """One fault on a fresh Job; returns (isolation s, MTTR s)."""
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    name = f"{JOB}-{attempt}"
    batch.create_namespaced_job(ns, gpu_job(name, fleet))
    ranks = wait("4 ranks Running", lambda: (x := running_ranks(core, ns, name)) and len(x) == 4 and x, 60, chain)
    job_ref = f"{ns}/{name}"
    sick = ranks[attempt % 4].node
    asyncio.run(produce(bootstrap, [(chain.topic("jobs.events"), job_ref.encode(), r.encode(e))
                                    for e in placement(job_ref, ranks, time.time() - 1.0, attempt=attempt)]))
    time.sleep(0.5)  # the placement is in before the fault, as in a running fleet
    before = {x.uid for x in ranks}
    t0 = time.time()
    if direct:
        key = load_key(SIGNING_KEY)
        u = uuid.uuid4().hex[:6]
        cmds = [sign(r.RemediationCommand(id=f"bench-{u}/{a}", action=a, incident_id=f"bench-{u}", reason="bench",
                                          issued_at=t0, expires_at=t0 + 300, node=sick if a != "restart_job" else "",
                                          job=job_ref if a == "restart_job" else "",
                                          track="job" if a == "restart_job" else "node",
                                          exclude_nodes=[sick] if a == "restart_job" else []), key)
                for a in ("cordon", "taint", "restart_job")]  # the order the decision engine publishes
        msgs = [(chain.topic("remediation.commands"), (c.node or c.job).encode(), r.encode(c)) for c in cmds]
    else:
        fault = telemetry([sick], t0, 1, rng, xid_node=sick)
        msgs = [(chain.topic("telemetry.gpu"), m.node.encode(), r.encode(m)) for m in fault]
    asyncio.run(produce(bootstrap, msgs))
    isolated = recovered = 0.0
    deadline = time.monotonic() + 120
    while not (isolated and recovered):
        now = time.time()
        if not isolated and all(_state(core, sick)):
            isolated = now - t0
        if not recovered:
            x = running_ranks(core, ns, name)
            if len(x) == 4 and not ({y.uid for y in x} & before):
                assert sick not in {y.node for y in x}, "a replacement landed on the sick node"
                recovered = now - t0
        if time.monotonic() > deadline:
            ranks_now = running_ranks(core, ns, name)
            raise AssertionError(f"trial {attempt}: no recovery in 120 s (sick {sick}, running {ranks_now})\n"
                                 + "\n".join(f"--- {role}\n{tail(chain, role, 30)}" for role in chain.procs))
        time.sleep(0.05)
    if direct:  # an operator clears the node (nothing ran diagnostics for these hand-made commands)
        key = load_key(SIGNING_KEY)
        now = time.time()
        clear = sign(r.RemediationCommand(id=f"bench-clear-{uuid.uuid4().hex[:6]}", action="return_to_service",
                                          incident_id="bench", reason="bench reset", issued_at=now,
                                          expires_at=now + 300, node=sick, params={"actor": "bench"}), key)
        asyncio.run(produce(bootstrap, [(chain.topic("remediation.commands"), sick.encode(), r.encode(clear))]))
    wait(f"{sick} back in service", lambda: not any(_state(core, sick)), 120, chain)
    batch.delete_namespaced_job(name, ns, propagation_policy="Background")
    done = r.JobEvent(job=job_ref, event="completion", ts=time.time(), attempt=attempt, workload_kind="Job")
    asyncio.run(produce(bootstrap, [(chain.topic("jobs.events"), job_ref.encode(), r.encode(done))]))  # as the watcher
    wait(f"{name}'s pods gone", lambda: not core.list_namespaced_pod(ns, label_selector=f"job-name={name}").items,
         60, chain)
    return isolated, recovered


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--baseline-trials", type=int, default=10)
    args = ap.parse_args()
    bootstrap = os.environ.get("FLEETMEDIC_KAFKA_BOOTSTRAP", "127.0.0.1:19092")
    kubeconfig = Path(os.environ.get("FLEETMEDIC_KUBECONFIG", "/tmp/fleetmedic-dev/kube/kubeconfig"))
    rng = np.random.default_rng(11)
    with connect(kubeconfig) as api, tempfile.TemporaryDirectory(prefix="bench-mttr-") as tmp:
        core = client.CoreV1Api(api)
        ns = f"bench-{uuid.uuid4().hex[:6]}"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        fleet = fl.create_fleet(api, 8, name=fl.new_fleet_name("bench"))
        chain = chain_config(Path(tmp), bootstrap, kubeconfig, ns)
        try:
            wait("the default ServiceAccount", lambda: core.list_namespaced_service_account(
                ns, field_selector="metadata.name=default").items, 30)
            asyncio.run(ensure_topics(chain.settings))
            start(chain, "worker", "--datadir", str(Path(tmp) / "faust"))
            start(chain, "executor", "--identity", "bench-executor")
            wait_ready(chain)
            warm = telemetry(fleet.nodes, time.time(), 3, rng)  # the worker knows the nodes
            asyncio.run(produce(bootstrap, [(chain.topic("telemetry.gpu"), m.node.encode(), r.encode(m))
                                            for m in warm]))
            time.sleep(5.0)
            chain_iso, chain_mttr, base_mttr = [], [], []
            for i in range(args.trials):
                iso, mttr = _trial(chain, api, fleet, ns, bootstrap, i + 1, direct=False, rng=rng)
                chain_iso.append(iso)
                chain_mttr.append(mttr)
                print(f"  chain trial {i + 1:2d}: isolated {iso:5.2f}s, job Running again {mttr:5.2f}s", flush=True)
            for i in range(args.baseline_trials):
                _, mttr = _trial(chain, api, fleet, ns, bootstrap, 1000 + i, direct=True, rng=rng)
                base_mttr.append(mttr)
                print(f"  executor-only trial {i + 1}: job Running again {mttr:5.2f}s", flush=True)
        finally:
            stop_all(chain)
            fl.delete_fleet(api, fleet)
            core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
            core.delete_namespace(ns)
    p50, p99 = statistics.median(chain_mttr), _pct(chain_mttr, 99)
    print(f"\nwhole chain (XID 79 on Kafka -> worker -> executor), {len(chain_mttr)} trials:")
    print(f"  MTTR (fault event -> 4 pods Running off the node): p50 {p50:.2f}s  p99 {p99:.2f}s  "
          f"min {min(chain_mttr):.2f}s  max {max(chain_mttr):.2f}s")
    print(f"  isolation (fault event -> cordoned and tainted):  p50 {statistics.median(chain_iso):.2f}s  "
          f"p99 {_pct(chain_iso, 99):.2f}s")
    if base_mttr:
        b50 = statistics.median(base_mttr)
        print(f"baseline: executor alone on hand-made commands, {len(base_mttr)} trials: p50 {b50:.2f}s  "
              f"p99 {_pct(base_mttr, 99):.2f}s")
        print(f"ratio chain / executor-only (p50): {p50 / b50:.2f}x  (detection + decision: {p50 - b50:+.2f}s)")
    print(f"goal p50 < 10 s: {'met' if p50 < 10 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
