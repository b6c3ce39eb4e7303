"""Headless Chromium for the HTML report tests (no tests here): where it is, and a page's DOM after its
script ran."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from tests.conftest import require_tool


def chromium() -> str:
    return require_tool("chromium", "chromium-browser", why="scripts/test installs Debian's chromium package")


def dump_dom(page: Path, height: int) -> str:
    """The DOM after the page's script ran, in a 1280 x ``height`` window."""
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
             "--disable-background-networking", "--disable-component-update", f"--user-data-dir={profile}",
             "--hide-scrollbars", f"--window-size=1280,{height}", "--dump-dom", page.resolve().as_uri()],
            capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout
