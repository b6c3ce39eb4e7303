"""A production-shaped Kafka cluster on loopback: N KRaft nodes, TLS and SASL, one JVM per node.

Each node runs broker and controller in one JVM (KRaft *combined* mode): three JVMs rather than
six on a small machine. The three controllers form the quorum (static voters), so losing any one
node loses one broker and one voter; the quorum, and with replication factor 3 and
``min.insync.replicas`` 2 every partition, stays writable. (Production runs the controllers apart;
nothing a client sees differs.)

Security (``--security``):

- ``plaintext``: no TLS, no authentication.
- ``ssl``: TLS on every listener with client certificates required (mutual TLS); the client's
  principal is the CN of its certificate (``User:fleetmedic``).
- ``sasl_ssl``: clients authenticate with SASL over TLS: SCRAM-SHA-512 (users made at format time,
  ``kafka-storage format --add-scram``) or PLAIN. Brokers talk to each other over the same listener
  as the SCRAM user ``admin``.

In both secure modes the controller listener speaks mutual TLS, and the brokers authorize every
request (KRaft's ``StandardAuthorizer``, no ACL means no access): the brokers, ``admin`` and the
client user ``fleetmedic`` are super users; every other principal gets what ACLs grant. With
``sasl_ssl`` one SCRAM user per component of :mod:`fleetmedic.acls` is made too (``fleetmedic-detect``,
``fleetmedic-executor``, ...: :meth:`KafkaCluster.component_section` connects as one), and
:meth:`KafkaCluster.kafka_acls` runs ``kafka-acls`` commands as ``admin``. A CA and one
certificate per node (SAN ``localhost`` and ``127.0.0.1``) are made at the first start
(:mod:`fleetmedic.devenv.tls`); passwords are random, in ``secrets/`` (mode 0600). ``client.yaml``
holds the client side as a fleetmedic config: the ``kafka`` section (bootstrap servers, protocol,
mechanism, user, password file, CA file, client certificate) and, with several brokers, the
``topics`` replication.

Layout under ``dir``: ``cluster.json`` (shape and ports), ``client.yaml``, ``tls/``, ``secrets/``,
and ``broker-<id>/`` per node (``server.properties``, ``data/``, ``kafka.log``, ``kafka.pid``).
Node ``i`` (1-based) listens on ``port_i`` for clients and other brokers and on
``controller_port_i`` for the quorum.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from fleetmedic.devenv import proc, tls
from fleetmedic.devenv.kafka import DEFAULT_PORT, LOG4J, java_argv, new_cluster_id, quiet_aiokafka

Security = Literal["plaintext", "ssl", "sasl_ssl"]
SECURITY: tuple[Security, ...] = ("plaintext", "ssl", "sasl_ssl")
CLIENT_USER = "fleetmedic"  # what client.yaml connects as
ADMIN_USER = "admin"  # the brokers' own SCRAM user (inter-broker), a super user
MECHANISM = "SCRAM-SHA-512"
_PROTOCOL = {"plaintext": "PLAINTEXT", "ssl": "SSL", "sasl_ssl": "SASL_SSL"}


def replication(brokers: int) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) for a cluster of ``brokers``: 3 and 2 from three on."""
    rf = min(3, brokers)
    return rf, max(1, min(2, rf - 1))


