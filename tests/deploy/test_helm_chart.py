"""The Helm chart (deploy/helm/fleetmedic): it lints, renders, and the real API server accepts
every object it renders (server-side dry-run); its containers run real subcommands with a config
that fleetmedic itself accepts; it refuses to render without a signing key. Keys by role: the
operator keys are a Secret of their own, mounted into the decide stage only. RBAC: no pod delete at
all, workload rights bound per namespace when given. NetworkPolicies: egress only to the addresses
given (no render with empty ones), metrics only from the scrapers given."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from fleetmedic.cli import main as cli
from fleetmedic.config import parse_config
from tests.deploy.helpers_helm import CHART, EVERYTHING, OPERATOR_KEY, REQUIRED, SIGNING_KEY, helm, render, render_error

pytestmark = pytest.mark.helm


def _by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def _pod_specs(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objs
            if o["kind"] in ("Deployment", "DaemonSet")}


@pytest.mark.parametrize("extra", [(), EVERYTHING], ids=["defaults", "everything"])
def test_chart_lints(extra: tuple[str, ...]) -> None:
    sets = [a for s in (*REQUIRED, *extra) for a in ("--set", s)]
    out = helm("lint", str(CHART), "--strict", *sets)
    assert "0 chart(s) failed" in out.stdout


def test_renders_every_component_with_least_exposure() -> None:
    objs = render()
    kinds = {o["kind"] for o in objs}
    assert {"ConfigMap", "Secret", "Deployment", "DaemonSet", "PodDisruptionBudget", "NetworkPolicy"} <= kinds
    specs = _pod_specs(objs)
    assert set(specs) == {"fm-fleetmedic-detect", "fm-fleetmedic-decide", "fm-fleetmedic-executor",
                          "fm-fleetmedic-nvml-exporter", "fm-fleetmedic-job-watcher"}
    for name, spec in specs.items():
        (container,) = spec["containers"]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False, name
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        mounts = {m["name"] for m in container["volumeMounts"]}
        # only the signer (decide) and the verifier (executor) see the command key; only the decide
        # stage (which verifies operator commands) sees the operator keys, never the executor
        assert ("signing" in mounts) == name.endswith(("-decide", "-executor")), name
        assert ("operator-keys" in mounts) == name.endswith("-decide"), name
    exporter = specs["fm-fleetmedic-nvml-exporter"]
    # the exporter keeps reporting from quarantined nodes: that is how they prove healthy again
    assert {"operator": "Exists"} in exporter["tolerations"]
    assert _by_kind(objs, "Deployment")[0]["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    decide = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-decide"))
    assert decide["spec"]["replicas"] == 1 and decide["spec"]["strategy"] == {"type": "Recreate"}


def test_the_cluster_name_value_names_the_cluster_in_the_config() -> None:
    def config(*sets: str) -> str:
        (cm,) = _by_kind(render("ops", *sets), "ConfigMap")
        return parse_config(cm["data"]["fleetmedic.yaml"], env={}).cluster.name

    assert config() == ""
    assert config("clusterName=gpu-east-1") == "gpu-east-1"
    assert config("config.cluster.name=gpu-east-1") == "gpu-east-1"
    assert config("clusterName=gpu-east-1", "config.cluster.name=gpu-east-1") == "gpu-east-1"
    assert "clusterName \"gpu-east-1\" and config.cluster.name \"gpu-west-2\" differ" in render_error(
        "clusterName=gpu-east-1", "config.cluster.name=gpu-west-2")
    assert "clusterName" in render_error("clusterName=GPU_East")  # values.schema.json: a DNS-1123 label


def test_containers_run_real_subcommands_with_a_valid_config() -> None:
    objs = render("ops", "config.safety.dry_run=false", "config.detection.sample_interval_s=5")
    (cm,) = _by_kind(objs, "ConfigMap")
    text = cm["data"]["fleetmedic.yaml"]
    settings = parse_config(text, env={})
    assert settings.safety.dry_run is False and settings.detection.sample_interval_s == 5
    assert settings.executor.lease_namespace == "ops" and settings.executor.in_cluster
    assert settings.signing.key_file == "/etc/fleetmedic/signing/signing-key"
    assert settings.signing.operator_key_dir == "/etc/fleetmedic/operator-keys" and not settings.signing.allow_demo_keys
    parser = cli.build_parser()
    for name, spec in _pod_specs(render("ops", *EVERYTHING)).items():
        if name.endswith("-remote-write"):
            continue  # test_the_remote_write_receiver_runs_a_real_subcommand
        (container,) = spec["containers"]
        args = list(container["args"])
        try:
            parsed = parser.parse_args(args)
        except SystemExit as exc:  # argparse exits on an unknown command or flag
            pytest.fail(f"{name}: `fleetmedic {' '.join(args)}` is not a valid command line ({exc})")
        assert callable(parsed.handler), name


WITHOUT_KEYS = tuple(s for s in REQUIRED if not s.startswith("signing."))


def test_refuses_to_render_without_a_signing_key() -> None:
    assert "signing.existingSecret" in render_error(required=WITHOUT_KEYS)


def test_existing_secret_is_used_and_none_is_created() -> None:
    objs = render("fleetmedic-system", "signing.existingSecret=my-key", "signing.operator.existingSecret=ops-keys",
                  required=WITHOUT_KEYS)
    assert not _by_kind(objs, "Secret")
    volumes = _pod_specs(objs)["fm-fleetmedic-decide"]["volumes"]
    assert {"name": "signing", "secret": {"secretName": "my-key", "defaultMode": 0o400}} in volumes
    assert {"name": "operator-keys", "secret": {"secretName": "ops-keys", "defaultMode": 0o400}} in volumes


def test_operator_keys_are_a_secret_of_their_own_never_the_command_keys() -> None:
    secrets = {o["metadata"]["name"]: o["data"] for o in _by_kind(render(), "Secret")}
    assert secrets == {"fm-fleetmedic-signing": {"signing-key": SIGNING_KEY},
                       "fm-fleetmedic-operator-keys": {"ops-1": OPERATOR_KEY}}
    assert "operator keys must be a Secret of their own" in render_error(
        "signing.existingSecret=keys", "signing.operator.existingSecret=keys", required=WITHOUT_KEYS)
    assert "signing.operator.keys.ops-2 is the command key" in render_error(
        f"signing.operator.keys.ops-2={SIGNING_KEY}")
    assert "set existingSecret or keys, not both" in render_error("signing.operator.existingSecret=ops")
    # without operator keys it renders (the decide stage then refuses every operator command; NOTES say so)
    bare = tuple(s for s in REQUIRED if not s.startswith("signing.operator"))
    specs = _pod_specs(render(required=bare))
    assert all(v["name"] != "operator-keys" for v in specs["fm-fleetmedic-decide"]["volumes"])


def test_api_server_accepts_every_rendered_object(kube_api: Any, namespace: str, crds: list[str]) -> None:
    """Server-side apply with dryRun=All: schema, defaulting and validation of the real API server,
    with every component and every monitoring object on (the Prometheus-operator CRDs installed from
    tests/data/crds, so ServiceMonitor, PodMonitor and PrometheusRule meet the operator's schema)."""
    from kubernetes import dynamic

    assert {"servicemonitors.monitoring.coreos.com", "podmonitors.monitoring.coreos.com",
            "prometheusrules.monitoring.coreos.com"} <= set(crds)
    dyn = dynamic.DynamicClient(kube_api)
    release = f"r{namespace[-6:]}"
    objs = render(namespace, *EVERYTHING, release=release)
    # the PodMonitor instead of the ServiceMonitor (one or the other); the kernel-log DaemonSet on /dev/kmsg
    other = render(namespace, *EVERYTHING, "monitoring.serviceMonitor.enabled=false",
                   "monitoring.podMonitor.enabled=true", "connectors.kmsg.source=kmsg", release=release)
    objs += [o for o in other if o["kind"] == "PodMonitor"
             or (o["kind"] == "DaemonSet" and o["metadata"]["name"].endswith("-kmsg-exporter"))]
    kinds = {o["kind"] for o in objs}
    assert {"Service", "ServiceMonitor", "PodMonitor", "PrometheusRule", "DaemonSet"} <= kinds
    assert len(objs) >= 50
    from kubernetes.client.exceptions import ApiException

    def apply(obj: dict[str, Any]) -> Any:
        resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        ns = namespace if resource.namespaced else None
        # Strict: a field the schema does not know is an error, not silently dropped
        return dyn.server_side_apply(resource, body=obj, namespace=ns, field_manager="fleetmedic-tests",
                                     dry_run="All", query_params=[("fieldValidation", "Strict")])

    for obj in objs:
        got = apply(obj)
        assert got.metadata.name == obj["metadata"]["name"]
        if obj["kind"] == "Deployment":
            assert got.spec.template.spec.containers[0].image  # defaulted and kept: a real object
    # the operator's schema is really applied: a misspelt field of a ServiceMonitor is refused
    (monitor,) = [o for o in objs if o["kind"] == "ServiceMonitor"]
    monitor["spec"]["endpoints"][0]["honourLabels"] = monitor["spec"]["endpoints"][0].pop("honorLabels")
    with pytest.raises(ApiException) as refused:
        apply(monitor)
    assert "honourLabels" in str(refused.value.body)


def test_executor_rbac_equals_the_verified_manifests() -> None:
    """deploy/rbac/executor.yaml is what tests/executor/test_rbac.py proves least-privilege; the
    chart must grant exactly that, no more."""
    manifests = [d for d in yaml.safe_load_all((CHART.parents[1] / "rbac" / "executor.yaml").read_text()) if d]
    objs = render()
    want = {(d["kind"], d["metadata"]["name"].removeprefix("fleetmedic-")): d["rules"] for d in manifests
            if d["kind"] in ("ClusterRole", "Role")}
    got = {(o["kind"], o["metadata"]["name"].removeprefix("fm-fleetmedic-")): o["rules"] for o in objs
           if o["kind"] in ("ClusterRole", "Role") and "-executor" in o["metadata"]["name"]}
    assert set(want) == {("ClusterRole", "executor"), ("ClusterRole", "executor-workloads"), ("Role", "executor")}
    assert got == want


def _rules(objs: list[dict[str, Any]], kind: str, suffix: str) -> list[dict[str, Any]]:
    (role,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    return list(role["rules"])


def _verbs(rules: list[dict[str, Any]], resource: str) -> set[str]:
    return {v for rule in rules if resource in rule["resources"] for v in rule["verbs"]}


def test_the_executor_never_deletes_pods_and_deletes_jobs_only_where_its_workloads_are() -> None:
    objs = render()
    for role in [o for o in objs if o["kind"] in ("ClusterRole", "Role")]:
        assert "delete" not in _verbs(role["rules"], "pods"), role["metadata"]["name"]  # evictions only
        assert not _verbs(role["rules"], "secrets") and not _verbs(role["rules"], "*"), role["metadata"]["name"]
    node_side = _rules(objs, "ClusterRole", "-executor")
    assert _verbs(node_side, "pods") == {"get", "list", "watch"} and _verbs(node_side, "pods/eviction") == {"create"}
    assert not _verbs(node_side, "jobs")
    assert "delete" in _verbs(_rules(objs, "ClusterRole", "-executor-workloads"), "jobs")  # a JobSet's children
    assert _verbs(_rules(objs, "Role", "-executor"), "jobs") == {"create", "get", "list", "watch"}  # diagnostics
    # cluster-wide by default; with workloadNamespaces, bound only there
    bindings = {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in objs
                if o["kind"].endswith("Binding") and "executor" in o["metadata"]["name"]}
    assert ("ClusterRoleBinding", "fm-fleetmedic-executor-workloads", None) in bindings
    scoped = render("fleetmedic-system", "executor.workloadNamespaces={team-a,team-b}",
                    "config.executor.diagnostics_namespace=gpu-diag")
    bindings = {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in scoped
                if o["kind"].endswith("Binding") and "executor" in o["metadata"]["name"]}
    assert bindings == {("ClusterRoleBinding", "fm-fleetmedic-executor", None),
                        ("RoleBinding", "fm-fleetmedic-executor-workloads", "team-a"),
                        ("RoleBinding", "fm-fleetmedic-executor-workloads", "team-b"),
                        ("RoleBinding", "fm-fleetmedic-executor", None),
                        ("RoleBinding", "fm-fleetmedic-executor-diagnostics", "gpu-diag")}
    (diag,) = [o for o in scoped if o["kind"] == "Role" and o["metadata"].get("namespace") == "gpu-diag"]
    assert diag["rules"] == [{"apiGroups": ["batch"], "resources": ["jobs"],
                              "verbs": ["create", "get", "list", "watch"]}]


def _policies(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"].removeprefix("fm-fleetmedic-"): o["spec"] for o in _by_kind(objs, "NetworkPolicy")}


def test_network_policies_allow_egress_only_to_the_addresses_given_and_metrics_only_from_the_scrapers() -> None:
    policies = _policies(render())
    assert set(policies) == {"detect", "decide", "executor", "nvml-exporter", "job-watcher", "diagnostics"}
    for name, spec in policies.items():
        for rule in spec["egress"]:
            assert rule.get("to"), (name, rule)  # never "any address"
        cidrs = {peer["ipBlock"]["cidr"] for rule in spec["egress"] for peer in rule["to"] if "ipBlock" in peer}
        if name == "diagnostics":
            assert spec["egress"] == [] and spec["ingress"] == []
            continue
        api = {"10.96.0.1/32", "172.18.0.2/32"} if name in ("executor", "job-watcher") else set()
        assert cidrs == {"10.20.0.0/24"} | api, name
        (ingress,) = spec["ingress"]
        monitoring = {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
        assert ingress["from"] == [{"namespaceSelector": monitoring}]
    nobody = _policies(render(required=tuple(s for s in REQUIRED if "metricsFrom" not in s)))
    assert all(spec["ingress"] == [] for spec in nobody.values())


@pytest.mark.parametrize(("drop", "extra", "message"), [
    ("kafkaCIDRs", (), "networkPolicy.kafkaCIDRs and networkPolicy.kafkaPeers are empty"),
    ("apiServerCIDRs", (), "networkPolicy.apiServerCIDRs and networkPolicy.apiServerPeers are empty"),
    ("metricsFrom", ("networkPolicy.metricsFrom[0].namespaceSelector.x=null",), "admits every namespace"),
])
def test_network_policies_refuse_to_render_with_empty_addresses_or_an_open_scraper(
        drop: str, extra: tuple[str, ...], message: str) -> None:
    required = tuple(s for s in REQUIRED if drop not in s)
    assert message in render_error(*extra, required=required)
    render("fleetmedic-system", "networkPolicy.enabled=false", *extra, required=required)  # off: renders


def test_job_watcher_is_read_only() -> None:
    (role,) = [o for o in render() if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-job-watcher")]
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert verbs == {"get", "list", "watch"}
