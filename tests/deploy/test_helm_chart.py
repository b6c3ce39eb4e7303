"""The Helm chart (deploy/helm/fleetmedic): it lints, renders, and the real API server accepts
every object it renders (server-side dry-run); its containers run real subcommands with a config
that fleetmedic itself accepts; it refuses to render without a signing key."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from fleetmedic.cli import main as cli
from fleetmedic.config import parse_config
from tests.deploy.helm import CHART, helm, render


def _by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def _pod_specs(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objs
            if o["kind"] in ("Deployment", "DaemonSet")}


def test_chart_lints() -> None:
    out = helm("lint", str(CHART), "--strict", "--set", "signing.key=a2V5")
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
        # only the signer (decide) and the verifier (executor) see the signing key
        assert ("signing" in mounts) == name.endswith(("-decide", "-executor")), name
    exporter = specs["fm-fleetmedic-nvml-exporter"]
    # the exporter keeps reporting from quarantined nodes: that is how they prove healthy again
    assert {"operator": "Exists"} in exporter["tolerations"]
    assert _by_kind(objs, "Deployment")[0]["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    decide = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-decide"))
    assert decide["spec"]["replicas"] == 1 and decide["spec"]["strategy"] == {"type": "Recreate"}


def test_containers_run_real_subcommands_with_a_valid_config() -> None:
    objs = render("ops", "config.safety.dry_run=false", "config.detection.sample_interval_s=5")
    (cm,) = _by_kind(objs, "ConfigMap")
    text = cm["data"]["fleetmedic.yaml"]
    settings = parse_config(text, env={})
    assert settings.safety.dry_run is False and settings.detection.sample_interval_s == 5
    assert settings.executor.lease_namespace == "ops" and settings.executor.in_cluster
    assert settings.signing.key_file == "/etc/fleetmedic/signing/signing-key"
    parser = cli.build_parser()
    for name, spec in _pod_specs(objs).items():
        (container,) = spec["containers"]
        args = list(container["args"])
        try:
            parsed = parser.parse_args(args)
        except SystemExit as exc:  # argparse exits on an unknown command or flag
            pytest.fail(f"{name}: `fleetmedic {' '.join(args)}` is not a valid command line ({exc})")
        assert callable(parsed.handler), name


def test_refuses_to_render_without_a_signing_key() -> None:
    proc = helm("template", "fm", str(CHART), check=False)
    assert proc.returncode != 0 and "signing.existingSecret" in proc.stderr


def test_existing_secret_is_used_and_none_is_created() -> None:
    out = helm("template", "fm", str(CHART), "--set", "signing.existingSecret=my-key").stdout
    objs = [d for d in yaml.safe_load_all(out) if d]
    assert not _by_kind(objs, "Secret")
    volumes = _pod_specs(objs)["fm-fleetmedic-decide"]["volumes"]
    assert {"name": "signing", "secret": {"secretName": "my-key", "defaultMode": 0o400}} in volumes


def test_api_server_accepts_every_rendered_object(kube_api: Any, namespace: str) -> None:
    """Server-side apply with dryRun=All: schema, defaulting and validation of the real API server."""
    from kubernetes import dynamic

    dyn = dynamic.DynamicClient(kube_api)
    objs = render(namespace, release=f"r{namespace[-6:]}")
    assert len(objs) >= 10
    for obj in objs:
        resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        ns = namespace if resource.namespaced else None
        got = dyn.server_side_apply(resource, body=obj, namespace=ns, field_manager="fleetmedic-tests",
                                    dry_run="All")
        assert got.metadata.name == obj["metadata"]["name"]
        if obj["kind"] == "Deployment":
            assert got.spec.template.spec.containers[0].image  # defaulted and kept: a real object


def test_executor_rbac_equals_the_verified_manifests() -> None:
    """deploy/rbac/executor.yaml is what tests/executor/test_rbac.py proves least-privilege; the
    chart must grant exactly that, no more."""
    manifests = [d for d in yaml.safe_load_all((CHART.parents[1] / "rbac" / "executor.yaml").read_text()) if d]
    objs = render()
    for kind in ("ClusterRole", "Role"):
        (want,) = [d for d in manifests if d["kind"] == kind]
        (got,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith("-executor")]
        assert got["rules"] == want["rules"], kind


def test_job_watcher_is_read_only() -> None:
    (role,) = [o for o in render() if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-job-watcher")]
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert verbs == {"get", "list", "watch"}
