"""Evictions through the Eviction API honour PodDisruptionBudgets on the dev control plane: the
disruption controller computes the budget, an eviction that would break it is refused with 429,
``fleetmedic.devenv.fleet.evict`` retries and then gives up cleanly, and once the budget allows a
disruption the same eviction succeeds."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from kubernetes import client

from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.waiting import wait
from fleetmedic.k8s_keys import LABEL_FLEET


def _pod(name: str, fleet: fl.Fleet) -> client.V1Pod:
    gpus = {fl.GPU: "8"}
    return client.V1Pod.from_dict(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "trainer"}},
            "spec": {
                "nodeSelector": {LABEL_FLEET: fleet.name},
                "tolerations": [fl.KWOK_TOLERATION],
                "containers": [
                    {"name": "t", "image": "example.invalid/t:1", "resources": {"requests": gpus, "limits": gpus}}
                ],
            },
        }
    )



def test_eviction_blocked_by_pdb_gets_429_helper_gives_up_then_evicts_when_budget_allows(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    core, policy = client.CoreV1Api(kube_api), client.PolicyV1Api(kube_api)
    fleet = make_fleet(2)
    for name in ("trainer-0", "trainer-1"):
        core.create_namespaced_pod(namespace, _pod(name, fleet))
    wait(
        "2 Running pods",
        lambda: all(
            (p := core.read_namespaced_pod(n, namespace)).status and p.status.phase == "Running"
            for n in ("trainer-0", "trainer-1")
        ),
    )
    pdb = client.V1PodDisruptionBudget.from_dict(
        {
            "metadata": {"name": "trainers"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "trainer"}}},
        }
    )
    policy.create_namespaced_pod_disruption_budget(namespace, pdb)

    def budget(allowed: int) -> bool:
        got = policy.read_namespaced_pod_disruption_budget("trainers", namespace)
        s, gen = got.status, got.metadata.generation if got.metadata else None
        return bool(s and s.observed_generation == gen and s.expected_pods == 2 and s.disruptions_allowed == allowed)

    wait("the disruption controller to compute 0 allowed disruptions", lambda: budget(0))

    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="trainer-0", namespace=namespace))
    with pytest.raises(client.ApiException) as refused:
        core.create_namespaced_pod_eviction("trainer-0", namespace, eviction)
    assert refused.value.status == 429

    t = time.monotonic()
    gave_up = fl.evict(kube_api, "trainer-0", namespace, attempts=3, backoff=0.05)
    assert gave_up == fl.Eviction(False, 3, 429, gave_up.reason)
    assert "disruption budget" in gave_up.reason
    assert time.monotonic() - t < 5

    policy.patch_namespaced_pod_disruption_budget("trainers", namespace, {"spec": {"minAvailable": 1}})
    wait("the budget to allow 1 disruption", lambda: budget(1))
    done = fl.evict(kube_api, "trainer-0", namespace, attempts=3, backoff=0.05)
    assert done.evicted and done.status == 201

    def gone_or_terminating() -> bool:
        try:
            pod = core.read_namespaced_pod("trainer-0", namespace)
        except client.ApiException as exc:
            return exc.status == 404
        return bool(pod.metadata and pod.metadata.deletion_timestamp)

    wait("trainer-0 to be deleted", gone_or_terminating)
    assert core.read_namespaced_pod("trainer-1", namespace).status.phase == "Running"
