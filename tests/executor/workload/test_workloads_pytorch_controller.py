"""restart_workload on a PyTorchJob with the **real training operator** (kubeflow/training-operator
v1.9.0, the version of the committed CRD, built from the Go module proxy) running against the
test cluster, watching only the test's namespace (``--namespace``, ``--enable-scheme=pytorchjob``).

The operator binary is the one ``fleetmedic dev build`` builds, or ``FLEETMEDIC_TRAINING_OPERATOR``
names one (``go build ./cmd/training-operator.v1``; see docs/workloads.md); without it this test is
skipped, and fails under ``FLEETMEDIC_REQUIRE_SERVICES=1`` (CI). Its certificate rotator gets the Secret it manages in
the test namespace, and the ValidatingWebhookConfiguration it injects its CA into exists, with a
rule that matches nothing: the operator's certificate is for ``<service>.<namespace>.svc``, which
the API server cannot reach out of cluster. So the webhook is not exercised; its update check only
keeps ``runPolicy.managedBy`` immutable (``pkg/webhooks/pytorch``), so it would allow the template
patch.

Proves that the operator the other PyTorchJob tests play behaves like the real one: the operator
creates the master and worker pods; after restart_workload patches the replica templates (node
anti-affinity: the pods tolerate every taint) and deletes the pods, it recreates every replica from
the patched templates, and no replacement pod is bound to the quarantined node.
"""

from __future__ import annotations

import base64
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv import proc, settings
from fleetmedic.devenv.waiting import wait
from fleetmedic.devenv.workloads import (
    TOLERATE_ALL,
    BindingWatch,
    pod_spec,
    quarantine,
    running,
)
from fleetmedic.executor.kube import KubeCluster
from fleetmedic.executor.workload.apply import restart_workload
from tests.executor.workload.helpers_controllers import real_controller

OPERATOR, pytestmark = real_controller("FLEETMEDIC_TRAINING_OPERATOR", settings.layout().training_operator,
                                       "training-operator")
PT = "training.kubeflow.org"
CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")  # fixed in the operator (pkg/cert)
WEBHOOK_CONFIG = "validator.training-operator.kubeflow.org"  # the name the operator's cert rotator looks for


@pytest.fixture
def training_operator(kube_api: client.ApiClient, kube_config: Path, crds: list[str], namespace: str,
                      tmp_path: Path) -> Iterator[Path]:
    client.CoreV1Api(kube_api).create_namespaced_secret(namespace, client.V1Secret.from_dict(
        {"metadata": {"name": "training-operator-webhook-cert"}}))
    # the rotator reports its certificates ready only once it has put its CA into this configuration;
    # its one rule matches no resource, so the API server never calls it (see the module docstring)
    reg = client.AdmissionregistrationV1Api(kube_api)
    reg.create_validating_webhook_configuration(client.V1ValidatingWebhookConfiguration.from_dict({
        "metadata": {"name": WEBHOOK_CONFIG}, "webhooks": [{
            "name": "validator.pytorchjob.training-operator.kubeflow.org", "sideEffects": "None",
            "admissionReviewVersions": ["v1"], "failurePolicy": "Ignore",
            "clientConfig": {"url": "https://127.0.0.1:1/validate-kubeflow-org-v1-pytorchjob"},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "rules": [{"apiGroups": ["fleetmedic.invalid"], "apiVersions": ["v1"], "resources": ["none"],
                       "operations": ["CREATE"]}]}]}))
    metrics, health, webhook = proc.free_ports(3)
    log = tmp_path / "training-operator.log"
    with log.open("wb") as out:
        operator = subprocess.Popen(
            [OPERATOR, f"--namespace={namespace}", "--enable-scheme=pytorchjob",
             f"--metrics-bind-address=127.0.0.1:{metrics}", f"--health-probe-bind-address=127.0.0.1:{health}",
             f"--webhook-server-port={webhook}"],
            stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": str(kube_config), "MY_POD_NAMESPACE": namespace})
    mount = threading.Thread(target=_mount_secret, args=(kube_api, namespace), daemon=True)
    mount.start()
    try:
        yield log
    finally:
        operator.terminate()
        operator.wait(timeout=10)
        reg.delete_validating_webhook_configuration(WEBHOOK_CONFIG)


def _mount_secret(api: client.ApiClient, namespace: str, timeout: float = 60.0) -> None:
    """Do what the kubelet's Secret volume does for the operator's pod: once the rotator has
    written its certificates into the Secret, put them in its (fixed) certificate directory."""
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        data = core.read_namespaced_secret("training-operator-webhook-cert", namespace).data or {}
        if {"ca.crt", "tls.crt", "tls.key"} <= set(data):
            CERT_DIR.mkdir(parents=True, exist_ok=True)
            for key, value in data.items():
                (CERT_DIR / key).write_bytes(base64.b64decode(value))
            return
        time.sleep(0.2)


def test_real_training_operator_recreates_replicas_from_the_patched_templates(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet], training_operator: Path
) -> None:
    fleet = make_fleet(6)

    def replica(n: int) -> dict[str, object]:
        spec = pod_spec(fleet, TOLERATE_ALL, restart_policy="OnFailure")
        spec["containers"][0]["name"] = "pytorch"  # the operator looks for its default container name
        return {"replicas": n, "restartPolicy": "OnFailure", "template": {"spec": spec}}

    client.CustomObjectsApi(kube_api).create_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "real"},
        "spec": {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(3)}}})
    selector = f"{PT}/job-name=real"
    before = wait("4 Running pods from the real operator", lambda: running(kube_api, namespace, selector, 4),
                  timeout=120)
    suspect = next(p.spec.node_name for p in before if p.metadata.labels[f"{PT}/replica-type"] == "master")
    quarantine(kube_api, suspect)
    old = {p.metadata.uid for p in before}
    watcher = BindingWatch(kube_api, namespace).start()

    out = restart_workload(KubeCluster(kube_api), f"{namespace}/real", action="restart_job", exclude_nodes=[suspect],
                           params={}, dry_run=False, actor="t")

    assert out.outcome == "applied", out.reason
    assert out.details["deleted"] == "4" and out.details["template_changed"] == "true"
    after = wait("4 new Running pods", lambda: running(kube_api, namespace, selector, 4, old), timeout=120)
    assert suspect not in {p.spec.node_name for p in after}, training_operator.read_text()[-2000:]
    assert sorted(p.metadata.labels[f"{PT}/replica-type"] for p in after) == ["master", "worker", "worker", "worker"]
    seen = [node for uid, _, node in watcher.stop() if uid not in old]
    assert seen and suspect not in seen
