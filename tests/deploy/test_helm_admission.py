"""The chart's bind-time check (``decide.admission``): the decide pod serves the webhook with the
mounted certificate, the ValidatingWebhookConfiguration reaches it through the decide Service and trusts
the CA that signed it, and the NetworkPolicy lets the API server (and no one else) connect. The
server-side apply of every object is in test_helm_chart.py (EVERYTHING enables it); the webhook
itself against a real API server in tests/streams/test_admission_kube.py."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

from fleetmedic.config import parse_config
from tests.deploy.helpers_helm import render, render_error


def by(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def test_the_decide_pod_serves_the_check_the_api_server_calls_through_a_service_with_a_ca_it_trusts(
        tmp_path: Path) -> None:
    objs = render("ops", "decide.admission.enabled=true")
    hook = by(objs, "ValidatingWebhookConfiguration", "fm-fleetmedic-admission")["webhooks"][0]
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
    assert hook["rules"][0]["resources"] == ["pods", "pods/binding"] and hook["rules"][0]["operations"] == ["CREATE"]
    svc_ref = hook["clientConfig"]["service"]
    assert svc_ref == {"namespace": "ops", "name": "fm-fleetmedic-decide", "path": "/admission/binding", "port": 443}
    svc = by(objs, "Service", "fm-fleetmedic-decide")  # a ClusterIP (the API server resolves it), not headless
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "decide" and "clusterIP" not in svc["spec"]
    assert {"name": "admission", "port": 443, "targetPort": "admission", "protocol": "TCP"} in svc["spec"]["ports"]
    deploy = by(objs, "Deployment", "fm-fleetmedic-decide")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert {"name": "admission", "containerPort": 8443} in container["ports"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "admission-tls")
    volume = next(v for v in deploy["spec"]["template"]["spec"]["volumes"] if v["name"] == "admission-tls")
    assert volume["secret"]["secretName"] == "fm-fleetmedic-admission" and mount["readOnly"]
    # the config the worker reads serves HTTPS on that port with the mounted files
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "fm-fleetmedic-config"]
    settings = parse_config(cm["data"]["fleetmedic.yaml"], env={})
    a = settings.admission
    assert a.enabled and a.listen == "0.0.0.0:8443" and a.path == svc_ref["path"]
    assert a.cert_file == f"{mount['mountPath']}/tls.crt" and a.key_file == f"{mount['mountPath']}/tls.key"
    # the certificate names the Service and the caBundle the API server is given verifies it
    secret = by(objs, "Secret", "fm-fleetmedic-admission")["data"]
    assert secret["ca.crt"] == hook["clientConfig"]["caBundle"]
    (tmp_path / "ca.pem").write_bytes(base64.b64decode(secret["ca.crt"]))
    (tmp_path / "tls.pem").write_bytes(base64.b64decode(secret["tls.crt"]))
    verified = subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.pem"), "-verify_hostname",
                               "fm-fleetmedic-decide.ops.svc", str(tmp_path / "tls.pem")],
                              capture_output=True, text=True, timeout=30)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    # only the API server may connect to the webhook port
    policy = by(objs, "NetworkPolicy", "fm-fleetmedic-decide")
    webhook_rules = [r for r in policy["spec"]["ingress"] if {"port": "admission", "protocol": "TCP"} in r["ports"]]
    assert [r["from"] for r in webhook_rules] == [[{"ipBlock": {"cidr": "10.96.0.1/32"}},
                                                   {"ipBlock": {"cidr": "172.18.0.2/32"}}]]


def test_off_by_default_and_a_given_secret_needs_its_ca() -> None:
    objs = render("ops")
    assert not [o for o in objs if o["kind"] == "ValidatingWebhookConfiguration"]
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "fm-fleetmedic-config"]
    assert not parse_config(cm["data"]["fleetmedic.yaml"], env={}).admission.enabled
    assert "caBundle" in render_error("decide.admission.enabled=true", "decide.admission.existingSecret=mine")
    given = render("ops", "decide.admission.enabled=true", "decide.admission.existingSecret=mine",
                   "decide.admission.caBundle=Q0E=", "decide.admission.failurePolicy=Fail")
    assert not [o for o in given if o["kind"] == "Secret" and o["metadata"]["name"] == "fm-fleetmedic-admission"]
    hook = by(given, "ValidatingWebhookConfiguration", "fm-fleetmedic-admission")["webhooks"][0]
    assert hook["clientConfig"]["caBundle"] == "Q0E=" and hook["failurePolicy"] == "Fail"
    deploy = by(given, "Deployment", "fm-fleetmedic-decide")
    volume = next(v for v in deploy["spec"]["template"]["spec"]["volumes"] if v["name"] == "admission-tls")
    assert volume["secret"]["secretName"] == "mine"
