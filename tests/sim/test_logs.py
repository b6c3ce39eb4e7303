"""Failure log excerpts look as PyTorch, torchrun, NCCL and the NVIDIA driver print them, and the
project's failure-pattern library recognises every excerpt the simulator attaches to a failure."""

from __future__ import annotations

import re

from fleetmedic.remediation.log_patterns import default_library
from fleetmedic.sim import logs, xids
from fleetmedic.sim.engine import SimConfig, Simulator
from fleetmedic.sim.fleet import FleetSpec
from fleetmedic.sim.workload import WorkloadSpec

T = 1_767_225_600.0 + 3723.25


def test_nccl_watchdog_line() -> None:
    lines = logs.nccl_watchdog_timeout(T, rank=3, seq=48213, numel=262144000)
    assert re.fullmatch(
        r"\[rank3\]:\[E0101 01:02:03\.250000000 ProcessGroupNCCL\.cpp:607\] \[Rank 3\] Watchdog caught collective "
        r"operation timeout: WorkNCCL\(SeqNum=48213, OpType=ALLREDUCE, NumelIn=262144000, NumelOut=262144000, "
        r"Timeout\(ms\)=600000\) ran for 6000\d\d milliseconds before timing out\.", lines[0])
    assert lines[4] == "terminate called after throwing an instance of 'c10::DistBackendError'"


def test_driver_xid_lines() -> None:
    assert xids.nvrm_line(79, "3b") == ("NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
                                        "GPU has fallen off the bus.")
    assert xids.nvrm_line(48, "18", pid=4242).startswith("NVRM: Xid (PCI:0000:18:00): 48, pid=4242, name=python, "
                                                         "An uncorrectable double bit error (DBE)")


def test_cuda_oom_and_ib_lines() -> None:
    oom = logs.cuda_oom(gpu=3, tried_gib=2.0, total_gib=79.1, free_gib=0.5, pid=77)
    assert oom[-1].startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a "
                              "total capacity of 79.10 GiB of which 0.50 GiB is free.")
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in logs.cuda_error(
        "an illegal memory access was encountered")
    ib = logs.nccl_ib_completion_error("gpu-node-0001", 100, 140, 3, "10.3.0.12", "10.3.0.11", "mlx5_3", rank=11)
    assert re.search(r"NCCL WARN NET/IB : Got completion from peer 10\.3\.0\.12<\d+> with status=12 opcode=0", ib[0])


def test_the_pattern_library_recognises_every_failure_excerpt() -> None:
    spec = ("xid79@20m/0/1,xid48@20m/4/2,xid119@20m/8/3,nic_down@20m/12/1,nccl_timeout@25m,worker_crash@26m,"
            "oom@27m,job_bug@28m,xid13@29m")
    sim = Simulator(SimConfig(fleet=FleetSpec(nodes=16, nodes_per_su=8), duration_s=3000, seed=9, faults=spec,
                              workload=WorkloadSpec(target_utilization=1.0, job_sizes=(4, 2))))
    lib = default_library()
    failures = [e for out in sim.run() for e in out.job_events
                if e.event == "failure" and e.reason not in ("Terminated", "NodeLost", "Evicted")]
    assert len(failures) >= 9
    for e in failures:
        matched = [m for m in (lib.classify(x) for x in e.log_excerpt) if m.pattern is not None]
        assert matched, f"no pattern recognises the excerpt of {e.job}: {e.log_excerpt[:3]}"
