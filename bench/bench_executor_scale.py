"""The job watcher and the executor against thousands of kwok nodes, on the real control plane.

    .venv/bin/python bench/bench_executor_scale.py [--base-nodes 200 --base-pods 400] [--nodes 2000 --pods 4000]
        [--commands 20] [--churn 50] [--lease-s 600] [--kubeconfig FILE]

Starts etcd, kube-apiserver, the controller-manager, the scheduler and kwok (``fleetmedic.devenv.kube``,
the binaries in ~/.cache/fleetmedic; or uses ``--kubeconfig`` / ``$FLEETMEDIC_KUBECONFIG``), then
measures two sizes in one run: the baseline (``--base-nodes`` kwok GPU nodes, ``--base-pods`` pods)
and the target (grown to ``--nodes`` / ``--pods``). Nodes and pods are created concurrently
(``--threads`` workers, raw JSON); the pods are the ranks of 8-rank Indexed GPU Jobs (4 GPUs each,
bound with ``spec.nodeName``), which kwok's pod-ready stage marks Running. Setup creates the nodes,
waits until kwok has made every one Ready (a pod created on a node kwok has not taken in yet is
left Pending until its next event), creates the pods and waits until all are Running, touching
those still Pending every minute (the count of them is printed).

The node Leases (``--lease-s``, default 600): kwok renews each node's Lease as a kubelet does, and
the controller-manager marks a node whose Lease is older than its ``--node-monitor-grace-period``
NotReady, taints it ``node.kubernetes.io/unreachable:NoExecute`` and, 300 s later (the toleration
the DefaultTolerationSeconds admission plugin gives every pod), evicts its pods. kwok started
without ``--node-lease-duration-seconds`` keeps no Leases at all (and its node heartbeat stage posts
status only every 10-20 min), so after the 50 s grace period nodes flap NotReady, and pods are
evicted while a big run is still setting up: measured, the job watcher never held the 4,000 pods it
waits for (docs/scale.md). With ``--lease-s`` the control plane (``Kube(node_lease_s=...)``) gives
kwok that lease duration and the controller-manager a grace period 60 s longer: nodes stay Ready,
and the Lease writes (one per node per quarter of the duration) stay a small load on this machine,
whose CPUs the control plane shares with the code measured. (``--kubeconfig``: the cluster's own.)

At each size:

- the job watcher (``JobWatcher``: list + watch of Pods, Jobs and Nodes, its ``JobTracker`` and
  ``NodeTracker``) and the executor's cache (``ClusterCache``): time from start until every node and
  pod is taken in (list + watch established), and the memory each holds then (tracemalloc, in a
  separate pass; RSS growth of the timing pass);
- what one restart costs for placement: the old per-restart lists (every live pod and every node,
  decoded as client models) against the cache's indexes; the drain's per-poll ``pods_on`` list
  against the cache's pods-by-node index;
- with both running and ``--churn`` pod updates per second flowing through their watches,
  ``--commands`` cordons, each of another node, through ``CommandExecutor`` on a worker thread (as
  the service runs it): time from the command's bytes arriving to its first API request, and to
  its result (p50/p95).

Prints the figures per node and the target/baseline ratio per node (linear: within 1.5x). Setup
time is printed too. Tears the cluster down (or, with ``--kubeconfig``, deletes what it made).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import queue
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetmedic import kube_watch
from fleetmedic import records as r
from fleetmedic.config import Settings, parse_config
from fleetmedic.connectors.kube.jobs import JobWatcher
from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv import settings as dev_settings
from fleetmedic.devenv.kube import Kube, Ports
from fleetmedic.executor.cache import ClusterCache, cached_pod, node_state
from fleetmedic.executor.dispatch import kube_executor
from fleetmedic.executor.kube import KubeCluster
from fleetmedic.k8s_keys import LABEL_FLEET
from fleetmedic.signing import sign

KEY = b"s" * 40
FLEET = "scale"
NS = "scale-bench"
GPUS_PER_POD = 4
RANKS = 8
CONTINUE = re.compile(rb'"continue":"([^"]*)"')


# --- the API, raw ------------------------------------------------------------------------------


def make_api(kubeconfig: Path, pool: int = 32) -> client.ApiClient:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)  # type: ignore[no-untyped-call]
    cfg.connection_pool_maxsize = pool
    return client.ApiClient(cfg)


def call(api: client.ApiClient, method: str, path: str, body: Any = None, content_type: str = "application/json",
         query: dict[str, str] | None = None) -> tuple[int, bytes]:
    m, url, headers, data, post = api.param_serialize(
        method, path, query_params=list((query or {}).items()), header_params={"Content-Type": content_type},
        body=body, auth_settings=["BearerToken"])
    resp: Any = api.call_api(m, url, headers, data, post, _request_timeout=(10.0, 120.0))
    resp.read()
    return int(resp.status), bytes(resp.data or b"")


def must(status_body: tuple[int, bytes], ok: tuple[int, ...] = (200, 201)) -> bytes:
    status, body = status_body
    if status not in ok:
        raise RuntimeError(f"API {status}: {body[:300]!r}")
    return body


def count(api: client.ApiClient, path: str, fields: str = "") -> int:
    """Objects at ``path``: one list without pages (a continue token would expire on this test
    cluster, which compacts etcd every 10 s, while a busy server pages 4,000 pods); an error counts 0."""
    status, body = call(api, "GET", path, query={"fieldSelector": fields} if fields else {})
    return len(json.loads(body).get("items") or []) if status == 200 else 0


# --- setup -------------------------------------------------------------------------------------


def node_name(i: int) -> str:
    return f"{FLEET}-gpu-{i:04d}"


def create_node(api: client.ApiClient, i: int) -> None:
    body = fl.node_manifest(FLEET, i, fl.Topology(nodes_per_rack=8, racks_per_leaf=8))
    body["metadata"]["name"] = body["metadata"]["labels"]["kubernetes.io/hostname"] = node_name(i)
    must(call(api, "POST", "/api/v1/nodes", body), (201, 409))
    must(call(api, "PATCH", f"/api/v1/nodes/{node_name(i)}/status", {"status": body["status"]},
              "application/merge-patch+json"))


def create_pod(api: client.ApiClient, i: int) -> None:
    """Pod ``i``: rank ``i % 8`` of job ``i // 8``, on node ``i // 2`` (4 GPUs: two fill a node's 8)."""
    job, rank = divmod(i, RANKS)
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"j{job:04d}-{rank}", "namespace": NS,
                         "labels": {"batch.kubernetes.io/job-name": f"j{job:04d}",
                                    "batch.kubernetes.io/job-completion-index": str(rank)}},
            "spec": {"nodeName": node_name(i // 2), "tolerations": [fl.KWOK_TOLERATION],
                     "containers": [{"name": "train", "image": "example.invalid/train:1",
                                     "resources": {"limits": {fl.GPU: str(GPUS_PER_POD)}}}]}}
    must(call(api, "POST", f"/api/v1/namespaces/{NS}/pods", body), (201, 409))


