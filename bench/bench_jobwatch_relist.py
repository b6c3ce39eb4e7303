"""The job watcher's memory through lists and re-lists: its RSS at start and after each full re-list.

    .venv/bin/python bench/bench_jobwatch_relist.py [--nodes 2000] [--pods 512] [--relists 6]
    .venv/bin/python bench/bench_jobwatch_relist.py --kubeconfig FILE [--relists 6]

Runs ``fleetmedic watch-jobs``' watcher (:class:`fleetmedic.connectors.kube.jobs.JobWatcher`: its
watch threads, bounded queue and trackers; no Kafka: the loop that drains the queue calls the
trackers as ``JobWatcher.run`` does) against an in-memory API server
(:mod:`fleetmedic.devenv.fake_api`) holding ``nodes`` Nodes and ``pods`` GPU pods of 8-rank Jobs as a
kwok cluster serves them (about 4-5 KB of JSON each). It waits until the first lists are through,
then ``relists`` times answers every watch 410 Gone at once, so every resource is listed again
together, as after the soak's kube-apiserver restart, and waits until those lists are through.
With ``--kubeconfig`` it watches a real cluster's Nodes (and the Pods and Jobs of namespace ``soak``)
as they are instead; its watches, renewed every 2 s, are answered 410 Gone on each re-list.

Prints the process's RSS (``VmRSS``) and high mark (``VmHWM``) before the watcher starts, after the
first lists and after each re-list; with ``--trace``, tracemalloc's peak too (slower). The RSS the
lists add is what the watcher holds at once: the objects decoded and waiting in the queue.
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry

from fleetmedic.config import JobWatchSettings, Settings
from fleetmedic.connectors.kube.jobs import JobWatcher, resource_path
from fleetmedic.devenv.fake_api import FakeApiServer, served_node, served_pod
from fleetmedic.devenv.kclient import api_client

NS = "soak"


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def mib(kib: int) -> str:
    return f"{kib / 1024:7.1f} MiB"


class GoneOnRequest:
    """A real cluster's ApiClient whose next watch of each path is answered 410 Gone after
    :meth:`relist` (the watcher lists that path again)."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.pending: set[str] = set()
        self.lists = 0

    def relist(self, paths: list[str]) -> None:
        self.pending |= set(paths)

    def param_serialize(self, *args: Any, **kw: Any) -> Any:
        return self.api.param_serialize(*args, **kw)

    def call_api(self, method: str, url: str, *args: Any, **kw: Any) -> Any:
        parts = urlsplit(url)
        if "watch=1" in parts.query and parts.path in self.pending:
            self.pending.discard(parts.path)
            return _Gone()
        if "watch=1" not in parts.query and "continue=" not in parts.query:
            self.lists += 1
        return self.api.call_api(method, url, *args, **kw)


class _Gone:
    status = 410

    def read(self) -> bytes:
        return b"{}"


def count(api: Any, path: str) -> int:
    """How many objects ``path`` holds, from a one-object page (listing them all here would set the
    process's high mark before the watcher starts)."""
    import json

    from fleetmedic.kube_watch import get

    doc = json.loads(get(api, path, {"limit": "1"}, 30.0).read())
    return len(doc.get("items") or []) + int((doc.get("metadata") or {}).get("remainingItemCount") or 0)


def drain(w: JobWatcher, until: int, counter: list[int], timeout: float = 300.0) -> None:
    """Take watch events off the queue into the trackers (as ``JobWatcher.run``) until ``until`` are through."""
    deadline = time.monotonic() + timeout
    while counter[0] < until:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{counter[0]} of {until} watch events through")
        item = w._next(0.5)
        if item is None:
            continue
        kind, etype, obj = item
        if kind == "Node":
            w.handle_node(etype, obj)
            w.handle_node_conditions(etype, obj)
        else:
            w.handle(kind, etype, obj)
        counter[0] += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--pods", type=int, default=512)
    ap.add_argument("--relists", type=int, default=6)
    ap.add_argument("--trace", action="store_true", help="tracemalloc's peak as well (slower)")
    ap.add_argument("--kubeconfig", default="", help="watch this cluster instead of the in-memory API server")
    args = ap.parse_args()

    node_path, pod_path, job_path = resource_path("Node"), resource_path("Pod", NS), resource_path("Job", NS)
    api: Any
    if args.kubeconfig:
        api = GoneOnRequest(api_client(args.kubeconfig))
        nodes, pods, jobs = (count(api.api, p) for p in (node_path, pod_path, job_path))
        where = f"the cluster of {args.kubeconfig}"
    else:
        api = FakeApiServer()
        for i in range(args.nodes):
            api.put(node_path, served_node("soak", i))
        nodes, pods, jobs = args.nodes, args.pods, (args.pods + 7) // 8
        for j in range(jobs):
            api.put(job_path, {"metadata": {"name": f"j{j}", "namespace": NS, "uid": f"j{j}-job-uid"},
                               "spec": {"parallelism": 8, "completions": 8, "completionMode": "Indexed"},
                               "status": {}})
        for p in range(pods):
            api.put(pod_path, served_pod(NS, f"j{p // 8}", p % 8, f"soak-gpu-{p % max(1, nodes):03d}"))
        where = "the in-memory API server"
    timeout_s = 2 if args.kubeconfig else 3600
    settings = Settings(jobwatch=JobWatchSettings(namespaces=[NS], kinds=["Job"], watch_timeout_s=timeout_s))
    objects = nodes + pods + jobs
    gc.collect()
    base_rss = status_kib("VmRSS")
    print(f"{nodes} Nodes, {pods} Pods, {jobs} Jobs in {where}; RSS {mib(base_rss)} before the watcher starts",
          flush=True)
    if args.trace:
        tracemalloc.start()

    w = JobWatcher(api, settings, CollectorRegistry())  # type: ignore[arg-type]
    counter = [0]
    t0 = time.perf_counter()
    w.start_watches(first_list_timeout=0.0)  # lists the pods at once; the loop below drains meanwhile
    drain(w, objects, counter)

    def report(what: str) -> None:
        gc.collect()
        rss, hwm = status_kib("VmRSS"), status_kib("VmHWM")
        line = f"{what:<16} RSS {mib(rss)} (+{mib(rss - base_rss).strip()}), high mark {mib(hwm)}"
        if args.trace:
            size, peak = tracemalloc.get_traced_memory()
            line += f", traced {size / 2**20:6.1f} MiB, traced peak {peak / 2**20:6.1f} MiB"
        print(line, flush=True)

    report(f"first lists ({time.perf_counter() - t0:.1f} s)")
    for r in range(args.relists):
        if isinstance(api, GoneOnRequest):
            api.relist([job_path, pod_path, node_path])
        else:
            for path in (job_path, pod_path, node_path):
                api.gone(path)
        drain(w, objects * (r + 2), counter)
        report(f"re-list {r + 1}")
    w.stop.set()
    if isinstance(api, GoneOnRequest):
        print(f"{api.lists} lists; nodes {len(w.node_tracker.nodes)}")
    else:
        relists = sum(1 for _, q in api.requests if "watch" not in q and "continue" not in q)
        print(f"{relists} lists, {len(api.requests)} requests; tracked jobs {len(w.tracker.jobs)}, "
              f"nodes {len(w.node_tracker.nodes)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
