"""A Kubernetes control plane on loopback: etcd, kube-apiserver, kube-scheduler,
kube-controller-manager and kwok (fake nodes), from the binaries ``fleetmedic dev build`` made.

- The apiserver serves TLS with a self-signed certificate it generates into ``<dir>/pki``; the
  kubeconfig trusts that certificate and authenticates with a static admin token
  (``system:masters``). Authorization is RBAC; service-account tokens are signed with an RSA key
  made by ``openssl``.
- The controller-manager and scheduler use the same kubeconfig, so Jobs create pods, the scheduler
  binds them, the disruption controller computes PodDisruptionBudget status (evictions honour
  PDBs) and every namespace gets its ``default`` ServiceAccount.
- kwok manages only nodes annotated ``kwok.x-k8s.io/node=fake`` (see ``fleet``), with the stages
  copied from kwok's ``fast`` set. One change: pods owned by a Job complete only when annotated
  ``fleetmedic.io/kwok-complete: "true"``; otherwise they stay Running like a training job.

Ready means: apiserver ``/readyz`` ok, scheduler, controller-manager and kwok ``/healthz`` ok,
and the ``default`` ServiceAccount exists in namespace ``default`` (the controllers run).
"""

from __future__ import annotations

import functools
import json
import secrets
import shutil
import ssl
import subprocess
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from fleetmedic.devenv import proc, settings
from fleetmedic.devenv.build import KWOK_STAGES
from fleetmedic.k8s_keys import ANNOTATION_KWOK_COMPLETE

KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
SERVICE_CIDR = "10.0.0.0/24"
POD_CIDR = "10.64.0.0/12"


@dataclass(frozen=True)
class Ports:
    etcd: int = 12379
    etcd_peer: int = 12380
    apiserver: int = 16443
    scheduler: int = 16459
    controller_manager: int = 16457
    kwok: int = 16447

    @classmethod
    def free(cls) -> Ports:
        """Fresh free ports (the test fixtures use these so they never collide with `dev up`)."""
        return cls(*proc.free_ports(6))


