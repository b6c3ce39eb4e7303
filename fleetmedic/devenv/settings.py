"""Where things live: pinned versions, the cache, the run directory and the env vars we read."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: Environment variables (documented in docs/development.md).
ENV_CACHE = "FLEETMEDIC_CACHE"  # build outputs and jars; default ~/.cache/fleetmedic
ENV_RUN_DIR = "FLEETMEDIC_RUN_DIR"  # data, logs, pidfiles of running services; default /tmp/fleetmedic-dev
ENV_KAFKA_BOOTSTRAP = "FLEETMEDIC_KAFKA_BOOTSTRAP"  # use this broker instead of starting one
ENV_KAFKA_CLUSTER = "FLEETMEDIC_KAFKA_CLUSTER"  # dir of a running 3-broker sasl_ssl `dev up` cluster the tests use
ENV_KUBECONFIG = "FLEETMEDIC_KUBECONFIG"  # use this cluster instead of starting one
ENV_REQUIRE = "FLEETMEDIC_REQUIRE_SERVICES"  # "1": a service that cannot start fails the run


def read_versions(path: Path = HERE / "versions.env") -> dict[str, str]:
    """Parse the ``KEY=value`` lines of versions.env (the one place versions are pinned)."""
    out: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip().strip("\"'")
    return out


@dataclass(frozen=True)
class Layout:
    """Paths derived from the cache root and the pinned versions."""

    cache: Path
    k8s_version: str
    kwok_version: str
    kafka_version: str
    helm_version: str = "3.22.0"
    jobset_version: str = "0.12.0"
    training_operator_version: str = "1.9.0"
    kueue_version: str = "0.17.0"

    @property
    def k8s_dir(self) -> Path:
        return self.cache / f"k8s-{self.k8s_version}-kwok-{self.kwok_version}"

    @property
    def k8s_bin(self) -> Path:
        return self.k8s_dir / "bin"

    @property
    def kwok_stages(self) -> Path:
        return self.k8s_dir / "kwok-stages"

    @property
    def kafka_dir(self) -> Path:
        return self.cache / f"kafka-{self.kafka_version}"

    @property
    def kafka_libs(self) -> Path:
        return self.kafka_dir / "libs"

    @property
    def helm(self) -> Path:
        """The helm binary that renders and lints deploy/helm (built from the Go module proxy)."""
        return self.cache / f"helm-{self.helm_version}" / "bin" / "helm"

    @property
    def jobset_manager(self) -> Path:
        """The real JobSet controller (sigs.k8s.io/jobset), run out of cluster by the executor tests."""
        return self.cache / "controllers" / f"jobset-manager-v{self.jobset_version}"

    @property
    def training_operator(self) -> Path:
        """The real Kubeflow training-operator (PyTorchJob), run out of cluster by the executor tests."""
        return self.cache / "controllers" / f"training-operator-v{self.training_operator_version}"

    @property
    def kueue_manager(self) -> Path:
        """The real Kueue controller manager (sigs.k8s.io/kueue), run out of cluster by the executor tests."""
        return self.cache / "controllers" / f"kueue-manager-v{self.kueue_version}"

    @property
    def kueue_crds(self) -> Path:
        """Kueue's own CRDs, from the module source the manager was built from."""
        return self.cache / "build" / f"kueue-manager-v{self.kueue_version}" / "config" / "components" / "crd" / "bases"

    @property
    def maven_repo(self) -> Path:
        return self.cache / "m2"


def layout() -> Layout:
    versions = read_versions()
    cache = Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "fleetmedic")
    return Layout(
        cache=cache,
        k8s_version=versions["K8S_VERSION"],
        kwok_version=versions["KWOK_VERSION"],
        kafka_version=versions["KAFKA_VERSION"],
        helm_version=versions["HELM_VERSION"],
        jobset_version=versions["JOBSET_VERSION"],
        training_operator_version=versions["TRAINING_OPERATOR_VERSION"],
        kueue_version=versions["KUEUE_VERSION"],
    )


def run_dir() -> Path:
    """Root for the data, logs and pidfiles of services started by ``fleetmedic dev up``."""
    return Path(os.environ.get(ENV_RUN_DIR) or "/tmp/fleetmedic-dev")


def services_required() -> bool:
    """True in CI: a service that fails to start must fail the run, never skip it."""
    ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    return ci or os.environ.get(ENV_REQUIRE, "") == "1"
