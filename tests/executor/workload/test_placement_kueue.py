"""restart_job on a Kueue-managed Job or JobSet goes through its Kueue Workload
(fleetmedic.executor.workload.kueue), against **Kueue's own CRDs and the real Kueue controller manager**
(sigs.k8s.io/kueue, built from the Go module proxy by ``fleetmedic dev build``), run out of cluster
against the test cluster; the JobSet tests also run the **real JobSet controller** (v0.12.0) with
its webhooks registered for the test's namespace (fleetmedic/devenv/jobset.py).

Kueue runs with its ``batch/job`` and ``jobset.x-k8s.io/jobset`` integrations for the test's
namespace only, no leader election, its certificate management off (self-signed certificates
written for its webhook and metrics servers) and no webhook configurations registered: the API
server never calls Kueue's webhooks, so the tests create their Jobs and JobSets suspended with the
queue-name label, as Kueue's mutating webhooks would leave them. Everything else is Kueue's: it
creates the Workload, admits it against the ClusterQueue's quota (its flavor's node label and
toleration go into the pod templates), un-suspends the workload, and on ``spec.active: false``
evicts the Workload and suspends the workload.

Proves: detection and dry run; that with no Kueue controller running nothing is left inactive
(Job and JobSet); with the real controller, that the restart deactivates the Workload, Kueue evicts
it and suspends the Job, the placement (exclusion of the suspect, preference toward the surviving
ranks) is written while suspended, and Kueue admits the same Job again, whose new pods avoid the
suspect; for a JobSet, that the placement goes onto its suspended child Jobs and survives Kueue's
readmission (which rewrites the JobSet's templates) next to the flavor's nodeSelector and
toleration, while the Workload's pod sets stay as they were (same Workload, no update); that a
Workload someone else deactivated is left alone and one fleetmedic left inactive is finished.
Routing the JobSet around Kueue (checked) fails both JobSet tests: the dry run names no Workload,
and the restart times out because Kueue keeps the child Jobs running.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from prometheus_client import CollectorRegistry

from fleetmedic.config import PlacementSettings, Settings
from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv import proc, settings
from fleetmedic.devenv.jobset import (
    JS_GROUP,
    JS_VERSION,
    create_when_served,
    register_webhooks,
    unregister_webhooks,
)
from fleetmedic.devenv.jobset import jobset_controller as run_jobset_controller
from fleetmedic.devenv.waiting import wait
from fleetmedic.devenv.workloads import (
    GPUS,
    gpu_job,
    live_pods,
    pod_spec,
    quarantine,
    running,
)
from fleetmedic.executor.kube import MERGE, KubeCluster
from fleetmedic.executor.workload import kueue
from fleetmedic.executor.workload.placement_apply import PlacementRestarter
from fleetmedic.executor.workload.placement_metrics import PlacementMetrics
from fleetmedic.executor.workload.plan import excluded_nodes
from fleetmedic.k8s_keys import (
    ANNOTATION_EXCLUDED_NODES,
    ANNOTATION_RESTART_IN_PROGRESS,
    LABEL_FLEET,
    LABEL_POOL,
    LABEL_STANDBY,
    TAINT_STANDBY,
)
from tests.executor.workload.helpers_controllers import jobset_manager, real_controller

KUEUE, pytestmark = real_controller("FLEETMEDIC_KUEUE", settings.layout().kueue_manager, "Kueue manager")
JOBSET_MANAGER, JOBSET_MARKS = jobset_manager()
METRICS_CERTS = Path("/etc/kueue/metrics/certs")  # fixed in Kueue's main when its cert management is off
FLAVOR_LABELS = {LABEL_POOL: "h100"}  # every fleet's pool (make_fleet's default)
FLAVOR_TOLERATION = {"key": "example.com/flavor", "operator": "Exists", "effect": "NoSchedule"}
JS_SELECTOR = "jobset.sigs.k8s.io/jobset-name=queued"


@pytest.fixture(scope="module")
def kueue_crds(kube_api: client.ApiClient) -> str:
    """Kueue's CRDs installed (replacing any older definition); the served Workload version."""
    ext = client.ApiextensionsV1Api(kube_api)
    names = []
    for path in sorted(settings.layout().kueue_crds.glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        names.append(body["metadata"]["name"])
        try:
            ext.create_custom_resource_definition(body)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
            body["metadata"]["resourceVersion"] = ext.read_custom_resource_definition(
                body["metadata"]["name"]).metadata.resource_version
            ext.replace_custom_resource_definition(body["metadata"]["name"], body)

    def established() -> bool:
        for name in names:
            conds = ext.read_custom_resource_definition(name).status.conditions or []
            if not any(c.type == "Established" and c.status == "True" for c in conds):
                return False
        return True

    wait("Kueue CRDs established", established, 60)
    return str(wait("Workload API served", lambda: kueue.served_version(KubeCluster(kube_api)), 30))


def _self_signed(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "tls.crt").exists() and (directory / "tls.key").exists():
        return
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "365",
                    "-subj", "/CN=127.0.0.1", "-keyout", str(directory / "tls.key"),
                    "-out", str(directory / "tls.crt")], check=True, capture_output=True)


