"""kube-scheduler places GPU pods on kwok nodes and honours cordons: a batch/v1 Job of 4 pods x 8
GPUs on a 16-node kwok fleet gets all 4 pods Running, one per node; after the node of one pod is
cordoned and that pod deleted, the Job's replacement pod stays Pending (Unschedulable) while the
cordoned node is the only one with free GPUs, and runs on the first node that is uncordoned.

Takes ~12 s: the Job controller waits its pod-failure backoff (10 s) before replacing a pod."""

from __future__ import annotations

from collections.abc import Callable

from kubernetes import client

from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.waiting import wait
from fleetmedic.k8s_keys import LABEL_FLEET


def _job(name: str, fleet: fl.Fleet) -> client.V1Job:
    gpus = {fl.GPU: "8"}
    return client.V1Job.from_dict(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name},
            "spec": {
                "parallelism": 4,
                "completions": 4,
                "backoffLimit": 10,
                "template": {
                    "metadata": {"labels": {"job": name}},
                    "spec": {
                        "restartPolicy": "Never",
                        "nodeSelector": {LABEL_FLEET: fleet.name},
                        "tolerations": [fl.KWOK_TOLERATION],
                        "containers": [
                            {
                                "name": "trainer",
                                "image": "example.invalid/trainer:1",
                                "resources": {"requests": gpus, "limits": gpus},
                            }
                        ],
                    },
                },
            },
        }
    )



def _unschedulable(pod: client.V1Pod) -> bool:
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable" for c in conditions)


def test_gpu_job_pods_run_on_kwok_nodes_and_replacement_never_lands_on_cordoned_node(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    core = client.CoreV1Api(kube_api)
    fleet = make_fleet(16)
    client.BatchV1Api(kube_api).create_namespaced_job(namespace, _job("train", fleet))

    def pods() -> list[client.V1Pod]:
        live = core.list_namespaced_pod(namespace, label_selector="job=train").items
        return [p for p in live if p.metadata and not p.metadata.deletion_timestamp]

    def running() -> list[client.V1Pod]:
        return [p for p in pods() if p.status and p.status.phase == "Running"]

    first = wait("4 Running pods", lambda: (r := running()) and len(r) == 4 and r)
    hosts = {p.spec.node_name for p in first if p.spec}
    assert len(hosts) == 4 and hosts <= set(fleet.nodes)  # 8 GPUs each: one pod per node

    victim = first[0]
    assert victim.metadata and victim.spec and victim.spec.node_name
    cordoned = victim.spec.node_name
    idle = sorted(set(fleet.nodes) - hosts)
    for node in [cordoned, *idle]:
        core.patch_node(node, {"spec": {"unschedulable": True}})
    core.delete_namespaced_pod(fl.name_of(victim), namespace)

    def replacement() -> client.V1Pod | None:
        new = [p for p in pods() if fl.name_of(p) not in {fl.name_of(q) for q in first}]
        return new[0] if new else None

    # the cordoned node is the only one with 8 free GPUs: the scheduler must refuse it
    pending = wait(
        "the replacement to be marked Unschedulable", lambda: (p := replacement()) and _unschedulable(p) and p
    )
    assert pending.spec is None or pending.spec.node_name is None

    core.patch_node(idle[0], {"spec": {"unschedulable": False}})
    placed = wait(
        "the replacement to run on the uncordoned node",
        lambda: (p := replacement()) and p.status and p.status.phase == "Running" and p,
    )
    assert placed.spec.node_name == idle[0] != cordoned
    assert len(running()) == 4
