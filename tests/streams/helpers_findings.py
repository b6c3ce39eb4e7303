"""A fleet of sixteen nodes in the past of the machine's clock and an XID finding on one of them, for
the decision-stage tests (no tests here)."""

from __future__ import annotations

import numpy as np

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.devenv.synth import gpu_message
from fleetmedic.models.stages import NodeDetection

NODES = [f"n{i}" for i in range(16)]
T0 = 1_790_000_000.0  # in the past of the machine's clock


def xid_finding(node: str, ts: float) -> r.Finding:
    """The finding stage 1 makes of an XID 79 on ``node`` at ``ts``."""
    stage, rng = NodeDetection(Settings().detection), np.random.default_rng(0)
    found: list[r.Finding] = []
    for k in range(5, -1, -1):
        t = ts - 10 * k
        found += stage.on_gpu([gpu_message(node, t, rng, xids=[r.XidEvent(gpu=1, xid=79, ts=t)] if k == 0 else None)])
    (finding,) = found
    return finding