@pytest.fixture
def kueue_queue(kube_api: client.ApiClient, namespace: str, kueue_crds: str) -> Iterator[str]:
    """A ResourceFlavor (node label and toleration, which Kueue writes into the pod templates on
    admission), a ClusterQueue with 64 GPUs of quota for the namespace, and its LocalQueue."""
    custom = client.CustomObjectsApi(kube_api)
    g, v = kueue.GROUP, kueue_crds
    flavor, cq = f"{namespace}-flavor", f"{namespace}-cq"
    custom.create_cluster_custom_object(g, v, "resourceflavors", {
        "apiVersion": f"{g}/{v}", "kind": "ResourceFlavor", "metadata": {"name": flavor},
        "spec": {"nodeLabels": FLAVOR_LABELS, "tolerations": [FLAVOR_TOLERATION]}})
    custom.create_cluster_custom_object(g, v, "clusterqueues", {
        "apiVersion": f"{g}/{v}", "kind": "ClusterQueue", "metadata": {"name": cq},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                 "resourceGroups": [{"coveredResources": [fl.GPU], "flavors": [
                     {"name": flavor, "resources": [{"name": fl.GPU, "nominalQuota": 64}]}]}]}})
    custom.create_namespaced_custom_object(g, v, namespace, "localqueues", {
        "apiVersion": f"{g}/{v}", "kind": "LocalQueue", "metadata": {"name": "team-a"},
        "spec": {"clusterQueue": cq}})
    yield "team-a"
    for plural, name in (("clusterqueues", cq), ("resourceflavors", flavor)):
        with contextlib.suppress(client.ApiException):
            custom.delete_cluster_custom_object(g, v, plural, name)


class Manager:
    def __init__(self, process: subprocess.Popen[bytes], log: Path) -> None:
        self.process, self.log = process, log

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def alive(self) -> bool:
        """True while the manager runs; a manager that exited fails the test with its log."""
        if self.process.poll() is not None:
            raise AssertionError(f"the Kueue manager exited ({self.process.returncode}):\n{self.tail()}")
        return True


@pytest.fixture
def kueue_manager(kube_config: Path, namespace: str, kueue_queue: str, crds: list[str],
                  tmp_path: Path) -> Iterator[Manager]:
    """The real Kueue controller manager, managing batch Jobs and JobSets (its integrations need
    their CRDs at start) of the test's namespace."""
    _self_signed(METRICS_CERTS)
    _self_signed(tmp_path / "webhook-certs")
    metrics, health, webhook, visibility = proc.free_ports(4)
    config = tmp_path / "kueue.yaml"
    config.write_text(yaml.safe_dump({
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": "kueue-system",  # Kueue's own: its managed-jobs selector must not match it
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics}"},
        "webhook": {"port": webhook, "host": "127.0.0.1", "certDir": str(tmp_path / "webhook-certs")},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "managedJobsNamespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "integrations": {"frameworks": ["batch/job", "jobset.x-k8s.io/jobset"]},
    }))
    log = tmp_path / "kueue.log"
    with log.open("wb") as out:
        manager = subprocess.Popen(
            [KUEUE, f"--config={config}", "--feature-gates=VisibilityOnDemand=false",
             f"--visibility-server-port={visibility}"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "KUBECONFIG": str(kube_config)})
    try:
        yield Manager(manager, log)
    finally:
        manager.terminate()
        try:
            manager.wait(timeout=10)
        except subprocess.TimeoutExpired:
            manager.kill()


