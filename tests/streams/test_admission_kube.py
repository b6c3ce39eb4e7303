"""The bind-time check against a real kube-apiserver: the decision worker's webhook server
(:class:`~fleetmedic.streams.admission.AdmissionServer`, HTTPS with a certificate the webhook's
caBundle signed) registered as a ValidatingWebhookConfiguration on ``pods/binding``. The API server
refuses a binding to a node whose cordon is on its way with fleetmedic's message, and lets
bindings to other nodes through; a pod created already bound is checked the same way. The
webhook is scoped to the test's namespace and fails closed here (``failurePolicy: Fail``), so an
allowed binding proves the server answered."""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from fleetmedic.config import AdmissionSettings
from fleetmedic.devenv import proc, tls
from fleetmedic.devenv.fleet import model
from fleetmedic.devenv.waiting import wait
from fleetmedic.streams.admission import AdmissionServer


class Served:
    """The server on its own event loop in a thread; ``refused`` is what the engine would say."""

    def __init__(self, settings: AdmissionSettings) -> None:
        self.refused: dict[str, str] = {}
        self.registry = CollectorRegistry()
        self.server = AdmissionServer(settings, lambda: self.refused, lambda: False, self.registry)
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._run(),), daemon=True)
        self.error: BaseException | None = None

    async def _run(self) -> None:
        try:
            await self.server.run(self.stop)
        except BaseException as exc:
            self.error = exc

    def reviews(self, outcome: str) -> float:
        return self.registry.get_sample_value("fleetmedic_admission_reviews_total", {"outcome": outcome}) or 0.0


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Served, str]]:
    ca = tls.make_ca(tmp_path / "ca")
    leaf = tls.issue(ca, tmp_path / "leaf", "webhook")
    (port,) = proc.free_ports(1)
    s = Served(AdmissionSettings(enabled=True, listen=f"127.0.0.1:{port}", cert_file=str(leaf.cert),
                                 key_file=str(leaf.key)))
    s.thread.start()
    wait("the admission server listening", lambda: s.server.bound is not None or s.error is not None, timeout=30)
    assert s.error is None, s.error
    yield s, base64.b64encode(ca.cert.read_bytes()).decode()
    s.loop.call_soon_threadsafe(s.stop.set)
    s.thread.join(timeout=30)


def register(api: Any, namespace: str, port: int, ca: str) -> str:
    name = f"fleetmedic-bind-{namespace}"
    client.AdmissionregistrationV1Api(api).create_validating_webhook_configuration(model(
        client.V1ValidatingWebhookConfiguration, {"metadata": {"name": name}, "webhooks": [{
            "name": "bind.fleetmedic.io", "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "failurePolicy": "Fail", "timeoutSeconds": 5,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods", "pods/binding"]}],
            "clientConfig": {"url": f"https://127.0.0.1:{port}/admission/binding", "caBundle": ca}}]}))
    return name


def pending_pod(core: client.CoreV1Api, namespace: str, name: str, node: str = "") -> Any:
    spec: dict[str, Any] = {"schedulerName": "nobody", "containers": [{"name": "c", "image": "busybox"}],
                            "tolerations": [{"operator": "Exists"}]}
    if node:
        spec["nodeName"] = node
    return core.create_namespaced_pod(namespace, model(client.V1Pod, {"metadata": {"name": name}, "spec": spec}))


def bind(core: client.CoreV1Api, namespace: str, pod: str, node: str) -> None:
    body = model(client.V1Binding, {"metadata": {"name": pod}, "target": {"kind": "Node", "name": node}})
    core.create_namespaced_pod_binding(pod, namespace, body, _preload_content=False)


def test_the_api_server_refuses_a_bind_to_a_node_whose_cordon_is_on_its_way(
        kube_api: Any, namespace: str, make_fleet: Any, served: tuple[Served, str]) -> None:
    s, ca = served
    assert s.server.bound is not None
    fleet = make_fleet(2)
    bad, good = fleet.nodes[0], fleet.nodes[1]
    core = client.CoreV1Api(kube_api)
    name = register(kube_api, namespace, s.server.bound[1], ca)
    try:
        s.refused = {bad: "quarantined (definitive evidence, xid:79)"}
        pending_pod(core, namespace, "a")
        with pytest.raises(ApiException) as refused:
            bind(core, namespace, "a", bad)
        assert refused.value.status == 403
        assert f"node {bad} is being taken out of service" in str(refused.value.body), refused.value.body
        assert not core.read_namespaced_pod("a", namespace).spec.node_name  # still waiting for a node
        bind(core, namespace, "a", good)  # the scheduler's next try, elsewhere
        assert core.read_namespaced_pod("a", namespace).spec.node_name == good
        # created already bound: the same check
        with pytest.raises(ApiException) as bound:
            pending_pod(core, namespace, "b", node=bad)
        assert bound.value.status == 403 and "xid:79" in str(bound.value.body)
        # once the cordon is applied the engine lets the scheduler's own check take over
        s.refused = {}
        pending_pod(core, namespace, "c")
        bind(core, namespace, "c", bad)
        assert core.read_namespaced_pod("c", namespace).spec.node_name == bad
        assert s.reviews("denied") == 2 and s.reviews("allowed") >= 2
    finally:
        client.AdmissionregistrationV1Api(kube_api).delete_validating_webhook_configuration(name)
