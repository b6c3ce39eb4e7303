"""NVIDIA's XID catalog (shipped as ``fleetmedic/data/xids.csv``) mapped onto fleetmedic's actions.

The catalog gives each XID an *immediate action* bucket. fleetmedic maps those buckets onto its
own action classes, which say what the XID means for the node:

==================  =======================================================  ==================
action              buckets                                                  isolates the node?
==================  =======================================================  ==================
``ignore``          IGNORE, XID_154 (informational), WORKFLOW_XID_45         no
``restart_app``     RESTART_APP, CHECK_UVM                                   no (job track only)
``reset_gpu``       RESET_GPU, WORKFLOW_XID_48 (DBE)                         yes
``reboot_node``     RESTART_BM, RESTART_VM                                   yes
``isolate``         WORKFLOW_NVLINK_ERR, WORKFLOW_NVLINK5_ERR,               yes
                    CHECK_MECHANICALS
``investigate``     CONTACT_SUPPORT, UPDATE_SWFW, unknown XIDs               no, by itself
==================  =======================================================  ==================

``detection.xid.action_overrides`` in the config replaces the action of any XID. Application-class
XIDs (13, 31, 43 …) never isolate by themselves; repetition rules in the GPU detector turn a
repeated one into node evidence.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Final

from fleetmedic.config import XidAction

#: the XID catalog's actions (not remediation actions: :mod:`fleetmedic.actions`) that call for isolating the node
ISOLATING_XID_ACTIONS: Final[frozenset[str]] = frozenset({"reset_gpu", "reboot_node", "isolate"})

BUCKET_ACTIONS: Final[dict[str, XidAction]] = {
    "IGNORE": "ignore",
    "XID_154": "ignore",
    "WORKFLOW_XID_45": "ignore",
    "RESTART_APP": "restart_app",
    "CHECK_UVM": "restart_app",
    "RESET_GPU": "reset_gpu",
    "WORKFLOW_XID_48": "reset_gpu",
    "RESTART_BM": "reboot_node",
    "RESTART_VM": "reboot_node",
    "WORKFLOW_NVLINK_ERR": "isolate",
    "WORKFLOW_NVLINK5_ERR": "isolate",
    "CHECK_MECHANICALS": "isolate",
    "CONTACT_SUPPORT": "investigate",
    "UPDATE_SWFW": "investigate",
}


@dataclass(frozen=True)
class XidInfo:
    code: int
    mnemonic: str
    bucket: str
    action: XidAction

    @property
    def isolates(self) -> bool:
        return self.action in ISOLATING_XID_ACTIONS


class XidCatalog:
    """XID code -> :class:`XidInfo`, with the config's overrides applied."""

    def __init__(self, entries: Mapping[int, XidInfo], overrides: Mapping[int, XidAction] | None = None) -> None:
        merged = dict(entries)
        for code, action in (overrides or {}).items():
            base = merged.get(code)
            merged[code] = XidInfo(code, base.mnemonic if base else "UNKNOWN", "override", action)
        self._entries = merged

    def lookup(self, code: int) -> XidInfo:
        info = self._entries.get(code)
        return info if info is not None else XidInfo(code, "UNKNOWN", "", "investigate")

    def __len__(self) -> int:
        return len(self._entries)


def parse_catalog(text: str) -> dict[int, XidInfo]:
    """Parse NVIDIA's catalog CSV (columns ``Code``, ``Mnemonic``, immediate-action bucket)."""
    reader = csv.reader(io.StringIO(text))
    header = next(reader)
    col_code = header.index("Code")
    col_mnemonic = header.index("Mnemonic")
    col_bucket = next(i for i, h in enumerate(header) if h.startswith("Resolution Bucket") and "Immediate" in h)
    out: dict[int, XidInfo] = {}
    for row in reader:
        if len(row) <= col_bucket or not row[col_code].strip().isdigit():
            continue
        code = int(row[col_code])
        bucket = row[col_bucket].strip()
        out[code] = XidInfo(code, row[col_mnemonic].strip(), bucket, BUCKET_ACTIONS.get(bucket, "investigate"))
    return out


@lru_cache(maxsize=1)
def _shipped_entries() -> dict[int, XidInfo]:
    text = resources.files("fleetmedic").joinpath("data/xids.csv").read_text(encoding="utf-8")
    return parse_catalog(text)


def default_catalog(overrides: Mapping[int, XidAction] | None = None) -> XidCatalog:
    """The catalog shipped with fleetmedic, with ``overrides`` from the config applied."""
    return XidCatalog(_shipped_entries(), overrides)