def _queued_job(api: client.ApiClient, namespace: str, fleet: fl.Fleet, name: str, *, suspend: bool) -> str:
    manifest = gpu_job(name, fleet, 2)
    manifest["metadata"]["labels"] = {kueue.QUEUE_LABEL: "team-a"}
    manifest["spec"]["suspend"] = suspend  # as Kueue's mutating webhook leaves a queued Job
    return str(client.BatchV1Api(api).create_namespaced_job(namespace, client.V1Job.from_dict(manifest)).metadata.uid)


def _workload(api: client.ApiClient, version: str, namespace: str, job_uid: str) -> dict[str, Any] | None:
    return kueue.owning_workload(KubeCluster(api), version, namespace, job_uid)


def _conditions(workload: dict[str, Any]) -> dict[str, tuple[str, str]]:
    conditions = (workload.get("status") or {}).get("conditions") or []
    return {c["type"]: (c["status"], c.get("reason", "")) for c in conditions}


@pytest.fixture
def fleet4(make_fleet: Callable[..., fl.Fleet]) -> Iterator[fl.Fleet]:
    yield make_fleet(4)


def test_without_a_kueue_controller_nothing_is_left_inactive(
    kube_api: client.ApiClient, namespace: str, fleet4: fl.Fleet, kueue_crds: str
) -> None:
    """Detection, dry run, and the timeout path, with Kueue's CRDs but no controller running: the
    test writes the Workload a Kueue would have written."""
    uid = _queued_job(kube_api, namespace, fleet4, "queued", suspend=False)
    wait("2 Running pods", lambda: running(kube_api, namespace, "app=queued", 2))
    pod_template = {"spec": {"containers": [{"name": "trainer", "image": "example.invalid/trainer:1",
                                             "resources": {"requests": GPUS}}]}}
    client.CustomObjectsApi(kube_api).create_namespaced_custom_object(kueue.GROUP, kueue_crds, namespace, "workloads", {
        "apiVersion": f"{kueue.GROUP}/{kueue_crds}", "kind": "Workload",
        "metadata": {"name": "job-queued-1a2b3", "ownerReferences": [
            {"apiVersion": "batch/v1", "kind": "Job", "name": "queued", "uid": uid, "controller": True,
             "blockOwnerDeletion": True}]},
        "spec": {"active": True, "queueName": "team-a",
                 "podSets": [{"name": "main", "count": 2, "template": pod_template}]}})
    owner = kueue.owning_workload(KubeCluster(kube_api), kueue_crds, namespace, uid)
    assert owner is not None and owner["metadata"]["name"] == "job-queued-1a2b3"
    restarter = PlacementRestarter(KubeCluster(kube_api), Settings())
    before = {p.metadata.uid for p in live_pods(kube_api, namespace, "app=queued")}
    suspect = next(p.spec.node_name for p in live_pods(kube_api, namespace, "app=queued"))
    quarantine(kube_api, suspect)

    dry = restarter.restart(f"{namespace}/queued", action="restart_job", exclude_nodes=[suspect], params={},
                            dry_run=True, actor="t")
    assert dry.outcome == "skipped" and "through Kueue Workload" in dry.reason
    assert dry.details["kueue_workload"] == f"{namespace}/job-queued-1a2b3"

    out = restarter.restart(f"{namespace}/queued", action="restart_job", exclude_nodes=[suspect],
                            params={"timeout_s": "2"}, dry_run=False, actor="t")
    assert out.outcome == "failed" and "Kueue did not evict" in out.reason and "set active again" in out.reason
    w = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(kueue.GROUP, kueue_crds, namespace,
                                                                      "workloads", "job-queued-1a2b3")
    assert w["spec"]["active"] is True
    job = client.BatchV1Api(kube_api).read_namespaced_job("queued", namespace)
    assert not job.spec.suspend and {p.metadata.uid for p in live_pods(kube_api, namespace, "app=queued")} == before


