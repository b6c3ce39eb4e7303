"""The worker scenario the streams and subscriber tests share (no tests here): a four-node job with one
sick node, and a worker's metrics read from the address its log names."""

from __future__ import annotations

import re
import urllib.request

NODES = [f"gpu-node-{i}" for i in range(4)]
SICK = "gpu-node-2"
JOB = "team/train"


def scrape(log: str, path: str = "/metrics") -> str:
    """The worker's /metrics page, or another of its paths (its address is in the log: an ephemeral
    port in these tests)."""
    url = re.search(r"metrics on (http://127\.0\.0\.1:\d+)/metrics", log)
    assert url, "the worker did not log its metrics address"
    with urllib.request.urlopen(url.group(1) + path, timeout=10) as resp:
        return str(resp.read().decode())
