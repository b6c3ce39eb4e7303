"""Job-events watcher: Kubernetes Pods, Jobs, PyTorchJobs and JobSets -> ``jobs.events`` on Kafka;
Nodes -> ``cluster.nodes``.

One thread per watched resource (and namespace) lists it, then watches from the list's
``resourceVersion`` (bookmarks on; the calls are :mod:`fleetmedic.kube_watch`'s), renews the watch
when it times out, lists again when the server says the version is too old (410 Gone) and
reconnects with exponential backoff after any other error. A workload kind whose API is not served
(CRD missing) is looked for again every ``missing_kind_retry_s``. Watch events are raw JSON dicts
(no model decoding, so a malformed object cannot break a stream), reduced to the fields the
trackers read (``FIELDS``: no managedFields, pod templates, volumes or images), and go through a
bounded queue (watches block when it is full) to
:class:`fleetmedic.connectors.kube.jobs_map.JobTracker`, whose ``JobEvent`` records are produced to
``jobs.events`` keyed by job ("namespace/name"). A list goes to the queue a page at a time
(``list_page_size`` objects), so the watcher never holds a whole list: what a list holds at once
sets the process's RSS for good (2,000 kwok Nodes decode to ~40 MiB, real ones to more). After a
re-list the tracker is told of objects that disappeared meanwhile. Everything is counted in
``fleetmedic_jobwatch_*`` metrics on the registry passed in.

With ``jobwatch.watch_nodes`` it also watches Nodes (cluster-scoped, one watch): the
:class:`fleetmedic.connectors.kube.nodes_map.NodeTracker` turns them into ``NodeObservation``
records (cordon, who made it, the placement and opt-out labels; deleted nodes) produced to
``cluster.nodes`` keyed by node, which the decision stage reads for its topology and fleet size.
The same watch feeds :class:`fleetmedic.connectors.kube.node_conditions.ConditionTracker`: a node
condition (the kubelet's, node-problem-detector's, NVSentinel's) that changes into a state a rule of
the ``conditions`` section names becomes a ``Finding`` on ``findings``, keyed by node.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry, Counter, Gauge

from fleetmedic.config import JobWatchSettings, Settings
from fleetmedic.connectors.kube.jobs_map import POD_FIELDS, WORKLOAD_FIELDS, WORKLOAD_KINDS, JobTracker
from fleetmedic.connectors.kube.node_conditions import CONDITION_FIELDS, ConditionTracker
from fleetmedic.connectors.kube.nodes_map import NODE_FIELDS, NodeTracker
from fleetmedic.kube_watch import (
    Fields,
    Gone,
    NotServed,
    event_of,
    keep,
    list_pages,
    merged,
    resource_version,
    watch_lines,
)
from fleetmedic.records import Finding, JobEvent, NodeObservation, Record, encode, labelled

log = logging.getLogger("fleetmedic.connectors.kube_jobs")
RESOURCES: dict[str, tuple[str, str]] = {  # kind -> (API prefix, plural)
    "Pod": ("/api/v1", "pods"),
    "Job": ("/apis/batch/v1", "jobs"),
    "PyTorchJob": ("/apis/kubeflow.org/v1", "pytorchjobs"),
    "JobSet": ("/apis/jobset.x-k8s.io/v1alpha2", "jobsets"),
    "Node": ("/api/v1", "nodes"),
}
CLUSTER_SCOPED = frozenset({"Node"})
#: What the watcher keeps of each kind's objects: the fields its trackers read
FIELDS: dict[str, Fields] = {"Pod": POD_FIELDS, **dict.fromkeys(WORKLOAD_KINDS, WORKLOAD_FIELDS),
                             "Node": merged(NODE_FIELDS, CONDITION_FIELDS)}


class JobWatchMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p = "fleetmedic_jobwatch_"
        self.objects = Counter(f"{p}objects_total", "Watch events received", ["kind"], registry=registry)
        self.events = Counter(f"{p}job_events_total", "JobEvent records produced", ["event"], registry=registry)
        self.skipped = Counter(f"{p}skipped_total", "Objects skipped as unreadable", ["kind", "reason"],
                               registry=registry)
        self.relists = Counter(f"{p}relists_total", "Full lists (start, 410 Gone, reconnect)", ["kind", "cause"],
                               registry=registry)
        self.errors = Counter(f"{p}watch_errors_total", "Failed lists or watches", ["kind"], registry=registry)
        self.produce_errors = Counter(f"{p}produce_errors_total", "JobEvents Kafka did not take", registry=registry)
        self.node_observations = Counter(f"{p}node_observations_total", "NodeObservation records produced",
                                         registry=registry)
        self.condition_findings = Counter(f"{p}condition_findings_total",
                                          "Findings produced from node conditions, by condition type", ["type"],
                                          registry=registry)
        self.tracked = Gauge(f"{p}tracked_jobs", "Training jobs being tracked", registry=registry)
        self.queue = Gauge(f"{p}queue_depth", "Watch events waiting for the tracker", registry=registry)


def resource_path(kind: str, namespace: str = "") -> str:
    """The API path of ``kind`` in ``namespace`` ("" = all; ignored for cluster-scoped kinds)."""
    prefix, plural = RESOURCES[kind]
    if kind in CLUSTER_SCOPED:
        return f"{prefix}/{plural}"
    return f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"


Sink = Callable[[str, str, Any], None]  # (kind, event type, object or raw bytes)


@dataclass
class ResourceWatch:
    """List + watch one resource in one namespace ("" = all) until ``stop`` is set."""

    api: client.ApiClient
    kind: str
    namespace: str
    selector: str
    sink: Sink
    metrics: JobWatchMetrics
    settings: JobWatchSettings
    stop: threading.Event
    resume_version: str = ""  # watch from here first instead of listing (410 Gone: list after all)
    first_pass: threading.Event = field(default_factory=threading.Event)  # set after the first list (or try)
    fields: Fields | None = None  # what the sink gets of each object (None: all of it)

    def run(self) -> None:
        path = resource_path(self.kind, self.namespace)
        known: dict[str, Stub] = {}
        cause, backoff = "start", self.settings.reconnect_backoff_s
        while not self.stop.is_set():
            try:
                try:
                    rv, self.resume_version = self.resume_version or self._relist(path, known, cause), ""
                finally:
                    self.first_pass.set()
                backoff = self.settings.reconnect_backoff_s
                while not self.stop.is_set():
                    rv = self._watch(path, known, rv)
            except Gone:
                cause = "gone"
            except NotServed:
                log.info("%s: not served by the API server; looking again in %.0fs", path,
                         self.settings.missing_kind_retry_s)
                cause = "not_served"
                self.stop.wait(self.settings.missing_kind_retry_s)
            except Exception as exc:  # network, TLS, API errors: reconnect with backoff
                self.metrics.errors.labels(self.kind).inc()
                log.warning("%s: %s; reconnecting in %.1fs", path, exc, backoff)
                cause = "error"
                self.stop.wait(backoff)
                backoff = min(backoff * 2, self.settings.max_backoff_s)

    def _relist(self, path: str, known: dict[str, Stub], cause: str) -> str:
        seen: set[str] = set()
        rv = ""
        pages = list_pages(self.api, path, self.selector, page=self.settings.list_page_size)
        for page in pages:  # each page to the sink before the next is read
            if page.again:  # the list starts over: what is deleted is what this one lacks
                seen.clear()
            self._listed(page.items, known, seen)
            rv = page.resource_version
            del page  # not held while the next page is read
        self.metrics.relists.labels(self.kind, cause).inc()
        for key in set(known) - seen:  # deleted while we were not watching
            self.sink(self.kind, "DELETED", _unstub(self.kind, known.pop(key)))
        return rv

    def _listed(self, items: list[dict[str, Any]], known: dict[str, Stub], seen: set[str]) -> None:
        for obj in items:
            key = _key(obj)
            seen.add(key)
            known[key] = _stub(self.kind, obj)
            self.sink(self.kind, "ADDED", self._kept(obj))

    def _watch(self, path: str, known: dict[str, Stub], rv: str) -> str:
        for line in watch_lines(self.api, path, self.selector, rv, self.settings.watch_timeout_s):
            if self.stop.is_set():
                break
            event = event_of(line, path)
            if event is None:
                self.sink(self.kind, "BAD", line[:200])
                continue
            etype, obj = event
            rv = resource_version(obj) or rv
            if etype == "BOOKMARK":
                continue
            if isinstance(obj.get("metadata"), dict):
                if etype == "DELETED":
                    known.pop(_key(obj), None)
                else:
                    known[_key(obj)] = _stub(self.kind, obj)
            self.sink(self.kind, etype, self._kept(obj))
        return rv

    def _kept(self, obj: dict[str, Any]) -> Any:
        return obj if self.fields is None else keep(obj, self.fields)


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


#: What reporting an object's deletion after a re-list needs of it: its name and uid (the tracker
#: finds a pod's job by uid, not by labels, and a workload by name; the node tracker reports a
#: deleted node with the labels it kept of it, so a node's labels, a hundred on a GPU node, are
#: not kept here).
STUB_FIELDS = ("name", "namespace", "uid")
#: Those fields' values in that order (None: absent); a tuple, not the metadata dict, since one is
#: kept for every object watched (at 4,000 pods the dicts took 2.7 MiB of the watcher's 10).
Stub = tuple[Any, ...]


def _stub(kind: str, obj: dict[str, Any]) -> Stub:
    """Enough of an object to report its deletion later (kept for every object watched)."""
    meta = obj.get("metadata") or {}
    name, namespace, uid = (meta.get(k) for k in STUB_FIELDS)
    if isinstance(namespace, str):  # a few namespaces, one copy each
        namespace = sys.intern(namespace)
    return name, namespace, uid


def _unstub(kind: str, stub: Stub) -> dict[str, Any]:
    """The object a deletion is reported with: its metadata's kept fields (absent ones left out)."""
    return {"metadata": {k: v for k, v in zip(STUB_FIELDS, stub, strict=True) if v is not None}}


