"""What every subcommand shares: the exit code for bad input, config and key loading, logging options."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

from fleetmedic.config import ConfigError, KafkaSettings, Settings, config_warnings, read_config
from fleetmedic.signing import KeySet, command_key, command_keys

EXIT_INVALID = 2
LOG_LEVELS = ("debug", "info", "warning", "error")


_ROLE = re.compile(r":(?:class|mod|func|meth|data|attr|exc):`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def plain_text(doc: str) -> str:
    """A docstring as a terminal shows it: reST roles (``:class:`~a.b.C```) become the name they
    point at (the last part when written with ``~``), double-backquoted literals lose their quotes,
    and a paragraph ending in ``::`` ends in ``:``."""
    def role(m: re.Match[str]) -> str:
        target = m.group(1)
        return target.rsplit(".", 1)[-1] if m.group(0).split("`", 1)[1].startswith("~") else target

    text = _ROLE.sub(role, doc)
    text = _LITERAL.sub(r"\1", text)
    return re.sub(r"::$", ":", text, flags=re.M)


def plain_help(parser: argparse.ArgumentParser) -> None:
    """Apply :func:`plain_text` to the description and epilog of ``parser`` and every subcommand's,
    and keep the lines of their examples as written (:class:`HelpFormatter`)."""
    for p in _parsers(parser):
        if p.description:
            p.description = plain_text(p.description)
        if p.epilog:
            p.epilog = plain_text(p.epilog)
        if p.formatter_class is argparse.HelpFormatter:
            p.formatter_class = HelpFormatter


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that a paragraph with an indented line (a list of examples, a
    table) keeps its lines as written; other paragraphs are wrapped as usual."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for para in re.split(r"\n\s*\n", text):
            if any(line[:1].isspace() for line in para.splitlines()[1:]):
                out.append("\n".join(indent + line for line in para.splitlines()))
            else:
                out.append(super()._fill_text(para, width, indent))
        return "\n\n".join(out)


def examples(*lines: str) -> str:
    """The epilog every command's help ends with: ``examples:`` and one command line each."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def duration(text: str) -> float:
    """An argparse type: a duration as ``90s``, ``10m``, ``2h``, ``1h30m``, ``2d`` or plain seconds."""
    from fleetmedic.sim.units import parse_duration

    try:
        value = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"duration {text!r}: must not be negative")
    return value


def timestamp(text: str) -> float:
    """An argparse type: a time as RFC 3339 (``2026-05-01T12:00:00Z``) or Unix seconds."""
    from fleetmedic.connectors.prometheus.api import parse_time

    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: the same default seed for every command that simulates: the same run whichever command starts it
DEFAULT_SEED = 7


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                out += _parsers(sub)
    return out


#: the commands that talk to Kafka: each of them (and each of their verbs) takes ``--bootstrap``
KAFKA_COMMANDS = ("worker", "executor", "exporter", "watch-jobs", "ctl", "simulate", "demo")
BOOTSTRAP_ENV = "FLEETMEDIC__KAFKA__BOOTSTRAP_SERVERS"


