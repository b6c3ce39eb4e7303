"""The commands the docs give a user run here: each is lifted from the page as written and run
against records fleetmedic encodes, so a renamed field or flag fails a test instead of a user."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from fleetmedic import records as r
from tests.conftest import require_tool

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _jq() -> str:
    return require_tool("jq", why="Debian's jq package; scripts/test installs it")


def test_the_kcat_incident_filter_in_operations_selects_hardware_incidents() -> None:
    page = (DOCS / "operations.md").read_text()
    m = re.search(r"kcat -b \$KAFKA -G ticketing fleetmedic\.incidents \| jq -c '(.+?)'", page, re.S)
    assert m, "the kcat example is gone from docs/operations.md"
    program = m.group(1)

    def incident(i: str, klass: r.IncidentClass) -> bytes:
        return r.encode(r.Incident(id=i, incident_class=klass, confidence=0.9, evidence=[], first_seen=1.0,
                                   status="open", summary=f"{klass} on gpu-node-3",
                                   suspects=[r.Suspect(kind="node", name="gpu-node-3"),
                                             r.Suspect(kind="switch", name="leaf-1")]))

    stream = incident("inc-1", "hardware") + b"\n" + incident("inc-2", "network") + b"\n"
    out = subprocess.run([_jq(), "-c", program], input=stream, capture_output=True, timeout=30, check=True)
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert rows == [{"id": "inc-1", "status": "open", "summary": "hardware on gpu-node-3", "nodes": ["gpu-node-3"]}]
