"""The image, built for real: scripts/build_image.sh --offline-base builds the Dockerfile with buildah
(vfs storage, chroot isolation) on a base made from Debian packages by mmdebstrap, and the image's
own entrypoint runs in it with `buildah run`: ``--help`` and ``config check`` of the configuration the
image ships, as the image's user.

The storage and the base are kept in the cache (``$FLEETMEDIC_CACHE/image``): a first run takes about
5 minutes, a later one (the source changed) about 4, one with nothing changed seconds. Needs root,
buildah and mmdebstrap (scripts/test installs them), the Debian mirror and PyPI."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetmedic.devenv import settings
from tests.conftest import require_tool, unavailable

pytestmark = pytest.mark.buildah

ROOT = Path(__file__).resolve().parents[2]
TAG = "localhost/fleetmedic:test"
BUILD_TIMEOUT_S = 1200


def _buildah(store: Path) -> list[str]:
    return ["buildah", "--root", str(store), "--runroot", str(store / "run")]


def _env() -> dict[str, str]:
    return {**os.environ, "STORAGE_DRIVER": "vfs", "BUILDAH_ISOLATION": "chroot"}


@pytest.fixture(scope="module")
def image() -> Iterator[tuple[list[str], dict[str, Any]]]:
    """Builds the image; yields the buildah command line for its storage and the image's OCI config."""
    require_tool("buildah", why="scripts/test installs Debian's buildah")
    require_tool("mmdebstrap", why="scripts/test installs Debian's mmdebstrap")
    if os.geteuid() != 0:
        unavailable("root", "mmdebstrap and buildah's chroot isolation run as root here")
    store = settings.layout().cache / "image" / "containers"
    log = store.parent / "build.log"
    store.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        done = subprocess.run(
            ["bash", str(ROOT / "scripts" / "build_image.sh"), "--offline-base", "--prune",
             "--root", str(store), "--tag", TAG],
            cwd=ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S, check=False,
        )
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        pytest.fail(f"scripts/build_image.sh exited {done.returncode}; the end of {log}:\n{tail}", pytrace=False)
    bh = _buildah(store)
    inspected = json.loads(subprocess.run([*bh, "inspect", "--type", "image", TAG], env=_env(), check=True,
                                          capture_output=True, text=True).stdout)
    yield bh, inspected["OCIv1"]["config"]


@pytest.fixture
def container(image: tuple[list[str], dict[str, Any]]) -> Iterator[str]:
    bh, _ = image
    name = subprocess.run([*bh, "from", "--pull-never", TAG], env=_env(), check=True,
                          capture_output=True, text=True).stdout.strip()
    yield name
    subprocess.run([*bh, "rm", name], env=_env(), check=False, capture_output=True)


def _run(bh: list[str], ctr: str, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    extra = [f"--env={k}={v}" for k, v in (env or {}).items()]
    return subprocess.run([*bh, "run", *extra, ctr, "--", *argv], env=_env(), capture_output=True, text=True,
                          timeout=120, check=False)


def test_image_entrypoint_help_and_config_check(image: tuple[list[str], dict[str, Any]], container: str) -> None:
    bh, config = image
    entrypoint = config["Entrypoint"]
    assert entrypoint == ["fleetmedic"] and config["Cmd"] == ["--help"]
    assert config["User"] == "10001" and "9108/tcp" in config["ExposedPorts"]

    # runs as the image's user, not root; the C loops were compiled into the image
    who = _run(bh, container, "sh", "-c", "id -u; command -v fleetmedic")
    assert who.returncode == 0, who.stderr
    assert who.stdout.split() == ["10001", "/usr/local/bin/fleetmedic"]

    helped = _run(bh, container, *entrypoint, "--help")
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: fleetmedic")
    for command in ("worker", "config", "demo", "ctl"):
        assert command in helped.stdout, command

    checked = _run(bh, container, *entrypoint, "config", "check", "/etc/fleetmedic/fleetmedic.yaml")
    assert checked.returncode == 0, checked.stderr
    assert "kafka:" in checked.stdout and "bootstrap_servers:" in checked.stdout

    # the same check refuses a bad override, naming the field (exit 2)
    bad = _run(bh, container, *entrypoint, "config", "check", "--quiet", "/etc/fleetmedic/fleetmedic.yaml",
               env={"FLEETMEDIC__STREAMS__MAX_FUTURE_SKEW_S": "-5"})
    assert bad.returncode == 2, (bad.stdout, bad.stderr)
    assert "streams.max_future_skew_s" in bad.stderr

    c_loops = _run(bh, container, "python", "-c", "import fleetmedic.models._columns, fleetmedic.models._baselines, "
                   "fleetmedic.connectors.remote_write._remote_write, fleetmedic.connectors.prometheus._gpu_record, "
                   "fleetmedic.sim.whatif._shuffle")
    assert c_loops.returncode == 0, c_loops.stderr
