"""What the job watcher holds between the API server and its trackers, against an in-memory API
server (fleetmedic.devenv.fake_api):

- a list goes to the queue a page at a time: the first page's objects are queued before the second
  page is asked for, and a list that starts over after an expired continue token still reports the
  objects deleted meanwhile;
- what is queued of each object is the fields its trackers read (no managedFields, volumes, kwok
  status), and the trackers say exactly the same of those as of the whole objects, malformed ones
  included;
- :func:`fleetmedic.kube_watch.keep` and :func:`~fleetmedic.kube_watch.merged` on their own.
"""

from __future__ import annotations

import copy
import json
import threading
from typing import Any

from prometheus_client import CollectorRegistry

from fleetmedic.config import JobWatchSettings, Settings
from fleetmedic.connectors.kube.jobs import FIELDS, JobWatcher, JobWatchMetrics, ResourceWatch, resource_path
from fleetmedic.connectors.kube.jobs_map import JobTracker
from fleetmedic.connectors.kube.node_conditions import ConditionTracker
from fleetmedic.connectors.kube.nodes_map import NodeTracker
from fleetmedic.devenv.fake_api import FakeApiServer, served_node, served_pod
from fleetmedic.kube_watch import keep, merged

NS = "ml"
PAGE = 20  # jobwatch.list_page_size in these tests


def _watch(api: FakeApiServer, kind: str, sink: Any) -> ResourceWatch:
    return ResourceWatch(api, kind, NS, "", sink, JobWatchMetrics(CollectorRegistry()),  # type: ignore[arg-type]
                         JobWatchSettings(list_page_size=PAGE), threading.Event(), fields=FIELDS[kind])


def test_a_list_reaches_the_sink_a_page_at_a_time() -> None:
    api = FakeApiServer()
    path = resource_path("Pod", NS)
    for i in range(2 * PAGE + 10):
        api.put(path, served_pod(NS, f"j{i // 8}", i % 8, f"n{i}"))
    requests_at: list[int] = []
    w = _watch(api, "Pod", lambda kind, etype, obj: requests_at.append(len(api.requests)))
    rv = w._relist(path, {}, "start")
    assert len(api.requests) == 3 and rv == str(api.version)
    assert [q["limit"] for _, q in api.requests] == [str(PAGE)] * 3  # jobwatch.list_page_size
    # a page's objects are queued before the next page is read: the watcher never holds the whole list
    assert requests_at[:PAGE] == [1] * PAGE and requests_at[PAGE:2 * PAGE] == [2] * PAGE
    assert requests_at[2 * PAGE:] == [3] * 10


def test_a_list_that_starts_over_reports_what_the_second_list_lacks() -> None:
    api = FakeApiServer()
    path = resource_path("Pod", NS)
    for i in range(PAGE + 5):
        api.put(path, served_pod(NS, "big", i, f"n{i}", uid=f"u{i}"))
    seen: list[tuple[str, str]] = []
    w = _watch(api, "Pod", lambda kind, etype, obj: seen.append((etype, obj["metadata"]["uid"])))
    known: dict[str, Any] = {}
    w._relist(path, known, "start")
    assert len(known) == PAGE + 5

    def compacted_meanwhile(path_: str, query: dict[str, str]) -> None:
        if "continue" in query:  # after the first page: pod 0 is deleted and the token has expired
            api.delete(path, f"{NS}/big-0-x7k2p")

    seen.clear()
    api.requests.clear()
    api.before, api.expire_continue = compacted_meanwhile, True
    w._relist(path, known, "gone")
    assert [q.get("continue") for _, q in api.requests] == [None, str(PAGE), None]  # then all in one piece
    assert ("ADDED", "u0") in seen  # from the first page, before the list started over
    assert [uid for etype, uid in seen if etype == "DELETED"] == ["u0"]
    assert len(known) == PAGE + 4 and f"{NS}/big-0-x7k2p" not in known


def test_the_watcher_queues_only_the_fields_its_trackers_read() -> None:
    api = FakeApiServer()
    for i in range(4):
        api.put(resource_path("Node"), served_node("f", i))
        api.put(resource_path("Pod", NS), served_pod(NS, "train", i, f"f-gpu-00{i}"))
    api.put(resource_path("Job", NS), {"metadata": {"name": "train", "namespace": NS, "uid": "train-job-uid",
                                                    "managedFields": [{"manager": "kubectl"}],
                                                    "annotations": {"kubectl.kubernetes.io/last-applied-configuration":
                                                                    "{...}" * 1000}},
                                       "spec": {"parallelism": 4, "completions": 4, "template": {"spec": {
                                           "containers": [{"name": "t", "image": "i"}]}}}, "status": {}})
    settings = Settings(jobwatch=JobWatchSettings(namespaces=[NS], kinds=["Job"]))
    w = JobWatcher(api, settings, CollectorRegistry())  # type: ignore[arg-type]
    w.start_watches(first_list_timeout=10)
    got: list[tuple[str, str, Any]] = []
    while len(got) < 9:
        got.append(w.queue.get(timeout=10))
    w.stop.set()
    by_kind: dict[str, list[Any]] = {}
    for kind, _, obj in got:
        by_kind.setdefault(kind, []).append(obj)
    whole = {"Node": served_node("f", 0), "Pod": served_pod(NS, "train", 0, "f-gpu-000")}
    for kind, objs in by_kind.items():
        for obj in objs:
            assert "managedFields" not in obj["metadata"] and "resourceVersion" not in obj["metadata"]
        if kind in whole:
            assert len(json.dumps(objs[0])) < len(json.dumps(whole[kind])) / 2
    assert set(by_kind["Pod"][0]["spec"]) == {"nodeName", "containers"}
    assert set(by_kind["Node"][0]["status"]) == {"conditions"}
    assert by_kind["Job"][0] == {"metadata": {"name": "train", "namespace": NS, "uid": "train-job-uid",
                                              "annotations": {}},
                                 "spec": {"parallelism": 4, "completions": 4}, "status": {}}
    events = [e for kind, etype, obj in got if kind != "Node" for e in w.handle(kind, etype, obj)]
    assert [e.event for e in events] == ["placement", "start"] and events[0].world_size == 4