def parallel(threads: int, fn: Callable[[int], None], items: range) -> float:
    t0 = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        for f in [pool.submit(fn, i) for i in items]:
            f.result()
    return time.monotonic() - t0


def wait_for(what: str, check: Callable[[], bool], timeout: float, every_s: float = 1.0) -> float:
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        time.sleep(every_s)
    return time.monotonic() - t0


@dataclass
class Setup:
    nodes_s: float = 0.0
    ready_s: float = 0.0
    pods_s: float = 0.0
    running_s: float = 0.0
    nudged: int = 0


def ready_nodes(api: client.ApiClient) -> int:
    status, body = call(api, "GET", "/api/v1/nodes", query={"labelSelector": f"{LABEL_FLEET}={FLEET}"})
    return sum(1 for x in (json.loads(body).get("items") or [] if status == 200 else [])
               if any(c.get("type") == "Ready" and c.get("status") == "True"
                      for c in (x.get("status") or {}).get("conditions") or []))


def wait_running(api: client.ApiClient, want: int, timeout: float, nudge_every_s: float = 60.0) -> tuple[float, int]:
    """Seconds until ``want`` pods are Running, and how many Pending pods were touched meanwhile.

    kwok plays a pod's stages when it sees an event of the pod on a node it manages; a pod whose
    events all came before kwok took its node in is left Pending until its next event (or kwok's
    next relist: minutes). So a pod still Pending after ``nudge_every_s`` gets an annotation patch.
    The count is one unpaged list every 5 s (each reads every pod from etcd on this test server)."""
    t0 = time.monotonic()
    nudged, last_nudge = 0, t0
    while count(api, f"/api/v1/namespaces/{NS}/pods", fields="status.phase=Running") < want:
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{want} pods Running (kwok): not within {timeout:.0f}s")
        if time.monotonic() - last_nudge > nudge_every_s:
            touched = touch_pending(api)
            if touched:
                print(f"  {touched} pods still Pending after {time.monotonic() - t0:.0f}s: touched each", flush=True)
            nudged, last_nudge = nudged + touched, time.monotonic()
        time.sleep(5.0)
    return time.monotonic() - t0, nudged


