"""Scrape mode's pod discovery: exporter pods listed through the Kubernetes API -> scrape targets
with the pod's node. The last test runs on the real control plane with kwok nodes: kwok gives a
hostNetwork pod its node's InternalIP, and the test's nodes have 127.0.0.1 there, so the pods'
discovered addresses are the fixture exporters' and the scrape goes to them for real."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from fleetmedic import records as r
from fleetmedic.config import PodDiscoverySettings, Settings, parse_config
from fleetmedic.connectors.prometheus.api import pod_targets
from fleetmedic.connectors.prometheus.ingest import PrometheusSource
from fleetmedic.connectors.runtime import ConnectorMetrics, Outbox

FIELD = Path(__file__).parents[2] / "data" / "field"


def _pod(name: str, node: str = "gpu-1", ip: str = "10.244.1.5", phase: str = "Running", port: int = 9400,
         port_name: str = "metrics", **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "gpu-operator", **meta},
            "spec": {"nodeName": node, "containers": [{"name": "exporter", "ports": [
                {"name": port_name, "containerPort": port}]}]},
            "status": {"phase": phase, "podIP": ip}}


def test_running_pods_become_targets_with_their_node_and_the_others_are_counted() -> None:
    pods = [
        _pod("dcgm-a", node="gpu-1", ip="10.244.1.5"),
        _pod("dcgm-b", node="gpu-2", ip="fd00::7"),
        _pod("dcgm-pending", phase="Pending", ip=""),
        _pod("dcgm-going", deletionTimestamp="2026-01-01T00:00:00Z"),
        _pod("dcgm-no-ip", ip=""),
        _pod("dcgm-unnamed-port", port_name="http"),
        {"metadata": {"name": "x"}, "spec": {}, "status": {"phase": "Running", "podIP": "10.0.0.9"}},
        "not a pod",
    ]
    skipped: Counter[str] = Counter()
    got = pod_targets(pods, PodDiscoverySettings(enabled=True), skipped)
    assert [(t.url, t.labels, t.pod) for t in got] == [
        ("http://10.244.1.5:9400/metrics", {"instance": "10.244.1.5:9400", "node": "gpu-1"}, "gpu-operator/dcgm-a"),
        ("http://[fd00::7]:9400/metrics", {"instance": "[fd00::7]:9400", "node": "gpu-2"}, "gpu-operator/dcgm-b"),
    ]
    assert skipped == Counter({"discovery: pod not running": 2, "discovery: pod without an IP": 1,
                               "discovery: pod without a container port named metrics": 1,
                               "discovery: pod without a node": 1, "discovery: not a pod object": 1})
    # a fixed port and another label name, scheme and path
    d = PodDiscoverySettings(enabled=True, port=9100, node_label="kubernetes_node", scheme="https", path="/m")
    (t,) = pod_targets([_pod("node-exporter", port_name="other")], d, Counter())
    assert (t.url, t.labels) == ("https://10.244.1.5:9100/m", {"instance": "10.244.1.5:9100",
                                                               "kubernetes_node": "gpu-1"})


def test_discovery_settings_are_checked() -> None:
    for text, why in (("{node_label: 'a-b'}", "node_label"), ("{path: metrics}", "path"),
                      ("{enabled: true, port_name: '', port: 0}", r"port_name or port")):
        with pytest.raises(Exception, match=why):
            parse_config(f"exporters: {{prometheus: {{discovery: {text}}}}}")
    with pytest.raises(ValueError, match=r"discovery\.enabled"):
        PrometheusSource(Settings(), Outbox(10, ConnectorMetrics(CollectorRegistry(), "p")),
                         ConnectorMetrics(CollectorRegistry(), "p"))


def _exporter_text(pod_hostname: str) -> str:
    # gpu-operator before v23.9 runs dcgm-exporter with the pod's host name in Hostname: the
    # ignore pattern skips it and the node comes from the discovered pod
    text = (FIELD / "dcgm-exporter" / "kops-l4-gpu-operator.prom").read_text()
    return text.replace('Hostname="i-030791dc5a37cd257"', f'Hostname="{pod_hostname}"')


def test_discovered_exporter_pods_on_the_real_control_plane_are_scraped_with_their_nodes(
    kube_api: Any, kube_config: Path, namespace: str, make_fleet: Callable[..., Any],
    fixture_exporter: Callable[[Callable[[int], str]], str], tmp_path: Path,
) -> None:
    import aiohttp
    from kubernetes import client

    from fleetmedic.devenv.fleet import KWOK_TOLERATION

    core = client.CoreV1Api(kube_api)
    fleet = make_fleet(2)
    for node in fleet.nodes:  # kwok keeps an InternalIP the node already has (node-initialize stage)
        core.patch_node_status(node, {"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                                               {"type": "Hostname", "address": node}]}})
    urls = [fixture_exporter(lambda n, h=h: _exporter_text(h)) for h in ("nvidia-dcgm-exporter-x7k2p",
                                                                          "nvidia-dcgm-exporter-q9m4z")]
    ports = [int(u.rsplit(":", 1)[1].split("/", 1)[0]) for u in urls]
    app = f"dcgm-{uuid.uuid4().hex[:6]}"

    def pod(name: str, node: str, port: int, labels: dict[str, str], **spec: Any) -> None:
        core.create_namespaced_pod(namespace, client.V1Pod.from_dict({
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": node, "hostNetwork": True, "tolerations": [KWOK_TOLERATION],
                     "containers": [{"name": "exporter", "image": "nvcr.io/nvidia/k8s/dcgm-exporter",
                                     "ports": [{"name": "metrics", "containerPort": port}]}], **spec}}))

    pod("exporter-a", fleet.nodes[0], ports[0], {"app": app})
    pod("exporter-b", fleet.nodes[1], ports[1], {"app": app})
    pod("other-app", fleet.nodes[1], 9999, {"app": f"{app}-other"})  # not selected
    pod("exporter-pending", "", ports[0], {"app": app}, nodeName=None,
        nodeSelector={"no-such-label": "x"})  # unschedulable: Pending, no IP
    deadline = time.monotonic() + 60
    while True:
        pods = {p.metadata.name: p for p in core.list_namespaced_pod(namespace, label_selector=f"app={app}").items}
        running = [p for p in pods.values() if p.status.phase == "Running" and p.status.pod_ip]
        if len(running) == 2:
            break
        assert time.monotonic() < deadline, {n: (p.status.phase, p.status.pod_ip) for n, p in pods.items()}
        time.sleep(0.2)
    # what kwok did: the hostNetwork pods got their node's InternalIP
    assert {p.status.pod_ip for p in running} == {"127.0.0.1"}

    settings = parse_config(
        "exporters: {prometheus: {mode: scrape, interval_s: 1, timeout_s: 5, discovery: "
        f"{{enabled: true, in_cluster: false, kubeconfig: '{kube_config}', namespace: {namespace}, "
        f"label_selector: 'app={app}'}}}}}}")
    registry = CollectorRegistry()
    metrics = ConnectorMetrics(registry, "prometheus")
    outbox = Outbox(100, metrics)
    source = PrometheusSource(settings, outbox, metrics)

    async def main() -> int:
        found = await source.discover()
        assert [(t.url, t.labels, t.pod) for t in found] == sorted(
            (f"http://127.0.0.1:{port}/metrics", {"instance": f"127.0.0.1:{port}", "node": node}, f"{namespace}/{name}")
            for name, node, port in (("exporter-a", fleet.nodes[0], ports[0]),
                                     ("exporter-b", fleet.nodes[1], ports[1])))
        async with aiohttp.ClientSession() as session:
            return await source.tick(session)

    try:
        assert asyncio.run(main()) == 2
    finally:
        source.pods.close()  # type: ignore[union-attr]
    recs = [o.record for o in outbox.peek(10)]
    assert all(isinstance(x, r.GpuTelemetry) for x in recs)
    by_node = {x.node: x for x in recs if isinstance(x, r.GpuTelemetry)}
    assert set(by_node) == set(fleet.nodes), "the GPUs are keyed by the pod's node, not the exporter pod's name"
    assert all(x.gpus == [0] and x.metrics.gpu_temp == [31.0] for x in by_node.values())
    assert registry.get_sample_value("fleetmedic_connector_skipped_total", {
        "connector": "prometheus", "reason": "discovery: pod not running"}) == 1

    # no API server at the kubeconfig's address: counted, the last list kept (a listing that
    # worked would give none: nothing carries the default selector here)
    import re

    gone = tmp_path / "gone.kubeconfig"
    gone.write_text(re.sub(r"server: \S+", "server: https://127.0.0.1:1", kube_config.read_text()))
    bad = parse_config(
        "exporters: {prometheus: {mode: scrape, discovery: "
        f"{{enabled: true, in_cluster: false, kubeconfig: '{gone}'}}}}}}")
    source2 = PrometheusSource(bad, outbox, metrics)
    source2.discovered = list(source.discovered)
    try:
        assert asyncio.run(source2.discover()) == source.discovered
    finally:
        source2.pods.close()  # type: ignore[union-attr]
    errors = next(s for s in registry.collect() if s.name == "fleetmedic_connector_errors").samples
    assert any(s.labels["kind"].startswith("discovery_") and s.value >= 1 for s in errors)