def _pod_corpus() -> list[tuple[str, dict[str, Any]]]:
    """Pod events of every shape the tracker reads: ranks placed, running, failing (state and
    lastState), a replacement, a deletion mark, a CPU pod, and malformed objects."""
    events: list[tuple[str, dict[str, Any]]] = []
    for r in range(3):
        events.append(("ADDED", served_pod(NS, "train", r, "", "Pending")))
        events.append(("MODIFIED", served_pod(NS, "train", r, f"n{r}", "Running")))
    crashed = served_pod(NS, "train", 1, "n1", "Running")
    crashed["status"]["containerStatuses"][0].update(
        {"restartCount": 1, "state": {"terminated": {"exitCode": 139, "reason": "Error", "message": "segfault"}},
         "lastState": {"terminated": {"exitCode": 1, "reason": "OOMKilled"}}})
    failed = served_pod(NS, "train", 2, "n2", "Failed")
    failed["status"].update({"reason": "Evicted", "containerStatuses": []})
    gone = served_pod(NS, "train", 0, "n0", "Running")
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    cpu = served_pod(NS, "web", 0, "n0")
    cpu["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    pytorch = served_pod(NS, "pt", 0, "n3")
    pytorch["metadata"]["labels"] = {"training.kubeflow.org/job-name": "pt",
                                     "training.kubeflow.org/replica-type": "master"}
    bad_gpu = served_pod(NS, "train", 5, "n5")
    bad_gpu["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "eight"}}
    odd_spec = served_pod(NS, "train", 6, "n6")
    odd_spec["spec"] = {"nodeName": "n6"}  # no containers: no GPUs
    odd_status = served_pod(NS, "train", 7, "n7")
    odd_status["status"]["containerStatuses"] = [{"name": "t", "restartCount": "x", "state": {
        "terminated": {"exitCode": "?"}}}]
    events += [("MODIFIED", crashed), ("MODIFIED", failed), ("ADDED", served_pod(NS, "train", 2, "n9", uid="new")),
               ("MODIFIED", gone), ("ADDED", cpu), ("ADDED", pytorch), ("ADDED", bad_gpu), ("ADDED", odd_spec),
               ("ADDED", odd_status), ("ADDED", {"metadata": {"name": "x"}}), ("ADDED", {"metadata": "x"}),
               ("DELETED", served_pod(NS, "train", 1, "n1", "Running"))]
    return events


def _workload_corpus() -> list[tuple[str, str, dict[str, Any]]]:
    def obj(name: str, spec: Any, status: Any = None, **meta: Any) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": NS, "uid": f"{name}-job-uid", "managedFields": [{}], **meta},
                "spec": spec, "status": status if status is not None else {}}

    template = {"spec": {"parallelism": 2, "template": {"spec": {"containers": [{"name": "t"}]}}}}
    return [
        ("Job", "ADDED", obj("train", {"parallelism": 3, "completions": 3, "template": {}})),
        ("Job", "MODIFIED", obj("train", {"parallelism": 3}, {"conditions": [
            {"type": "Suspended", "status": "False"}]},
            annotations={"fleetmedic.io/restart-attempts": "2", "other": "x" * 100})),
        ("Job", "MODIFIED", obj("done", {"parallelism": 1}, {"conditions": [
            {"type": "Complete", "status": "True", "reason": "CompletionsReached"}]})),
        ("Job", "MODIFIED", obj("failed", {"parallelism": 1}, {"conditions": [
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "m"}]})),
        ("PyTorchJob", "ADDED", obj("pt", {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": {}},
                                                                   "Worker": {"replicas": 3}, "Odd": None}})),
        ("PyTorchJob", "ADDED", obj("pt2", {"pytorchReplicaSpecs": ["not", "a", "map"]})),
        ("JobSet", "ADDED", obj("js", {"replicatedJobs": [{"name": "w", "replicas": 2, "template": template},
                                                          {"name": "d", "template": "odd"}]}, {"restarts": 1})),
        ("JobSet", "ADDED", obj("js2", {"replicatedJobs": [{"name": "w", "replicas": 1, "template": template}, 5]})),
        ("Job", "ADDED", obj("child", {"parallelism": 1},
                             ownerReferences=[{"kind": "JobSet", "name": "js", "controller": True}])),
        ("Job", "ADDED", obj("odd", "not an object")),
        ("Job", "DELETED", obj("train", {"parallelism": 3})),
    ]


