"""Failure log lines as PyTorch, torchrun, NCCL and the NVIDIA driver print them.

Each function returns the lines of one excerpt (what a log shipper would attach to a job failure),
timestamped with the simulated time (the node's clock). The formats follow PyTorch 2.4 /
NCCL 2.21 / driver 550 output; random parts (pids, sequence numbers, addresses) come from the caller
so that excerpts are deterministic per seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

NCCL_VERSION = "2.21.5"
_SITE = "/usr/local/lib/python3.10/dist-packages"


@dataclass(frozen=True)
class FailureReport:
    """What the job controller and log shipper report when a job's attempt fails."""

    exit_code: int
    reason: str  # the container's termination reason: Error, OOMKilled, Evicted, NodeLost, ...
    rank: int
    node: int  # fleet node index of the reporting rank
    lines: list[str] = field(default_factory=list)


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def glog(ts: float, level: str = "E") -> str:
    """glog prefix as c10 prints it: ``E1127 10:32:11.123456789``."""
    d = _dt(ts)
    return f"{level}{d:%m%d %H:%M:%S}.{int((ts % 1) * 1e9):09d}"


def _cuda_tail() -> list[str]:
    return [
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
        "below might be incorrect.",
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
    ]


def _traceback(frames: list[tuple[str, int, str, str]]) -> list[str]:
    out = ["Traceback (most recent call last):"]
    for path, line, func, code in frames:
        out.append(f'  File "{path}", line {line}, in {func}')
        out.append(f"    {code}")
    return out


_TRAIN_FRAMES = [
    ("/workspace/train.py", 412, "<module>", "main()"),
    ("/workspace/train.py", 377, "main", "loss = train_step(model, batch, optimizer)"),
    ("/workspace/train.py", 241, "train_step", "loss.backward()"),
    (f"{_SITE}/torch/_tensor.py", 521, "backward", "torch.autograd.backward("),
    (f"{_SITE}/torch/autograd/__init__.py", 289, "backward", "_engine_run_backward("),
]


def torchrun_root_cause(ts: float, host: str, rank: int, local_rank: int, exitcode: int, pid: int,
                        traceback: str) -> list[str]:
    """torchrun's ``ChildFailedError`` summary block."""
    return [
        f"{glog(ts)} {pid + 7} torch/distributed/elastic/multiprocessing/api.py:833] failed (exitcode: "
        f"{exitcode}) local_rank: {local_rank} (pid: {pid}) of binary: /usr/bin/python",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "============================================================",
        "train.py FAILED",
        "------------------------------------------------------------",
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        f"  time      : {_dt(ts):%Y-%m-%d_%H:%M:%S}",
        f"  host      : {host}",
        f"  rank      : {rank} (local_rank: {local_rank})",
        f"  exitcode  : {exitcode} (pid: {pid})",
        "  error_file: <N/A>",
        f"  traceback : {traceback}",
        "============================================================",
    ]


def nccl_watchdog_timeout(ts: float, rank: int, seq: int, numel: int, timeout_ms: int = 600_000,
                          op: str = "ALLREDUCE") -> list[str]:
    ran = timeout_ms + 7 + seq % 50
    work = (f"WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={numel}, "
            f"Timeout(ms)={timeout_ms})")
    p = f"[rank{rank}]:[{glog(ts)} ProcessGroupNCCL.cpp"
    return [
        f"{p}:607] [Rank {rank}] Watchdog caught collective operation timeout: {work} ran for {ran} "
        "milliseconds before timing out.",
        f"{p}:1664] [PG 0 (default_pg) Rank {rank}] Exception (either an error or timeout) detected by "
        f"watchdog at work: {seq}, last enqueued NCCL work: {seq}, last completed NCCL work: {seq - 1}.",
        f"{p}:621] [Rank {rank}] Some NCCL operations have failed or timed out. Due to the asynchronous "
        "nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
        f"{p}:627] [Rank {rank}] To avoid data inconsistency, we are taking the entire process down.",
        "terminate called after throwing an instance of 'c10::DistBackendError'",
        f"  what():  [PG 0 (default_pg) Rank {rank}] Process group watchdog thread terminated with exception: "
        f"[Rank {rank}] Watchdog caught collective operation timeout: {work} ran for {ran} milliseconds "
        "before timing out.",
    ]


def cuda_error(message: str) -> list[str]:
    """A Python traceback ending in ``RuntimeError: CUDA error: <message>``."""
    return [*_traceback(_TRAIN_FRAMES), f"RuntimeError: CUDA error: {message}", *_cuda_tail()]


_ATTN_FRAME = ("/workspace/model.py", 188, "forward", "attn = torch.matmul(q, k.transpose(-2, -1)) * self.scale")


def cuda_oom(gpu: int, tried_gib: float, total_gib: float, free_gib: float, pid: int) -> list[str]:
    in_use = total_gib - free_gib
    allocated = in_use * 0.93
    reserved = in_use - allocated - 0.4
    return [
        *_traceback([*_TRAIN_FRAMES[:3], _ATTN_FRAME]),
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried_gib:.2f} GiB. GPU {gpu} has a "
        f"total capacity of {total_gib:.2f} GiB of which {free_gib:.2f} GiB is free. Process {pid} has "
        f"{in_use:.2f} GiB memory in use. Of the allocated memory {allocated:.2f} GiB is allocated by PyTorch, "
        f"and {max(reserved, 0.01):.2f} GiB is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
        "fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
    ]


