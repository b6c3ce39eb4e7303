"""The XIDs the simulator emits: code, mnemonic, NVIDIA's immediate-action bucket, and the driver's
message as ``NVRM`` prints it.

Buckets come from NVIDIA's XID catalog (shipped as ``fleetmedic/data/xids.csv``, column
"Resolution Bucket (Immediate Action)", parsed by :mod:`fleetmedic.models.xid_catalog`).
``RESTART_APP``/``IGNORE`` codes must not isolate a node by themselves;
``RESET_GPU``/``RESTART_BM`` and the workflow buckets of 48/74 do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class XidInfo:
    code: int
    mnemonic: str
    bucket: str
    message: str  # after "NVRM: Xid (PCI:0000:BB:00): NN, pid=..., name=..., "


_TABLE: Final[tuple[XidInfo, ...]] = (
    XidInfo(8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "RESTART_APP", "Channel 00000018 GPU stopped processing"),
    XidInfo(13, "ROBUST_CHANNEL_GR_EXCEPTION", "RESTART_APP",
            "Graphics SM Warp Exception on (GPC 3, TPC 1, SM 0): Out Of Range Address"),
    XidInfo(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP",
            "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_2 faulted @ 0x7f3a_4e000000. "
            "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"),
    XidInfo(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "IGNORE", "Ch 00000010"),
    XidInfo(45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "WORKFLOW_XID_45", "Ch 00000010"),
    XidInfo(46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "RESET_GPU", "GPU stopped processing"),
    XidInfo(48, "ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48",
            "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
            "partition 6, subpartition 1."),
    XidInfo(61, "PMU_BREAKPOINT", "CONTACT_SUPPORT", "Internal micro-controller breakpoint/warning"),
    XidInfo(62, "PMU_HALT_ERROR", "RESET_GPU", "Internal micro-controller halt"),
    XidInfo(63, "INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE",
            "Row Remapper: New row (0x00000000000a2f40) marked for remapping, reset gpu to activate."),
    XidInfo(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU",
            "Row Remapper Error: Failed to remap row (0x00000000000a2f40), the row remapping table is full."),
    XidInfo(74, "NVLINK_ERROR", "WORKFLOW_NVLINK_ERR",
            "NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"),
    XidInfo(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", "GPU has fallen off the bus."),
    XidInfo(92, "EXCESSIVE_SBE_INTERRUPTS", "IGNORE", "High single-bit ECC error rate"),
    XidInfo(94, "ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP", "Contained: SM (0x1). RST: No, D-RST: No"),
    XidInfo(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU", "Uncontained: LTC TAG (0x2,0x0). RST: Yes, D-RST: No"),
    XidInfo(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "RESET_GPU",
            "Ch 00000010, errorString CTX SWITCH TIMEOUT, Info 0x3c025"),
    XidInfo(119, "GSP_RPC_TIMEOUT", "RESET_GPU",
            "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) "
            "(0x20800a4c 0x4)."),
    XidInfo(120, "GSP_ERROR", "RESET_GPU", "GSP task timeout @ pc:0x4bd36ae, task: 1"),
    XidInfo(136, "ALI_TRAINING_FAIL", "RESET_GPU", "Link Training Failed"),
    XidInfo(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "RESET_GPU",
            "An uncorrectable ECC error escaped the containment boundary"),
    XidInfo(143, "GPU_INIT_ERROR", "RESET_GPU", "GPU Initialization Failure"),
)

XIDS: Final[dict[int, XidInfo]] = {x.code: x for x in _TABLE}

#: buckets that make an XID, on its own, a reason to isolate the GPU's node
ISOLATING_BUCKETS: Final[frozenset[str]] = frozenset(
    {"RESET_GPU", "RESTART_BM", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR", "CHECK_MECHANICALS"}
)


def info(code: int) -> XidInfo:
    return XIDS.get(code) or XidInfo(code, f"XID_{code}", "CONTACT_SUPPORT", f"Xid {code} reported")


def isolating(code: int) -> bool:
    return info(code).bucket in ISOLATING_BUCKETS


def nvrm_line(code: int, pci: str, pid: int | None = None, process: str = "python") -> str:
    """The kernel log line, e.g. ``NVRM: Xid (PCI:0000:3a:00): 79, pid='<unknown>', name=<unknown>, …``."""
    who = f"pid={pid}, name={process}" if pid is not None else "pid='<unknown>', name=<unknown>"
    return f"NVRM: Xid (PCI:0000:{pci}:00): {code}, {who}, {info(code).message}"