def add_bootstrap(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``--bootstrap HOST:PORT[,...]`` on every parser of :data:`KAFKA_COMMANDS` that reads a config:
    it overrides ``kafka.bootstrap_servers`` exactly as ``FLEETMEDIC__KAFKA__BOOTSTRAP_SERVERS``
    does (``main`` sets that variable, so the one config loader reads it like any override)."""
    for name in KAFKA_COMMANDS:
        for p in _parsers(sub.choices[name]):
            options = {o for a in p._actions for o in a.option_strings}
            if "--config" in options and "--bootstrap" not in options:
                p.add_argument("--bootstrap", metavar="HOST:PORT[,HOST:PORT]",
                               help="Kafka brokers; overrides kafka.bootstrap_servers (as the variable "
                                    f"{BOOTSTRAP_ENV} does)")


DRY_RUN_ENV = "FLEETMEDIC__SAFETY__DRY_RUN"


def add_dry_run(p: argparse.ArgumentParser) -> None:
    """``--dry-run``: observe for this run whatever ``safety.dry_run`` says (``main`` sets
    ``FLEETMEDIC__SAFETY__DRY_RUN=true``, so the one config loader reads it like any override)."""
    p.add_argument("--dry-run", action="store_true",
                   help="decide and report, change nothing, whatever safety.dry_run says (as the variable "
                        f"{DRY_RUN_ENV}=true does)")


def add_deprecated_alias(p: argparse.ArgumentParser, option: str, dest: str, **kwargs: Any) -> None:
    """An older spelling of an option, still accepted (scripts keep working) but left out of the help."""
    p.add_argument(option, dest=dest, help=argparse.SUPPRESS, **kwargs)


def add_loglevel(p: argparse.ArgumentParser) -> None:
    """``--loglevel``, the same on every long-running subcommand."""
    p.add_argument("--loglevel", default="info", choices=LOG_LEVELS, help="log level (default: info)")


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def settings_or_none(path: str | None) -> Settings | None:
    """The config at ``path`` (defaults when None) with environment overrides, or None after
    printing every error (callers exit with :data:`EXIT_INVALID`). Dangerous-but-valid settings
    (:func:`~fleetmedic.config.config_warnings`) are printed as warnings; the command still runs."""
    try:
        settings = read_config(path, os.environ)
    except ConfigError as exc:
        for line in exc.messages():
            print(f"error: {line}", file=sys.stderr)
        return None
    for warning in config_warnings(settings):
        print(f"warning: {warning}", file=sys.stderr)
    return settings


def signing_key(settings: Settings) -> bytes:
    """The active command key, the one the decision stage signs with (under ``signing.key_id``):
    from ``signing.key_file`` or the env var ``signing.key_env``."""
    return command_key(settings.signing, os.environ)[1]


def settings_and_key(path: str | None, need_key: bool = True) -> tuple[Settings, bytes] | None:
    """The config (as :func:`settings_or_none`) and the signing key (``b""`` unless ``need_key``),
    or None after printing what is wrong (callers exit with :data:`EXIT_INVALID`)."""
    settings = settings_or_none(path)
    if settings is None:
        return None
    try:
        return settings, signing_key(settings) if need_key else b""
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def settings_and_command_keys(path: str | None) -> tuple[Settings, KeySet] | None:
    """The config (as :func:`settings_or_none`) and the command keys the executor accepts, by id:
    the active key and each of ``signing.command_keys``
    (:func:`~fleetmedic.signing.command_keys`), or None after printing what is wrong (callers exit
    with :data:`EXIT_INVALID`). Never an operator key: those are not read here."""
    settings = settings_or_none(path)
    if settings is None:
        return None
    try:
        return settings, command_keys(settings.signing, os.environ)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


# --- reaching the Kubernetes API: one line saying why not ----------------------------------------

SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def kubeconfig_path(kubeconfig: str) -> str:
    """The kubeconfig a command outside the cluster reads: the config's, else the first of
    ``$KUBECONFIG``, else ``~/.kube/config``."""
    return kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or os.path.expanduser("~/.kube/config")


def kube_access_problem(section: str, in_cluster: bool, kubeconfig: str) -> str | None:
    """One line saying why a command configured by ``<section>.in_cluster`` / ``<section>.kubeconfig``
    cannot reach the Kubernetes API (no kubeconfig file, not in a pod), or None when it can try."""
    if in_cluster:
        if os.environ.get("KUBERNETES_SERVICE_HOST") and os.path.exists(SERVICE_ACCOUNT_TOKEN):
            return None
        return (f"{section}.in_cluster is true, but this is not a pod with a ServiceAccount token "
                f"({SERVICE_ACCOUNT_TOKEN}, $KUBERNETES_SERVICE_HOST); outside a cluster set {section}.in_cluster: "
                f"false and {section}.kubeconfig")
    path = kubeconfig_path(kubeconfig)
    if os.path.isfile(path):
        return None
    return (f"no kubeconfig at {path}: set {section}.kubeconfig or $KUBECONFIG, or run in a pod with "
            f"{section}.in_cluster: true")


# --- connecting to Kafka: one line saying why not -------------------------------------------------

EXIT_KAFKA = 1  # a command that could not connect to, or log in to, the Kafka cluster


@contextlib.contextmanager
def quiet_kafka_logs() -> Iterator[None]:
    """Hold back aiokafka's own log records (one ERROR per bootstrap server that fails) for the
    block: the command reports the failure once, through :func:`kafka_failure`."""
    logger = logging.getLogger("aiokafka")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def kafka_failure(exc: BaseException, k: KafkaSettings) -> str | None:
    """One line saying why a Kafka client configured by ``k`` failed with ``exc``, naming the setting
    to fix (a wrong password, an untrusted certificate, a host-name mismatch, a listener of another
    protocol, no broker, an ACL), or None when ``exc`` is no failure to connect (a caller re-raises).

    aiokafka reports any failure to bootstrap as one ``KafkaConnectionError`` ("Unable to bootstrap
    from ...") and logs the causes; for that error the bootstrap servers are probed again
    (:func:`kafka_check`) to find the cause."""
    from aiokafka import errors

    if isinstance(exc, errors.KafkaConnectionError) and "bootstrap" in str(exc):
        if _loop_running():
            return _one_line(f"cannot connect to the Kafka cluster at {k.bootstrap_servers}: {exc}")
        return kafka_check(k) or _one_line(f"cannot connect to the Kafka cluster at {k.bootstrap_servers}: {exc}")
    return _describe(exc, k, "", 0)


def kafka_check(k: KafkaSettings, timeout: float | None = None) -> str | None:
    """Connect to the bootstrap servers as every client does (TLS, SASL, a metadata request) and
    return None once one answers, else the one line of :func:`kafka_failure` for the first failure."""
    import asyncio

    limit = timeout if timeout is not None else min(k.request_timeout_s, 15.0)
    with quiet_kafka_logs():
        found = asyncio.run(_probe(k, limit))
    if found is None:
        return None
    host, port, exc = found
    return _describe(exc, k, host, port) or _one_line(f"Kafka at {host}:{port}: {type(exc).__name__}: {exc}")


def _loop_running() -> bool:
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _hosts(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for item in bootstrap.split(","):
        host, _, port = item.strip().rpartition(":")
        if host and port.isdigit():
            out.append((host.strip("[]"), int(port)))
    return out


async def _probe(k: KafkaSettings, timeout: float) -> tuple[str, int, BaseException] | None:
    import asyncio

    from aiokafka.conn import create_conn
    from aiokafka.protocol.metadata import MetadataRequest

    from fleetmedic.bus import client_options

    hosts = _hosts(k.bootstrap_servers)
    first = hosts[0] if hosts else ("", 0)
    try:
        opts = client_options(k)
    except (OSError, ValueError) as exc:  # a password file, a CA file, a key that cannot be read
        return first[0], first[1], exc
    names = ("ssl_context", "security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password")
    conn_opts = {name: opts[name] for name in names if name in opts}
    failure: tuple[str, int, BaseException] | None = None
    for host, port in hosts:
        try:
            conn = await asyncio.wait_for(create_conn(host, port, client_id=k.client_id,
                                                      request_timeout_ms=int(timeout * 1000), **conn_opts), timeout)
            try:
                await asyncio.wait_for(conn.send(MetadataRequest([])), timeout)
            finally:
                conn.close()
            return None
        except Exception as exc:  # the first failure is the one reported
            failure = failure or (host, port, exc)
    return failure or (*first, ValueError(f"no host:port in kafka.bootstrap_servers {k.bootstrap_servers!r}"))


def _one_line(text: str) -> str:
    return " ".join(text.split())


# X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH; X509_V_ERR_CERT_HAS_EXPIRED, _NOT_YET_VALID
_NAME_MISMATCH = {62, 64}
_OUT_OF_DATE = {9, 10}


def _describe(exc: BaseException, k: KafkaSettings, host: str, port: int) -> str | None:
    """The line for one cause, or None when it is no failure to connect."""
    import asyncio
    import socket
    import ssl

    from aiokafka import errors

    where = f"{host}:{port}" if host else k.bootstrap_servers
    proto = k.security_protocol
    if isinstance(exc, ssl.SSLCertVerificationError):
        why = exc.verify_message or str(exc)
        if exc.verify_code in _NAME_MISMATCH:
            line = (f"TLS: the certificate of the Kafka broker at {where} is not valid for the name "
                    f"{host or 'it was reached by'!r} (host-name mismatch: {why}); connect through a name the "
                    "certificate lists (kafka.bootstrap_servers) or reissue it with that name")
        elif exc.verify_code in _OUT_OF_DATE:
            line = f"TLS: the certificate of the Kafka broker at {where} is out of date ({why})"
        else:
            line = (f"TLS: the certificate of the Kafka broker at {where} is not trusted ({why}); "
                    f"kafka.ssl_cafile ({k.ssl_cafile or 'unset: the system trust store'}) must hold the CA "
                    "that signed it")
    elif isinstance(exc, ssl.SSLError):
        line = (f"TLS handshake with the Kafka broker at {where} failed ({exc.reason or exc}); does that listener "
                f"speak TLS (kafka.security_protocol {proto})?")
    elif isinstance(exc, errors.SaslAuthenticationFailed):
        source = (f"the file {k.sasl_password_file}" if k.sasl_password_file
                  else f"${k.sasl_password_env}" if k.sasl_password_env else "no password source")
        line = (f"SASL: the Kafka broker at {where} refused user {k.sasl_username!r} ({k.sasl_mechanism}): wrong "
                f"user name or password (kafka.sasl_username; the password from {source})")
    elif isinstance(exc, errors.UnsupportedSaslMechanismError):
        line = (f"SASL: the Kafka broker at {where} does not offer the mechanism {k.sasl_mechanism} "
                "(kafka.sasl_mechanism)")
    elif isinstance(exc, errors.TopicAuthorizationFailedError | errors.GroupAuthorizationFailedError
                    | errors.ClusterAuthorizationFailedError):
        line = (f"Kafka denied user {k.sasl_username or '(the certificate holder)'!r} access: "
                f"{type(exc).__name__} ({exc}); the ACLs it needs are in docs/operations.md")
    elif isinstance(exc, errors.KafkaConnectionError) and "closed" in str(exc):
        line = (f"the Kafka broker at {where} closed the connection during the handshake: its listener does not "
                f"speak {proto}{' with ' + str(k.sasl_mechanism) if proto.startswith('SASL') else ''} "
                "(kafka.security_protocol)")
    elif isinstance(exc, ConnectionRefusedError):
        line = f"no Kafka broker listens at {where} (connection refused; kafka.bootstrap_servers)"
    elif isinstance(exc, socket.gaierror):
        line = f"cannot resolve the Kafka host {host or where!r} ({exc.strerror}; kafka.bootstrap_servers)"
    elif isinstance(exc, asyncio.TimeoutError | errors.KafkaTimeoutError | errors.RequestTimedOutError):
        line = f"no answer from the Kafka broker at {where} in time (kafka.bootstrap_servers, kafka.security_protocol)"
    elif isinstance(exc, errors.UnknownTopicOrPartitionError):
        line = (f"a topic is missing on the Kafka cluster at {where} ({exc}); `fleetmedic worker` creates them "
                "(topics.prefix, topics.names)")
    elif isinstance(exc, OSError) and exc.filename:
        line = f"cannot read {exc.filename} ({exc.strerror}): check the file names in the kafka section"
    elif isinstance(exc, errors.KafkaConnectionError | errors.NodeNotReadyError | OSError):
        line = f"cannot connect to Kafka at {where}: {type(exc).__name__}: {exc}"
    else:
        return None
    return _one_line(line)
