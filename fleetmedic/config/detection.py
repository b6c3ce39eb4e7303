"""Stage 1's detectors: baselines, per-metric thresholds, peers, stragglers, the multivariate model,
XIDs, InfiniBand counters, sibling GPUs."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from fleetmedic.config.section import Fraction, NonNegFloat, NonNegInt, PosFloat, PosInt, Section


class BaselineSettings(Section, frozen=True, kw_only=True):
    warmup_samples: PosInt = 30
    halflife_samples: PosFloat = 120.0
    protect_z: PosFloat = 4.0
    min_std: PosFloat = 0.5


class MetricThreshold(Section, frozen=True, kw_only=True):
    direction: Literal["up", "down", "both"] = "up"
    z_warning: PosFloat = 4.0
    z_critical: PosFloat = 8.0
    min_delta: NonNegFloat = 0.0


def _default_metric_thresholds() -> dict[str, MetricThreshold]:
    return {
        "gpu_temp": MetricThreshold(direction="up", min_delta=5.0),
        "memory_temp": MetricThreshold(direction="up", min_delta=5.0),
        "sm_clock": MetricThreshold(direction="down", min_delta=100.0),
        "ecc_sbe_rate": MetricThreshold(direction="up", z_warning=6.0, z_critical=12.0, min_delta=1.0),
        "pcie_replay_rate": MetricThreshold(direction="up", z_warning=6.0, z_critical=12.0, min_delta=1.0),
        "nvlink_error_rate": MetricThreshold(direction="up", z_warning=6.0, z_critical=12.0, min_delta=1.0),
    }


class CusumSettings(Section, frozen=True, kw_only=True):
    drift_k: NonNegFloat = 0.5
    threshold_h: PosFloat = 20.0


class PeerSettings(Section, frozen=True, kw_only=True):
    z_threshold: PosFloat = 3.5
    continuity_window_s: PosFloat = 120.0
    min_peers: Annotated[int, Meta(ge=2, le=100_000)] = 4
    # across a SKU fleet, temperatures are judged against what the node's power draw predicts ("": raw)
    sku_adjust_by: Literal["", "power_usage", "gpu_util", "sm_clock"] = "power_usage"
    # across a SKU fleet, a node is judged against its own usual deviation from the median, learned
    # with this half-life (frozen while it stands out); 0: against the median itself
    offset_halflife_s: NonNegFloat = 21_600.0
    # across a SKU fleet, the smallest spread of temperatures (degC) a node is measured against: inlet
    # air differs by a few degrees from rack to rack and sensors report whole degrees, so a node must
    # stand z_threshold times this above its usual place (7 degC by default); a failed fan heats by more
    sku_min_temp_spread_c: PosFloat = 2.0
    # a node's load band, from its median GPU utilisation (percent): nodes are compared with peers of
    # the same band ("idle" below the first, "busy" above the second, neither in between)
    idle_below_util: Annotated[float, Meta(ge=0.0, le=100.0)] = 10.0
    busy_above_util: Annotated[float, Meta(ge=0.0, le=100.0)] = 90.0

    def __post_init__(self) -> None:
        if self.idle_below_util > self.busy_above_util:
            raise ValueError("idle_below_util must not be above busy_above_util")


class StragglerSettings(Section, frozen=True, kw_only=True):
    slowdown_ratio: Annotated[float, Meta(gt=1.0, le=100.0)] = 1.10
    min_steps: PosInt = 5
    job_warmup_steps: PosInt = 20
    job_cusum_h: PosFloat = 10.0


class MultivariateSettings(Section, frozen=True, kw_only=True):
    enabled: bool = True
    algorithm: Literal["robust_covariance", "isolation_forest"] = "robust_covariance"
    window_s: PosFloat = 300.0
    refit_interval_s: PosFloat = 3600.0
    min_training_windows: PosInt = 64
    max_training_windows: PosInt = 20_000
    consecutive_windows: PosInt = 2
    distance_threshold: PosFloat = 25.0
    n_estimators: PosInt = 100
    score_threshold: Fraction = 0.65
    seed: NonNegInt = 0
    # a sample counts towards a window's features when the node's median GPU utilisation (percent) is
    # at least this (or not reported): an idle node's temperatures and clocks say little of its health
    busy_util: Annotated[float, Meta(ge=0.0, le=100.0)] = 50.0


def _default_ib_thresholds() -> dict[str, NonNegInt]:
    # rdma-core's default alert thresholds (per check interval), see BRIEF §3
    return {
        "symbol_error_counter": 10,
        "link_error_recovery_counter": 10,
        "link_downed_counter": 10,
        "port_rcv_errors": 10,
        "local_link_integrity_errors": 10,
        "excessive_buffer_overrun_errors": 10,
        "port_rcv_remote_physical_errors": 100,
        "port_xmit_discards": 100,
        "port_xmit_wait": 1000,
    }


# fleetmedic's action classes for XIDs; the NVIDIA catalog's buckets map onto them (models/xid_catalog.py)
XidAction = Literal["ignore", "restart_app", "reset_gpu", "reboot_node", "isolate", "investigate"]


class XidSettings(Section, frozen=True, kw_only=True):
    action_overrides: dict[Annotated[int, Meta(ge=0, le=100_000)], XidAction] = {}
    repeat_xids: list[int] = msgspec.field(default_factory=lambda: [13, 31, 43])
    repeat_count: Annotated[int, Meta(ge=2, le=1000)] = 2
    repeat_window_s: PosFloat = 3600.0
    repeat_max_gpus: Annotated[int, Meta(ge=1, le=1024)] = 2  # an XID on more GPUs at once is the application's
    repeat_burst_s: NonNegFloat = 10.0  # "at once": within this many seconds
    trend_xids: list[int] = msgspec.field(default_factory=lambda: [63, 94])
    trend_count: Annotated[int, Meta(ge=2, le=1000)] = 3
    trend_window_s: PosFloat = 86_400.0


class SiblingSettings(Section, frozen=True, kw_only=True):
    """A GPU's error rate against the median of its node's GPUs (detector ``gpu_siblings``): errors
    rising on one GPU while its siblings stay flat, however slowly (a per-GPU baseline can learn a
    slow rise as normal). Rates are per minute, smoothed per GPU with ``halflife_samples``."""

    signals: list[str] = msgspec.field(default_factory=lambda: ["nvlink_error_rate"])  # rate signals compared
    halflife_samples: PosFloat = 12.0
    min_excess: PosFloat = 3.0  # per minute above the median of the node's GPUs ...
    ratio: PosFloat = 4.0  # ... and at least this multiple of that median
    critical_excess: PosFloat = 60.0  # per minute (1/s: DCGM's limit for NVLink replay/recovery errors)
    min_gpus: Annotated[int, Meta(ge=2, le=256)] = 4  # GPUs of the node reporting the signal


class DetectionSettings(Section, frozen=True, kw_only=True):
    sample_interval_s: PosFloat = 10.0
    continuity_samples: PosInt = 4
    reassert_s: PosFloat = 600.0
    max_sample_gap_s: PosFloat = 120.0
    baseline: BaselineSettings = BaselineSettings()
    metrics: dict[str, MetricThreshold] = msgspec.field(default_factory=_default_metric_thresholds)
    cusum: CusumSettings = CusumSettings()
    peers: PeerSettings = PeerSettings()
    straggler: StragglerSettings = StragglerSettings()
    multivariate: MultivariateSettings = MultivariateSettings()
    xid: XidSettings = XidSettings()
    ib_thresholds: dict[str, NonNegInt] = msgspec.field(default_factory=_default_ib_thresholds)
    effective_ber_threshold: Fraction = 1.0e-12
    link_speed_min_ratio: Fraction = 0.9  # an up link below this share of its expected speed is degraded
    dbe_threshold: PosInt = 1
    thermal_throttle_fraction: Fraction = 0.2
    hw_thermal_is_hard: bool = True  # HW thermal slowdown (0x40) on a GPU is a hard fault (cooling)
    power_brake_min_gpu_fraction: Fraction = 0.5  # HW power brake (0x80) on this share of a node's GPUs: PSU; 0 = off
    # a GPU absent from a node's records (or listed with no values) is lost only once it was absent
    # from this many records in a row spanning this long: one partial or misaligned scrape is not a
    # GPU fallen off the bus. XID 79 for that GPU (NVML's lost-GPU error) confirms it at once
    gpu_missing_after_samples: PosInt = 3
    gpu_missing_after_s: NonNegFloat = 20.0
    # the same XID (node, GPU, code) from the kernel log and from NVML or dcgm within this many
    # seconds of event time is one event (models/event_dedup.py); 0: every report counts
    xid_dedup_window_s: Annotated[float, Meta(ge=0.0, le=3600.0)] = 60.0
    siblings: SiblingSettings = SiblingSettings()
    # stage 1's memory is bounded whatever node names arrive: a node silent this long (event time:
    # the latest record stamp stage 1 has seen) is forgotten, and beyond this many nodes a worker
    # forgets the least recently seen one. A forgotten node that returns starts fresh (baselines warm
    # up again: baseline.warmup_samples); its saved state is deleted from the state topic
    evict_node_after_s: PosFloat = 7 * 86400.0
    max_nodes_per_worker: PosInt = 50_000