def _node_corpus() -> list[tuple[str, dict[str, Any]]]:
    nodes = [served_node("f", i) for i in range(3)]
    cordoned = copy.deepcopy(nodes[0])
    cordoned["spec"]["unschedulable"] = True
    cordoned["metadata"]["annotations"]["fleetmedic.io/cordoned-by"] = "fleetmedic"
    sick = copy.deepcopy(nodes[1])
    sick["status"]["conditions"].append({"type": "KernelDeadlock", "status": "True", "reason": "DockerHung",
                                         "message": "blocked", "lastTransitionTime": "2026-01-01T00:02:00Z",
                                         "lastHeartbeatTime": "2026-01-01T00:02:00Z"})
    not_ready = copy.deepcopy(nodes[2])
    not_ready["status"]["conditions"][0].update({"status": "False", "reason": "KubeletNotReady"})
    bad_label = copy.deepcopy(nodes[2])
    bad_label["metadata"]["labels"][Settings().triage.rack_label] = "x" * 100
    odd = copy.deepcopy(nodes[1])
    odd["status"] = {"conditions": "none"}
    odd["metadata"]["annotations"] = ["not", "a", "map"]
    return [("ADDED", n) for n in nodes] + [("MODIFIED", cordoned), ("MODIFIED", sick), ("MODIFIED", not_ready),
                                            ("MODIFIED", bad_label), ("MODIFIED", odd), ("MODIFIED", {"spec": 1}),
                                            ("DELETED", nodes[2])]


def test_the_trackers_say_the_same_of_the_kept_fields_as_of_the_whole_objects() -> None:
    settings = Settings()
    results = []
    for fields in (False, True):
        def kept(kind: str, obj: dict[str, Any], fields: bool = fields) -> Any:
            return keep(obj, FIELDS[kind]) if fields else obj

        jobs = JobTracker()
        *workloads, deletion = _workload_corpus()
        out: list[Any] = [e for kind, etype, obj in workloads
                          for e in jobs.observe_workload(kind, etype, kept(kind, obj), 1.0)]
        out += [e for etype, obj in _pod_corpus() for e in jobs.observe_pod(etype, kept("Pod", obj), 2.0)]
        out += jobs.observe_workload(deletion[0], deletion[1], kept(deletion[0], deletion[2]), 3.0)
        nodes, conditions = NodeTracker.of(settings), ConditionTracker.of(settings)
        for etype, obj in _node_corpus():
            out.append(nodes.observe(etype, kept("Node", obj), 3.0))
            out += conditions.observe(etype, kept("Node", obj), 3.0)
        results.append((out, dict(jobs.skipped), dict(nodes.skipped), sorted(jobs.jobs), sorted(nodes.nodes),
                        conditions.nodes, conditions.hard))
    whole, kept_only = results
    assert kept_only == whole
    events, job_skips, node_skips = whole[0], whole[1], whole[2]
    kinds = {getattr(e, "event", None) or type(e).__name__ for e in events if e is not None}
    assert {"placement", "start", "failure", "restart", "completion", "NodeObservation", "Finding"} <= kinds
    assert set(job_skips) >= {("Pod", "bad_gpu_request"), ("Pod", "no_metadata"), ("PyTorchJob", "bad_spec"),
                              ("JobSet", "bad_spec"), ("Job", "bad_spec")}
    assert set(node_skips) >= {"bad_label", "bad_metadata", "no_metadata"}


def test_keep_takes_the_named_fields_and_leaves_odd_shapes_whole() -> None:
    obj = {"a": 1, "b": {"c": 2, "d": 3}, "l": [{"x": 1, "y": 2}, "odd"], "m": {"k1": {"r": 1, "s": 2}, "k2": None},
           "n": "not an object"}
    fields = {"b": {"c": True}, "l": [{"x": True}], "m": {"*": {"r": True}}, "n": {"z": True}, "absent": True}
    assert keep(obj, fields) == {"b": {"c": 2}, "l": [{"x": 1}, "odd"], "m": {"k1": {"r": 1}, "k2": None},
                                 "n": "not an object"}
    assert obj["b"] == {"c": 2, "d": 3}  # the object itself is untouched
    assert keep("text", fields) == "text"
    assert merged({"a": {"b": True}, "l": [{"x": True}]}, {"a": {"c": True}, "l": [{"y": True}], "d": True}) == {
        "a": {"b": True, "c": True}, "l": [{"x": True, "y": True}], "d": True}
    assert merged({"a": {"b": True}}, {"a": True}) == {"a": True} == merged({"a": True}, {"a": {"b": True}})
