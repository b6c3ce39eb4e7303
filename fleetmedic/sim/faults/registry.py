"""The registry of fault kinds: each kind's declaration (:data:`KINDS`), lookup and construction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleetmedic.evaluation.truth import Component, ExpectedResponse, FaultClass
from fleetmedic.sim import xids as xidlib
from fleetmedic.sim.faults.base import Fault, KindInfo
from fleetmedic.sim.faults.controls import (
    AppXid,
    CheckpointSlowdown,
    DataloaderStall,
    MisalignedScrape,
    PartialScrape,
    PlannedReboot,
    PlannedRestart,
    Xid63Single,
)
from fleetmedic.sim.faults.gpu import (
    GpuHardFault,
    HbmDegradation,
    NvlinkBurst,
    NvlinkDegradingSlow,
    NvlinkErrors,
    PcieDegradation,
    Straggler,
)
from fleetmedic.sim.faults.jobs import JobBug, NcclTimeout, Oom, WorkerCrash
from fleetmedic.sim.faults.network import IbBer, LeafFailure, NicDown, NicFlap, NicSpeedLow
from fleetmedic.sim.faults.node import FanFailure, NodeCrash, PsuFailure

H, M = 3600.0, 60.0
_HARD = (6 * H, 24 * H)


def _k(name: str, cls: FaultClass, comp: Component, exp: ExpectedResponse, remedy: str, dur: tuple[float, float],
       target: str, weight: float, diag: float, symptoms: tuple[str, ...], factory: Callable[..., Fault],
       desc: str = "") -> KindInfo:
    return KindInfo(name, cls, comp, exp, remedy, dur, target, weight, diag, symptoms,
                    desc or " ".join((factory.__doc__ or "").split("\n\n")[0].split()), factory)


def _hard(code: int, remedy: str, weight: float, symptoms: tuple[str, ...], desc: str) -> KindInfo:
    return _k(f"xid{code}", "hardware", "gpu", "isolate_node", remedy, _HARD, "gpu", weight, 0.97,
              (f"xid:{code}", *symptoms), GpuHardFault, desc)


KINDS: dict[str, KindInfo] = {
    k.name: k
    for k in (
        _hard(79, "reboot", 8, ("gpu_missing", "job_failure", "log:unspecified launch failure"),
              "GPU has fallen off the bus"),
        _hard(48, "reset_gpu", 6, ("xid:63", "up:ecc_dbe_vol_total", "up:row_remap_pending", "job_failure",
                                  "log:uncorrectable ECC error"), "double-bit ECC error"),
        _hard(64, "repair", 2, ("xid:48", "up:row_remap_failure", "job_failure"), "row remapping failure"),
        _hard(95, "reset_gpu", 2, ("up:ecc_dbe_vol_total", "job_failure"), "uncontained memory error"),
        _hard(119, "reset_gpu", 4, ("job_hang", "log:Watchdog caught collective operation timeout"),
              "GSP RPC timeout: the GPU is wedged"),
        _hard(74, "reset_gpu", 3, ("up:nvlink_links_down", "up:nvlink_recovery_error_count_total", "job_failure"),
              "fatal NVLink error"),
        _k("hbm_degradation", "degradation", "gpu", "isolate_node", "repair", (2 * H, 5 * H), "gpu", 5, 0.9,
           ("up:ecc_sbe_vol_total", "up:correctable_remapped_rows", "xid:63", "xid:48", "job_failure"), HbmDegradation),
        _k("straggler", "degradation", "gpu", "isolate_node", "repair", (2 * H, 8 * H), "gpu", 8, 0.8,
           ("down:sm_clock", "reason:throttle", "rank_slowdown", "step_slowdown"), Straggler),
        _k("nvlink_errors", "degradation", "gpu", "isolate_node", "repair", (2 * H, 8 * H), "gpu", 4, 0.9,
           ("up:nvlink_crc_flit_error_count_total", "up:nvlink_replay_error_count_total"), NvlinkErrors),
        # weight 0: not drawn by `mix` (its plan stays as it was); in `all`, or asked for by name
        _k("nvlink_degrading_slow", "degradation", "gpu", "isolate_node", "repair", (3 * H, 8 * H), "gpu", 0, 0.9,
           ("up:nvlink_crc_flit_error_count_total", "up:nvlink_replay_error_count_total", "nvlink_siblings_flat"),
           NvlinkDegradingSlow),
        _k("nvlink_burst", "degradation", "gpu", "isolate_node", "repair", (1 * H, 4 * H), "gpu", 0, 0.9,
           ("up:nvlink_crc_flit_error_count_total", "up:nvlink_replay_error_count_total", "nvlink_siblings_flat"),
           NvlinkBurst),
        _k("pcie_degradation", "degradation", "gpu", "isolate_node", "repair", (2 * H, 8 * H), "gpu", 3, 0.9,
           ("down:pcie_link_width", "up:pcie_replay_counter", "rank_slowdown"), PcieDegradation),
        _k("nic_flap", "network", "nic", "isolate_node", "repair", (40 * M, 3 * H), "nic", 6, 0.6,
           ("link_down", "port_up:link_downed_counter", "port_up:symbol_error_counter"), NicFlap),
        _k("ib_ber", "network", "link", "isolate_link", "repair", (1 * H, 6 * H), "nic", 5, 0.3,
           ("ber_up", "port_up:symbol_error_counter", "port_up:port_rcv_errors", "step_slowdown"), IbBer),
        _k("leaf_switch", "network", "switch", "isolate_switch", "switch_repair", (30 * M, 2 * H), "leaf", 1.5, 1.0,
           ("device_missing", "link_down", "job_failure", "log:NET/IB : Got completion from peer"), LeafFailure),
        _k("nic_down", "network", "nic", "isolate_node", "repair", _HARD, "nic", 2, 1.0,
           ("link_down", "job_failure", "log:status=12"), NicDown),
        _k("nic_speed_low", "network", "nic", "isolate_node", "repair", _HARD, "nic", 2, 0.5,
           ("port_speed_low", "step_slowdown"), NicSpeedLow),
        _k("fan_failure", "hardware", "node", "isolate_node", "repair", (2 * H, 12 * H), "node", 2, 0.8,
           ("gauge_up:gpu_temp", "reason:throttle", "step_slowdown"), FanFailure),
        _k("psu_failure", "hardware", "node", "isolate_node", "repair", (2 * H, 12 * H), "node", 2, 0.7,
           ("reason:power_brake", "step_slowdown"), PsuFailure),
        _k("node_crash", "hardware", "node", "isolate_node", "repair", (2 * H, 12 * H), "node", 3, 1.0,
           ("node_missing", "job_failure"), NodeCrash),
        _k("nccl_timeout", "transient_software", "job", "retry_in_place", "none", (10 * M, 10 * M), "job", 5, 0.0,
           ("job_hang", "job_failure", "log:Watchdog caught collective operation timeout"), NcclTimeout),
        _k("worker_crash", "transient_software", "job", "retry_in_place", "none", (1 * M, 1 * M), "job", 4, 0.0,
           ("job_failure", "log:DataLoader worker"), WorkerCrash),
        _k("oom", "transient_software", "job", "retry_in_place", "none", (5 * M, 5 * M), "job", 3, 0.0,
           ("fb_high", "job_failure", "log:torch.OutOfMemoryError: CUDA out of memory"), Oom),
        _k("job_bug", "job_bug", "job", "fix_job", "none", (45 * M, 3 * H), "job", 3, 0.0,
           ("job_failure", "repeat_failure"), JobBug),
        _k("xid13", "negative_control", "gpu", "no_action", "none", (1.0, 1.0), "busy_gpu", 3, 0.0,
           ("xid:13", "job_failure", "log:an illegal memory access"), AppXid, "XID 13 from an application fault"),
        _k("xid31", "negative_control", "gpu", "no_action", "none", (1.0, 1.0), "busy_gpu", 2, 0.0,
           ("xid:31", "job_failure"), AppXid, "XID 31 (MMU fault) from an application fault"),
        _k("xid43", "negative_control", "gpu", "no_action", "none", (1.0, 1.0), "busy_gpu", 2, 0.0,
           ("xid:43",), AppXid, "XID 43 as an application is killed"),
        _k("xid63", "negative_control", "gpu", "no_action", "none", (1.0, 1.0), "gpu", 3, 0.0,
           ("xid:63", "up:correctable_remapped_rows"), Xid63Single),
        _k("partial_scrape", "negative_control", "gpu", "no_action", "none", (30 * M, 2 * H), "gpu", 0, 0.0,
           ("gpu_absent_briefly",), PartialScrape),
        _k("misaligned_scrape", "negative_control", "gpu", "no_action", "none", (30 * M, 2 * H), "gpu", 0, 0.0,
           ("scrape_split",), MisalignedScrape),
        _k("checkpoint_slowdown", "negative_control", "job", "no_action", "none", (30 * M, 30 * M), "job", 2, 0.0,
           ("job_idle",), CheckpointSlowdown),
        _k("dataloader_stall", "negative_control", "job", "no_action", "none", (10 * M, 30 * M), "job", 2, 0.0,
           ("step_slowdown",), DataloaderStall),
        _k("planned_restart", "negative_control", "job", "no_action", "none", (1.0, 1.0), "job", 2, 0.0,
           ("restart_event",), PlannedRestart),
        _k("planned_reboot", "negative_control", "node", "no_action", "none", (5 * M, 12 * M), "idle_node", 2, 0.0,
           ("node_missing", "boot_id_change", "port_up:link_downed_counter"), PlannedReboot),
    )
}


def kind_info(name: str) -> KindInfo:
    """The kind called ``name``; ``xid<N>`` for codes beyond the table picks a behaviour by bucket."""
    info = KINDS.get(name)
    if info is not None:
        return info
    if name.startswith("xid") and name[3:].isdigit():
        code = int(name[3:])
        xi = xidlib.info(code)
        if xidlib.isolating(code):
            remedy = "reboot" if xi.bucket == "RESTART_BM" else "reset_gpu"
            return _k(name, "hardware", "gpu", "isolate_node", remedy, _HARD, "gpu", 0, 0.95,
                      (f"xid:{code}", "job_failure"), GpuHardFault, f"XID {code} {xi.mnemonic} ({xi.bucket})")
        return _k(name, "negative_control", "gpu", "no_action", "none", (1.0, 1.0), "busy_gpu", 0, 0.0,
                  (f"xid:{code}",), AppXid, f"XID {code} {xi.mnemonic} ({xi.bucket or 'no bucket'})")
    raise ValueError(f"unknown fault kind {name!r} (known: {', '.join(KINDS)}, or xid<N>)")


def leaves_node_dead(name: str) -> bool:
    """Faults that leave a GPU or the node unusable at once (a fatal XID, the node crashed): what
    fleetmedic must isolate without waiting for any budget."""
    try:
        info = kind_info(name)
    except ValueError:
        return False
    return info.fault_class == "hardware" and info.factory in (GpuHardFault, NodeCrash)


def make_fault(name: str, fid: str, onset: float, duration: float, rng: np.random.Generator, *, node: int = -1,
               gpu: int = -1, nic: int = -1, leaf: int = -1, source: str = "spec",
               params: dict[str, Any] | None = None) -> Fault:
    info = kind_info(name)
    p = dict(params or {})
    if name.startswith("xid") and name[3:].isdigit():
        p.setdefault("xid", int(name[3:]))
    return info.factory(info, fid, onset, onset + duration, rng, node=node, gpu=gpu, nic=nic, leaf=leaf,
                        source=source, params=p)


@dataclass
class FaultSet:
    """The faults of one run, in onset order."""

    faults: list[Fault] = field(default_factory=list)

    def active(self) -> list[Fault]:
        return [f for f in self.faults if f.active]