def test_real_kueue_requeues_the_job_with_the_placement(
    kube_api: client.ApiClient, namespace: str, fleet4: fl.Fleet, kueue_crds: str, kueue_manager: Manager
) -> None:
    uid = _queued_job(kube_api, namespace, fleet4, "queued", suspend=True)
    pods = wait("Kueue admits the Job: 2 Running pods",
                lambda: kueue_manager.alive() and running(kube_api, namespace, "app=queued", 2), timeout=90)
    first = _workload(kube_api, kueue_crds, namespace, uid)
    assert first is not None and _conditions(first).get("Admitted", ("",))[0] == "True", kueue_manager.tail()
    suspect = pods[0].spec.node_name
    quarantine(kube_api, suspect)
    registry = CollectorRegistry()
    settings_ = Settings(placement=PlacementSettings(standby_label=LABEL_STANDBY))  # + its toleration

    out = PlacementRestarter(KubeCluster(kube_api), settings_, PlacementMetrics(registry)).restart(
        f"{namespace}/queued", action="restart_job", exclude_nodes=[suspect], params={"timeout_s": "60"},
        dry_run=False, actor="t")

    assert out.outcome == "applied", (out.reason, kueue_manager.tail())
    assert out.details["mechanism"] == "kueue_workload" and out.details["capacity"] == "sufficient"
    assert registry.get_sample_value("fleetmedic_executor_placements_total", {"capacity": "sufficient"}) == 1
    job = client.BatchV1Api(kube_api).read_namespaced_job("queued", namespace)
    template = client.ApiClient().sanitize_for_serialization(job.spec.template.spec)
    assert excluded_nodes(template["affinity"]) == {suspect}
    assert template["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    after = wait("Kueue admits the Job again: 2 new Running pods",
                 lambda: kueue_manager.alive() and running(kube_api, namespace, "app=queued", 2,
                                                           {p.metadata.uid for p in pods}), timeout=90)
    assert suspect not in {p.spec.node_name for p in after}
    for p in after:  # the standby toleration (a pod-set toleration for Kueue) and the flavor's survived
        assert {t.key for t in p.spec.tolerations} >= {TAINT_STANDBY, FLAVOR_TOLERATION["key"]}
    now = _workload(kube_api, kueue_crds, namespace, uid)
    assert now is not None and now["spec"].get("active", True) is True
    assert _conditions(now).get("Admitted", ("",))[0] == "True"
    # Kueue itself evicted the Workload fleetmedic deactivated, suspended the Job, and admitted the
    # same Workload again (the placement written while suspended did not make it a new one)
    events = client.CoreV1Api(kube_api).list_namespaced_event(namespace).items
    seen = {(e.involved_object.kind, e.reason) for e in events}
    assert {("Workload", "EvictedDueToDeactivated"), ("Job", "Suspended"), ("Job", "Stopped")} <= seen, seen
    assert sum(1 for e in events if e.reason == "CreatedWorkload") == 1
    assert now["metadata"]["uid"] == first["metadata"]["uid"]


def test_a_queue_label_without_a_workload_restarts_the_ordinary_way(
    kube_api: client.ApiClient, namespace: str, fleet4: fl.Fleet, kueue_crds: str
) -> None:
    _queued_job(kube_api, namespace, fleet4, "plain", suspend=False)
    wait("2 Running pods", lambda: running(kube_api, namespace, "app=plain", 2))
    suspect = live_pods(kube_api, namespace, "app=plain")[0].spec.node_name
    quarantine(kube_api, suspect)
    out = PlacementRestarter(KubeCluster(kube_api), Settings()).restart(f"{namespace}/plain", action="restart_job",
                                                           exclude_nodes=[suspect], params={}, dry_run=False,
                                                           actor="t")
    assert out.outcome == "applied" and out.details["mechanism"] == "suspend_resume", out.reason


# --- JobSets ---------------------------------------------------------------------------------------


def _needs_jobset_controller(test: Callable[..., None]) -> Callable[..., None]:
    for mark in JOBSET_MARKS:
        test = mark(test)
    return test


