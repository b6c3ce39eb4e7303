"""``fleetmedic dev build``: put the Kafka jars and Kubernetes binaries into the cache, once.

- Kafka: ``mvn`` copy-dependencies of ``kafka-pom.xml`` (kafka_2.13 + the reload4j backend) from
  Maven Central into ``<cache>/kafka-<v>/libs`` (Maven's own repository: ``<cache>/m2``).
- Kubernetes: ``build-k8s.sh`` builds kube-apiserver, kube-scheduler, kube-controller-manager,
  etcd and kwok with Go from the module proxy into ``<cache>/k8s-<v>-kwok-<v>/bin``.
- Helm: ``go install helm.sh/helm/v3/cmd/helm`` into ``<cache>/helm-<v>/bin`` (the deployment tests
  lint and render deploy/helm with it).
- Controllers: ``build-controllers.sh`` builds the real JobSet controller and Kubeflow
  training-operator into ``<cache>/controllers`` (the executor tests run them out of cluster).

Idempotent: what is already there is left alone. A lock file keeps two builds from racing.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fleetmedic.devenv import proc, settings

MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
K8S_BINARIES = ("kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl", "etcd", "kwok")
KWOK_STAGES = (
    "node-initialize",
    "node-heartbeat-with-lease",
    "pod-ready",
    "pod-complete",
    "pod-delete",
)


class BuildError(RuntimeError):
    pass


def kafka_ready(lay: settings.Layout | None = None) -> bool:
    lay = lay or settings.layout()
    return (lay.kafka_libs / ".complete").exists()


def k8s_ready(lay: settings.Layout | None = None) -> bool:
    lay = lay or settings.layout()
    bins = all(os.access(lay.k8s_bin / b, os.X_OK) for b in K8S_BINARIES)
    return bins and all((lay.kwok_stages / f"{s}.yaml").exists() for s in KWOK_STAGES)


@contextmanager
def _lock(cache: Path) -> Iterator[None]:
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".build.lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _tool(name: str, apt_package: str, extra_dirs: tuple[str, ...] = ()) -> str:
    """Find ``name`` on PATH (or in ``extra_dirs``); as root, apt-get install it if missing."""
    found = shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), *extra_dirs]))
    if found:
        return found
    if apt_package and os.geteuid() == 0 and shutil.which("apt-get"):
        print(f"  {name} not found: apt-get install {apt_package}", flush=True)
        subprocess.run(["apt-get", "update", "-q"], check=False, stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "-q", apt_package], check=False)
        found = shutil.which(name)
        if found:
            return found
    raise BuildError(f"{name} not found on PATH (install {apt_package or name})")


def fetch_kafka(lay: settings.Layout, log: Path) -> None:
    mvn = _tool("mvn", "maven")
    _tool("java", "openjdk-17-jre-headless")
    tmp = lay.kafka_dir / "libs.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    argv = [
        mvn,
        "-B",
        "-q",
        "-f",
        str(settings.HERE / "kafka-pom.xml"),
        f"-Dmaven.repo.local={lay.maven_repo}",
        f"-Dkafka.version={lay.kafka_version}",
        f"{MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies",
        f"-DoutputDirectory={tmp}",
        "-DincludeScope=runtime",
    ]
    _run(argv, log, timeout=900, cwd=lay.cache)
    if not any(tmp.glob(f"kafka_2.13-{lay.kafka_version}.jar")):
        raise BuildError(f"mvn finished but kafka_2.13-{lay.kafka_version}.jar is not in {tmp}")
    shutil.rmtree(lay.kafka_libs, ignore_errors=True)
    tmp.rename(lay.kafka_libs)
    (lay.kafka_libs / ".complete").write_text(lay.kafka_version + "\n")


def build_k8s(lay: settings.Layout, log: Path) -> None:
    go = _tool("go", "", extra_dirs=("/usr/local/go/bin",))
    _tool("python3", "python3")
    env = {
        "PATH": f"{Path(go).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLEETMEDIC_CACHE": str(lay.cache),
    }
    _run(["bash", str(settings.HERE / "build-k8s.sh")], log, timeout=3600, env=env, echo=("building",))


def build_helm(lay: settings.Layout, log: Path) -> None:
    go = _tool("go", "", extra_dirs=("/usr/local/go/bin",))
    env = {
        "PATH": f"{Path(go).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "GOBIN": str(lay.helm.parent), "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0",
    }
    lay.helm.parent.mkdir(parents=True, exist_ok=True)
    _run([go, "install", "-trimpath", "-ldflags", "-s -w", f"helm.sh/helm/v3/cmd/helm@v{lay.helm_version}"], log,
         timeout=1800, env=env, cwd=lay.cache)
    if not os.access(lay.helm, os.X_OK):
        raise BuildError(f"go install finished but {lay.helm} is missing")


def controllers_ready(lay: settings.Layout) -> bool:
    return all(os.access(b, os.X_OK) for b in (lay.jobset_manager, lay.training_operator, lay.kueue_manager)) \
        and lay.kueue_crds.is_dir()


def build_controllers(lay: settings.Layout, log: Path) -> None:
    go = _tool("go", "", extra_dirs=("/usr/local/go/bin",))
    env = {"PATH": f"{Path(go).parent}{os.pathsep}{os.environ.get('PATH', '')}", "FLEETMEDIC_CACHE": str(lay.cache)}
    _run(["bash", str(settings.HERE / "build-controllers.sh")], log, timeout=3600, env=env, echo=("building",))


def _run(
    argv: list[str],
    log: Path,
    *,
    timeout: float,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    echo: tuple[str, ...] = (),
) -> None:
    """Run a build step, all output to ``log``; echo lines starting with ``echo`` prefixes."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with log.open("w") as out:
        p = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=cwd,
            env={**os.environ, **(env or {})},
        )
        assert p.stdout is not None
        for line in p.stdout:
            out.write(line)
            out.flush()
            if line.startswith(echo) and echo:
                print(f"  {line.rstrip()} ({time.monotonic() - start:.0f}s)", flush=True)
            if time.monotonic() - start > timeout:
                p.kill()
        rc = p.wait()
    if rc != 0:
        raise BuildError(f"{' '.join(argv[:2])} failed (exit {rc})\n--- last lines of {log} ---\n{proc.tail(log)}")


