"""Negative controls: events that look like faults but ask for no action (application XIDs, scrape
artefacts, a single XID 63, checkpoints, stalls, planned restarts and reboots).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetmedic.sim import logs
from fleetmedic.sim import xids as xidlib
from fleetmedic.sim.faults.base import Fault, FaultHost
from fleetmedic.sim.faults.jobs import JobFault
from fleetmedic.sim.telemetry import GpuTick

if TYPE_CHECKING:
    from fleetmedic.sim.workload import Job


class AppXid(Fault):
    """An XID caused by the application (13, 31: its process dies with an illegal memory access and a
    retry succeeds; 43: reported as the process is killed; others per bucket). Never a reason to
    isolate the node."""

    @property
    def code(self) -> int:
        return int(self.params.get("xid", 13))

    def on_start(self, host: FaultHost, t: float) -> None:
        self._done = False

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        if self._done:
            return
        self._done = True
        code = self.code
        self.xid(host, self.onset, code)
        job = host.workload.job_on(self.node)
        if job is not None and job.active():
            self.affected.append(job.ref)
            if code in (13, 31) or xidlib.info(code).bucket == "RESTART_APP":
                lines = logs.cuda_error("an illegal memory access was encountered")
                rep = self.culprit_or_peer(host, job, self.onset + 1, self.node, self.gpu, 1, "Error", lines, 0.9)
                host.kill(job, self.onset + 1.0, rep, self)
        self.end = self.onset + 1.0


class PartialScrape(Fault):
    """Partial scrapes: now and then one round of the node's telemetry lacks one GPU (an exporter
    timing out on one device, a scrape cut short), one round at a time, 2-10 min apart. The GPU is
    fine: missing data, not a GPU fallen off the bus. No action."""

    def on_start(self, host: FaultHost, t: float) -> None:
        self._next = t

    def gpu_post(self, tick: GpuTick) -> None:
        if tick.t >= self._next:
            tick.blank[self.node, self.gpu] = True
            self._next = tick.t + float(self.rng.uniform(120.0, 600.0))


class MisalignedScrape(Fault):
    """Misaligned scrapes: now and then one GPU's series are stamped a millisecond apart from the
    rest of the node's scrape, so one round arrives as two records (the node's other GPUs, then that
    GPU alone), 2-10 min apart. Nothing is wrong with the GPU. No action."""

    def on_start(self, host: FaultHost, t: float) -> None:
        self._next = t

    def gpu_post(self, tick: GpuTick) -> None:
        if tick.t >= self._next:
            tick.split[self.node, self.gpu] = True
            self._next = tick.t + float(self.rng.uniform(120.0, 600.0))


class Xid63Single(Fault):
    """One row remap (XID 63): a correctable-rows count goes up and a remap is pending until the next
    GPU reset. Normal wear; no action."""

    def on_start(self, host: FaultHost, t: float) -> None:
        host.gpu.corr_rows[self.node, self.gpu] += 1
        host.gpu.remap_pending[self.node, self.gpu] = 1
        self.xid(host, t, 63)
        self.end = t + 1.0


class CheckpointSlowdown(JobFault):
    """The job's next checkpoint takes 5-10x longer (slow storage): every rank idles meanwhile."""

    def job_started(self, host: FaultHost, job: Job, t: float) -> None:
        mul = float(self.params.setdefault("factor", round(float(self.rng.uniform(5.0, 10.0)), 2)))
        job.ckpt_mul = mul
        nxt = max(t, job.last_ckpt_t + job.ckpt_interval)
        self.end = nxt + job.ckpt_s * mul


class DataloaderStall(JobFault):
    """Input pipeline stalls slow every rank of the job (step time +20-60 %) for a while."""

    def job_started(self, host: FaultHost, job: Job, t: float) -> None:
        self.params.setdefault("stall", round(float(self.rng.uniform(0.2, 0.6)), 3))
        job.stall_extra += float(self.params["stall"])

    def on_stop(self, host: FaultHost, t: float) -> None:
        job = host.workload.jobs[self.job_idx]
        job.stall_extra = max(0.0, job.stall_extra - float(self.params["stall"]))


class PlannedRestart(JobFault):
    """The owner restarts the job (new code, new hyper-parameters): it stops and resumes from its last
    checkpoint."""

    def job_started(self, host: FaultHost, job: Job, t: float) -> None:
        host.workload.restart(job, t, "user", "user requested restart (kubectl delete pods)")
        self.end = t + 1.0


class PlannedReboot(Fault):
    """Planned maintenance on an idle node (kernel update), as an operator does it: cordon the node,
    drain what runs there, reboot (down for a few minutes, back with a new boot id and counters
    restarted from zero), uncordon a couple of minutes after it is back (``params.uncordon_after_s``).
    fleetmedic sees the cordon, made by someone else, through its node observations."""

    def on_start(self, host: FaultHost, t: float) -> None:
        after = float(self.params.setdefault("uncordon_after_s", 120.0))
        self.params["up_at"] = self.end
        self.end += after
        host.set_operator_cordon(self.node, t, True)
        job = host.workload.job_on(self.node)
        if job is not None and job.active():  # the operator drains it first: a planned restart elsewhere
            self.affected.append(job.ref)
            host.workload.restart(job, t, "user", f"node {host.fleet.node_names[self.node]} drained for planned "
                                  "maintenance", exclude={self.node})
        host.set_node_down(self.node, t, True)

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        if "booted" not in self.params and t1 >= float(self.params["up_at"]):
            self.params["booted"] = True
            self._boot(host, t1)

    def on_stop(self, host: FaultHost, t: float) -> None:
        if "booted" not in self.params:
            self.params["booted"] = True
            self._boot(host, t)
        host.set_operator_cordon(self.node, t, False)

    def _boot(self, host: FaultHost, t: float) -> None:
        host.gpu.reboot(self.node)
        host.ports.reboot_device(self.node)
        host.set_node_down(self.node, t, False)