def touch_pending(api: client.ApiClient) -> int:
    """An annotation patch on every Pending pod (a new event for kwok); how many."""
    status, body = call(api, "GET", f"/api/v1/namespaces/{NS}/pods", query={"fieldSelector": "status.phase=Pending"})
    names = [p["metadata"]["name"] for p in json.loads(body).get("items") or []] if status == 200 else []
    patch = {"metadata": {"annotations": {"bench/nudge": str(time.time())}}}

    def touch(i: int) -> None:
        must(call(api, "PATCH", f"/api/v1/namespaces/{NS}/pods/{names[i]}", patch, "application/merge-patch+json"),
             (200, 404))

    parallel(8, touch, range(len(names)))
    return len(names)


def fleet_health(api: client.ApiClient) -> str:
    """Nodes Ready, nodes tainted NoExecute by the node controller, pods and pods being deleted."""
    status, body = call(api, "GET", "/api/v1/nodes", query={"labelSelector": f"{LABEL_FLEET}={FLEET}"})
    nodes = json.loads(body).get("items") or [] if status == 200 else []
    ready = sum(1 for x in nodes if any(c.get("type") == "Ready" and c.get("status") == "True"
                                        for c in (x.get("status") or {}).get("conditions") or []))
    tainted = sum(1 for x in nodes if any(t.get("effect") == "NoExecute" and t.get("key", "").startswith("node.kube")
                                          for t in (x.get("spec") or {}).get("taints") or []))
    status, body = call(api, "GET", f"/api/v1/namespaces/{NS}/pods")
    pods = json.loads(body).get("items") or [] if status == 200 else []
    deleting = sum(1 for p in pods if (p.get("metadata") or {}).get("deletionTimestamp"))
    return (f"nodes {len(nodes)}, Ready {ready}, tainted NoExecute {tainted}; pods {len(pods)}, "
            f"being deleted {deleting}")


def grow(api: client.ApiClient, have: tuple[int, int], want: tuple[int, int], threads: int) -> Setup:
    """Nodes, then (once kwok has made every node Ready: it manages them) the pods, until all Running."""
    s = Setup()
    s.nodes_s = parallel(threads, lambda i: create_node(api, i), range(have[0], want[0]))
    s.ready_s = wait_for(f"{want[0]} nodes Ready (kwok)", lambda: ready_nodes(api) >= want[0], 900.0)
    s.pods_s = parallel(threads, lambda i: create_pod(api, i), range(have[1], want[1]))
    s.running_s, s.nudged = wait_running(api, want[1], 1500.0)
    return s


# --- measuring ---------------------------------------------------------------------------------


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def watcher_settings(kubeconfig: Path) -> Settings:
    return parse_config(f"jobwatch: {{kubeconfig: {kubeconfig}, watch_timeout_s: 60}}\n"
                        "metrics: {port: 0}\n", env={})


@dataclass
class RunningWatcher:
    watcher: JobWatcher
    drained: threading.Thread
    handled: list[int] = field(default_factory=lambda: [0])

    def stop(self) -> None:
        self.watcher.stop.set()


