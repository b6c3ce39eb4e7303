"""Shared fixtures: the real Kafka broker and Kubernetes control plane (docs/development.md).

- ``kafka_bootstrap`` (session): ``host:port`` of a broker. Uses ``$FLEETMEDIC_KAFKA_BOOTSTRAP``
  when set, otherwise starts one on free loopback ports and stops it at the end of the session.
- ``kafka_secure_cluster`` (session): a :class:`~fleetmedic.devenv.kafka_cluster.KafkaCluster` of
  three brokers with SASL_SSL (SCRAM-SHA-512 over TLS), replication factor 3, ``min.insync.replicas``
  2. Uses the ``dev up --only kafka --brokers 3 --security sasl_ssl`` cluster in
  ``$FLEETMEDIC_KAFKA_CLUSTER`` when set, otherwise starts one (once) under the session's directory.
  Tests may kill, stall and restart its brokers; they leave it whole (every broker up, in sync).
- ``kube_config`` (session): path of a kubeconfig. Uses ``$FLEETMEDIC_KUBECONFIG`` when set,
  otherwise starts etcd, kube-apiserver, scheduler, controller-manager and kwok likewise.
- ``kube_api`` (session): a ``kubernetes.client.ApiClient`` for that cluster.
- ``namespace``: a fresh namespace per test (deleted afterwards).
- ``make_fleet``: ``make_fleet(n)`` creates n kwok GPU nodes with a unique fleet name (deleted
  afterwards); see ``fleetmedic.devenv.fleet`` for the labels.
- ``crds``: the PyTorchJob and JobSet CRDs from tests/data/crds, installed once.

And the one way a test finds a tool or service it needs: :func:`require_tool` (a binary on ``PATH``
or at a path) and :func:`unavailable` (anything else), which fail under CI and skip elsewhere.

Tests using these get the ``kafka`` / ``kube`` markers automatically (``-m "not kube"`` works), and
so do tests using a fixture that needs a tool (:data:`TOOL_FIXTURES`); a test calling a tool
directly carries its marker (``helm``, ``promtool``, ``chromium``, ``node``, ``buildah``, listed in
pyproject.toml), so ``-m "not helm and not chromium"`` runs what a machine without them can.
When a service cannot start, its tests fail with the service's log tail if ``CI=true`` or
``FLEETMEDIC_REQUIRE_SERVICES=1``, and are skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from fleetmedic.devenv import proc, settings

KAFKA_FIXTURES = {"kafka_bootstrap", "kafka_secure_cluster"}
KUBE_FIXTURES = {"kube_config", "kube_api", "namespace", "make_fleet", "crds"}
#: fixtures that need a tool, and the tool's marker
TOOL_FIXTURES = {"prometheus": "promtool", "loaded_prometheus": "promtool", "sim_dom": "chromium"}
CRD_DIR = Path(__file__).parent / "data" / "crds"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the soak runs only where asked for by name (-m soak): CI's default run keeps its time
    if "soak" not in (config.option.markexpr or ""):
        soak = [item for item in items if item.get_closest_marker("soak")]
        if soak:
            config.hook.pytest_deselected(items=soak)
            items[:] = [item for item in items if not item.get_closest_marker("soak")]
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & KAFKA_FIXTURES:
            item.add_marker(pytest.mark.kafka)
        if names & KUBE_FIXTURES:
            item.add_marker(pytest.mark.kube)
        for marker in sorted({TOOL_FIXTURES[n] for n in names & TOOL_FIXTURES.keys()}):
            item.add_marker(marker)


def unavailable(what: str, detail: str) -> NoReturn:
    """A service or tool a test needs is missing: fail under CI (``CI=true``) or
    ``FLEETMEDIC_REQUIRE_SERVICES=1``, skip otherwise, with the reason (and the log tail in ``detail``)."""
    if settings.services_required():
        pytest.fail(f"{what} is required here but unavailable:\n{detail}", pytrace=False)
    pytest.skip(f"{what} unavailable (set {settings.ENV_REQUIRE}=1 to fail instead): {detail}")


def require_tool(*candidates: str | Path, why: str) -> str:
    """The first of ``candidates`` found: a name is looked up on ``PATH``, a path must be an
    executable file. When none is, :func:`unavailable` (``why`` says what provides it)."""
    for c in map(str, candidates):
        if os.sep in c:
            if Path(c).is_file() and os.access(c, os.X_OK):
                return c
        elif found := shutil.which(c):
            return found
    unavailable(" or ".join(str(c) for c in candidates), f"not found ({why})")


@pytest.fixture(scope="session")
def services_dir() -> Iterator[Path]:
    """Run directory for the services this session starts (``fleetmedic dev down`` finds it)."""
    d = settings.run_dir() / f"pytest-{os.getpid()}"
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def kafka_bootstrap(services_dir: Path) -> Iterator[str]:
    from fleetmedic.devenv.kafka import Kafka, reachable

    given = os.environ.get(settings.ENV_KAFKA_BOOTSTRAP)
    if given:
        if not reachable(given, timeout=20):
            unavailable("Kafka", f"{settings.ENV_KAFKA_BOOTSTRAP}={given} does not answer")
        yield given
        return
    port, controller_port = proc.free_ports(2)
    broker = Kafka(services_dir / "kafka", port=port, controller_port=controller_port)
    try:
        broker.start(timeout=120)
    except (proc.ServiceError, OSError) as exc:
        broker.stop()
        unavailable("Kafka", str(exc))
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_secure_cluster(services_dir: Path) -> Iterator[Any]:
    from fleetmedic.devenv.kafka_cluster import KafkaCluster

    what = "a three-broker SASL_SSL Kafka cluster"
    given = os.environ.get(settings.ENV_KAFKA_CLUSTER)
    if given:
        found = KafkaCluster.load(Path(given))
        if found is None or (found.brokers, found.security) != (3, "sasl_ssl") or len(found.running()) != 3:
            unavailable(what, f"{settings.ENV_KAFKA_CLUSTER}={given} holds no running 3-broker sasl_ssl cluster "
                               "(`fleetmedic dev up --only kafka --brokers 3 --security sasl_ssl`)")
        yield found
        return
    failures: list[str] = []
    for attempt in range(2):  # free ports are picked, then bound: another process may take one in between
        cluster = KafkaCluster.free(services_dir / ("kafka-secure" if attempt == 0 else f"kafka-secure-{attempt}"),
                                    3, "sasl_ssl")
        try:
            cluster.start(timeout=240)
            break
        except (proc.ServiceError, OSError) as exc:
            cluster.stop()
            failures.append(f"try {attempt + 1}: {exc}")
    else:
        unavailable(what, "\n".join(failures))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kube_config(services_dir: Path) -> Iterator[Path]:
    from fleetmedic.devenv.kube import Kube, Ports, reachable

    given = os.environ.get(settings.ENV_KUBECONFIG)
    if given:
        if not reachable(Path(given), timeout=20):
            unavailable("Kubernetes", f"{settings.ENV_KUBECONFIG}={given}: /readyz does not answer ok")
        yield Path(given)
        return
    # free ports are picked, released, then bound by the components: on a busy machine another
    # connection can take one in between (etcd then exits at once); a fresh set of ports, a fresh
    # directory and up to three tries, each failure's log tail kept for the report
    failures: list[str] = []
    for attempt in range(3):
        if attempt:
            time.sleep(10.0 * attempt)  # whatever stopped the last try (a short busy spell) may pass
        cluster = Kube(services_dir / ("kube" if attempt == 0 else f"kube-{attempt}"), Ports.free())
        try:
            cluster.start(timeout=180)
            break
        except (proc.ServiceError, OSError) as exc:
            cluster.stop()
            failures.append(f"try {attempt + 1}: {exc}")
    else:
        unavailable("Kubernetes", "\n".join(failures))
    try:
        yield cluster.kubeconfig
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kube_api(kube_config: Path) -> Iterator[Any]:
    from fleetmedic.devenv.kclient import connect

    with connect(kube_config) as api:
        yield api


@pytest.fixture
def namespace(kube_api: Any) -> Iterator[str]:
    """A fresh namespace with its default ServiceAccount in place (pods can be created)."""
    from kubernetes import client

    core = client.CoreV1Api(kube_api)
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    deadline = time.monotonic() + 30
    while not core.list_namespaced_service_account(name, field_selector="metadata.name=default").items:
        if time.monotonic() > deadline:
            pytest.fail(f"namespace {name}: no default ServiceAccount after 30s (controller-manager?)")
        time.sleep(0.1)
    yield name
    # kwok nodes may be gone before the namespace (fixture teardown order): force-delete pods so
    # nothing waits for a kubelet, then drop the namespace without waiting.
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    core.delete_namespace(name)


@pytest.fixture
def make_fleet(kube_api: Any) -> Iterator[Callable[..., Any]]:
    """``make_fleet(n, **Topology fields)`` -> Fleet of n Ready kwok GPU nodes, unique names."""
    from fleetmedic.devenv import fleet

    made: list[fleet.Fleet] = []

    def make(count: int, **topology: Any) -> fleet.Fleet:
        f = fleet.create_fleet(kube_api, count, name=fleet.new_fleet_name("t"), topo=fleet.Topology(**topology))
        made.append(f)
        return f

    yield make
    for f in made:
        fleet.delete_fleet(kube_api, f)


@pytest.fixture(scope="session")
def crds(kube_api: Any) -> list[str]:
    """Install the CRDs committed under tests/data/crds (PyTorchJob, JobSet); return their names."""
    from fleetmedic.devenv.fleet import install_crds

    return install_crds(kube_api, sorted(CRD_DIR.glob("*.yaml")))
