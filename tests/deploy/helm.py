"""Rendering the Helm chart in tests: ``render(values, namespace)`` -> the list of objects."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetmedic.devenv import settings

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "fleetmedic"
SIGNING_KEY = "c2lnbmluZy1rZXktZm9yLXRlc3RzLW9ubHktMzItYnl0ZXMtbG9uZy4u"  # base64, 42 bytes


def helm_binary() -> str:
    helm = settings.layout().helm
    if not os.access(helm, os.X_OK):
        why = f"{helm} is missing: `fleetmedic dev build` builds it"
        if settings.services_required():
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    return str(helm)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HELM_CACHE_HOME": "/tmp/fleetmedic-helm-cache",
                               "HELM_CONFIG_HOME": "/tmp/fleetmedic-helm-config"})
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def render(namespace: str = "fleetmedic-system", *sets: str, release: str = "fm") -> list[dict[str, Any]]:
    args = ["template", release, str(CHART), "--namespace", namespace, "--set", f"signing.key={SIGNING_KEY}"]
    for s in sets:
        args += ["--set", s]
    out = helm(*args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]