def start_watcher(api: client.ApiClient, settings: Settings, nodes: int, pods: int,
                  timeout: float = 600.0) -> tuple[RunningWatcher, float]:
    """A JobWatcher taking every node and pod in (its queue drained through the trackers on a thread,
    as its loop does minus Kafka); the seconds until it holds ``nodes`` nodes and ``pods`` pods."""
    w = JobWatcher(api, settings, CollectorRegistry())
    synced = threading.Event()
    handled = [0]

    def drain() -> None:
        while not w.stop.is_set():
            try:
                kind, etype, obj = w.queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if kind == "Node":
                w.handle_node(etype, obj)
            else:
                w.handle(kind, etype, obj)
            handled[0] += 1
            if not synced.is_set() and len(w.node_tracker.nodes) >= nodes and len(w.tracker.pod_jobs) >= pods:
                synced.set()

    t0 = time.monotonic()
    drained = threading.Thread(target=drain, daemon=True)
    drained.start()
    threading.Thread(target=w.start_watches, daemon=True).start()
    while not synced.wait(30.0):
        samples = next(iter(w.metrics.relists.collect())).samples
        relists = {f"{x.labels['kind']}/{x.labels['cause']}": x.value for x in samples if x.name.endswith("_total")}
        errors = {x.labels["kind"]: x.value for x in next(iter(w.metrics.errors.collect())).samples
                  if x.name.endswith("_total")}
        progress = (f"job watcher after {time.monotonic() - t0:.0f}s: {len(w.node_tracker.nodes)} nodes, "
                    f"{len(w.tracker.pod_jobs)} pods, {handled[0]} events handled, queue {w.queue.qsize()}, "
                    f"relists {relists}, errors {errors}")
        print(f"  {progress}", flush=True)
        if time.monotonic() - t0 > timeout:
            w.stop.set()
            raise TimeoutError(progress)
    return RunningWatcher(w, drained, handled), time.monotonic() - t0


def start_cache(api: client.ApiClient) -> tuple[ClusterCache, float]:
    t0 = time.monotonic()
    cache = ClusterCache(api, watch_timeout_s=60).start()
    if not cache.wait_synced(600):
        raise TimeoutError("the executor cache did not sync")
    return cache, time.monotonic() - t0


def raw_list(api: client.ApiClient, path: str) -> list[bytes]:
    """The pages of a list as the cache's first list reads them (``kube_watch``'s pages of 500),
    read but not decoded: the continue token is taken from the page's head, where the API server
    writes the list's metadata."""
    pages: list[bytes] = []
    query = {"limit": str(kube_watch.PAGE)}
    while True:
        resp = kube_watch.get(api, path, query, kube_watch.LIST_READ_TIMEOUT_S)
        pages.append(must((resp.status, resp.read())))
        token = CONTINUE.search(pages[-1][:4096])
        if token is None or not token.group(1):
            return pages
        query["continue"] = token.group(1).decode()


def decode_pages(nodes: list[bytes], pods: list[bytes]) -> int:
    """What the cache makes of those pages: JSON, then its node states and cached pods."""
    n = 0
    for page in nodes:
        for item in json.loads(page)["items"]:
            node_state(item, "nvidia.com/gpu")
            n += 1
    for page in pods:
        for item in json.loads(page)["items"]:
            cached_pod(item, "nvidia.com/gpu")
            n += 1
    return n


def sync_parts(api: client.ApiClient, size: Size) -> None:
    """The cache's sync taken apart: the API server's lists (wall time until the last byte, pages
    read one after another) and our decode of the same bytes (process CPU time), medians of 3."""
    f = size.figures
    read: list[tuple[list[bytes], list[bytes]]] = []
    f["list_server_s"] = median_s(lambda: read.append((raw_list(api, "/api/v1/nodes"),
                                                       raw_list(api, "/api/v1/pods"))), 3)
    nodes, pods = read[-1]
    f["list_kib"] = sum(map(len, nodes + pods)) / 1024
    times = []
    for _ in range(3):
        t0 = time.process_time()
        got = decode_pages(nodes, pods)
        times.append(time.process_time() - t0)
    if got < size.nodes + size.pods:
        raise RuntimeError(f"the raw lists held {got} objects, not {size.nodes + size.pods}")
    f["list_decode_s"] = statistics.median(times)


def held(build: Callable[[], Any]) -> tuple[Any, int]:
    """What ``build()`` returns and the bytes it still holds after (tracemalloc, after a collection)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    obj = build()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return obj, after - before


def median_s(fn: Callable[[], Any], n: int = 3) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class FirstCall:
    """Wraps the executor's ApiClient: when its next request after :meth:`arm` leaves."""

    def __init__(self, api: client.ApiClient) -> None:
        self.at: float | None = None
        self.path = ""
        self._armed = False
        original = api.call_api

        def call_api(method: str, url: str, *args: Any, **kw: Any) -> Any:
            if self._armed:
                self._armed, self.at, self.path = False, time.perf_counter(), f"{method} {url.split('/api', 1)[-1]}"
            return original(method, url, *args, **kw)

        api.call_api = call_api  # type: ignore[method-assign]

    def arm(self) -> None:
        self.at, self._armed = None, True


