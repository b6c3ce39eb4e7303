"""A throwaway certificate authority for the dev Kafka cluster, made with the ``openssl`` command.

:func:`make_ca` writes a CA (``ca.pem``, ``ca.key``); :func:`issue` a leaf certificate signed by it
(``<name>.pem``, ``<name>.key``) and ``<name>.keystore.pem``, the key followed by the chain, which
Kafka reads as a ``PEM`` keystore (``ssl.keystore.type=PEM``; the CA file is its ``PEM``
truststore). So no JKS or PKCS12 store and no ``keytool`` are needed. Keys are EC P-256, unencrypted
PKCS#8, readable by the owner only; leaf certificates are valid for server and client
authentication and name ``DNS:localhost`` and ``IP:127.0.0.1`` unless told otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from fleetmedic.devenv.proc import ServiceError

LOOPBACK_SANS = ("DNS:localhost", "IP:127.0.0.1")
DAYS = 30

_REQ_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = {cn}
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[leaf]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth,clientAuth
subjectAltName = {sans}
authorityKeyIdentifier = keyid
subjectKeyIdentifier = hash
"""


@dataclass(frozen=True)
class Ca:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Leaf:
    cert: Path  # the certificate alone
    key: Path  # its private key (PKCS#8 PEM)
    keystore: Path  # key + certificate + CA certificate: a Kafka PEM keystore


def _openssl(args: list[str], cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise ServiceError("openssl not found on PATH (needed for the dev cluster's certificates)")
    done = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise ServiceError(f"openssl {' '.join(args[:2])} failed: {done.stderr.strip()[-2000:]}")


def _private(path: Path) -> None:
    os.chmod(path, 0o600)


def _config(dir: Path, name: str, cn: str, sans: tuple[str, ...]) -> Path:
    path = dir / f"{name}.cnf"
    path.write_text(_REQ_CONFIG.format(cn=cn, sans=",".join(sans) or "DNS:localhost"))
    return path


def make_ca(dir: Path, cn: str = "fleetmedic dev CA") -> Ca:
    """A self-signed CA in ``dir`` (``ca.pem``, ``ca.key``)."""
    dir.mkdir(parents=True, exist_ok=True)
    cnf = _config(dir, "ca", cn, ())
    _openssl(["req", "-x509", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
              "-keyout", "ca.key", "-out", "ca.pem", "-days", str(DAYS), "-config", cnf.name, "-extensions", "ca"], dir)
    _private(dir / "ca.key")
    return Ca(dir / "ca.pem", dir / "ca.key")


def issue(ca: Ca, dir: Path, name: str, sans: tuple[str, ...] = LOOPBACK_SANS, cn: str | None = None) -> Leaf:
    """A certificate for ``name`` (CN ``cn`` or ``name``) signed by ``ca``, in ``dir``."""
    dir.mkdir(parents=True, exist_ok=True)
    cnf = _config(dir, name, cn or name, sans)
    _openssl(["req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
              "-keyout", f"{name}.key", "-out", f"{name}.csr", "-config", cnf.name], dir)
    _private(dir / f"{name}.key")
    _openssl(["x509", "-req", "-in", f"{name}.csr", "-CA", str(ca.cert), "-CAkey", str(ca.key), "-CAcreateserial",
              "-out", f"{name}.pem", "-days", str(DAYS), "-extfile", cnf.name, "-extensions", "leaf"], dir)
    keystore = dir / f"{name}.keystore.pem"
    keystore.write_text((dir / f"{name}.key").read_text() + (dir / f"{name}.pem").read_text() + ca.cert.read_text())
    _private(keystore)
    (dir / f"{name}.csr").unlink(missing_ok=True)
    return Leaf(dir / f"{name}.pem", dir / f"{name}.key", keystore)
