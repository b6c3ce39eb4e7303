"""The Node packages the tests use (tests/asyncapi/package.json, pinned by its package-lock.json):
the official AsyncAPI parser and ajv. ``npm ci`` installs them once into the cache, outside the
repository (``$FLEETMEDIC_CACHE/npm/<hash of the lock file>/node_modules``); later runs reuse it.

``python -m tests.asyncapi.helpers_npm`` installs them (scripts/test does; fast when cached). In tests,
:func:`node_modules` returns the folder, and when node or npm is missing or ``npm ci`` fails it
fails the test under ``FLEETMEDIC_REQUIRE_SERVICES=1`` (CI) and skips it otherwise.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from fleetmedic.devenv import settings

HERE = Path(__file__).resolve().parent
MANIFESTS = ("package.json", "package-lock.json")


class NodeUnavailable(RuntimeError):
    pass


def tool(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise NodeUnavailable(f"{name} is missing (Node.js 20+ with npm; scripts/test needs it for these tests)")
    return found


def install() -> Path:
    """``npm ci`` into the cache (once per lock file); the ``node_modules`` folder."""
    npm = tool("npm")
    tool("node")
    digest = hashlib.sha256(b"".join((HERE / m).read_bytes() for m in MANIFESTS)).hexdigest()[:16]
    target = settings.layout().cache / "npm" / digest
    modules = target / "node_modules"
    if (modules / ".package-lock.json").is_file():
        return modules
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=target.parent))
    try:
        for m in MANIFESTS:
            shutil.copy(HERE / m, work / m)
        run = subprocess.run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
                             cwd=work, capture_output=True, text=True, timeout=600)
        if run.returncode != 0:
            raise NodeUnavailable(f"npm ci failed ({run.returncode}):\n{(run.stdout + run.stderr)[-3000:]}")
        try:
            os.replace(work, target)  # atomic: a half-installed folder is never taken for a cache hit
        except OSError:
            if not (modules / ".package-lock.json").is_file():  # not another run's install finishing first
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return modules


def node_modules() -> Path:
    """For tests: :func:`install`, failing (``FLEETMEDIC_REQUIRE_SERVICES=1``) or skipping when it cannot."""
    from tests.conftest import unavailable

    try:
        return install()
    except (NodeUnavailable, OSError, subprocess.TimeoutExpired) as exc:
        unavailable("Node.js and the npm packages", str(exc))


def node_env() -> dict[str, str]:
    return {**os.environ, "FLEETMEDIC_NODE_MODULES": str(node_modules())}


if __name__ == "__main__":
    try:
        print(install())
    except NodeUnavailable as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