class JobWatcher:
    """The watches, the tracker and the Kafka producer of ``fleetmedic watch-jobs``."""

    def __init__(self, api: client.ApiClient, settings: Settings, registry: CollectorRegistry,
                 clock: Callable[[], float] = time.time) -> None:
        self.api, self.settings, self.clock = api, settings, clock
        self.jw = settings.jobwatch
        self.metrics = JobWatchMetrics(registry)
        self.tracker = JobTracker(gpu_only=self.jw.gpu_only, gpu_resource=self.jw.gpu_resource,
                                  tombstone_s=self.jw.deleted_memory_s)
        self.node_tracker = NodeTracker.of(settings)
        self.condition_tracker = ConditionTracker.of(settings)
        self.queue: queue.Queue[tuple[str, str, Any]] = queue.Queue(maxsize=self.jw.queue_size)
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self._skipped_seen: dict[tuple[str, str], int] = {}

    def start_watches(self, first_list_timeout: float = 30.0) -> None:
        """Workload watches first; pods once the workloads' first lists are queued (or they failed or
        timed out), so the tracker knows each job's size before its pods: no partial placements."""
        namespaces = self.jw.namespaces or [""]
        workloads = [self._watch(kind, ns, self.jw.workload_label_selector)
                     for kind in self.jw.kinds for ns in namespaces]
        deadline = time.monotonic() + first_list_timeout
        for w in workloads:
            w.first_pass.wait(max(0.0, deadline - time.monotonic()))
        for ns in namespaces:
            self._watch("Pod", ns, self.jw.pod_label_selector)
        if self.jw.watch_nodes:
            self._watch("Node", "", "")

    def _watch(self, kind: str, namespace: str, selector: str) -> ResourceWatch:
        w = ResourceWatch(self.api, kind, namespace, selector, self._enqueue, self.metrics, self.jw, self.stop,
                          fields=FIELDS[kind])
        t = threading.Thread(target=w.run, name=f"watch-{kind}-{namespace or 'all'}", daemon=True)
        t.start()
        self.threads.append(t)
        return w

    def _enqueue(self, kind: str, etype: str, obj: Any) -> None:
        while not self.stop.is_set():
            try:
                self.queue.put((kind, etype, obj), timeout=0.5)
                return
            except queue.Full:
                continue

    def handle(self, kind: str, etype: str, obj: Any) -> list[JobEvent]:
        """One watch event through the tracker (also used directly by tests)."""
        self.metrics.objects.labels(kind).inc()
        now = self.clock()
        if etype == "BAD" or not isinstance(obj, dict):
            self.tracker.skip(kind, "bad_json", repr(obj)[:200])
            events: list[JobEvent] = []
        elif kind == "Pod":
            events = self.tracker.observe_pod(etype, obj, now)
        else:
            events = self.tracker.observe_workload(kind, etype, obj, now)
        for key, n in self.tracker.skipped.items():
            if n != self._skipped_seen.get(key, 0):
                self.metrics.skipped.labels(*key).inc(n - self._skipped_seen.get(key, 0))
                self._skipped_seen[key] = n
                log.warning("skipped %s", self.tracker.last_skip)
        self.metrics.tracked.set(len(self.tracker.jobs))
        return events

    def handle_node(self, etype: str, obj: Any) -> NodeObservation | None:
        """One Node watch event through the node tracker (also used directly by tests)."""
        self.metrics.objects.labels("Node").inc()
        before = self.node_tracker.skipped.total()
        obs = None
        if etype == "BAD" or not isinstance(obj, dict):
            self.node_tracker.skip("bad_json", repr(obj)[:200])
        else:
            obs = self.node_tracker.observe(etype, obj, self.clock())
        if self.node_tracker.skipped.total() != before:
            self.metrics.skipped.labels("Node", self.node_tracker.last_code).inc()
            log.warning("skipped Node: %s", self.node_tracker.last_skip)
        return obs

    def handle_node_conditions(self, etype: str, obj: Any) -> list[Finding]:
        """One Node watch event through the condition rules: the findings of the conditions that changed."""
        return self.condition_tracker.observe(etype, obj, self.clock()) if etype != "BAD" else []

    async def run(self, until: asyncio.Event | None = None) -> None:
        """Watch and produce until ``until`` is set (or forever)."""
        from aiokafka import AIOKafkaProducer

        from fleetmedic.bus import TELEMETRY, producer_options

        topic, nodes_topic = self.settings.topics.topic("jobs.events"), self.settings.topics.topic("cluster.nodes")
        findings_topic = self.settings.topics.topic("findings")
        cluster = self.settings.cluster.name  # on every record it sends

        def value(record: Record) -> bytes:
            return encode(labelled(record, cluster))

        producer = AIOKafkaProducer(**producer_options(self.settings.kafka, TELEMETRY))
        await _start_with_retry(producer, self.jw.reconnect_backoff_s, self.jw.max_backoff_s, until)
        loop = asyncio.get_running_loop()
        starter = threading.Thread(target=self.start_watches, name="watch-starter", daemon=True)
        starter.start()  # while the loop below already drains the queue the first lists fill
        try:
            while until is None or not until.is_set():
                item = await loop.run_in_executor(None, self._next, 0.5)
                self.metrics.queue.set(self.queue.qsize())
                if item is None:
                    continue
                if item[0] == "Node":
                    obs = self.handle_node(item[1], item[2])
                    if obs is not None:
                        fut = await producer.send(nodes_topic, key=obs.node.encode(), value=value(obs))
                        fut.add_done_callback(self._sent_node(obs.node))
                    for finding in self.handle_node_conditions(item[1], item[2]):
                        fut = await producer.send(findings_topic, key=finding.node.encode(), value=value(finding))
                        fut.add_done_callback(self._sent_finding(finding))
                    continue
                for event in self.handle(*item):
                    fut = await producer.send(topic, key=event.job.encode(), value=value(event))
                    fut.add_done_callback(self._sent(event.event))
        finally:
            self.stop.set()
            await producer.stop()
            # watch threads end at their next event or watch timeout; they are daemons, so wait a
            # little (one shared deadline), not for every open stream
            deadline = time.monotonic() + 2.0
            for t in [starter, *self.threads]:
                t.join(timeout=max(0.0, deadline - time.monotonic()))

    def _next(self, timeout: float) -> tuple[str, str, Any] | None:
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def _sent(self, event: str) -> Callable[[asyncio.Future[Any]], None]:
        def done(fut: asyncio.Future[Any]) -> None:
            if fut.cancelled() or fut.exception() is not None:
                self.metrics.produce_errors.inc()
                log.warning("jobs.events: %s not produced: %s", event, None if fut.cancelled() else fut.exception())
            else:
                self.metrics.events.labels(event).inc()
        return done


    def _sent_finding(self, finding: Finding) -> Callable[[asyncio.Future[Any]], None]:
        ctype = finding.evidence[0].metric.partition(":")[2] if finding.evidence else ""

        def done(fut: asyncio.Future[Any]) -> None:
            if fut.cancelled() or fut.exception() is not None:
                self.metrics.produce_errors.inc()
                log.warning("findings: %s not produced: %s", finding.id, None if fut.cancelled() else fut.exception())
            else:
                self.metrics.condition_findings.labels(ctype).inc()
                log.info("node %s: %s", finding.node, finding.summary)
        return done

    def _sent_node(self, node: str) -> Callable[[asyncio.Future[Any]], None]:
        def done(fut: asyncio.Future[Any]) -> None:
            if fut.cancelled() or fut.exception() is not None:
                self.metrics.produce_errors.inc()
                log.warning("cluster.nodes: %s not produced: %s", node, None if fut.cancelled() else fut.exception())
            else:
                self.metrics.node_observations.inc()
        return done


async def _start_with_retry(producer: Any, backoff: float, max_backoff: float, until: asyncio.Event | None) -> None:
    from aiokafka.errors import KafkaError

    while True:
        try:
            await producer.start()
            return
        except KafkaError as exc:
            if until is not None and until.is_set():
                raise
            log.warning("Kafka: %s; retrying in %.1fs", exc, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, max_backoff)
