"""Topology-aware restart_job on the real control plane (kube-scheduler, Job controller, kwok nodes
labelled with racks and leaves), through :class:`~fleetmedic.executor.workload.placement_apply.PlacementRestarter`.

- Leaf locality: 16 nodes in 4 leaves, one 2-pod x 8-GPU Job started in each leaf, 5 recoveries
  (each quarantines one node of a job, then restarts it): every replacement pod runs in the job's
  original leaf (capacity exists there) and none ever binds to a quarantined node.
- Isolation not yet acknowledged: restart_job arrives before the cordon/taint; the replacements get a
  required anti-affinity for the suspect in the same write that resumes the Job, and stay off it.
- Scarce capacity: no healthy node left for one pod -> ``capacity: insufficient`` with what is
  missing, a Warning Event, the metric, the pod Pending; a second restart is refused as thrashing;
  a node joining the fleet ends the wait, which is measured.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from kubernetes import client
from prometheus_client import CollectorRegistry

from fleetmedic.config import PlacementSettings, Settings
from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.placement import (
    ScheduleWatch,
    leaves_of,
    pick_suspect,
    recover,
    recover_round,
    repeat_placements,
    start_one_job_per_leaf,
)
from fleetmedic.devenv.waiting import wait
from fleetmedic.devenv.workloads import BindingWatch, gpu_job, live_pods, quarantine, running
from fleetmedic.executor.kube import KubeCluster
from fleetmedic.executor.workload.placement_apply import PlacementRestarter
from fleetmedic.executor.workload.placement_metrics import PlacementMetrics
from fleetmedic.executor.workload.plan import excluded_nodes
from fleetmedic.k8s_keys import (
    ANNOTATION_EXCLUDED_NODES,
    ANNOTATION_PLACEMENT,
    LABEL_LEAF,
    LABEL_POOL,
    LABEL_RACK,
    LABEL_STANDBY,
    TAINT_QUARANTINE,
    TAINT_STANDBY,
)


def _restarter(api: client.ApiClient, **placement: object) -> tuple[PlacementRestarter, CollectorRegistry]:
    registry = CollectorRegistry()
    settings = Settings(placement=PlacementSettings(**placement))  # type: ignore[arg-type]
    return PlacementRestarter(KubeCluster(api), settings, PlacementMetrics(registry)), registry


def test_replacements_stay_in_the_original_leaf_and_never_on_a_suspect(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    fleet = make_fleet(16, nodes_per_rack=2, racks_per_leaf=2)
    leaf_of = leaves_of(kube_api, fleet)
    assert len(set(leaf_of.values())) == 4
    jobs = start_one_job_per_leaf(kube_api, namespace, fleet, pods=2)
    watcher = ScheduleWatch(kube_api, namespace).start()
    restarter, registry = _restarter(kube_api)
    suspects: dict[str, float] = {}

    recoveries = recover_round(kube_api, restarter, namespace, jobs, 2, leaf_of, suspects)
    recoveries += recover_round(kube_api, restarter, namespace, {"job-0": jobs["job-0"]}, 2, leaf_of, suspects, 1)

    assert len(recoveries) == 5
    for r in recoveries:
        assert r.outcome == "applied", r.reason
        assert r.details["capacity"] == "sufficient" and r.leaf_had_capacity, r.details
        assert r.details["preferred_domain"] == f"leaf={r.leaf}"
        assert r.in_leaf == 2, f"{r.job}: replacements on {r.nodes_after}, leaf {r.leaf}"
    bindings = watcher.stop()
    assert len(bindings) >= 10  # every replacement's scheduling was seen
    assert repeat_placements(bindings, suspects) == []
    template = client.BatchV1Api(kube_api).read_namespaced_job("job-0", namespace)
    prefs = template.spec.template.spec.affinity.node_affinity.preferred_during_scheduling_ignored_during_execution
    assert [(p.weight, p.preference.match_expressions[0].key) for p in prefs] == [
        (40, LABEL_LEAF), (20, LABEL_RACK), (5, LABEL_POOL)]  # replaced, not accumulated
    assert ANNOTATION_PLACEMENT in template.metadata.annotations
    assert registry.get_sample_value("fleetmedic_executor_placements_total", {"capacity": "sufficient"}) == 5


def test_restart_before_the_cordon_keeps_the_replacements_off_the_suspect(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    fleet = make_fleet(8, nodes_per_rack=2, racks_per_leaf=2)
    leaf_of = leaves_of(kube_api, fleet)
    jobs = start_one_job_per_leaf(kube_api, namespace, fleet, pods=3, leaves=[min(leaf_of.values())])
    pods = live_pods(kube_api, namespace, "app=job-0")
    suspect = sorted(p.spec.node_name for p in pods)[0]
    watcher = BindingWatch(kube_api, namespace).start()
    restarter, registry = _restarter(kube_api)

    r = recover(kube_api, restarter, namespace, "job-0", jobs["job-0"], 3, suspect, leaf_of, {suspect: 0.0})

    assert r.outcome == "applied", r.reason
    assert r.details["isolation_forced"] == suspect and r.details["isolated_by"] == f"{suspect}:anti-affinity-added"
    assert suspect not in r.nodes_after and r.in_leaf == 3
    old = {p.metadata.uid for p in pods}
    assert all(node != suspect for uid, _, node in watcher.stop() if uid not in old)
    job = client.BatchV1Api(kube_api).read_namespaced_job("job-0", namespace)
    assert excluded_nodes(client.ApiClient().sanitize_for_serialization(job.spec.template.spec.affinity)) == {suspect}
    assert registry.get_sample_value("fleetmedic_executor_isolation_forced_total") == 1


def test_no_healthy_capacity_is_reported_waited_for_and_not_thrashed(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    fleet = make_fleet(4)
    client.BatchV1Api(kube_api).create_namespaced_job(namespace, client.V1Job.from_dict(gpu_job("big", fleet, 4)))
    before = wait("4 Running pods", lambda: running(kube_api, namespace, "app=big", 4))
    first = sorted(p.spec.node_name for p in before)[0]
    quarantine(kube_api, first)
    restarter, registry = _restarter(kube_api, capacity_wait_s=60.0, capacity_poll_s=0.2)
    threading.Timer(2.0, _add_node, (kube_api, fleet, 4)).start()  # capacity arrives during the wait

    out = restarter.restart(f"{namespace}/big", action="restart_job", exclude_nodes=[first], params={},
                            dry_run=False, actor="t")

    assert out.outcome == "applied", out.reason
    assert out.details["capacity"] == "insufficient", out.details
    assert out.details["capacity_missing"].startswith("1 of 4 pod(s) (32 GPU(s) in all) do not fit on the 3 healthy")
    assert "no healthy capacity" in out.reason
    assert out.details["capacity_still_waiting"] == "false" and float(out.details["capacity_wait_s"]) >= 1.5
    assert registry.get_sample_value("fleetmedic_executor_capacity_wait_seconds_count") == 1
    events = client.CoreV1Api(kube_api).list_namespaced_event(
        namespace, field_selector="involvedObject.kind=Job,involvedObject.name=big").items
    assert any(e.reason == "FleetmedicCapacityWait" and e.type == "Warning" for e in events)
    now = wait("4 Running pods", lambda: running(kube_api, namespace, "app=big", 4))
    assert first not in {p.spec.node_name for p in now}

    # another node fails and nothing joins: the pod waits Pending, the executor stops waiting after 0.5 s
    second = sorted(p.spec.node_name for p in now)[0]
    quarantine(kube_api, second)
    short, registry = _restarter(kube_api, capacity_wait_s=0.5, capacity_poll_s=0.1)
    out = short.restart(f"{namespace}/big", action="restart_job", exclude_nodes=[second], params={},
                        dry_run=False, actor="t")
    assert out.outcome == "applied" and out.details["capacity_still_waiting"] == "true", out.details
    assert registry.get_sample_value("fleetmedic_executor_capacity_waits_total", {"action": "restart_job"}) == 1
    pending = wait("1 Pending pod", lambda: [p for p in live_pods(kube_api, namespace, "app=big")
                                             if p.status.phase == "Pending" and not p.spec.node_name])
    assert len(pending) == 1
    # the same command again would only recreate the pending pods: refused
    again = short.restart(f"{namespace}/big", action="restart_job", exclude_nodes=[second], params={},
                          dry_run=False, actor="t")
    assert again.outcome == "skipped" and again.details["capacity"] == "waiting", again.reason
    assert [p.metadata.uid for p in live_pods(kube_api, namespace, "app=big") if not p.spec.node_name] == \
        [pending[0].metadata.uid]


def _add_node(api: client.ApiClient, fleet: fl.Fleet, index: int) -> None:
    body = fl.node_manifest(fleet.name, index)
    client.CoreV1Api(api).create_node(client.V1Node.from_dict(body))
    client.CoreV1Api(api).patch_node_status(body["metadata"]["name"], {"status": body["status"]})


def test_the_warm_standby_pool_is_used_first_and_tolerated(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    fleet = make_fleet(8, nodes_per_rack=2, racks_per_leaf=2)
    leaf_of = leaves_of(kube_api, fleet)
    core = client.CoreV1Api(kube_api)
    standby = sorted(leaf_of)[-2:]  # two nodes of the other leaf, reserved: label + taint
    for n in standby:
        taints = [t.to_dict() for t in core.read_node(n).spec.taints or []]
        core.patch_node(n, {"metadata": {"labels": {LABEL_STANDBY: "true"}},
                            "spec": {"taints": [*taints, {"key": TAINT_STANDBY, "value": "true",
                                                          "effect": "NoSchedule"}]}})
    jobs = start_one_job_per_leaf(kube_api, namespace, fleet, pods=2, leaves=[leaf_of[sorted(leaf_of)[0]]])
    restarter, _ = _restarter(kube_api, standby_label=LABEL_STANDBY)
    suspect = sorted(p.spec.node_name for p in live_pods(kube_api, namespace, "app=job-0"))[0]
    quarantine(kube_api, suspect)

    r = recover(kube_api, restarter, namespace, "job-0", jobs["job-0"], 2, suspect, leaf_of, {suspect: 0.0})

    assert r.outcome == "applied", r.reason
    assert r.details["capacity_fit_on_standby"] == "2"
    assert sorted(r.nodes_after) == standby  # the reserved nodes first, though the own leaf had room
    spec = client.BatchV1Api(kube_api).read_namespaced_job("job-0", namespace).spec.template.spec
    assert any(t.key == TAINT_STANDBY and t.operator == "Exists" for t in spec.tolerations)
    prefs = spec.affinity.node_affinity.preferred_during_scheduling_ignored_during_execution
    assert (prefs[0].weight, prefs[0].preference.match_expressions[0].key) == (100, LABEL_STANDBY)


def test_the_executor_runs_restart_job_through_the_placement(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    from fleetmedic.executor.dispatch import kube_executor
    from fleetmedic.executor.metrics import ExecutorMetrics
    from tests.executor.helpers_executor import KEY, command, settings

    fleet = make_fleet(8, nodes_per_rack=2, racks_per_leaf=2)
    leaf_of = leaves_of(kube_api, fleet)
    jobs = start_one_job_per_leaf(kube_api, namespace, fleet, pods=2, leaves=[min(leaf_of.values())])
    suspect = sorted(p.spec.node_name for p in live_pods(kube_api, namespace, "app=job-0"))[0]
    quarantine(kube_api, suspect)
    registry = CollectorRegistry()
    ex = kube_executor(KubeCluster(kube_api, instance="t"), settings(namespace), KEY, identity="t",
                         metrics=ExecutorMetrics(registry))

    result = ex.handle(command("restart_job", job=f"{namespace}/job-0", exclude_nodes=[suspect]))

    assert result.outcome == "applied", result.reason
    assert result.details.get("preferred_domain") == f"leaf={jobs['job-0']}", result.details
    assert result.details["capacity"] == "sufficient", result.details
    assert registry.get_sample_value("fleetmedic_executor_placements_total", {"capacity": "sufficient"}) == 1


def test_a_node_back_in_service_is_no_longer_excluded_at_the_next_restart(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    """Exclusions must not pile up on a long job: after n1's fault the Job carries NotIn [n1]; n1 is
    repaired and returned (uncordoned, untainted); the next fault (on another node) leaves the
    template excluding only the new suspect, and the result says which exclusion was lifted."""
    fleet = make_fleet(6, nodes_per_rack=2, racks_per_leaf=4)
    leaf_of = leaves_of(kube_api, fleet)
    jobs = start_one_job_per_leaf(kube_api, namespace, fleet, pods=2)
    restarter, _ = _restarter(kube_api)
    core, batch = client.CoreV1Api(kube_api), client.BatchV1Api(kube_api)
    suspects: dict[str, float] = {}

    first = pick_suspect(kube_api, namespace, "job-0")
    quarantine(kube_api, first)
    r1 = recover(kube_api, restarter, namespace, "job-0", jobs["job-0"], 2, first, leaf_of, suspects)
    assert r1.outcome == "applied", r1.reason
    template = batch.read_namespaced_job("job-0", namespace).spec.template.spec
    assert excluded_nodes(kube_api.sanitize_for_serialization(template.affinity)) == {first}

    core.patch_node(first, {"spec": {"unschedulable": False, "taints": [
        t.to_dict() for t in core.read_node(first).spec.taints or [] if t.key != TAINT_QUARANTINE]}})
    second = pick_suspect(kube_api, namespace, "job-0")
    assert second != first
    quarantine(kube_api, second)
    time.sleep(2.5)  # past the restarter's node cache, as a later fault would be
    r2 = recover(kube_api, restarter, namespace, "job-0", jobs["job-0"], 2, second, leaf_of, suspects)

    assert r2.outcome == "applied", r2.reason
    assert r2.details.get("exclusion_released") == first
    job = batch.read_namespaced_job("job-0", namespace)
    assert excluded_nodes(kube_api.sanitize_for_serialization(job.spec.template.spec.affinity)) == {second}
    assert job.metadata.annotations[ANNOTATION_EXCLUDED_NODES] == second
    assert second not in r2.nodes_after


def test_the_node_cache_is_refreshed_for_a_node_it_does_not_know(
    kube_api: client.ApiClient, make_fleet: Callable[..., fl.Fleet]
) -> None:
    """The shared node list (cached for placement.node_cache_s) must not hide a node that joined
    since: a job whose pods run there would get no topology (seen as a flaky placement test)."""
    restarter, _ = _restarter(kube_api, node_cache_s=3600.0)
    before = {n["metadata"]["name"] for n in restarter.nodes()}
    fleet = make_fleet(2)
    new = sorted(leaves_of(kube_api, fleet))
    assert not set(new) & before
    assert {n["metadata"]["name"] for n in restarter.nodes()} == before  # cached: the TTL holds
    assert set(new) <= {n["metadata"]["name"] for n in restarter.nodes(knowing=new)}