@pytest.fixture
def js_controller(kube_api: client.ApiClient, kube_config: Path, crds: list[str], namespace: str,
                  tmp_path: Path) -> Iterator[Path]:
    """The real JobSet controller with its webhooks registered for the test's namespace."""
    with run_jobset_controller(JOBSET_MANAGER, kube_config, tmp_path / "jobset") as log:
        hooks = register_webhooks(kube_api, namespace, log.parent)
        try:
            yield log
        finally:
            unregister_webhooks(kube_api, hooks)


def _queued_jobset(api: client.ApiClient, namespace: str, fleet: fl.Fleet, *, suspend: bool) -> str:
    """A JobSet of a leader and one worker (1 pod x 8 GPUs each) in LocalQueue team-a; suspended as
    Kueue's JobSet webhook leaves a queued one (that webhook is not registered here)."""
    def rjob(name: str) -> dict[str, Any]:
        return {"name": name, "replicas": 1, "template": {"spec": {
            "parallelism": 1, "completions": 1, "backoffLimit": 0,
            "template": {"spec": pod_spec(fleet, restart_policy="OnFailure")}}}}

    manifest = {"apiVersion": f"{JS_GROUP}/{JS_VERSION}", "kind": "JobSet",
                "metadata": {"name": "queued", "labels": {kueue.QUEUE_LABEL: "team-a"}},
                "spec": {"suspend": suspend, "replicatedJobs": [rjob("leader"), rjob("workers")]}}
    custom = client.CustomObjectsApi(api)
    created = wait("the JobSet webhook server to answer", lambda: create_when_served(custom, namespace, manifest))
    return str(created["metadata"]["uid"])


