"""The job-events watcher against the real control plane and the real broker: a 4-pod x 8-GPU
Indexed Job on a 6-node kwok fleet is read back from Kafka as a placement (rank = completion index
-> node), a start, and, after one pod is failed the way a kubelet reports an OOM-killed container
(kwok has no failure stage, so the test writes that pod status), a failure naming rank, node, exit
code and reason. A CPU-only Job in the same namespace produces nothing (GPU pods only); a Job already
running when the watcher starts gives one placement and one start. The watches renew after their
timeout and list again after 410 Gone. ``fleetmedic watch-jobs`` serves its metrics and exits 0 on
SIGTERM. A Job deleted while it runs ends with a ``completion`` (reason ``deleted: ...``)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry

from fleetmedic.config import ClusterSettings, JobWatchSettings, KafkaSettings, Settings, TopicSettings
from fleetmedic.connectors.kube.jobs import Gone, JobWatcher, JobWatchMetrics, ResourceWatch, resource_path
from fleetmedic.devenv import fleet as fl
from fleetmedic.k8s_keys import LABEL_FLEET, LABEL_LEAF, LABEL_POOL, LABEL_RACK
from fleetmedic.records import JobEvent, decode

INDEX = "batch.kubernetes.io/job-completion-index"


def _job(name: str, fleet: fl.Fleet, pods: int, gpus: int) -> client.V1Job:
    res = {fl.GPU: str(gpus)} if gpus else {"cpu": "1"}
    return client.V1Job.from_dict({"metadata": {"name": name}, "spec": {
        "parallelism": pods, "completions": pods, "completionMode": "Indexed", "backoffLimit": 10,
        "template": {"spec": {"restartPolicy": "Never", "nodeSelector": {LABEL_FLEET: fleet.name},
                              "tolerations": [fl.KWOK_TOLERATION],
                              "containers": [{"name": "trainer", "image": "example.invalid/t:1",
                                              "resources": {"requests": res, "limits": res}}]}}}})


def _fail_pod_like_a_kubelet(core: client.CoreV1Api, namespace: str, pod: client.V1Pod) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": {
        "phase": "Failed",
        "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}],
        "containerStatuses": [{"name": "trainer", "image": "example.invalid/t:1", "imageID": "", "ready": False,
                               "restartCount": 0, "state": {"terminated": {
                                   "exitCode": 137, "reason": "OOMKilled", "startedAt": now, "finishedAt": now}}}]}})


def test_watcher_publishes_placement_start_and_failure_of_a_gpu_job_to_kafka(
    kafka_bootstrap: str, kube_api: client.ApiClient, namespace: str, crds: list[str],
    make_fleet: Callable[..., fl.Fleet]
) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    fleet = make_fleet(6)
    prefix = f"jw-{uuid.uuid4().hex[:8]}."
    settings = Settings(kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap), topics=TopicSettings(prefix=prefix),
                        jobwatch=JobWatchSettings(namespaces=[namespace], watch_timeout_s=2))
    registry = CollectorRegistry()
    core, batch = client.CoreV1Api(kube_api), client.BatchV1Api(kube_api)

    async def read_until(consumer: AIOKafkaConsumer, got: list[JobEvent], done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 90
        while not done():
            assert time.monotonic() < deadline, f"timed out; got {[(e.job, e.event) for e in got]}"
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for rec in records:
                    event = decode(JobEvent, rec.value)
                    assert rec.key == event.job.encode()
                    got.append(event)

    async def go() -> tuple[list[JobEvent], list[client.V1Pod], client.V1Pod]:
        # a job already running when the watcher starts: its size is known before its pods are
        await asyncio.to_thread(batch.create_namespaced_job, namespace, _job("early", fleet, 2, 8))
        while len([p for p in (await asyncio.to_thread(core.list_namespaced_pod, namespace,
                                                       label_selector="job-name=early")).items
                   if p.status.phase == "Running"]) < 2:
            await asyncio.sleep(0.2)
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        await admin.create_topics([NewTopic(f"{prefix}jobs.events", 1, 1)])
        await admin.close()
        until = asyncio.Event()
        task = asyncio.create_task(JobWatcher(kube_api, settings, registry).run(until))
        consumer = AIOKafkaConsumer(f"{prefix}jobs.events", bootstrap_servers=kafka_bootstrap,
                                    auto_offset_reset="earliest", group_id=f"{prefix}test")
        await consumer.start()
        got: list[JobEvent] = []
        try:
            await asyncio.to_thread(batch.create_namespaced_job, namespace, _job("cpu", fleet, 1, 0))
            await asyncio.to_thread(batch.create_namespaced_job, namespace, _job("train", fleet, 4, 8))
            job = f"{namespace}/train"
            await read_until(consumer, got, lambda: any(e.job == job and e.event == "start" for e in got))
            await asyncio.sleep(3)  # past the watches' 2 s timeout: they renew
            pods = await asyncio.to_thread(core.list_namespaced_pod, namespace, label_selector="job-name=train")
            victim = next(p for p in pods.items if p.metadata.annotations[INDEX] == "2")
            await asyncio.to_thread(_fail_pod_like_a_kubelet, core, namespace, victim)
            await read_until(consumer, got, lambda: any(e.job == job and e.event == "failure" for e in got))
            # a job deleted while it runs (cancelled) ends with a completion saying so. Its pods linger
            # and are updated before they go (the Job controller strips their finalizer, the garbage
            # collector their owner): none of that may start it again. Orphaning them makes those
            # updates certain (in CI once, a background deletion's pods were updated first too)
            await asyncio.to_thread(batch.delete_namespaced_job, "early", namespace,
                                    body=client.V1DeleteOptions(propagation_policy="Orphan"))
            early = f"{namespace}/early"
            await read_until(consumer, got, lambda: any(e.job == early and e.event == "completion" for e in got))
            deadline = time.monotonic() + 60
            while any(p.metadata.owner_references or p.metadata.finalizers for p in (await asyncio.to_thread(
                    core.list_namespaced_pod, namespace, label_selector="job-name=early")).items):
                assert time.monotonic() < deadline, "the deleted job's pods kept their owner"
                await asyncio.sleep(0.5)
            for p in (await asyncio.to_thread(core.list_namespaced_pod, namespace,
                                              label_selector="job-name=early")).items:  # as a kubelet would
                await asyncio.to_thread(core.patch_namespaced_pod, p.metadata.name, namespace,
                                        {"metadata": {"annotations": {"example.invalid/beat": "1"}}})
            settle = time.monotonic() + 3.0
            await read_until(consumer, got, lambda: time.monotonic() > settle)
        finally:
            until.set()
            await task
            await consumer.stop()
        return got, pods.items, victim

    got, pods, victim = asyncio.run(go())
    mine = [e for e in got if e.job == f"{namespace}/train"]
    placement = next(e for e in mine if e.event == "placement")
    assert placement.world_size == 4 and placement.workload_kind == "Job"
    by_index = {int(p.metadata.annotations[INDEX]): p.spec.node_name for p in pods}
    assert {r.rank: r.node for r in placement.placement} == by_index
    assert [e.event for e in mine].count("start") == 1
    failure = next(e for e in mine if e.event == "failure")
    assert (failure.rank, failure.node, failure.exit_code) == (2, victim.spec.node_name, 137)
    assert "OOMKilled" in failure.reason
    assert not [e for e in got if e.job == f"{namespace}/cpu"]  # no GPUs: not a training job
    early = [(e.event, e.world_size) for e in got if e.job == f"{namespace}/early"]
    assert early[:2] == [("placement", 2), ("start", 2)]  # no partial placement at start-up
    assert early[2:] == [("completion", None)]
    assert next(e for e in got if e.job == f"{namespace}/early" and e.event == "completion").reason.startswith(
        "deleted:")
    assert registry.get_sample_value("fleetmedic_jobwatch_job_events_total", {"event": "failure"}) == 1
    assert registry.get_sample_value("fleetmedic_jobwatch_relists_total", {"kind": "Pod", "cause": "start"}) == 1
    assert (registry.get_sample_value("fleetmedic_jobwatch_objects_total", {"kind": "Pod"}) or 0) >= 6


def test_a_watch_from_a_compacted_version_is_gone_and_the_loop_lists_again(
    kube_api: client.ApiClient, namespace: str
) -> None:
    seen: list[tuple[str, str, Any]] = []
    stop = threading.Event()
    settings = JobWatchSettings(watch_timeout_s=1, reconnect_backoff_s=0.1)
    registry = CollectorRegistry()
    metrics = JobWatchMetrics(registry)
    w = ResourceWatch(kube_api, "Pod", namespace, "", lambda *a: seen.append(a), metrics, settings, stop)
    # etcd history is compacted every 10 s in the test clusters (fleetmedic.devenv.kube): until the
    # first compaction a watch from version 1 is answered, after it 410 Gone
    deadline = time.monotonic() + 75
    gone = False
    while not gone and time.monotonic() < deadline:
        try:
            w._watch(resource_path("Pod", namespace), {}, "1")
            time.sleep(2)
        except Gone:
            gone = True
    assert gone, "the API server replayed from resourceVersion 1 for 75 s instead of answering 410 Gone"
    seen.clear()

    w.resume_version = "1"  # as if resuming from a version saved long ago: 410, then a full list
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    time.sleep(2.5)  # two watch timeouts: the watch was renewed from its resourceVersion
    client.CoreV1Api(kube_api).create_namespaced_pod(namespace, client.V1Pod.from_dict({
        "metadata": {"name": "late"}, "spec": {"containers": [{"name": "c", "image": "i"}],
                                               "nodeSelector": {"none": "none"}}}))
    deadline = time.monotonic() + 20
    while not any(kind == "Pod" and etype == "ADDED" and obj["metadata"]["name"] == "late"
                  for kind, etype, obj in seen):
        assert time.monotonic() < deadline, seen
        time.sleep(0.1)
    stop.set()
    thread.join(timeout=5)
    relists = "fleetmedic_jobwatch_relists_total"
    assert registry.get_sample_value(relists, {"kind": "Pod", "cause": "gone"}) == 1
    assert registry.get_sample_value(relists, {"kind": "Pod", "cause": "start"}) is None  # renewals: no list


def test_a_list_again_reports_the_objects_gone_meanwhile_by_name_namespace_and_uid(
    kube_api: client.ApiClient, namespace: str
) -> None:
    """What a watch missed while it was down: a pod deleted then is reported DELETED by the next
    list, from the stub kept of it (name, namespace, uid: the tracker finds the pod's job by uid)."""
    seen: list[tuple[str, str, Any]] = []
    w = ResourceWatch(kube_api, "Pod", namespace, "", lambda *a: seen.append(a), JobWatchMetrics(CollectorRegistry()),
                      JobWatchSettings(), threading.Event())
    core = client.CoreV1Api(kube_api)
    made = {name: core.create_namespaced_pod(namespace, client.V1Pod.from_dict({
        "metadata": {"name": name, "labels": {"app": "x"}},
        "spec": {"containers": [{"name": "c", "image": "i"}], "nodeSelector": {"none": "none"}}}))
        for name in ("stays", "goes")}
    known: dict[str, Any] = {}
    path = resource_path("Pod", namespace)
    w._relist(path, known, "start")
    assert sorted(obj["metadata"]["name"] for _, etype, obj in seen if etype == "ADDED") == ["goes", "stays"]
    core.delete_namespaced_pod("goes", namespace, grace_period_seconds=0)
    seen.clear()
    w._relist(path, known, "gone")
    assert [(etype, obj) for _, etype, obj in seen if etype == "DELETED"] == [
        ("DELETED", {"metadata": {"name": "goes", "namespace": namespace, "uid": made["goes"].metadata.uid}})]
    assert sorted(known) == [f"{namespace}/stays"]


def test_watch_jobs_cli_serves_metrics_and_stops_cleanly_on_sigterm(
    kafka_bootstrap: str, kube_config: Any, namespace: str, tmp_path: Any
) -> None:
    import re
    import signal
    import subprocess
    import sys
    import urllib.request

    config = tmp_path / "fleetmedic.yaml"
    config.write_text(f"kafka: {{bootstrap_servers: '{kafka_bootstrap}'}}\n"
                      f"topics: {{prefix: 'jwcli-{uuid.uuid4().hex[:8]}.'}}\n"
                      f"jobwatch: {{kubeconfig: '{kube_config}', namespaces: [{namespace}]}}\n"
                      "metrics: {bind_address: 127.0.0.1, port: 0}\n")
    proc = subprocess.Popen([sys.executable, "-m", "fleetmedic.cli.main", "watch-jobs", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        port, lines = None, []
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            line = proc.stdout.readline() if proc.stdout else ""
            lines.append(line)
            found = re.search(r"metrics on 127\.0\.0\.1:(\d+)", line)
            port = int(found.group(1)) if found else None
        assert port, "".join(lines)
        deadline = time.monotonic() + 30
        while True:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            if 'fleetmedic_jobwatch_relists_total{cause="start",kind="Pod"} 1.0' in body:
                break
            assert time.monotonic() < deadline, body[-2000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_watcher_publishes_node_observations_for_foreign_cordons_and_label_changes(
    kafka_bootstrap: str, kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    """The Node watch (``jobwatch.watch_nodes``) on the real API server: every node of a 3-node kwok
    fleet is published once at start (its rack, leaf and pool labels only); a cordon by someone else,
    a cordon with fleetmedic's annotation and placement/rail label changes each give one observation,
    keyed by node; a label fleetmedic does not use gives none. A condition node-problem-detector
    writes (KernelDeadlock) gives one finding on ``findings``, keyed by node. Both carry the
    watcher's ``cluster.name``."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    from fleetmedic.k8s_keys import ANNOTATION_CORDONED_BY
    from fleetmedic.records import Finding, NodeObservation

    fleet = make_fleet(3)
    a, b, c = fleet.nodes
    prefix = f"jwn-{uuid.uuid4().hex[:8]}."
    topic = f"{prefix}cluster.nodes"
    settings = Settings(kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap), topics=TopicSettings(prefix=prefix),
                        jobwatch=JobWatchSettings(namespaces=[namespace], kinds=["Job"], watch_timeout_s=5),
                        cluster=ClusterSettings(name="gpu-east-1"))
    registry = CollectorRegistry()
    core = client.CoreV1Api(kube_api)
    got: list[NodeObservation] = []
    found: list[tuple[bytes | None, Finding]] = []

    async def read_until(consumer: AIOKafkaConsumer, done: Callable[[list[NodeObservation]], bool]) -> None:
        deadline = time.monotonic() + 60
        while not done([o for o in got if o.node in fleet.nodes]):
            assert time.monotonic() < deadline, [o for o in got if o.node in fleet.nodes]
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for rec in records:
                    obs = decode(NodeObservation, rec.value)
                    assert rec.key == obs.node.encode()
                    got.append(obs)

    def patch(node: str, body: dict[str, Any]) -> Any:
        return asyncio.to_thread(core.patch_node, node, body)

    async def go() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        await admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"cleanup.policy": "compact"}),
                                   NewTopic(f"{prefix}findings", 1, 1)])
        await admin.close()
        until = asyncio.Event()
        task = asyncio.create_task(JobWatcher(kube_api, settings, registry).run(until))
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest",
                                    group_id=f"{prefix}test")
        await consumer.start()
        try:
            await read_until(consumer, lambda mine: {o.node for o in mine} == set(fleet.nodes))
            await patch(c, {"metadata": {"labels": {"team": "ml"}}})  # not a label fleetmedic uses
            await patch(a, {"spec": {"unschedulable": True}})  # a person's cordon
            await read_until(consumer, lambda mine: any(o.node == a and o.cordoned for o in mine))
            await patch(b, {"metadata": {"labels": {LABEL_RACK: f"{fleet.name}-rack-99",
                                                    "rails.fleetmedic.io/mlx5_0": "leaf-rail-0"}}})
            await read_until(consumer, lambda mine: any(o.node == b and o.labels.get(LABEL_RACK, "").endswith("-99")
                                                        for o in mine))
            await patch(c, {"metadata": {"annotations": {ANNOTATION_CORDONED_BY: "fleetmedic"}},
                            "spec": {"unschedulable": True}})  # what the executor's cordon writes
            await read_until(consumer, lambda mine: any(o.node == c and o.cordoned for o in mine))
            # node-problem-detector's condition, as it writes it: a finding on the findings topic
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            await asyncio.to_thread(core.patch_node_status, b, {"status": {"conditions": [
                {"type": "KernelDeadlock", "status": "True", "reason": "DockerHung", "lastHeartbeatTime": now,
                 "lastTransitionTime": now, "message": "task docker:7 blocked for more than 300 seconds."}]}})
            fc = AIOKafkaConsumer(f"{prefix}findings", bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest",
                                  group_id=f"{prefix}test-findings")
            await fc.start()
            try:
                deadline = time.monotonic() + 30
                while not found and time.monotonic() < deadline:
                    for records in (await fc.getmany(timeout_ms=500)).values():
                        found.extend((rec.key, decode(Finding, rec.value)) for rec in records)
            finally:
                await fc.stop()
        finally:
            until.set()
            await task
            await consumer.stop()

    asyncio.run(go())
    mine = [o for o in got if o.node in fleet.nodes]
    first = {o.node: o for o in mine[:3]}
    assert not any(o.cordoned or o.deleted for o in first.values())
    assert first[a].labels == {LABEL_RACK: f"{fleet.name}-rack-00", LABEL_LEAF: first[a].labels[LABEL_LEAF],
                               LABEL_POOL: first[a].labels[LABEL_POOL]}  # not the fleet/zone/hostname labels
    by_node = {n: [o for o in mine if o.node == n] for n in fleet.nodes}
    assert [(o.cordoned, o.cordoned_by_fleetmedic) for o in by_node[a]] == [(False, False), (True, False)]
    assert len(by_node[b]) == 2 and by_node[b][1].labels["rails.fleetmedic.io/mlx5_0"] == "leaf-rail-0"
    assert not by_node[b][1].cordoned
    # the "team" label gave nothing: c's second observation is the cordon
    assert [(o.cordoned, o.cordoned_by_fleetmedic) for o in by_node[c]] == [(False, False), (True, True)]
    assert registry.get_sample_value("fleetmedic_jobwatch_relists_total", {"kind": "Node", "cause": "start"}) == 1
    assert (registry.get_sample_value("fleetmedic_jobwatch_node_observations_total") or 0) >= len(mine)
    assert [(key, f.node, f.detector, f.evidence[0].metric) for key, f in found] == [
        (b.encode(), b, "node_condition", "uncertain:KernelDeadlock")]
    assert {o.cluster for o in mine} | {f.cluster for _, f in found} == {"gpu-east-1"}  # labelled as sent


def test_a_stub_keeps_what_a_deletion_is_reported_with_and_nothing_else() -> None:
    from fleetmedic.connectors.kube.jobs import _stub, _unstub

    node = {"metadata": {"name": "n1", "uid": "u1", "labels": {LABEL_RACK: "r1"}, "annotations": {"a": "b"},
                         "resourceVersion": "7"}, "spec": {"unschedulable": True}, "status": {}}
    kept = {"metadata": {"name": "n1", "uid": "u1"}}  # its labels: the node tracker keeps those it uses
    assert _unstub("Node", _stub("Node", node)) == kept
    pod = {"metadata": {"name": "p", "uid": "u2", "labels": {"x": "y"}}, "spec": {"nodeName": "n1"}}
    assert _unstub("Pod", _stub("Pod", pod)) == {"metadata": {"name": "p", "uid": "u2"}}  # no namespace: left out
    a, b = (_stub("Pod", {"metadata": {"name": n, "namespace": "".join(["team", "-a"]), "uid": n}}) for n in "ab")
    assert a[1] is b[1]  # one copy of a namespace, however many pods
