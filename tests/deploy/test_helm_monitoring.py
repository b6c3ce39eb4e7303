"""The chart's monitoring side and its connectors (deploy/helm/fleetmedic): a Service for every
component's metrics port, ServiceMonitor/PodMonitor/PrometheusRule behind values, the rules and the
dashboard identical to deploy/prometheus and deploy/grafana, probes on the metrics endpoint, the
connectors docs/operations.md tells users to run (kmsg with the least privilege its source needs),
and a values.schema.json that covers every value. The server-side apply of all of it is in
test_helm_chart.py (test_api_server_accepts_every_rendered_object)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetmedic.cli import main as cli
from fleetmedic.config import parse_config
from tests.deploy.helpers_helm import CHART, EVERYTHING, helm, render, render_error

pytestmark = pytest.mark.helm

DEPLOY = CHART.parents[1]


@functools.cache
def _rendered_everything() -> str:
    return json.dumps(render("fleetmedic-system", *EVERYTHING))


def _everything() -> list[dict[str, Any]]:
    """Every component and monitoring object on (rendered once per session; a fresh copy each call)."""
    objs: list[dict[str, Any]] = json.loads(_rendered_everything())
    return objs


def _workloads(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] in ("Deployment", "DaemonSet")}


def _component(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["labels"]["app.kubernetes.io/component"])


def test_every_component_has_a_service_for_its_metrics_port() -> None:
    for objs in (render(), _everything()):
        workloads = _workloads(objs)
        services = {_component(o): o for o in objs if o["kind"] == "Service"}
        assert set(services) == {_component(w) for w in workloads.values()}
        for name, workload in workloads.items():
            pod = workload["spec"]["template"]
            svc = services[_component(workload)]["spec"]
            # the Service selects exactly this component's pods
            assert svc["selector"] == workload["spec"]["selector"]["matchLabels"], name
            assert svc["selector"].items() <= pod["metadata"]["labels"].items(), name
            (container,) = pod["spec"]["containers"]
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            metrics = next(p for p in svc["ports"] if p["name"] == "metrics")
            assert metrics["targetPort"] == "metrics" and metrics["port"] == ports["metrics"] == 9108, name
    everything = {_component(o): o["spec"] for o in _everything() if o["kind"] == "Service"}
    assert len(everything) == 11
    # the receiver takes writes through its Service, and the decide stage the API server's calls of
    # its bind-time check (EVERYTHING enables it); the others are headless (only scrapers connect)
    assert "clusterIP" not in everything["remote-write"] and "clusterIP" not in everything["decide"]
    ports = {p["name"]: p["port"] for p in everything["remote-write"]["ports"]}
    assert ports == {"metrics": 9108, "remote-write": 9201}
    assert {p["name"]: p["port"] for p in everything["decide"]["ports"]} == {"metrics": 9108, "admission": 443}
    assert all(spec.get("clusterIP") == "None" for c, spec in everything.items() if c not in ("remote-write", "decide"))


def test_probes_ask_the_health_endpoints_every_container_serves() -> None:
    """Every component serves /healthz and /readyz on its metrics port (fleetmedic.serving;
    tests/foundation/test_serving.py holds every process to it)."""
    paths = {"startupProbe": "/healthz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"}
    for name, workload in _workloads(_everything()).items():
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        for probe, path in paths.items():
            assert container[probe]["httpGet"] == {"path": path, "port": "metrics"}, (name, probe)
        assert container["livenessProbe"]["failureThreshold"] * container["livenessProbe"]["periodSeconds"] >= 60
        # the decide stage restores its state before it serves: minutes before liveness may count
        assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 300
    off = _workloads(render("fleetmedic-system", "probes.liveness=null"))
    assert all("livenessProbe" not in w["spec"]["template"]["spec"]["containers"][0] for w in off.values())


def _monitoring(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (obj,) = [o for o in objs if o["kind"] == kind]
    return obj


def test_monitors_and_rules_are_behind_values_and_keep_fleetmedics_node_label() -> None:
    kinds = {o["kind"] for o in render()}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule"}  # off by default: no CRDs needed
    objs = render("fleetmedic-system", *EVERYTHING, "monitoring.labels.release=kube-prometheus-stack")
    sm = _monitoring(objs, "ServiceMonitor")
    (endpoint,) = sm["spec"]["endpoints"]
    # without honorLabels Prometheus renames fleetmedic's own `node` label (the GPU node) to exported_node
    assert endpoint["honorLabels"] is True and endpoint["port"] == "metrics"
    assert "node" not in {r["targetLabel"] for r in endpoint["relabelings"]}
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["fleetmedic-system"]}
    selected = sm["spec"]["selector"]["matchLabels"]
    services = [o for o in objs if o["kind"] == "Service"]
    assert services and all(selected.items() <= s["metadata"]["labels"].items() for s in services)
    pm = _monitoring(render("fleetmedic-system", "monitoring.podMonitor.enabled=true"), "PodMonitor")
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["honorLabels"] is True and endpoint["port"] == "metrics"
    assert "not both" in render_error("monitoring.podMonitor.enabled=true", "monitoring.serviceMonitor.enabled=true")


def test_the_rules_and_the_dashboard_are_the_ones_in_deploy() -> None:
    """The chart carries copies (Helm reads no file outside the chart): they must not drift. After
    editing deploy/prometheus/alerts.yml or the dashboard, copy them into the chart's files/."""
    for shipped in (DEPLOY / "prometheus" / "alerts.yml", DEPLOY / "grafana" / "fleetmedic-dashboard.json"):
        copy = CHART / "files" / shipped.name
        assert copy.read_bytes() == shipped.read_bytes(), f"{copy} differs from {shipped}: cp {shipped} {copy}"
    objs = render("fleetmedic-system", *EVERYTHING, "monitoring.dashboard.namespace=grafana")
    rule = _monitoring(objs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    annotations = [r["annotations"]["summary"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert any("{{ $labels.node }}" in a for a in annotations)  # Prometheus' templates, not Helm's
    (dashboard,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["namespace"] == "grafana"
    assert json.loads(dashboard["data"]["fleetmedic-dashboard.json"]) == json.loads(
        (DEPLOY / "grafana" / "fleetmedic-dashboard.json").read_text())


def _container(objs: list[dict[str, Any]], component: str) -> tuple[dict[str, Any], dict[str, Any]]:
    (w,) = [w for w in _workloads(objs).values() if _component(w) == component]
    spec = w["spec"]["template"]["spec"]
    return spec, spec["containers"][0]


def test_kmsg_runs_on_every_gpu_node_with_the_least_privilege_its_source_needs() -> None:
    objs = render("fleetmedic-system", "connectors.kmsg.enabled=true")
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet" and _component(o) == "kmsg-exporter"]
    spec, container = _container(objs, "kmsg-exporter")
    assert {"operator": "Exists"} in spec["tolerations"]  # keeps reading on quarantined nodes
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    # /dev/kmsg (the default: the image has no journalctl): privileged (the device cgroup admits the
    # device to privileged pods only), the device read-only
    assert container["args"][:4] == ["exporter", "kmsg", "--source", "kmsg"]
    assert container["securityContext"]["privileged"] is True
    assert {"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True} in container["volumeMounts"]
    assert {"name": "kmsg", "hostPath": {"path": "/dev/kmsg", "type": "CharDevice"}} in spec["volumes"]
    # the journal (for an image with journalctl): no privilege, no capability, the host's files read-only
    spec, container = _container(render("fleetmedic-system", "connectors.kmsg.enabled=true",
                                        "connectors.kmsg.source=journal"), "kmsg-exporter")
    assert container["args"][:4] == ["exporter", "kmsg", "--source", "journal"]
    sc = container["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False
    assert "privileged" not in sc and sc["readOnlyRootFilesystem"] is True
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host == {"state": "/var/lib/fleetmedic", "journal": "/var/log/journal", "run-journal": "/run/log/journal",
                    "machine-id": "/etc/machine-id"}
    writable = {m["name"] for m in container["volumeMounts"] if not m.get("readOnly") and m["name"] in host}
    assert writable == {"state"}  # only its own position
    # a non-root journal reader in the host's systemd-journal group
    objs = render("fleetmedic-system", "connectors.kmsg.enabled=true", "connectors.kmsg.source=journal",
                  "connectors.kmsg.journal.runAsUser=65534", "connectors.kmsg.journal.supplementalGroups={190}")
    spec, _ = _container(objs, "kmsg-exporter")
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["supplementalGroups"] == [190]


def test_connectors_get_egress_only_to_what_they_read() -> None:
    objs = _everything()
    policies = {o["metadata"]["name"].removeprefix("fm-fleetmedic-"): o["spec"] for o in objs
                if o["kind"] == "NetworkPolicy"}
    assert {"prometheus-exporter", "kafka-exporter", "logs-exporter", "infiniband-exporter", "kmsg-exporter",
            "remote-write"} <= set(policies)
    prom = policies["prometheus-exporter"]["egress"]
    assert prom[-1]["ports"] == [{"port": 9400}]  # connectors.prometheus.egress
    for name in ("kafka-exporter", "logs-exporter", "infiniband-exporter", "kmsg-exporter", "remote-write"):
        assert [r["ports"][0]["port"] for r in policies[name]["egress"]] == [53, 9092], name  # DNS, Kafka only
    writers = policies["remote-write"]["ingress"]
    assert [r["ports"] for r in writers] == [[{"port": "metrics", "protocol": "TCP"}],
                                             [{"port": "remote-write", "protocol": "TCP"}]]
    prometheus_on = ("connectors.prometheus.enabled=true",)
    assert "connectors.prometheus.egress is empty" in render_error(*prometheus_on)
    assert "connectors.remoteWrite.ingressFrom is empty" in render_error(
        "connectors.remoteWrite.enabled=true", "connectors.remoteWrite.auth.existingSecret=remote-write-auth")
    # an egress rule without peers would open egress to any address: the schema refuses it
    assert "missing property 'to'" in render_error(*prometheus_on, "connectors.prometheus.egress[0].ports[0].port=9400")
    assert "/connectors/prometheus/egress/0/to" in render_error(*prometheus_on, "connectors.prometheus.egress[0].to={}")


def test_the_remote_write_receiver_is_off_by_default_and_listens_where_its_service_points() -> None:
    assert not [o for o in render() if "remote-write" in o["metadata"]["name"]]
    _, container = _container(_everything(), "remote-write")
    args = container["args"]
    assert args[:3] == ["exporter", "remote-write", "--listen"] and args[3] == "0.0.0.0:9201"
    assert {"name": "remote-write", "containerPort": 9201} in container["ports"]


def test_the_remote_write_receiver_takes_only_senders_with_the_secrets_credentials_by_default() -> None:
    """HTTPS and Bearer tokens from a Secret mounted as a folder (so a rotation reaches the files the
    receiver reads again); no Secret is a render error unless allowUnauthenticated says so."""
    pod, container = _container(_everything(), "remote-write")
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "remote-write-auth"]
    assert mount == {"name": "remote-write-auth", "mountPath": "/etc/fleetmedic/remote-write", "readOnly": True}
    assert "subPath" not in mount
    (volume,) = [v for v in pod["volumes"] if v["name"] == "remote-write-auth"]
    assert volume["secret"] == {"secretName": "remote-write-auth", "defaultMode": 0o400}
    config = _config_of(_everything())
    rw = config["exporters"]["remote_write"]
    assert rw["tls"] == {"cert_file": "/etc/fleetmedic/remote-write/tls.crt",
                         "key_file": "/etc/fleetmedic/remote-write/tls.key"}
    assert rw["auth"] == {"bearer_tokens_file": "/etc/fleetmedic/remote-write/tokens"}
    assert rw["allow_unauthenticated"] is False
    assert parse_config(yaml.safe_dump(config)).exporters.remote_write.authenticated
    on = ("connectors.remoteWrite.enabled=true",
          "connectors.remoteWrite.ingressFrom[0].podSelector.matchLabels.app=prometheus")
    assert "connectors.remoteWrite.auth.existingSecret is empty" in render_error(*on)
    mtls = _config_of(render("fleetmedic-system", *on, "connectors.remoteWrite.auth.existingSecret=s",
                             "connectors.remoteWrite.auth.clientCertificates=true"))
    assert mtls["exporters"]["remote_write"]["tls"]["client_ca_file"] == "/etc/fleetmedic/remote-write/ca.crt"
    open_ = render("fleetmedic-system", *on, "connectors.remoteWrite.allowUnauthenticated=true")
    assert _config_of(open_)["exporters"]["remote_write"] == {"allow_unauthenticated": True}
    _, plain = _container(open_, "remote-write")
    assert not [m for m in plain["volumeMounts"] if m["name"] == "remote-write-auth"]


def _config_of(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-config")]
    config: dict[str, Any] = yaml.safe_load(cm["data"]["fleetmedic.yaml"])
    return config


def test_the_remote_write_receiver_runs_a_real_subcommand() -> None:
    _, container = _container(_everything(), "remote-write")
    parsed = cli.build_parser().parse_args(container["args"])
    assert callable(parsed.handler)


def _leaves(values: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(values, dict) and values:
        return [leaf for k, v in values.items() for leaf in _leaves(v, (*path, k))]
    return [path]


def test_the_values_schema_covers_every_value_and_refuses_typos() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    uncovered = []
    for path in _leaves(values):
        node = schema
        for key in path:
            props = node.get("properties")
            if node.get("additionalProperties") is not False:
                # open: a Kubernetes object (resources, affinity, ...) or `config`, fleetmedic's own
                # config, which fleetmedic validates (test_containers_run_real_subcommands_with_a_valid_config)
                assert node.get("type") == "object", path
                break
            assert props is not None, path
            if key not in props:
                uncovered.append(".".join(path))
                break
            node = props[key]
    assert not uncovered, f"values without a schema: {uncovered}"
    # chart-owned objects are closed: a misspelt key is an error, not silently ignored
    assert "additional properties 'replicaz' not allowed" in render_error("detect.replicaz=2")
    assert "connectors.kmsg.source" in render_error("connectors.kmsg.source=dmesg").replace("/", ".")
    assert "monitoring" in render_error("monitoring.serviceMonitor.enabeld=true")


def test_helm_lint_uses_the_schema(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("executor:\n  replicas: two\n")
    proc = helm("lint", str(CHART), "--strict", "-f", str(bad), check=False)
    assert proc.returncode != 0 and "replicas" in proc.stdout + proc.stderr