def _child_specs(api: client.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    jobs = client.BatchV1Api(api).list_namespaced_job(namespace, label_selector=JS_SELECTOR).items
    return {j.metadata.name: api.sanitize_for_serialization(j.spec.template.spec) for j in jobs}


@_needs_jobset_controller
def test_without_a_kueue_controller_a_jobset_is_left_active_and_untouched(
    kube_api: client.ApiClient, namespace: str, fleet4: fl.Fleet, kueue_crds: str, js_controller: Path
) -> None:
    """Detection of a JobSet's Workload, dry run, and the timeout path, with the real JobSet
    controller and Kueue's CRDs but no Kueue controller: the test writes the Workload."""
    uid = _queued_jobset(kube_api, namespace, fleet4, suspend=False)
    before = wait("2 Running pods", lambda: running(kube_api, namespace, JS_SELECTOR, 2), timeout=90)
    pod_template = {"spec": {"containers": [{"name": "trainer", "image": "example.invalid/trainer:1",
                                             "resources": {"requests": GPUS}}]}}
    client.CustomObjectsApi(kube_api).create_namespaced_custom_object(kueue.GROUP, kueue_crds, namespace, "workloads", {
        "apiVersion": f"{kueue.GROUP}/{kueue_crds}", "kind": "Workload",
        "metadata": {"name": "jobset-queued-1a2b3", "ownerReferences": [
            {"apiVersion": f"{JS_GROUP}/{JS_VERSION}", "kind": "JobSet", "name": "queued", "uid": uid,
             "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"active": True, "queueName": "team-a", "podSets": [
            {"name": n, "count": 1, "template": pod_template} for n in ("leader", "workers")]}})
    suspect = before[0].spec.node_name
    quarantine(kube_api, suspect)
    children = _child_specs(kube_api, namespace)
    restarter = PlacementRestarter(KubeCluster(kube_api), Settings())

    # named by one of its child Jobs: resolves to the JobSet
    child = next(iter(children))
    dry = restarter.restart(f"{namespace}/{child}", action="restart_job", exclude_nodes=[suspect], params={},
                            dry_run=True, actor="t")
    assert dry.outcome == "skipped" and "through Kueue Workload" in dry.reason and "child Jobs" in dry.reason
    assert dry.details["kind"] == "JobSet" and dry.details["kueue_workload"] == f"{namespace}/jobset-queued-1a2b3"

    out = restarter.restart(f"{namespace}/queued", action="restart_job", exclude_nodes=[suspect],
                            params={"timeout_s": "2"}, dry_run=False, actor="t")
    assert out.outcome == "failed" and "Kueue did not evict" in out.reason and "set active again" in out.reason
    w = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(kueue.GROUP, kueue_crds, namespace,
                                                                      "workloads", "jobset-queued-1a2b3")
    assert w["spec"]["active"] is True and ANNOTATION_RESTART_IN_PROGRESS not in (
        w["metadata"].get("annotations") or {})
    js = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(JS_GROUP, JS_VERSION, namespace, "jobsets",
                                                                       "queued")
    assert not js["spec"].get("suspend")
    assert _child_specs(kube_api, namespace) == children
    assert {p.metadata.uid for p in live_pods(kube_api, namespace, JS_SELECTOR)} == {p.metadata.uid for p in before}


@_needs_jobset_controller
def test_real_kueue_requeues_a_jobset_with_the_placement_on_its_child_jobs(
    kube_api: client.ApiClient, namespace: str, fleet4: fl.Fleet, kueue_crds: str, js_controller: Path,
    kueue_manager: Manager
) -> None:
    """Real Kueue (jobset integration) + real JobSet controller and webhooks: the restart goes
    through the Workload, the placement is on the suspended child Jobs, and it survives Kueue's
    readmission, which writes the flavor's nodeSelector and toleration into the JobSet's templates
    (merged into the children by the JobSet controller)."""
    uid = _queued_jobset(kube_api, namespace, fleet4, suspend=True)
    pods = wait("Kueue admits the JobSet: 2 Running pods",
                lambda: kueue_manager.alive() and running(kube_api, namespace, JS_SELECTOR, 2), timeout=120)
    first = _workload(kube_api, kueue_crds, namespace, uid)
    assert first is not None and _conditions(first).get("Admitted", ("",))[0] == "True", kueue_manager.tail()
    suspect = pods[0].spec.node_name
    quarantine(kube_api, suspect)
    standby = {"key": TAINT_STANDBY, "operator": "Exists", "effect": "NoSchedule"}
    settings_ = Settings(placement=PlacementSettings(standby_label=LABEL_STANDBY))  # + its toleration
    registry = CollectorRegistry()

    out = PlacementRestarter(KubeCluster(kube_api), settings_, PlacementMetrics(registry)).restart(
        f"{namespace}/queued", action="restart_job", exclude_nodes=[suspect], params={"timeout_s": "60"},
        dry_run=False, actor="t")

    assert out.outcome == "applied", (out.reason, kueue_manager.tail())
    assert out.details["mechanism"] == "kueue_workload" and out.details["kind"] == "JobSet", out.details
    assert out.details["children_patched"] == "2" and out.details["capacity"] == "sufficient", out.details
    assert registry.get_sample_value("fleetmedic_executor_placements_total", {"capacity": "sufficient"}) == 1
    after = wait("Kueue admits the JobSet again: 2 new Running pods",
                 lambda: kueue_manager.alive() and running(kube_api, namespace, JS_SELECTOR, 2,
                                                           {p.metadata.uid for p in pods}), timeout=120)
    assert suspect not in {p.spec.node_name for p in after}
    # the placement survived the readmission on the child Jobs, next to what Kueue merged in
    specs = _child_specs(kube_api, namespace)
    assert len(specs) == 2
    for name, spec in specs.items():
        assert excluded_nodes(spec.get("affinity")) == {suspect}, (name, spec.get("affinity"))
        assert spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"], name
        assert spec["nodeSelector"] == {LABEL_FLEET: fleet4.name, **FLAVOR_LABELS}, name
        assert FLAVOR_TOLERATION in spec["tolerations"] and standby in spec["tolerations"], name
    for p in after:  # the pods were created from them
        assert excluded_nodes(kube_api.sanitize_for_serialization(p.spec.affinity)) == {suspect}
        assert {t.key for t in p.spec.tolerations} >= {standby["key"], FLAVOR_TOLERATION["key"]}
    js = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(JS_GROUP, JS_VERSION, namespace, "jobsets",
                                                                       "queued")
    assert not js["spec"].get("suspend") and js["metadata"]["annotations"][ANNOTATION_EXCLUDED_NODES] == suspect
    for rjob in js["spec"]["replicatedJobs"]:  # Kueue's admission is on the template, fleetmedic's is not
        template = rjob["template"]["spec"]["template"]["spec"]
        assert template["nodeSelector"] == {LABEL_FLEET: fleet4.name, **FLAVOR_LABELS}
        assert not template.get("affinity")
    now = _workload(kube_api, kueue_crds, namespace, uid)
    assert now is not None and now["spec"].get("active", True) is True
    assert _conditions(now).get("Admitted", ("",))[0] == "True"
    assert ANNOTATION_RESTART_IN_PROGRESS not in (now["metadata"].get("annotations") or {})
    # Kueue evicted the Workload fleetmedic deactivated and stopped the JobSet, then admitted the
    # same Workload again, its pod sets untouched (a template change would have made Kueue update it)
    events = client.CoreV1Api(kube_api).list_namespaced_event(namespace).items
    seen = {(e.involved_object.kind, e.reason) for e in events}
    assert {("Workload", "EvictedDueToDeactivated"), ("JobSet", "Stopped"), ("JobSet", "Started")} <= seen, seen
    assert ("JobSet", "UpdatedWorkload") not in seen, seen
    assert sum(1 for e in events if e.reason == "CreatedWorkload" and e.involved_object.kind == "JobSet") == 1
    assert now["metadata"]["uid"] == first["metadata"]["uid"] and now["spec"]["podSets"] == first["spec"]["podSets"]


def test_a_workload_deactivated_by_someone_else_is_left_alone_and_fleetmedics_own_is_finished(
    kube_api: client.ApiClient, namespace: str, fleet4: fl.Fleet, kueue_crds: str, kueue_manager: Manager
) -> None:
    """A Workload someone else deactivated is not touched; one carrying fleetmedic's marker (an
    executor died between deactivating and reactivating it) is finished by the next restart."""
    uid = _queued_job(kube_api, namespace, fleet4, "queued", suspend=True)
    pods = wait("Kueue admits the Job: 2 Running pods",
                lambda: kueue_manager.alive() and running(kube_api, namespace, "app=queued", 2), timeout=90)
    workload = _workload(kube_api, kueue_crds, namespace, uid)
    assert workload is not None
    wname = workload["metadata"]["name"]
    suspect = pods[0].spec.node_name
    quarantine(kube_api, suspect)
    custom = client.CustomObjectsApi(kube_api)
    custom.patch_namespaced_custom_object(kueue.GROUP, kueue_crds, namespace, "workloads", wname,
                                          {"spec": {"active": False}}, _content_type=MERGE)
    restarter = PlacementRestarter(KubeCluster(kube_api), Settings())

    other = restarter.restart(f"{namespace}/queued", action="restart_job", exclude_nodes=[suspect],
                              params={"timeout_s": "60"}, dry_run=False, actor="t")

    assert other.outcome == "skipped" and "deactivated by someone else" in other.reason, other.reason
    w = custom.get_namespaced_custom_object(kueue.GROUP, kueue_crds, namespace, "workloads", wname)
    assert w["spec"]["active"] is False

    custom.patch_namespaced_custom_object(kueue.GROUP, kueue_crds, namespace, "workloads", wname, {
        "metadata": {"annotations": {ANNOTATION_RESTART_IN_PROGRESS: "requeue Job"}}},
        _content_type=MERGE)  # as an executor that died after deactivating it leaves it
    out = restarter.restart(f"{namespace}/queued", action="restart_job", exclude_nodes=[suspect],
                            params={"timeout_s": "60"}, dry_run=False, actor="t")

    assert out.outcome == "applied", (out.reason, kueue_manager.tail())
    w = custom.get_namespaced_custom_object(kueue.GROUP, kueue_crds, namespace, "workloads", wname)
    assert w["spec"]["active"] is True and ANNOTATION_RESTART_IN_PROGRESS not in (
        w["metadata"].get("annotations") or {})
    after = wait("Kueue admits the Job again: 2 new Running pods",
                 lambda: kueue_manager.alive() and running(kube_api, namespace, "app=queued", 2,
                                                           {p.metadata.uid for p in pods}), timeout=90)
    assert suspect not in {p.spec.node_name for p in after}
