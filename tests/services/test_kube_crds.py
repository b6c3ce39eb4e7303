"""The upstream CRDs committed under tests/data/crds (Kubeflow PyTorchJob, JobSet) install on the
dev control plane, become Established, and their schemas accept a typical multi-node GPU job
(no operator runs: this proves the API surface fleetmedic reads and patches exists)."""

from __future__ import annotations

from typing import Any

from kubernetes import client

GPUS = {"nvidia.com/gpu": "8"}


def _pod_template() -> dict[str, Any]:
    return {
        "spec": {"containers": [{"name": "pytorch", "image": "example.invalid/train:1", "resources": {"limits": GPUS}}]}
    }


def test_pytorchjob_and_jobset_crds_install_and_accept_gpu_jobs(
    kube_api: client.ApiClient, namespace: str, crds: list[str]
) -> None:
    assert {"pytorchjobs.kubeflow.org", "jobsets.jobset.x-k8s.io"} <= set(crds)
    custom = client.CustomObjectsApi(kube_api)

    pytorchjob = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "llama"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": _pod_template()},
                "Worker": {"replicas": 3, "restartPolicy": "OnFailure", "template": _pod_template()},
            }
        },
    }
    custom.create_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", pytorchjob)
    got = custom.get_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", "llama")
    assert got["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3

    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "llama-js"},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": 4,
                    "template": {"spec": {"parallelism": 1, "completions": 1, "template": _pod_template()}},
                }
            ]
        },
    }
    custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", jobset)
    got = custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", "llama-js")
    assert got["spec"]["replicatedJobs"][0]["replicas"] == 4