def churn(api: client.ApiClient, pods: int, rate: float, stop: threading.Event, done: list[int]) -> None:
    """Merge-patch an annotation of random pods at ``rate`` per second (watch events for both)."""
    period = 1.0 / rate
    nxt = time.monotonic()
    while not stop.is_set():
        i = random.randrange(pods)
        job, rank = divmod(i, RANKS)
        patch = {"metadata": {"annotations": {"bench/tick": str(time.time())}}}
        call(api, "PATCH", f"/api/v1/namespaces/{NS}/pods/j{job:04d}-{rank}", patch, "application/merge-patch+json")
        done[0] += 1
        nxt += period
        time.sleep(max(0.0, nxt - time.monotonic()))


def cordon_command(node: str) -> bytes:
    now = time.time()
    cmd = sign(r.RemediationCommand(id=f"scale-{uuid.uuid4().hex[:8]}/cordon/{node}", action="cordon",
                                    incident_id="scale", reason="scale bench", issued_at=now, expires_at=now + 600,
                                    node=node), KEY)
    return r.encode(cmd)


@dataclass
class Size:
    nodes: int
    pods: int
    setup: Setup
    figures: dict[str, float] = field(default_factory=dict)


def measure(kubeconfig: Path, size: Size, first_node: int, args: argparse.Namespace) -> None:
    f = size.figures
    wset = watcher_settings(kubeconfig)
    # timing pass: each alone
    rss0 = rss_kib()
    wapi = make_api(kubeconfig)
    try:
        w, f["watcher_sync_s"] = start_watcher(wapi, wset, size.nodes, size.pods, args.sync_timeout)
        f["watcher_rss_kib"] = rss_kib() - rss0
        w.stop()
    except TimeoutError as exc:  # reported, and the rest measured without the job watcher
        print(f"  the job watcher did not take in the fleet: {exc}", flush=True)
        f["watcher_sync_s"] = f["watcher_rss_kib"] = f["watcher_bytes"] = float("nan")
    rss0 = rss_kib()
    capi = make_api(kubeconfig)
    cache, f["cache_sync_s"] = start_cache(capi)
    f["cache_rss_kib"] = rss_kib() - rss0
    cache.close()
    sync_parts(capi, size)
    # memory pass: what each holds once it has the fleet
    mapi = make_api(kubeconfig)
    w2: RunningWatcher | None = None
    if f["watcher_sync_s"] == f["watcher_sync_s"]:  # not nan
        w2, f["watcher_bytes"] = held(lambda: start_watcher(mapi, wset, size.nodes, size.pods, args.sync_timeout)[0])
    cache2, f["cache_bytes"] = held(lambda: start_cache(make_api(kubeconfig))[0])
    # what one restart's placement costs: the old lists against the cache's indexes
    core = client.CoreV1Api(mapi)
    f["restart_lists_s"] = median_s(lambda: (  # 1-100 s on a busy machine: once
        core.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded,status.phase!=Failed"),
        core.list_node()), 1)
    f["restart_cache_s"] = median_s(lambda: (cache2.requested_by_node(), cache2.node_states()), 20)
    probe = node_name(first_node + args.commands + 1)  # not cordoned; two pods (when pods = 2 x nodes)
    f["pods_on_list_s"] = median_s(lambda: KubeCluster(mapi).pods_on(probe), 5)
    f["pods_on_cache_s"] = median_s(lambda: cache2.pods_on(probe), 20)
    # commands under load: both running, pod updates flowing through their watches
    eapi = make_api(kubeconfig, pool=8)
    first = FirstCall(eapi)
    ex = kube_executor(KubeCluster(eapi, instance="scale"), Settings(), KEY, identity="scale", cache=cache2)
    stop, ticks = threading.Event(), [0]
    churners = [threading.Thread(target=churn, args=(mapi, size.pods, args.churn / 4, stop, ticks), daemon=True)
                for _ in range(4)]
    for t in churners:
        t.start()
    time.sleep(2.0)
    handled0, events0, t_load = w2.handled[0] if w2 else 0, cache2.events, time.monotonic()
    to_call, to_result = [], []
    outcomes: dict[str, int] = {}
    with ThreadPoolExecutor(4) as pool:
        for k in range(args.commands):
            raw = cordon_command(node_name(first_node + k))
            t0 = time.perf_counter()
            first.arm()

            def arrive(raw: bytes = raw) -> r.RemediationResult:
                return ex.handle(r.decode(r.RemediationCommand, raw))

            result = pool.submit(arrive).result()
            t1 = time.perf_counter()
            if first.at is None:
                raise RuntimeError("no API call for a cordon")
            to_call.append(first.at - t0)
            to_result.append(t1 - t0)
            outcomes[result.outcome] = outcomes.get(result.outcome, 0) + 1
            time.sleep(0.3)
    load_s = time.monotonic() - t_load
    stop.set()
    for t in churners:
        t.join()
    f["churn_per_s"] = ticks[0] / (load_s + 2.0)
    f["watcher_events_per_s"] = (w2.handled[0] - handled0) / load_s if w2 else float("nan")
    f["cache_events_per_s"] = (cache2.events - events0) / load_s
    f["first_call_p50_ms"], f["first_call_p95_ms"] = pct(to_call, 50) * 1e3, pct(to_call, 95) * 1e3
    f["result_p50_ms"], f["result_p95_ms"] = pct(to_result, 50) * 1e3, pct(to_result, 95) * 1e3
    f["applied"] = outcomes.get("applied", 0)
    print(f"  first request of each command: {first.path}; outcomes {outcomes}", flush=True)
    if w2:
        w2.stop()
    cache2.close()


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))]


