"""The fault base: what a fault may touch (:class:`FaultHost`), a kind's declaration (:class:`KindInfo`)
and :class:`Fault`: lifecycle, telemetry hooks, job strikes, truth. The kinds subclass it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fleetmedic.evaluation.truth import Blame, Component, ExpectedResponse, FaultClass, TruthRecord
from fleetmedic.sim import logs
from fleetmedic.sim import xids as xidlib
from fleetmedic.sim.logs import FailureReport
from fleetmedic.sim.telemetry import GpuTick, PortTick

if TYPE_CHECKING:
    from fleetmedic.sim.fleet import Fleet
    from fleetmedic.sim.telemetry import GpuModel, PortModel
    from fleetmedic.sim.workload import Job, Workload


ELASTIC_HINT = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
REMEDY_LEVEL = {"none": 0, "reset_gpu": 1, "reboot": 2, "repair": 3}
ReportFn = Callable[["FaultHost", "Job", float], FailureReport]


class FaultHost(Protocol):
    """What a fault may touch (the engine implements it)."""

    fleet: Fleet
    workload: Workload
    gpu: GpuModel
    ports: PortModel

    def kill(self, job: Job, t: float, report: FailureReport, fault: Fault) -> None: ...
    def hang(self, job: Job, t: float, report: FailureReport, fault: Fault) -> None: ...
    def set_node_down(self, node: int, t: float, down: bool) -> None: ...
    def set_operator_cordon(self, node: int, t: float, cordoned: bool) -> None: ...
    def skew(self, node: int) -> float: ...


@dataclass(frozen=True)
class KindInfo:
    name: str
    fault_class: FaultClass
    component: Component
    expected: ExpectedResponse
    remedy: str
    duration_s: tuple[float, float]
    target: str  # gpu | node | nic | leaf | job | idle_node
    weight: float  # share in the random mix
    diag_detect: float  # probability that diagnostics fail while it is active
    symptoms: tuple[str, ...]
    description: str
    factory: Callable[..., Fault]


class Fault:
    """Base: lifecycle, job strikes, truth. Subclasses override the hooks they need."""

    def __init__(self, info: KindInfo, fid: str, onset: float, end: float, rng: np.random.Generator, *,
                 node: int = -1, gpu: int = -1, nic: int = -1, leaf: int = -1, source: str = "spec",
                 params: dict[str, Any] | None = None) -> None:
        self.info = info
        self.id = fid
        self.onset = onset
        self.planned_onset = onset
        self.end = end
        self.rng = rng
        self.pinned = False
        self.node = node
        self.gpu = gpu
        self.nic = nic
        self.leaf = leaf
        self.source = source
        self.params: dict[str, Any] = dict(params or {})
        self.job_ref = ""
        self.started = False
        self.active = False
        self.cleared_at: float | None = None
        self.cleared_by = ""
        self.affected: list[str] = []
        self.emitted_xids: list[int] = []
        self.dropped = False
        self.observed = False  # active at some tick while one of its nodes was not away for repair
        self._plan: dict[tuple[int, int], float] = {}
        self._struck: set[tuple[int, int]] = set()

    # --- identity ------------------------------------------------------------------------------

    @property
    def kind(self) -> str:
        return self.info.name

    @property
    def remedy(self) -> str:
        return self.info.remedy

    def nodes(self, fleet: Fleet) -> list[int]:
        if self.leaf >= 0:
            return fleet.leaf_nodes(self.leaf)
        return [self.node] if self.node >= 0 else []

    def isolate_nodes(self, fleet: Fleet) -> list[int]:
        if self.info.expected in ("isolate_node", "isolate_link", "isolate_switch"):
            return self.nodes(fleet)
        return []

    def blame(self, fleet: Fleet) -> list[Blame]:
        names = fleet.node_names
        c = self.info.component
        if c == "switch":
            return [Blame(kind="switch", name=fleet.leaf_names[self.leaf])]
        if c == "job":
            return [Blame(kind="job", name=self.job_ref)] if self.job_ref else []
        out: list[Blame] = []
        if c == "gpu" and self.node >= 0 and self.gpu >= 0:
            out.append(Blame(kind="gpu", name=f"{names[self.node]}/{self.gpu}"))
        if c in ("link", "nic") and self.node >= 0 and self.nic >= 0:
            pi = fleet.ports
            leaf = fleet.leaf_names[int(pi.leaf_of[self.node, self.nic])]
            out.append(Blame(kind="link", name=f"{leaf}:{pi.name[int(pi.leaf_port[self.node, self.nic])]}"))
            out.append(Blame(kind="link", name=f"{names[self.node]}:mlx5_{self.nic}"))
        if self.node >= 0:
            out.append(Blame(kind="node", name=names[self.node]))
        return out

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self, host: FaultHost, t: float) -> None:
        self.started = True
        self.active = True
        self.on_start(host, t)

    def stop(self, host: FaultHost, t: float, by: str = "") -> None:
        if not self.active:
            return
        self.active = False
        if by:
            self.cleared_at = t
            self.cleared_by = by
        self.on_stop(host, t)

    def on_start(self, host: FaultHost, t: float) -> None:
        pass

    def on_stop(self, host: FaultHost, t: float) -> None:
        pass

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        self.note_jobs(host)

    def slow(self, t: float, rank_slow: np.ndarray, net_slow: np.ndarray) -> None:
        pass

    def gpu_pre(self, tick: GpuTick) -> None:
        pass

    def gpu_post(self, tick: GpuTick) -> None:
        pass

    def port_pre(self, tick: PortTick) -> None:
        pass

    def port_post(self, tick: PortTick) -> None:
        pass

    # --- helpers for subclasses ------------------------------------------------------------------

    def note_jobs(self, host: FaultHost) -> None:
        for job in self.jobs_on(host):
            if job.ref not in self.affected:
                self.affected.append(job.ref)

    def jobs_on(self, host: FaultHost) -> list[Job]:
        wl = host.workload
        seen: dict[int, Job] = {}
        for n in self.nodes(host.fleet):
            j = wl.job_on(n)
            if j is not None and j.active():
                seen.setdefault(j.idx, j)
        return list(seen.values())

    def strike(self, host: FaultHost, t0: float, t1: float, mode: str, report: ReportFn,
               first_delay: tuple[float, float] = (1.0, 5.0), later_delay: tuple[float, float] = (20.0, 60.0),
               persistent: bool = True, since: float | None = None) -> None:
        """Crash or hang every job attempt on the fault's nodes: the one running at ``since`` (default:
        the onset) after ``first_delay``, later attempts (if ``persistent``) ``later_delay`` after they
        start."""
        since = self.onset if since is None else since
        for job in self.jobs_on(host):
            if job.ref not in self.affected:
                self.affected.append(job.ref)
            key = (job.idx, job.attempt)
            if key in self._struck:
                continue
            at = self._plan.get(key)
            if at is None:
                if job.attempt_started <= since:
                    at = since + float(self.rng.uniform(*first_delay))
                elif persistent:
                    at = max(t0, job.attempt_started + float(self.rng.uniform(*later_delay)))
                else:
                    continue
                self._plan[key] = at
            if at > t1:
                continue
            self._struck.add(key)
            rep = report(host, job, at)
            if mode == "hang":
                host.hang(job, at, rep, self)
            else:
                host.kill(job, at, rep, self)

    def rank_of(self, host: FaultHost, job: Job, node: int, gpu: int) -> int:
        return job.nodes.index(node) * host.fleet.g + max(gpu, 0) if node in job.nodes else 0

    def pid(self) -> int:
        return int(self.rng.integers(1000, 400_000))

    def culprit_or_peer(self, host: FaultHost, job: Job, t: float, node: int, gpu: int, exit_code: int,
                        reason: str, culprit_lines: list[str], p_culprit: float = 0.85) -> FailureReport:
        """The controller reports the first pod that exited: usually the culprit's, sometimes a peer
        that died of the NCCL error first."""
        fleet = host.fleet
        g = fleet.g
        others = [n for n in job.nodes if n != node]
        if node in job.nodes and (not others or self.rng.random() < p_culprit):
            rank = self.rank_of(host, job, node, gpu)
            pid = self.pid()
            ts = t + host.skew(node)
            lines = [*culprit_lines,
                     *logs.torchrun_root_cause(ts, fleet.node_names[node], rank, rank % g, 1, pid, ELASTIC_HINT)]
            return FailureReport(exit_code, reason, rank, node, lines)
        peer = others[int(self.rng.integers(0, len(others)))] if others else node
        lg = int(self.rng.integers(0, g))
        rank = job.nodes.index(peer) * g + lg
        pid = self.pid()
        lines = logs.nccl_peer_lost(fleet.node_names[peer], pid, pid + 31, lg,
                                    fleet.node_names[node] if node >= 0 else "unknown", rank)
        return FailureReport(1, "Error", rank, peer, lines)

    def watchdog_report(self, host: FaultHost, job: Job, t: float) -> FailureReport:
        """Every rank times out together; the controller reports whichever pod exited first."""
        fleet = host.fleet
        g = fleet.g
        pos = int(self.rng.integers(0, len(job.nodes)))
        node = job.nodes[pos]
        lg = int(self.rng.integers(0, g))
        rank = pos * g + lg
        job.seq += int(self.rng.integers(1000, 5000))
        ts = t + host.skew(node)
        pid = self.pid()
        lines = [*logs.nccl_watchdog_timeout(ts, rank, job.seq, int(self.rng.integers(1, 64)) * 4_194_304,
                                             int(host.workload.spec.nccl_timeout_s * 1000)),
                 *logs.torchrun_root_cause(ts + 4, fleet.node_names[node], rank, lg, -6, pid,
                                           f"Signal 6 (SIGABRT) received by PID {pid}")]
        return FailureReport(1, "Error", rank, node, lines)

    def xid(self, host: FaultHost, t: float, code: int, gpu: int | None = None, node: int | None = None) -> None:
        n = self.node if node is None else node
        g = self.gpu if gpu is None else gpu
        pid = self.pid() if host.workload.job_on(n) is not None else None
        host.gpu.emit_xid(n, g, code, t, xidlib.nvrm_line(code, host.fleet.pci(g), pid))
        if code not in self.emitted_xids:
            self.emitted_xids.append(code)

    # --- truth ------------------------------------------------------------------------------------

    def truth(self, fleet: Fleet) -> TruthRecord:
        names = fleet.node_names
        pi = fleet.ports
        port = ""
        if self.nic >= 0 and self.node >= 0:
            port = (f"mlx5_{self.nic}" if self.info.component == "nic"
                    else pi.name[int(pi.leaf_port[self.node, self.nic])])
        switch = ""
        if self.leaf >= 0:
            switch = fleet.leaf_names[self.leaf]
        elif self.nic >= 0 and self.node >= 0:
            switch = fleet.leaf_names[int(pi.leaf_of[self.node, self.nic])]
        return TruthRecord(
            id=self.id,
            kind=self.kind,
            fault_class=self.info.fault_class,
            component=self.info.component,
            onset=round(self.onset, 3),
            end=round(self.end, 3),
            expected_response=self.info.expected,
            blame=self.blame(fleet),
            node=names[self.node] if self.node >= 0 else "",
            nodes=[names[n] for n in self.nodes(fleet)],
            isolate_nodes=[names[n] for n in self.isolate_nodes(fleet)],
            gpu=self.gpu if self.gpu >= 0 else None,
            port=port,
            switch=switch,
            job=self.job_ref,
            affected_jobs=list(self.affected) or ([self.job_ref] if self.job_ref else []),
            xids=sorted(self.emitted_xids),
            symptoms=list(self.info.symptoms),
            source=self.source,
            description=self.info.description,
            params={k: str(v) for k, v in sorted(self.params.items())},
            cleared_at=round(self.cleared_at, 3) if self.cleared_at is not None else None,
            cleared_by=self.cleared_by,
            unobserved="" if self.observed else "repair",
        )