@dataclass(frozen=True)
class KafkaCluster:
    dir: Path
    ports: tuple[int, ...]  # client (and inter-broker) port of node 1, 2, ...
    controller_ports: tuple[int, ...]
    security: Security = "plaintext"
    heap: str = "384m"
    #: (name, value) pairs added to every node's server.properties (a later one wins)
    extra: tuple[tuple[str, str], ...] = ()
    #: secure modes: authorize requests by ACL (StandardAuthorizer; the users above are super users)
    authorizer: bool = True

    def __post_init__(self) -> None:
        if len(self.ports) != len(self.controller_ports) or not self.ports:
            raise ValueError("one client port and one controller port per node")
        if self.security not in SECURITY:
            raise ValueError(f"security must be one of {', '.join(SECURITY)}")

    # --- shape ------------------------------------------------------------------------------------

    @classmethod
    def on_ports(cls, dir: Path, brokers: int = 3, port: int = DEFAULT_PORT, security: Security = "plaintext",
                 **kw: Any) -> KafkaCluster:
        """Node i (0-based) on ``port + 2i`` (clients) and ``port + 2i + 1`` (controller)."""
        return cls(dir, tuple(port + 2 * i for i in range(brokers)),
                   tuple(port + 2 * i + 1 for i in range(brokers)), security, **kw)

    @classmethod
    def free(cls, dir: Path, brokers: int = 3, security: Security = "plaintext", **kw: Any) -> KafkaCluster:
        """On free loopback ports (the test fixtures)."""
        ports = proc.free_ports(2 * brokers)
        return cls(dir, tuple(ports[:brokers]), tuple(ports[brokers:]), security, **kw)

    @classmethod
    def load(cls, dir: Path) -> KafkaCluster | None:
        """The cluster described by ``dir/cluster.json``, or None."""
        try:
            doc = json.loads((dir / "cluster.json").read_text())
            return cls(dir, tuple(doc["ports"]), tuple(doc["controller_ports"]), doc["security"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @property
    def brokers(self) -> int:
        return len(self.ports)

    @property
    def ids(self) -> range:
        return range(1, self.brokers + 1)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    @property
    def protocol(self) -> str:
        return _PROTOCOL[self.security]

    @property
    def client_yaml(self) -> Path:
        return self.dir / "client.yaml"

    @property
    def tls_dir(self) -> Path:
        return self.dir / "tls"

    @property
    def secrets_dir(self) -> Path:
        return self.dir / "secrets"

    def node_dir(self, node: int) -> Path:
        return self.dir / f"broker-{node}"

    def log(self, node: int) -> Path:
        return self.node_dir(node) / "kafka.log"

    def port(self, node: int) -> int:
        return self.ports[node - 1]

    def password_file(self, user: str) -> Path:
        return self.secrets_dir / f"{user}.password"

    @property
    def component_users(self) -> tuple[str, ...]:
        """The SCRAM users made for the components of :mod:`fleetmedic.acls` (``sasl_ssl`` only)."""
        from fleetmedic.bus import COMPONENTS

        return tuple(component_user(c) for c in COMPONENTS) if self.security == "sasl_ssl" else ()

    # --- the client side --------------------------------------------------------------------------

    def kafka_section(self, **overrides: Any) -> dict[str, Any]:
        """The ``kafka`` config section a client of this cluster needs (client.yaml's)."""
        k: dict[str, Any] = {"bootstrap_servers": self.bootstrap, "security_protocol": self.protocol}
        if self.security == "sasl_ssl":
            k.update(sasl_mechanism=MECHANISM, sasl_username=CLIENT_USER,
                     sasl_password_file=str(self.password_file(CLIENT_USER)))
        if self.security != "plaintext":
            k["ssl_cafile"] = str(self.tls_dir / "ca.pem")
        if self.security == "ssl":
            k.update(ssl_certfile=str(self.tls_dir / f"{CLIENT_USER}.pem"),
                     ssl_keyfile=str(self.tls_dir / f"{CLIENT_USER}.key"))
        k.update(overrides)
        return k

    def component_section(self, component: str, **overrides: Any) -> dict[str, Any]:
        """The ``kafka`` section of a client that connects as ``component``'s own SCRAM user."""
        user = component_user(component)
        if user not in self.component_users:
            raise ValueError(f"no user for {component!r} on a {self.security} cluster (sasl_ssl only)")
        return self.kafka_section(sasl_username=user, sasl_password_file=str(self.password_file(user)), **overrides)

    def client_config(self) -> dict[str, Any]:
        """client.yaml as a dict: the ``kafka`` section and, with several brokers, ``topics``' replication."""
        doc: dict[str, Any] = {"kafka": self.kafka_section()}
        if self.brokers > 1:
            rf, isr = replication(self.brokers)
            doc["topics"] = {"replication_factor": rf, "min_insync_replicas": isr}
        return doc

    def client_options(self, **overrides: Any) -> dict[str, Any]:
        """aiokafka options for this cluster, built the way every fleetmedic client builds them."""
        from fleetmedic.bus import client_options
        from fleetmedic.config import KafkaSettings

        return client_options(KafkaSettings(**self.kafka_section(**overrides)))

    # --- Kafka's own tools ------------------------------------------------------------------------

    def admin_properties(self) -> Path:
        """A client properties file for Kafka's command-line tools: as the super user ``admin``
        (``sasl_ssl``), with the client's certificate (``ssl``), or plain."""
        path = self.secrets_dir / "admin.properties"
        lines = [f"security.protocol={self.protocol}"]
        if self.security != "plaintext":
            lines += ["ssl.truststore.type=PEM", f"ssl.truststore.location={self.tls_dir / 'ca.pem'}"]
        if self.security == "ssl":
            lines += ["ssl.keystore.type=PEM", f"ssl.keystore.location={self.tls_dir / f'{CLIENT_USER}.keystore.pem'}"]
        if self.security == "sasl_ssl":
            lines += [f"sasl.mechanism={MECHANISM}",
                      "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
                      f'username="{ADMIN_USER}" password="{self._password(ADMIN_USER)}";']
        self.secrets_dir.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        os.chmod(path, 0o600)
        return path

    def kafka_acls(self, commands: Sequence[Sequence[str]], timeout: float = 120.0) -> float:
        """Run ``kafka-acls`` command lines as :mod:`fleetmedic.acls` writes them (the program name
        first; their ``--bootstrap-server`` and ``--command-config`` are replaced by this cluster's
        and :meth:`admin_properties`) with the class ``kafka-acls.sh`` runs (``kafka.admin.AclCommand``),
        all in one JVM (:data:`ACL_BATCH`: a JVM start each cost 3 s of CPU); return the seconds.
        A command that fails ends the JVM and raises with its output."""
        conn = {"--bootstrap-server": self.bootstrap, "--command-config": str(self.admin_properties())}
        tools = self._tools()
        lines = []
        for line in commands:
            args = list(line[1:])
            for i, a in enumerate(args[:-1]):
                if a in conn:
                    args[i + 1] = conn[a]
            if "--command-config" not in args:
                args += ["--command-config", conn["--command-config"]]
            if any("\t" in a or "\n" in a for a in args):
                raise ValueError(f"an argument holds a tab or a new line: {args}")
            lines.append("\t".join(args))
        (tools / "acls.txt").write_text("\n".join(lines) + "\n")
        t0 = time.monotonic()
        self._java("AclBatch", ACL_BATCH, [str(tools / "acls.txt")], timeout=timeout, what="kafka-acls")
        return time.monotonic() - t0

    def move_leader(self, topic: str, partition: int, node: int, timeout: float = 120.0) -> float:
        """Make ``node`` (one of the partition's replicas, in sync) the preferred replica of
        ``topic``'s ``partition`` (a reassignment that only reorders its replicas, what
        ``kafka-reassign-partitions.sh`` does), elect it leader, and wait until every running broker's
        metadata says so (the election's answer comes before it: :meth:`leaders_seen`); the
        controller's own rebalance then keeps it there. Returns the seconds taken."""
        t0 = time.monotonic()
        self._java("MoveLeader", MOVE_LEADER, [self.bootstrap, str(self.admin_properties()), topic, str(partition),
                                               str(node)], timeout=timeout,
                   what=f"moving {topic}-{partition}'s leader to node {node}")
        left = max(1.0, timeout - (time.monotonic() - t0))
        proc.wait_until(lambda: set(self.leaders_seen(topic, partition).values()) == {node}, timeout=left,
                        what=f"every broker seeing node {node} lead {topic}-{partition}", log=self.log(node),
                        interval=0.5)
        return time.monotonic() - t0

    def _java(self, name: str, source: str, args: Sequence[str], *, timeout: float, what: str) -> str:
        """Run the single Java source ``source`` (class ``name``) with the broker's jars, in one JVM;
        its standard output, or :class:`~.proc.ServiceError` with the output's tail if it fails."""
        tools = self._tools()
        (tools / f"{name}.java").write_text(source)
        done = subprocess.run([*java_argv("256m", tools / "log4j.properties"), str(tools / f"{name}.java"), *args],
                              capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise proc.ServiceError(f"{what} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
        return done.stdout

    def _tools(self) -> Path:
        """Where the command-line tools' sources and log configuration are written."""
        tools = self.dir / "tools"
        tools.mkdir(parents=True, exist_ok=True)
        (tools / "log4j.properties").write_text(
            "log4j.rootLogger=ERROR, stderr\nlog4j.appender.stderr=org.apache.log4j.ConsoleAppender\n"
            "log4j.appender.stderr.Target=System.err\nlog4j.appender.stderr.layout=org.apache.log4j.PatternLayout\n")
        return tools

    # --- broker configuration ---------------------------------------------------------------------

    def _password(self, user: str) -> str:
        path = self.password_file(user)
        if not path.exists():
            self.secrets_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_urlsafe(18) + "\n")
            os.chmod(path, 0o600)
        return path.read_text().strip()

    def _make_tls(self) -> None:
        if (self.tls_dir / ".complete").exists():
            return
        shutil.rmtree(self.tls_dir, ignore_errors=True)
        ca = tls.make_ca(self.tls_dir)
        for node in self.ids:
            tls.issue(ca, self.tls_dir, f"broker-{node}")
        tls.issue(ca, self.tls_dir, CLIENT_USER)
        (self.tls_dir / ".complete").write_text("")

    def server_properties(self, node: int) -> str:
        rf, isr = replication(self.brokers)
        voters = ",".join(f"{i}@127.0.0.1:{self.controller_ports[i - 1]}" for i in self.ids)
        secure = self.security != "plaintext"
        lines = [
            "process.roles=broker,controller",
            f"node.id={node}",
            f"controller.quorum.voters={voters}",
            f"listeners=CLIENT://127.0.0.1:{self.port(node)},CONTROLLER://127.0.0.1:{self.controller_ports[node - 1]}",
            f"advertised.listeners=CLIENT://127.0.0.1:{self.port(node)}",
            "inter.broker.listener.name=CLIENT",
            "controller.listener.names=CONTROLLER",
            f"listener.security.protocol.map=CLIENT:{self.protocol},CONTROLLER:{'SSL' if secure else 'PLAINTEXT'}",
            f"log.dirs={self.node_dir(node) / 'data'}",
            "num.partitions=1",
            f"default.replication.factor={rf}",
            f"min.insync.replicas={isr}",
            f"offsets.topic.replication.factor={rf}",
            "offsets.topic.num.partitions=3",
            f"transaction.state.log.replication.factor={rf}",
            f"transaction.state.log.min.isr={isr}",
            "transaction.state.log.num.partitions=1",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=false",
            "unclean.leader.election.enable=false",
        ]
        if secure:
            lines += [
                "ssl.keystore.type=PEM",
                f"ssl.keystore.location={self.tls_dir / f'broker-{node}.keystore.pem'}",
                "ssl.truststore.type=PEM",
                f"ssl.truststore.location={self.tls_dir / 'ca.pem'}",
                f"ssl.client.auth={'required' if self.security == 'ssl' else 'none'}",
                "listener.name.controller.ssl.client.auth=required",
                "ssl.principal.mapping.rules=RULE:^CN=([^,]+)$/$1/,DEFAULT",
                "super.users=" + ";".join([f"User:{ADMIN_USER}", f"User:{CLIENT_USER}",
                                           *(f"User:broker-{i}" for i in self.ids)]),
            ]
            if self.authorizer:
                lines += ["authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                          "allow.everyone.if.no.acl.found=false"]
        if self.security == "sasl_ssl":
            admin, client = self._password(ADMIN_USER), self._password(CLIENT_USER)
            lines += [
                f"sasl.enabled.mechanisms={MECHANISM},PLAIN",
                f"sasl.mechanism.inter.broker.protocol={MECHANISM}",
                f"listener.name.client.{MECHANISM.lower()}.sasl.jaas.config="
                f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{ADMIN_USER}" '
                f'password="{admin}";',
                "listener.name.client.plain.sasl.jaas.config="
                f'org.apache.kafka.common.security.plain.PlainLoginModule required username="{ADMIN_USER}" '
                f'password="{admin}" user_{ADMIN_USER}="{admin}" user_{CLIENT_USER}="{client}";',
            ]
        lines += [f"{name}={value}" for name, value in self.extra]
        return "\n".join(lines) + "\n"

    def _scram_args(self) -> list[str]:
        if self.security != "sasl_ssl":
            return []
        return [arg for user in (ADMIN_USER, CLIENT_USER, *self.component_users)
                for arg in ("--add-scram", f"{MECHANISM}=[name={user},password={self._password(user)}]")]

    def _proc(self, node: int) -> proc.Proc:
        d = self.node_dir(node)
        return proc.Proc(f"kafka-{node}", [*java_argv(self.heap, d / "log4j.properties"), "kafka.Kafka",
                                           str(d / "server.properties")], d / "kafka.log", d / "kafka.pid")

    def _prepare(self) -> None:
        """Certificates, passwords and every node's configuration; storage formatted where it is not."""
        known = KafkaCluster.load(self.dir)
        if known is not None and (known.brokers, known.security) != (self.brokers, self.security):
            raise proc.ServiceError(
                f"{self.dir} holds a {known.brokers}-broker {known.security} cluster, not a {self.brokers}-broker "
                f"{self.security} one: `fleetmedic dev down --only kafka --wipe` first")
        if (self.dir / "instance.json").exists() or (self.dir / "data").exists():
            raise proc.ServiceError(f"{self.dir} holds a single plaintext broker's data: "
                                    "`fleetmedic dev down --only kafka --wipe` first")
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.security != "plaintext":
            self._make_tls()
        for node in self.ids:
            d = self.node_dir(node)
            d.mkdir(parents=True, exist_ok=True)
            (d / "server.properties").write_text(self.server_properties(node))
            (d / "log4j.properties").write_text(LOG4J)
        unformatted = [n for n in self.ids if not (self.node_dir(n) / "data" / "meta.properties").exists()]
        if unformatted:
            cluster_id = self._cluster_id()
            formats = []
            for node in unformatted:  # in parallel: a JVM start each
                d = self.node_dir(node)
                argv = [*java_argv("256m", d / "log4j.properties"), "kafka.tools.StorageTool", "format",
                        "-t", cluster_id, "-c", str(d / "server.properties"), *self._scram_args()]
                out = (d / "kafka.log").open("ab")
                formats.append((node, subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT), out))
            failed = []
            for node, p, out in formats:
                try:
                    if p.wait(timeout=120) != 0:
                        failed.append(node)
                finally:
                    out.close()
            if failed:
                raise proc.failure(f"formatting Kafka storage of node {failed[0]} failed", self.log(failed[0]))

    def _cluster_id(self) -> str:
        path = self.dir / "cluster.id"
        if not path.exists():
            path.write_text(new_cluster_id())
        return path.read_text().strip()

    def _write_description(self) -> None:
        (self.dir / "cluster.json").write_text(json.dumps({
            "brokers": self.brokers, "security": self.security, "bootstrap": self.bootstrap,
            "ports": list(self.ports), "controller_ports": list(self.controller_ports)}))
        write_client_yaml(self.client_yaml, self.client_config(),
                          f"the dev Kafka cluster in {self.dir} ({self.brokers} broker(s), {self.security})")

    # --- lifecycle --------------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> float:
        """Make what is missing (certificates, users, storage), start every node and wait until all
        ``brokers`` answer as one cluster; return the seconds that took."""
        t0 = time.monotonic()
        self._prepare()
        for port in (*self.ports, *self.controller_ports):
            if proc.port_open(port):
                raise proc.ServiceError(f"port 127.0.0.1:{port} is taken; is another broker running?")
        self._write_description()
        started: list[int] = []
        try:
            for node in self.ids:
                self._proc(node).start()
                started.append(node)
            self.wait_ready(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except proc.ServiceError:
            self.stop()
            raise
        return time.monotonic() - t0

    def start_broker(self, node: int, timeout: float = 120.0) -> float:
        """Start one node again (after :meth:`stop_broker` or :meth:`kill`) and wait until the
        cluster shows all its brokers; return the seconds that took."""
        t0 = time.monotonic()
        self._proc(node).start()
        self.wait_ready(timeout=timeout)
        return time.monotonic() - t0

    def stop_broker(self, node: int, timeout: float = 60.0) -> bool:
        """SIGTERM: a controlled shutdown (its partitions' leadership moves first)."""
        return self._proc(node).stop(timeout=timeout)

    def pid(self, node: int) -> int | None:
        return self._proc(node).pid()

    def signal(self, node: int, sig: signal.Signals) -> None:
        """Send ``sig`` to node ``node``'s JVM (SIGKILL: a crash; SIGSTOP/SIGCONT: a stall)."""
        pid = self.pid(node)
        if pid is None:
            raise proc.ServiceError(f"kafka node {node} is not running")
        os.kill(pid, sig)

    def kill(self, node: int) -> None:
        """kill -9 the node's JVM and reap it."""
        self.signal(node, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while self._proc(node).pid() is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        self._proc(node).pidfile.unlink(missing_ok=True)

    def running(self) -> list[int]:
        return [n for n in self.ids if self._proc(n).pid() is not None]

    def stop(self, timeout: float = 15.0) -> list[int]:
        """Stop every node at once (a stalled one is continued first; SIGKILL after ``timeout``: the
        last ones cannot shut down in a controlled way without a quorum); return the ids stopped."""
        for node in self.ids:
            pid = self.pid(node)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGCONT)
        with concurrent.futures.ThreadPoolExecutor(self.brokers) as pool:
            done = dict(zip(self.ids, pool.map(lambda n: self._proc(n).stop(timeout=timeout), self.ids), strict=True))
        return [n for n, stopped in done.items() if stopped]

    def wipe(self) -> None:
        """Remove data, certificates, passwords and logs (only when stopped)."""
        if not self.running():
            shutil.rmtree(self.dir, ignore_errors=True)

    # --- looking at it ----------------------------------------------------------------------------

    def wait_ready(self, timeout: float = 120.0, brokers: int | None = None) -> float:
        """Until an admin client (the client side's credentials) sees ``brokers`` (default: all) brokers."""
        want = self.brokers if brokers is None else brokers
        with quiet_aiokafka():
            return proc.wait_until(lambda: len(asyncio.run(self.describe())["brokers"]) >= want,
                                   timeout=timeout, what=f"{want} Kafka brokers at {self.bootstrap}",
                                   log=self.log(1), procs=[self._proc(n) for n in self.running()], interval=0.5)

    async def admin(self) -> Any:
        from aiokafka.admin import AIOKafkaAdminClient

        client = AIOKafkaAdminClient(**self.client_options(), request_timeout_ms=5000)
        await client.start()
        return client

    async def describe(self) -> dict[str, Any]:
        """``describe_cluster()``: brokers and controller id."""
        admin = await self.admin()
        try:
            return dict(await admin.describe_cluster())
        finally:
            await admin.close()

    async def partitions(self, topics: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """One dict per partition (topic, partition, leader, replicas, isr) of ``topics`` (default: all)."""
        admin = await self.admin()
        try:
            desc = await admin.describe_topics(list(topics) if topics is not None else None)
        finally:
            await admin.close()
        return [{"topic": t["topic"], "partition": p["partition"], "leader": p["leader"],
                 "replicas": list(p["replicas"]), "isr": list(p["isr"])}
                for t in desc for p in t.get("partitions", [])]

    def leader(self, topic: str, partition: int = 0) -> int:
        """The node leading ``topic``'s ``partition`` (-1: none)."""
        with quiet_aiokafka():
            for p in asyncio.run(self.partitions([topic])):
                if p["partition"] == partition:
                    return int(p["leader"])
        return -1

    def leaders_seen(self, topic: str, partition: int = 0) -> dict[int, int]:
        """The leader of ``topic``'s ``partition`` as each running broker's metadata has it (-1: none
        known). A broker answers from its own copy of the metadata, which reaches each at its own
        pace: :meth:`leader` asks one broker chosen at random."""
        from aiokafka.protocol.metadata import MetadataRequest

        async def ask() -> dict[int, int]:
            admin = await self.admin()
            try:
                seen = {}
                for node in self.running():
                    # the admin client's one way to ask a given broker (its public calls pick one)
                    meta = (await admin._send_request(MetadataRequest([topic]), node)).to_object()
                    seen[node] = next((int(p["leader"]) for t in meta["topics"] if t["topic"] == topic
                                       for p in t["partitions"] if p["partition"] == partition), -1)
                return seen
            finally:
                await admin.close()

        with quiet_aiokafka():
            return asyncio.run(ask())

    def under_replicated(self) -> list[tuple[str, int]]:
        """Partitions whose in-sync replicas are fewer than their replicas, or that have no leader."""
        with quiet_aiokafka():
            return [(p["topic"], p["partition"]) for p in asyncio.run(self.partitions())
                    if p["leader"] < 0 or len(p["isr"]) < len(p["replicas"])]

    def wait_in_sync(self, timeout: float = 120.0) -> float:
        """Until every partition has a leader and all its replicas in sync; return the seconds."""
        last: list[tuple[str, int]] = []

        def whole() -> bool:
            nonlocal last
            last = self.under_replicated()
            return not last

        try:
            return proc.wait_until(whole, timeout=timeout, what="every partition back in sync", log=self.log(1),
                                   interval=0.5)
        except proc.ServiceError as exc:
            raise proc.ServiceError(f"{exc}\nstill under-replicated: {last[:20]}") from None


#: Runs ``kafka.admin.AclCommand`` (what ``kafka-acls.sh`` runs) once per line of a file, arguments
#: separated by tabs, in one JVM (``java AclBatch.java FILE``: the JDK compiles a single source file
#: itself). AclCommand ends the JVM with status 1 on the first command that fails.
ACL_BATCH = """\
import java.nio.file.Files;
import java.nio.file.Path;

public class AclBatch {
    public static void main(String[] args) throws Exception {
        for (String line : Files.readAllLines(Path.of(args[0]))) {
            if (!line.isBlank()) {
                kafka.admin.AclCommand.main(line.split("\\t"));
            }
        }
    }
}
"""


#: Makes NODE the leader of TOPIC's PARTITION (``java MoveLeader.java BOOTSTRAP PROPERTIES TOPIC
#: PARTITION NODE``): reorders the partition's replicas so that NODE comes first (a reassignment with
#: the same replicas: nothing is copied), waits for the reassignment to end, elects the preferred
#: replica of that partition alone. NODE not among the replicas is status 2; a failed election (NODE
#: not in sync, say) is printed to stderr, status 1.
MOVE_LEADER = """\
import java.io.FileInputStream;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.ElectionType;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.ElectionNotNeededException;

public class MoveLeader {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        try (FileInputStream in = new FileInputStream(args[1])) {
            props.load(in);
        }
        props.put("bootstrap.servers", args[0]);
        TopicPartition tp = new TopicPartition(args[2], Integer.parseInt(args[3]));
        int node = Integer.parseInt(args[4]);
        try (Admin admin = Admin.create(props)) {
            TopicDescription d = admin.describeTopics(List.of(tp.topic())).allTopicNames().get().get(tp.topic());
            List<Node> replicas = d.partitions().get(tp.partition()).replicas();
            List<Integer> order = new ArrayList<>(List.of(node));
            for (Node r : replicas) {
                if (r.id() != node) {
                    order.add(r.id());
                }
            }
            if (order.size() != replicas.size()) {
                System.err.println(tp + ": node " + node + " is not among its replicas " + replicas);
                System.exit(2);
            }
            admin.alterPartitionReassignments(Map.of(tp, Optional.of(new NewPartitionReassignment(order)))).all().get();
            while (!admin.listPartitionReassignments(Set.of(tp)).reassignments().get().isEmpty()) {
                Thread.sleep(100);
            }
            Optional<Throwable> failed =
                admin.electLeaders(ElectionType.PREFERRED, Set.of(tp)).partitions().get().get(tp);
            if (failed != null && failed.isPresent() && !(failed.get() instanceof ElectionNotNeededException)) {
                System.err.println(tp + ": " + failed.get());
                System.exit(1);
            }
        }
    }
}
"""


def component_user(component: str) -> str:
    """The dev cluster's SCRAM user of a component of :mod:`fleetmedic.acls` (its principal is
    ``User:fleetmedic-<component>``, :data:`fleetmedic.acls.DEFAULT_PRINCIPAL_PREFIX`)."""
    return f"{CLIENT_USER}-{component}"


def write_client_yaml(path: Path, doc: dict[str, Any], what: str) -> Path:
    """A fleetmedic config holding the client side of ``what`` (``dev up`` prints its path)."""
    header = (f"# the client side of {what};\n"
              "# written by `fleetmedic dev up`: use it as --config, or copy its sections into yours\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False))
    return path


@contextlib.contextmanager
def stalled(cluster: KafkaCluster, node: int) -> Iterator[None]:
    """SIGSTOP node ``node`` for the block (SIGCONT at its end, whatever happens)."""
    cluster.signal(node, signal.SIGSTOP)
    try:
        yield
    finally:
        cluster.signal(node, signal.SIGCONT)