@dataclass(frozen=True)
class Kube:
    """A control plane rooted at ``dir`` (data, certs, kubeconfig, logs and pidfiles)."""

    dir: Path
    ports: Ports = Ports()
    # The node Lease duration kwok is given (``--node-lease-duration-seconds``; it renews each about
    # every quarter of it), with the controller-manager's ``--node-monitor-grace-period`` 60 s
    # longer, so nodes stay Ready between renewals. The default is a kubelet's (40 s). 0: kwok's
    # default, which keeps no Leases; its heartbeat stage then posts node status only every 10-20
    # min, so the node controller marks every node NotReady (and taints it NoExecute, which evicts
    # its pods after 300 s) after 50 s and kwok marks it Ready again: nodes flap, with a write load
    # that grows with the fleet (docs/scale.md). bench/bench_executor_scale.py uses 600 s.
    node_lease_s: int = 40

    @classmethod
    def load(cls, dir: Path) -> Kube:
        """The instance in ``dir`` with the ports it was started with (defaults if none)."""
        try:
            ports = json.loads((dir / "instance.json").read_text())["ports"]
        except (OSError, ValueError, KeyError):
            return cls(dir)
        return cls(dir, Ports(**ports))

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    def log(self, name: str) -> Path:
        return self.dir / f"{name}.log"

    def _proc(self, name: str, argv: list[str]) -> proc.Proc:
        return proc.Proc(name, argv, self.log(name), self.dir / f"{name}.pid", cwd=self.dir)

    def _procs(self) -> list[proc.Proc]:
        """All components, in start order, with their full command lines."""
        b = settings.layout().k8s_bin
        p = self.ports
        d = self.dir
        kc = str(self.kubeconfig)
        return [
            self._proc(
                "etcd",
                [
                    str(b / "etcd"),
                    "--name=fleetmedic",
                    f"--data-dir={d / 'etcd'}",
                    f"--listen-client-urls=http://127.0.0.1:{p.etcd}",
                    f"--advertise-client-urls=http://127.0.0.1:{p.etcd}",
                    f"--listen-peer-urls=http://127.0.0.1:{p.etcd_peer}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{p.etcd_peer}",
                    f"--initial-cluster=fleetmedic=http://127.0.0.1:{p.etcd_peer}",
                    "--unsafe-no-fsync",
                    "--log-level=warn",
                ],
            ),
            self._proc(
                "kube-apiserver",
                [
                    str(b / "kube-apiserver"),
                    f"--etcd-servers=http://127.0.0.1:{p.etcd}",
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    f"--secure-port={p.apiserver}",
                    f"--cert-dir={d / 'pki'}",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    "--allow-privileged=true",
                    "--authorization-mode=RBAC",
                    f"--token-auth-file={d / 'tokens.csv'}",
                    f"--service-account-issuer={self.server}",
                    f"--service-account-key-file={d / 'sa.key'}",
                    f"--service-account-signing-key-file={d / 'sa.key'}",
                    "--profiling=false",
                    "--event-ttl=1h",
                    # compact etcd every 10 s (default 5 min) and serve pod watches from etcd, so a
                    # watch from a compacted resourceVersion meets 410 Gone soon after start, as on a
                    # long-running cluster (the watch cache of a young one still answers it)
                    "--etcd-compaction-interval=10s",
                    "--watch-cache-sizes=pods#0",
                    "--v=1",
                ],
            ),
            self._proc(
                "kube-controller-manager",
                [
                    str(b / "kube-controller-manager"),
                    f"--kubeconfig={kc}",
                    "--kube-api-qps=500",
                    "--kube-api-burst=1000",
                    f"--authentication-kubeconfig={kc}",
                    f"--authorization-kubeconfig={kc}",
                    "--leader-elect=false",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={p.controller_manager}",
                    f"--cert-dir={d / 'kcm-certs'}",
                    f"--service-account-private-key-file={d / 'sa.key'}",
                    f"--root-ca-file={d / 'pki' / 'apiserver.crt'}",
                    "--profiling=false",
                    *self._grace_period(),
                    "--v=1",
                ],
            ),
            self._proc(
                "kube-scheduler",
                [
                    str(b / "kube-scheduler"),
                    f"--kubeconfig={kc}",
                    "--kube-api-qps=500",
                    "--kube-api-burst=1000",
                    f"--authentication-kubeconfig={kc}",
                    f"--authorization-kubeconfig={kc}",
                    "--leader-elect=false",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={p.scheduler}",
                    f"--cert-dir={d / 'scheduler-certs'}",
                    "--profiling=false",
                    "--v=1",
                ],
            ),
            self._proc(
                "kwok",
                [
                    str(b / "kwok"),
                    f"--kubeconfig={kc}",
                    f"--config={d / 'kwok-stages.yaml'}",
                    "--manage-all-nodes=false",
                    f"--manage-nodes-with-annotation-selector={'='.join(KWOK_ANNOTATION)}",
                    "--manage-nodes-with-label-selector=",
                    "--manage-single-node=",
                    f"--cidr={POD_CIDR}",
                    "--node-ip=10.0.0.1",
                    f"--server-address=127.0.0.1:{p.kwok}",
                    *([f"--node-lease-duration-seconds={self.node_lease_s}"] if self.node_lease_s else []),
                ],
            ),
        ]

    def _grace_period(self) -> list[str]:
        """``--node-monitor-grace-period`` above a lengthened lease (default 50 s otherwise)."""
        return [f"--node-monitor-grace-period={self.node_lease_s + 60}s"] if self.node_lease_s else []

    def running(self) -> list[str]:
        return [p.name for p in self._procs() if p.pid() is not None]

    def start(self, timeout: float = 120.0) -> dict[str, float]:
        """Start every component; return seconds each took to become ready (cumulative)."""
        lay = settings.layout()
        missing = [str(lay.k8s_bin / b) for b in ("etcd", "kube-apiserver", "kwok") if not (lay.k8s_bin / b).exists()]
        if missing:
            raise proc.ServiceError(f"missing {', '.join(missing)}: run `fleetmedic dev build` first")
        taken = [port for port in asdict(self.ports).values() if proc.port_open(port)]
        if taken:
            raise proc.ServiceError(f"ports {taken} on 127.0.0.1 are taken; is a control plane running?")
        self.dir.mkdir(parents=True, exist_ok=True)
        self._write_secrets()
        (self.dir / "instance.json").write_text(
            json.dumps({"server": self.server, "kubeconfig": str(self.kubeconfig), "ports": asdict(self.ports)})
        )
        (self.dir / "kwok-stages.yaml").write_text(kwok_stages(lay.kwok_stages))
        etcd, apiserver, kcm, scheduler, kwok = procs = self._procs()
        t0 = time.monotonic()
        times: dict[str, float] = {}
        try:
            etcd.start()
            proc.wait_until(
                lambda: b'"health":"true"' in _get(f"http://127.0.0.1:{self.ports.etcd}/health"),
                timeout=30,
                what="etcd /health",
                log=etcd.log,
                procs=[etcd],
            )
            times["etcd"] = time.monotonic() - t0
            apiserver.start()
            proc.wait_until(
                lambda: _get(f"{self.server}/readyz", token=self._token()) == b"ok",
                timeout=timeout,
                what="kube-apiserver /readyz",
                log=apiserver.log,
                procs=[etcd, apiserver],
            )
            times["kube-apiserver"] = time.monotonic() - t0
            self._write_kubeconfig()
            for p in (kcm, scheduler, kwok):
                p.start()
            for p, url in (
                (kcm, f"https://127.0.0.1:{self.ports.controller_manager}/healthz"),
                (scheduler, f"https://127.0.0.1:{self.ports.scheduler}/healthz"),
                (kwok, f"http://127.0.0.1:{self.ports.kwok}/healthz"),
            ):
                proc.wait_until(
                    functools.partial(_healthy, url),
                    timeout=timeout,
                    what=f"{p.name} /healthz",
                    log=p.log,
                    procs=procs,
                )
                times[p.name] = time.monotonic() - t0
            proc.wait_until(
                lambda: (
                    _get(
                        f"{self.server}/api/v1/namespaces/default/serviceaccounts/default",
                        token=self._token(),
                    )
                    != b""
                ),
                timeout=timeout,
                what="the default ServiceAccount (controller-manager at work)",
                log=kcm.log,
                procs=procs,
            )
            times["controllers"] = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise
        return times

    def stop(self) -> list[str]:
        """Stop all components (reverse start order); return the names of those that ran."""
        return [p.name for p in reversed(self._procs()) if p.stop(timeout=10)]

    def wipe(self) -> None:
        if not self.running():
            shutil.rmtree(self.dir, ignore_errors=True)

    def _token(self) -> str:
        return (self.dir / "tokens.csv").read_text().split(",", 1)[0]

    def _write_secrets(self) -> None:
        tokens = self.dir / "tokens.csv"
        if not tokens.exists():
            tokens.write_text(f'{secrets.token_hex(24)},admin,admin,"system:masters"\n')
            tokens.chmod(0o600)
        key = self.dir / "sa.key"
        if not key.exists():
            openssl = shutil.which("openssl")
            if openssl is None:
                raise proc.ServiceError("openssl not found (needed for the service-account signing key)")
            subprocess.run([openssl, "genrsa", "-out", str(key), "2048"], check=True, capture_output=True, timeout=60)

    def _write_kubeconfig(self) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "fleetmedic",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority": str(self.dir / "pki" / "apiserver.crt"),
                    },
                }
            ],
            "users": [{"name": "admin", "user": {"token": self._token()}}],
            "contexts": [{"name": "fleetmedic", "context": {"cluster": "fleetmedic", "user": "admin"}}],
            "current-context": "fleetmedic",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
        self.kubeconfig.chmod(0o600)