def build(kafka: bool = True, kube: bool = True) -> int:
    """Fetch/build what is missing; print what was done and how long it took."""
    lay = settings.layout()
    logs = lay.cache / "logs"
    if kafka and not kube and kafka_ready(lay):  # `dev up --only kafka` need not wait for a long kube build's lock
        print(f"Kafka {lay.kafka_version} jars: present in {lay.kafka_libs}")
        return 0
    with _lock(lay.cache):
        if kafka:
            if kafka_ready(lay):
                print(f"Kafka {lay.kafka_version} jars: present in {lay.kafka_libs}")
            else:
                print(f"Kafka {lay.kafka_version} jars: fetching from Maven Central ...", flush=True)
                t = time.monotonic()
                fetch_kafka(lay, logs / "kafka-fetch.log")
                took = time.monotonic() - t
                print(f"Kafka {lay.kafka_version} jars: fetched in {took:.0f}s -> {lay.kafka_libs}")
        if kube:
            if k8s_ready(lay):
                print(f"Kubernetes {lay.k8s_version} + kwok {lay.kwok_version}: present in {lay.k8s_bin}")
            else:
                print(
                    f"Kubernetes {lay.k8s_version} + kwok {lay.kwok_version}: building with Go "
                    f"(about 10-15 min on 2 cores the first time; log: {logs / 'build-k8s.log'}) ...",
                    flush=True,
                )
                t = time.monotonic()
                build_k8s(lay, logs / "build-k8s.log")
                print(f"Kubernetes binaries: built in {time.monotonic() - t:.0f}s -> {lay.k8s_bin}")
            if os.access(lay.helm, os.X_OK):
                print(f"Helm {lay.helm_version}: present in {lay.helm.parent}")
            else:
                print(f"Helm {lay.helm_version}: building with Go (a few minutes the first time) ...", flush=True)
                t = time.monotonic()
                build_helm(lay, logs / "build-helm.log")
                print(f"Helm: built in {time.monotonic() - t:.0f}s -> {lay.helm}")
            if controllers_ready(lay):
                print(f"JobSet {lay.jobset_version} + training-operator {lay.training_operator_version} + Kueue "
                      f"{lay.kueue_version} controllers: "
                      f"present in {lay.jobset_manager.parent}")
            else:
                print("JobSet, training-operator and Kueue controllers: building with Go (about 25 min on 2 cores the "
                      f"first time; log: {logs / 'build-controllers.log'}) ...", flush=True)
                t = time.monotonic()
                build_controllers(lay, logs / "build-controllers.log")
                print(f"controllers: built in {time.monotonic() - t:.0f}s -> {lay.jobset_manager.parent}")
    return 0
