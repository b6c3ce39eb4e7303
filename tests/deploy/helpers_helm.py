"""Rendering the Helm chart in tests: ``render(values, namespace)`` -> the list of objects."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from fleetmedic.devenv import settings
from tests.conftest import require_tool

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "fleetmedic"
SIGNING_KEY = "c2lnbmluZy1rZXktZm9yLXRlc3RzLW9ubHktMzItYnl0ZXMtbG9uZy4u"  # base64, 42 bytes
OPERATOR_KEY = "b3BlcmF0b3Ita2V5LWZvci10ZXN0cy1vbmx5LTMyLWJ5dGVzLWxvbmcu"  # base64, 42 bytes: another role's key
#: what every render needs besides: the command key, an operator key, where Kafka and the API server are
REQUIRED = (f"signing.key={SIGNING_KEY}", f"signing.operator.keys.ops-1={OPERATOR_KEY}",
            "networkPolicy.kafkaCIDRs={10.20.0.0/24}", "networkPolicy.apiServerCIDRs={10.96.0.1/32,172.18.0.2/32}",
            "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring")


def helm_binary() -> str:
    return require_tool(settings.layout().helm, why="`fleetmedic dev build` builds it")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HELM_CACHE_HOME": "/tmp/fleetmedic-helm-cache",
                               "HELM_CONFIG_HOME": "/tmp/fleetmedic-helm-config"})
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def template_args(namespace: str = "fleetmedic-system", *sets: str, release: str = "fm",
                  required: tuple[str, ...] = REQUIRED) -> list[str]:
    args = ["template", release, str(CHART), "--namespace", namespace]
    for s in (*required, *sets):
        args += ["--set", s]
    return args


def render(namespace: str = "fleetmedic-system", *sets: str, release: str = "fm",
           required: tuple[str, ...] = REQUIRED) -> list[dict[str, Any]]:
    out = helm(*template_args(namespace, *sets, release=release, required=required)).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def render_error(*sets: str, required: tuple[str, ...] = REQUIRED) -> str:
    """helm's error message for a render that must fail."""
    proc = helm(*template_args("fleetmedic-system", *sets, required=required), check=False)
    assert proc.returncode != 0, f"rendered although it should not have: {sets}"
    return proc.stderr


#: every component and every monitoring object on (what the server-side apply test renders)
EVERYTHING = ("connectors.prometheus.enabled=true", "connectors.kafka.enabled=true", "connectors.logs.enabled=true",
              "connectors.infiniband.enabled=true", "connectors.kmsg.enabled=true",
              "connectors.remoteWrite.enabled=true", "connectors.remoteWrite.auth.existingSecret=remote-write-auth",
              "connectors.prometheus.egress[0].to[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring",
              "connectors.prometheus.egress[0].ports[0].port=9400",
              "connectors.remoteWrite.ingressFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring",
              "monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true",
              "monitoring.dashboard.enabled=true", "decide.admission.enabled=true")