def kwok_stages(stage_dir: Path, names: tuple[str, ...] = KWOK_STAGES) -> str:
    """kwok's fast stages as one multi-document config; Job pods complete only when annotated."""
    docs = []
    for name in names:
        path = stage_dir / f"{name}.yaml"
        if not path.exists():
            raise proc.ServiceError(f"kwok stage file {path} missing: run `fleetmedic dev build`")
        stage = yaml.safe_load(path.read_text())
        if name == "pod-complete":
            stage["spec"]["selector"]["matchExpressions"].append(
                {"key": f'.metadata.annotations["{ANNOTATION_KWOK_COMPLETE}"]', "operator": "In", "values": ["true"]}
            )
        docs.append(stage)
    return yaml.safe_dump_all(docs, sort_keys=False)


_INSECURE = ssl.create_default_context()
_INSECURE.check_hostname = False
_INSECURE.verify_mode = ssl.CERT_NONE


def _healthy(url: str) -> bool:
    return _get(url) == b"ok"


def _get(url: str, token: str | None = None) -> bytes:
    """GET a loopback health endpoint; b"" on any HTTP error status."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=3, context=_INSECURE if url.startswith("https") else None) as r:
            body: bytes = r.read()
            return body
    except urllib.error.HTTPError:
        return b""


def reachable(kubeconfig: Path, timeout: float = 10.0) -> bool:
    """True if the cluster in ``kubeconfig`` answers /readyz."""
    from fleetmedic.devenv.kclient import connect, get_raw

    try:
        with connect(kubeconfig) as api:
            return get_raw(api, "/readyz", timeout) == (200, b"ok")
    except Exception:
        return False
