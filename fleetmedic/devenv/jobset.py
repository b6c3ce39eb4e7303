"""The real JobSet controller (sigs.k8s.io/jobset v0.12.0) run out of cluster, and its webhooks
registered by URL for one namespace: used by the JobSet tests and by
``bench/bench_recovery_placement.py --kind jobset``."""

from __future__ import annotations

import base64
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException

from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv import proc

JS_GROUP, JS_VERSION = "jobset.x-k8s.io", "v1alpha2"


@contextmanager
def jobset_controller(manager: str, kube_config: Path, workdir: Path) -> Iterator[Path]:
    """Run ``manager`` against the cluster with self-signed webhook certificates under ``workdir``
    (internal cert management and leader election off); yields its log file."""
    certs = workdir / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=jobset",
                    "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(certs / "tls.key"), "-out", str(certs / "tls.crt")],
                   check=True, capture_output=True)
    webhook, health = proc.free_ports(2)
    (workdir / "webhook-port").write_text(str(webhook))
    config = workdir / "jobset.yaml"
    config.write_text(f"""apiVersion: config.jobset.x-k8s.io/v1alpha1
kind: Configuration
internalCertManagement: {{enable: false}}
webhook: {{port: {webhook}, host: 127.0.0.1, certDir: {certs}}}
metrics: {{bindAddress: "0"}}
health: {{healthProbeBindAddress: "127.0.0.1:{health}"}}
leaderElection: {{leaderElect: false}}
""")
    log = workdir / "jobset-controller.log"
    with log.open("wb") as out:
        manager_proc = subprocess.Popen([manager, f"--config={config}"], stdout=out, stderr=subprocess.STDOUT,
                                        env={**os.environ, "KUBECONFIG": str(kube_config)})
    try:
        yield log
    finally:
        manager_proc.terminate()
        manager_proc.wait(timeout=10)


def register_webhooks(api: client.ApiClient, namespace: str, controller_dir: Path) -> list[str]:
    """The controller's JobSet defaulting and validating webhooks, as its manifests register them,
    but by URL (it runs out of cluster) and for ``namespace`` only."""
    port = (controller_dir / "webhook-port").read_text()
    ca = base64.b64encode((controller_dir / "certs" / "tls.crt").read_bytes()).decode()
    reg = client.AdmissionregistrationV1Api(api)
    common = {"sideEffects": "None", "admissionReviewVersions": ["v1"], "failurePolicy": "Fail", "timeoutSeconds": 10,
              "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}
    rule = {"apiGroups": [JS_GROUP], "apiVersions": [JS_VERSION], "resources": ["jobsets"]}
    name = f"fleetmedic-test-{namespace}"
    reg.create_mutating_webhook_configuration(fl.model(client.V1MutatingWebhookConfiguration, {
        "metadata": {"name": name}, "webhooks": [{**common, "name": "mjobset.kb.io", "rules": [
            {**rule, "operations": ["CREATE"]}], "clientConfig": {
            "url": f"https://127.0.0.1:{port}/mutate-jobset-x-k8s-io-v1alpha2-jobset", "caBundle": ca}}]}))
    reg.create_validating_webhook_configuration(fl.model(client.V1ValidatingWebhookConfiguration, {
        "metadata": {"name": name}, "webhooks": [{**common, "name": "vjobset.kb.io", "rules": [
            {**rule, "operations": ["CREATE", "UPDATE"]}], "clientConfig": {
            "url": f"https://127.0.0.1:{port}/validate-jobset-x-k8s-io-v1alpha2-jobset", "caBundle": ca}}]}))
    return [name]


def unregister_webhooks(api: client.ApiClient, names: list[str]) -> None:
    reg = client.AdmissionregistrationV1Api(api)
    for name in names:
        reg.delete_mutating_webhook_configuration(name)
        reg.delete_validating_webhook_configuration(name)


def create_when_served(custom: client.CustomObjectsApi, namespace: str, manifest: dict[str, Any]) -> Any:
    """Create the JobSet; None while the webhook server does not answer yet (retry)."""
    try:
        return custom.create_namespaced_custom_object(JS_GROUP, JS_VERSION, namespace, "jobsets", manifest)
    except ApiException as exc:
        if exc.status >= 500:
            return None
        raise