def nccl_ib_completion_error(host: str, pid: int, tid: int, local_gpu: int, peer_ip: str, local_ip: str,
                             hca: str, rank: int, status: int = 12) -> list[str]:
    """NCCL's IB transport seeing a failed work completion (status 12 = retry exceeded), then the abort."""
    port = 40000 + (pid * 7 + tid) % 20000
    tag = f"{host}:{pid}:{tid} [{local_gpu}]"
    err = (f"NET/IB : Got completion from peer {peer_ip}<{port}> with status={status} opcode=0 len=0 vendor "
           f"err 129 (Send) localGid ::ffff:{local_ip} remoteGid ::ffff:{peer_ip} hca {hca}")
    return [
        f"{tag} transport/net_ib.cc:1696 NCCL WARN {err}",
        f"{tag} NCCL INFO transport/net.cc:1298 -> 6",
        f"{tag} NCCL INFO proxy.cc:698 -> 6",
        f"{tag} NCCL INFO proxy.cc:878 -> 6 [Progress Thread]",
        f"RuntimeError: NCCL communicator was aborted on rank {rank}.  Original reason for failure was: NCCL "
        f"error: remote process exited or there was a network error, NCCL version {NCCL_VERSION}",
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
        "prematurely.",
        "Last error:",
        err,
    ]


def nccl_peer_lost(host: str, pid: int, tid: int, local_gpu: int, peer_host: str, rank: int) -> list[str]:
    """What surviving ranks print when a peer's node disappears (crash, power loss)."""
    tag = f"{host}:{pid}:{tid} [{local_gpu}]"
    port = 30000 + pid % 30000
    msg = f"socketProgress: Connection closed by remote peer {peer_host}<{port}>"
    return [
        f"{tag} misc/socket.cc:49 NCCL WARN {msg}",
        f"{tag} NCCL INFO misc/socket.cc:752 -> 6",
        f"{tag} NCCL INFO transport/net_ib.cc:1053 -> 6",
        f"RuntimeError: NCCL communicator was aborted on rank {rank}.  Original reason for failure was: NCCL "
        f"error: remote process exited or there was a network error, NCCL version {NCCL_VERSION}",
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
        "prematurely.",
        "Last error:",
        msg,
    ]


def nccl_unhandled_cuda(rank: int, host: str, pid: int, tid: int, local_gpu: int, cuda_msg: str) -> list[str]:
    tag = f"{host}:{pid}:{tid} [{local_gpu}]"
    return [
        f"{tag} enqueue.cc:1446 NCCL WARN Cuda failure '{cuda_msg}'",
        f"{tag} NCCL INFO group.cc:231 -> 1",
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        f"ProcessGroupNCCL.cpp:2006, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version "
        f"{NCCL_VERSION}",
        "ncclUnhandledCudaError: Call to CUDA function failed.",
        f"Last error:\nCuda failure '{cuda_msg}'",
    ]


def dataloader_killed(worker_pid: int, signal: str = "Killed") -> list[str]:
    return [
        *_traceback([
            ("/workspace/train.py", 412, "<module>", "main()"),
            ("/workspace/train.py", 371, "main", "batch = next(data_iter)"),
            (f"{_SITE}/torch/utils/data/dataloader.py", 631, "__next__", "data = self._next_data()"),
            (f"{_SITE}/torch/utils/data/dataloader.py", 1329, "_next_data", "idx, data = self._get_data()"),
            (f"{_SITE}/torch/utils/data/_utils/signal_handling.py", 67, "handler",
             "_error_if_any_worker_fails()"),
        ]),
        f"RuntimeError: DataLoader worker (pid {worker_pid}) is killed by signal: {signal}. ",
    ]


JOB_BUGS: tuple[tuple[str, list[tuple[str, int, str, str]]], ...] = (
    ("RuntimeError: The size of tensor a (4096) must match the size of tensor b (4097) at non-singleton "
     "dimension 1", [("/workspace/model.py", 203, "forward", "x = x + self.pos_emb[:, : x.size(1)]")]),
    ("IndexError: index out of range in self",
     [("/workspace/model.py", 142, "forward", "h = self.tok_emb(idx)"),
      (f"{_SITE}/torch/nn/modules/sparse.py", 164, "forward", "return F.embedding(")]),
    ("KeyError: 'attention_mask'",
     [("/workspace/data.py", 88, "collate", "masks = [b['attention_mask'] for b in batch]")]),
)


def job_bug(variant: int) -> list[str]:
    msg, frames = JOB_BUGS[variant % len(JOB_BUGS)]
    return [*_traceback(_TRAIN_FRAMES[:2] + frames), msg]


def sigterm(ts: float, pid: int) -> list[str]:
    """A worker terminated by SIGTERM (pod deleted, evicted by a drain, planned restart)."""
    return [
        f"{glog(ts, 'W')} {pid + 3} torch/distributed/elastic/agent/server/api.py:704] Received Signals.SIGTERM "
        "death signal, shutting down workers",
        f"{glog(ts, 'W')} {pid + 3} torch/distributed/elastic/multiprocessing/api.py:858] Sending process {pid} "
        "closing signal SIGTERM",
        f"torch.distributed.elastic.multiprocessing.api.SignalException: Process {pid + 3} got signal: 15",
    ]