def report(base: Size, target: Size) -> None:
    def row(label: str, key: str, unit: str, scale: float = 1.0, per_node: bool = True) -> None:
        b, t = base.figures[key] * scale, target.figures[key] * scale
        if per_node:
            bn, tn = b / base.nodes, t / target.nodes
            print(f"  {label:<44}{b:>11.3f}{t:>11.3f} {unit:<6}| per node {bn:>10.4f}{tn:>10.4f}  "
                  f"ratio {tn / bn if bn else float('nan'):5.2f}")
        else:
            print(f"  {label:<44}{b:>11.3f}{t:>11.3f} {unit:<6}| ratio {t / b if b else float('nan'):5.2f}")

    print(f"\nsizes: baseline {base.nodes} nodes / {base.pods} pods, target {target.nodes} nodes / {target.pods} pods")
    print(f"setup (target): nodes {target.setup.nodes_s:.1f}s for {target.nodes - base.nodes} (all Ready "
          f"{target.setup.ready_s:.1f}s later), pods {target.setup.pods_s:.1f}s for {target.pods - base.pods}, all "
          f"Running after {target.setup.running_s:.1f}s more; (baseline: {base.setup.nodes_s:.1f}s, "
          f"{base.setup.ready_s:.1f}s, {base.setup.pods_s:.1f}s, {base.setup.running_s:.1f}s)")
    print(f"  {'':<44}{'baseline':>11}{'target':>11}")
    row("job watcher: list+watch until synced", "watcher_sync_s", "s", 1.0)
    row("job watcher: memory held (tracemalloc)", "watcher_bytes", "KiB", 1 / 1024)
    row("job watcher: RSS growth", "watcher_rss_kib", "KiB")
    row("executor cache: list+watch until synced", "cache_sync_s", "s")
    row("  of it: the server's lists, read, not decoded", "list_server_s", "s")
    row("  of it: our decode of those bytes (CPU)", "list_decode_s", "s")
    row("  the lists' bytes", "list_kib", "KiB")
    row("executor cache: memory held (tracemalloc)", "cache_bytes", "KiB", 1 / 1024)
    row("executor cache: RSS growth", "cache_rss_kib", "KiB")
    row("restart placement, old lists (pods+nodes)", "restart_lists_s", "ms", 1e3)
    row("restart placement, cache indexes", "restart_cache_s", "ms", 1e3)
    row("drain poll: pods_on list (field selector)", "pods_on_list_s", "ms", 1e3, per_node=False)
    row("drain poll: cache pods-by-node", "pods_on_cache_s", "ms", 1e3, per_node=False)
    row("cordon: command -> first API call p50", "first_call_p50_ms", "ms", per_node=False)
    row("cordon: command -> first API call p95", "first_call_p95_ms", "ms", per_node=False)
    row("cordon: command -> result p50", "result_p50_ms", "ms", per_node=False)
    row("cordon: command -> result p95", "result_p95_ms", "ms", per_node=False)
    for s in (base, target):
        f = s.figures
        print(f"  load at {s.nodes} nodes: {f['churn_per_s']:.0f} pod updates/s; job watcher took "
              f"{f['watcher_events_per_s']:.0f} events/s, cache {f['cache_events_per_s']:.0f} events/s; "
              f"{f['applied']:.0f} cordons applied")


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--base-nodes", type=int, default=200)
    ap.add_argument("--base-pods", type=int, default=400)
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--pods", type=int, default=4000)
    ap.add_argument("--commands", type=int, default=20)
    ap.add_argument("--churn", type=float, default=50.0, help="pod updates per second during the commands")
    ap.add_argument("--threads", type=int, default=16, help="concurrent creations")
    ap.add_argument("--sync-timeout", type=float, default=600.0, help="give up on a sync after this (s)")
    ap.add_argument("--lease-s", type=int, default=600,
                    help="node Lease duration kwok renews (0: kwok's default, which keeps no Leases; see above; "
                         "the tests use 40)")
    ap.add_argument("--kubeconfig", default=os.environ.get(dev_settings.ENV_KUBECONFIG, ""))
    args = ap.parse_args()
    if args.pods > 2 * args.nodes or args.base_pods > 2 * args.base_nodes or args.commands + 2 > args.base_nodes:
        ap.error("at most 2 pods per node (8 GPUs), and more baseline nodes than commands")
    own: Kube | None = None
    tmp = ""
    if args.kubeconfig:
        kubeconfig = Path(args.kubeconfig)
    else:
        tmp = tempfile.mkdtemp(prefix="fm-scale-")
        own = Kube(Path(tmp) / "kube", Ports.free(), node_lease_s=args.lease_s)
        t0 = time.monotonic()
        own.start(timeout=180)
        print(f"control plane up in {time.monotonic() - t0:.1f}s ({tmp}); node leases: "
              + (f"{args.lease_s}s (kwok renews each every {args.lease_s / 4:.0f}s; node-monitor-grace-period "
                 f"{args.lease_s + 60}s), so nodes stay Ready and pods are not evicted" if args.lease_s else
                 "kwok's default (no Leases: nodes go NotReady after 50s, their pods are evicted 300s later)"),
              flush=True)
        kubeconfig = own.kubeconfig
    api = make_api(kubeconfig)
    try:
        must(call(api, "POST", "/api/v1/namespaces", {"metadata": {"name": NS}}), (201, 409))
        wait_for("the default ServiceAccount", lambda: call(
            api, "GET", f"/api/v1/namespaces/{NS}/serviceaccounts/default")[0] == 200, 60)
        sizes = []
        have = (0, 0)
        for n, p, first_node in ((args.base_nodes, args.base_pods, 0),
                                 (args.nodes, args.pods, args.base_nodes)):
            print(f"creating up to {n} nodes and {p} pods ...", flush=True)
            setup = grow(api, have, (n, p), args.threads)
            have = (n, p)
            print(f"  nodes {setup.nodes_s:.1f}s, all Ready (kwok) {setup.ready_s:.1f}s later, "
                  f"pods {setup.pods_s:.1f}s, Running after {setup.running_s:.1f}s "
                  f"({setup.nudged} Pending pods touched)", flush=True)
            print(f"  before measuring: {fleet_health(api)}", flush=True)
            size = Size(n, p, setup)
            measure(kubeconfig, size, first_node, args)
            print(f"  after measuring: {fleet_health(api)}", flush=True)
            print(f"  {json.dumps({k: round(v, 4) for k, v in size.figures.items()})}", flush=True)
            sizes.append(size)
        report(sizes[0], sizes[1])
    finally:
        logging.disable(logging.WARNING)  # the watches still open see the cluster go
        if own is not None:
            own.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            call(api, "DELETE", f"/api/v1/namespaces/{NS}")
            call(api, "DELETE", "/api/v1/nodes", query={"labelSelector": f"fleetmedic.io/fleet={FLEET}"})
        api.close()  # type: ignore[no-untyped-call]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
