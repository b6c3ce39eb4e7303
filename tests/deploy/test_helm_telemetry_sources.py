"""The chart in the cluster it lands in: one switch (telemetry.source) says where GPU telemetry comes
from and turns on what that source needs (the NVML DaemonSet only for nvml; for dcgm-exporter the
Prometheus connector discovering the exporter pods, with a ServiceAccount that may list and watch
pods, its token, and egress to the API server and those pods); Kafka and the API server may be
NetworkPolicy peers (an in-cluster Strimzi Kafka) instead of CIDRs; a ServiceMonitor or PodMonitor
opens the metrics port to the Prometheus servers that follow it; the kernel-log connector defaults
to /dev/kmsg; the schema refuses a misspelt key under `config`. Every supported combination
renders and passes `helm lint --strict`, and the dcgm-exporter + Prometheus operator + in-cluster
Kafka combination is applied to the real API server, whose authorizer then lets the connector's
ServiceAccount list the pods it discovers and nothing more."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetmedic.config import parse_config
from tests.deploy.helpers_helm import CHART, OPERATOR_KEY, SIGNING_KEY, helm, render, render_error

pytestmark = pytest.mark.helm

KEYS = (f"signing.key={SIGNING_KEY}", f"signing.operator.keys.ops-1={OPERATOR_KEY}")
CIDRS = ("networkPolicy.kafkaCIDRs={10.20.0.0/24}", "networkPolicy.apiServerCIDRs={10.96.0.1/32}")
#: a Strimzi cluster in namespace kafka, and the API server as a peer: no CIDR at all
PEERS = ("networkPolicy.kafkaPeers[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=kafka",
         "networkPolicy.kafkaPeers[0].podSelector.matchLabels.strimzi\\.io/cluster=my-cluster",
         "networkPolicy.kafkaPeers[0].podSelector.matchLabels.strimzi\\.io/kind=Kafka",
         "networkPolicy.apiServerPeers[0].ipBlock.cidr=172.18.0.2/32")
OPERATOR = ("monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true")
#: what each source needs besides (the receiver takes senders and their credentials, the Kafka
#: connector nothing more)
SOURCE_NEEDS = {
    "nvml": (),
    "dcgm-exporter": (),
    "remote-write": ("connectors.remoteWrite.ingressFrom[0].namespaceSelector.matchLabels."
                     "kubernetes\\.io/metadata\\.name=monitoring",
                     "connectors.remoteWrite.auth.existingSecret=fleetmedic-remote-write"),
    "kafka": (),
}
COMBINATIONS = [(source, net, mon) for source in SOURCE_NEEDS for net, mon in (("cidrs", False), ("peers", True))]


def _sets(source: str, net: str, monitoring: bool) -> tuple[str, ...]:
    return (*KEYS, *(CIDRS if net == "cidrs" else PEERS), f"telemetry.source={source}", *SOURCE_NEEDS[source],
            *(OPERATOR if monitoring else ()))


def _components(objs: list[dict[str, Any]]) -> set[str]:
    return {o["metadata"]["labels"].get("app.kubernetes.io/component", "") for o in objs
            if o["kind"] in ("Deployment", "DaemonSet")}


def _policy(objs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    (p,) = [o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"].endswith(f"-{component}")]
    return p["spec"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(("source", "net", "monitoring"), COMBINATIONS,
                         ids=[f"{s}-{n}{'-operator' if m else ''}" for s, n, m in COMBINATIONS])
def test_every_supported_combination_renders_and_lints_strictly(source: str, net: str, monitoring: bool) -> None:
    sets = _sets(source, net, monitoring)
    objs = render("fleetmedic-system", *sets, required=())
    runs = _components(objs)
    wanted = {"nvml": "nvml-exporter", "dcgm-exporter": "prometheus-exporter", "remote-write": "remote-write",
              "kafka": "kafka-exporter"}
    assert wanted[source] in runs
    assert ("nvml-exporter" in runs) == (source == "nvml")  # the NVML DaemonSet only where NVML is the source
    (config,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-config")]
    parse_config(config["data"]["fleetmedic.yaml"])  # fleetmedic accepts the config the chart writes
    out = helm("lint", str(CHART), "--strict", *[a for s in sets for a in ("--set", s)])
    assert "0 chart(s) failed" in out.stdout


def test_dcgm_exporter_source_discovers_the_exporter_pods_with_least_rights() -> None:
    objs = render("fleetmedic-system", "telemetry.source=dcgm-exporter")
    (deploy,) = [o for o in objs if o["kind"] == "Deployment"
                 and o["metadata"]["name"].endswith("-prometheus-exporter")]
    spec = deploy["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "fm-fleetmedic-prometheus-exporter"
    assert spec["automountServiceAccountToken"] is True
    (config,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-config")]
    prom = parse_config(config["data"]["fleetmedic.yaml"]).exporters.prometheus
    assert prom.mode == "scrape" and prom.discovery.enabled and prom.discovery.in_cluster
    assert (prom.discovery.namespace, prom.discovery.label_selector) == ("gpu-operator", "app=nvidia-dcgm-exporter")
    (role,) = [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"] == "fm-fleetmedic-prometheus-exporter"]
    assert role["metadata"]["namespace"] == "gpu-operator"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    (binding,) = [o for o in objs if o["kind"] == "RoleBinding"
                  and o["metadata"]["name"] == "fm-fleetmedic-prometheus-exporter"]
    assert binding["subjects"][0]["namespace"] == "fleetmedic-system"
    egress = _policy(objs, "prometheus-exporter")["egress"]
    api_server = [{"ipBlock": {"cidr": "10.96.0.1/32"}}, {"ipBlock": {"cidr": "172.18.0.2/32"}}]
    api = [r for r in egress if r["to"] == api_server]
    assert api, egress  # the API server (REQUIRED's apiServerCIDRs)
    (pods,) = [r for r in egress if r["ports"] == [{"port": 9400, "protocol": "TCP"}]]
    assert pods["to"] == [{"podSelector": {"matchLabels": {"app": "nvidia-dcgm-exporter"}},
                           "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gpu-operator"}}}]
    # every namespace: a ClusterRole instead
    objs = render("fleetmedic-system", "telemetry.source=dcgm-exporter", "telemetry.dcgmExporter.namespace=")
    assert [o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-prometheus-exporter")]


def test_nvml_stays_the_default_and_other_connectors_keep_no_token() -> None:
    objs = render("fleetmedic-system", "connectors.kafka.enabled=true")
    assert {"nvml-exporter", "kafka-exporter"} <= _components(objs)
    assert not [o for o in objs if o["kind"] == "ServiceAccount" and "prometheus" in o["metadata"]["name"]]
    (kafka,) = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-kafka-exporter")]
    assert kafka["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert "/telemetry/source" in render_error("telemetry.source=dcgm")


def test_kafka_and_the_api_server_may_be_peers_instead_of_cidrs() -> None:
    objs = render("fleetmedic-system", *KEYS, *PEERS, required=())
    for component in ("detect", "executor"):
        egress = _policy(objs, component)["egress"]
        (kafka,) = [r for r in egress if {"port": 9092, "protocol": "TCP"} in r["ports"]]
        assert kafka["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kafka"}},
                                "podSelector": {"matchLabels": {"strimzi.io/cluster": "my-cluster",
                                                                "strimzi.io/kind": "Kafka"}}}]
    assert {"to": [{"ipBlock": {"cidr": "172.18.0.2/32"}}], "ports": [{"port": 443, "protocol": "TCP"},
                                                                       {"port": 6443, "protocol": "TCP"}]} \
        in _policy(objs, "executor")["egress"]
    assert "kafkaCIDRs and networkPolicy.kafkaPeers are empty" in render_error(*KEYS, PEERS[-1], required=())
    assert "apiServerCIDRs and networkPolicy.apiServerPeers are empty" in render_error(*KEYS, *PEERS[:3], required=())


def test_a_service_monitor_lets_the_prometheus_servers_that_follow_it_scrape() -> None:
    def ingress(*sets: str) -> list[dict[str, Any]]:
        return _policy(render("fleetmedic-system", *KEYS, *CIDRS, *sets, required=()), "decide")["ingress"]

    assert ingress() == []  # nobody named, nothing scrapes through the operator
    scrapers = [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    for monitor in ("monitoring.serviceMonitor.enabled=true", "monitoring.podMonitor.enabled=true"):
        assert ingress(monitor) == [{"from": scrapers, "ports": [{"port": "metrics", "protocol": "TCP"}]}]


def test_the_schema_refuses_a_misspelt_config_key() -> None:
    err = render_error("config.safety.dry_rn=true")
    assert "dry_rn" in err
    assert "config" in render_error("config.detection.peers.z_threshold=fast")
    assert "sm_clok" in render_error("config.detection.metrics.sm_clok.z_warning=5")  # names the loader checks
    render("fleetmedic-system", "config.detection.peers.z_threshold=4")  # a valid one renders
    # --set passes 4.5 as a string, which fleetmedic's config refuses too: refused at render, not in the pods
    assert "want number" in render_error("config.detection.peers.z_threshold=4.5")


def test_dcgm_exporter_with_the_operator_and_strimzi_applies_to_the_real_api_server(
        kube_api: Any, kube_config: Path, namespace: str, crds: list[str]) -> None:
    """Namespaced objects are created for real in a fresh namespace (cluster-wide ones server-side
    dry-run: they would outlive it); then the real authorizer is asked what the connector's
    ServiceAccount may do."""
    from kubernetes import client, dynamic

    assert "servicemonitors.monitoring.coreos.com" in set(crds)
    release = f"r{namespace[-6:]}"
    objs = render(namespace, *KEYS, *PEERS, *OPERATOR, "telemetry.source=dcgm-exporter",
                  f"telemetry.dcgmExporter.namespace={namespace}", release=release, required=())
    dyn = dynamic.DynamicClient(kube_api)
    for obj in objs:
        resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        got = dyn.server_side_apply(resource, body=obj, namespace=namespace if resource.namespaced else None,
                                    field_manager="fleetmedic-tests", dry_run=None if resource.namespaced else "All",
                                    query_params=[("fieldValidation", "Strict")])
        assert got.metadata.name == obj["metadata"]["name"]
    apps = client.AppsV1Api(kube_api)
    deploy = apps.read_namespaced_deployment(f"{release}-fleetmedic-prometheus-exporter", namespace)
    assert deploy.spec.template.spec.automount_service_account_token is True
    sa = deploy.spec.template.spec.service_account_name
    assert not [d for d in apps.list_namespaced_daemon_set(namespace).items if "nvml" in d.metadata.name]
    policy = client.NetworkingV1Api(kube_api).read_namespaced_network_policy(
        f"{release}-fleetmedic-detect", namespace)
    (kafka,) = [rule for rule in policy.spec.egress if any(port.port == 9092 for port in rule.ports)]
    assert [(p.namespace_selector.match_labels, p.pod_selector.match_labels) for p in kafka.to] == [
        ({"kubernetes.io/metadata.name": "kafka"}, {"strimzi.io/cluster": "my-cluster", "strimzi.io/kind": "Kafka"})]

    def allowed(verb: str, where: str, resource: str = "pods") -> bool:
        review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{namespace}:{sa}",
            groups=["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
            resource_attributes=client.V1ResourceAttributes(verb=verb, resource=resource, namespace=where)))
        out = client.AuthorizationV1Api(kube_api).create_subject_access_review(review)
        return bool(out.status and out.status.allowed)

    assert allowed("list", namespace) and allowed("watch", namespace) and allowed("get", namespace)
    assert not allowed("delete", namespace) and not allowed("list", "kube-system")
    assert not allowed("list", namespace, "secrets")
    # the install notes (of a release beside, whose objects the applied ones do not own) say where the
    # telemetry comes from and who may scrape
    sets = (*KEYS, *PEERS, *OPERATOR, "telemetry.source=dcgm-exporter", f"telemetry.dcgmExporter.namespace={namespace}",
            "clusterName=gpu-east-1")
    notes = helm("install", f"{release}n", str(CHART), "-n", namespace, "--dry-run=client",
                 "--kubeconfig", str(kube_config),
                 *[a for s in sets for a in ("--set", s)]).stdout.split("NOTES:", 1)[1]
    assert "GPU telemetry: dcgm-exporter (telemetry.source)" in notes and namespace in notes
    assert "The NetworkPolicies let these reach the metrics port" in notes and "app.kubernetes.io/name" in notes
    assert "Cluster: gpu-east-1 (clusterName). Every record and metric carries cluster=gpu-east-1" in notes
