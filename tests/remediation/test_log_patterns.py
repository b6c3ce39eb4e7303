"""The failure-log library: the shipped defaults classify real PyTorch, NCCL, CUDA, NVIDIA driver
and Kubernetes lines as the right signature and class, symptoms never outrank causes, ranks and
hosts are extracted, XID lines follow the XID catalog, and a bad custom library is rejected with a
message naming the entry."""

from __future__ import annotations

import pytest

from fleetmedic.remediation.log_patterns import PatternError, PatternLibrary, default_library

REAL_LINES = [
    # (line, pattern, class)
    ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, NumelIn=1048576, "
     "NumelOut=1048576, Timeout(ms)=600000) ran for 600049 milliseconds before timing out.",
     "nccl_watchdog_timeout", "transient_software"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB "
     "of which 1.23 GiB is free.", "cuda_oom", "transient_software"),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "cuda_illegal_address",
     "transient_software"),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "cuda_uncorrectable_ecc", "hardware"),
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.", "xid_79", "hardware"),
    ("node-3:1184:1302 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.12<41234> with status=12 opcode=0 len=0 "
     "vendor err 129 (Recv)", "nccl_ib_retry_exceeded", "network"),
    ("ncclInternalError: Internal check failed.", "nccl_internal_error", "unknown"),
    ("Segmentation fault (core dumped)", "segfault", "transient_software"),
    ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:", "torchelastic_child_failed",
     "transient_software"),
    ("torch.distributed.elastic.agent.server.api: [WARNING] Received Signals.SIGTERM death signal, shutting down "
     "workers", "preempted", "transient_software"),
    ("KeyError: 'input_ids'", "python_user_exception", "job_bug"),
    ("AssertionError: global batch size must be divisible by micro batch size", "python_user_exception", "job_bug"),
    ("RuntimeError: CUDA error: device-side assert triggered", "cuda_device_side_assert", "job_bug"),
    ("NVRM: Xid (PCI:0000:18:00): 13, pid=8791, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): "
     "Out Of Range Address", "xid_13", "transient_software"),
    ("NVRM: Xid (PCI:0000:b3:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has "
     "been detected on GPU in the framebuffer at partition 6, subpartition 0.", "xid_48", "hardware"),
    ("OOMKilled", "host_oom_killed", "transient_software"),
    ("2024-05-01 10:00:00 INFO step 1200 loss 2.31", None, "unknown"),
]


@pytest.mark.parametrize(("line", "pattern", "klass"), REAL_LINES, ids=[str(p) for _, p, _ in REAL_LINES])
def test_the_default_library_classifies_real_lines(line: str, pattern: str | None, klass: str) -> None:
    m = default_library().classify(line)
    assert (m.pattern, m.incident_class) == (pattern, klass)


def test_every_shipped_example_classifies_as_its_own_pattern() -> None:
    assert default_library().self_check() == []


def test_timeouts_and_launcher_wrappers_are_symptoms_that_never_outrank_a_cause() -> None:
    lib = default_library()
    lines = ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
             "[rank2]:[E ProcessGroupNCCL.cpp:563] [Rank 2] Watchdog caught collective operation timeout: x",
             "RuntimeError: CUDA error: uncorrectable ECC error encountered"]
    matches = lib.classify_all(lines)
    assert [m.symptom for m in matches] == [True, True, False]
    best = lib.strongest(matches)
    assert best is not None and best.pattern == "cuda_uncorrectable_ecc"


def test_a_log_of_only_symptoms_is_summarised_by_its_strongest_symptom() -> None:
    lib = default_library()
    lines = ["ChildFailedError", "[Rank 1] Watchdog caught collective operation timeout"]
    best = lib.strongest(lib.classify_all(lines))
    assert best is not None and best.pattern == "nccl_watchdog_timeout" and best.symptom


def test_rank_and_host_are_extracted_from_pytorch_and_nccl_prefixes() -> None:
    lib = default_library()
    assert lib.classify("[rank5]:[E ProcessGroupNCCL.cpp:563] [Rank 5] Watchdog caught collective operation "
                        "timeout").rank == 5
    assert lib.classify("[PG 0 (default_pg) Rank 7] NCCL watchdog thread terminated with exception").rank == 7
    assert lib.classify("  rank      : 3 (local_rank: 3)").rank == 3
    assert lib.classify("gpu-node-12:2311:2490 [5] NCCL WARN Cuda failure 'uncorrectable ECC error encountered'"
                        ).host == "gpu-node-12"
    assert lib.classify("  host      : gpu-node-9").host == "gpu-node-9"


def test_xid_lines_follow_the_catalog_classes_and_hints() -> None:
    lib = default_library()
    fell_off = lib.classify("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.")
    assert (fell_off.xid, fell_off.incident_class, fell_off.hint) == (79, "hardware", "reboot_node")
    dbe = lib.classify("NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=python, DBE")
    assert (dbe.incident_class, dbe.hint) == ("hardware", "reset_gpu")
    ignored = lib.classify("NVRM: Xid (PCI:0000:3b:00): 43, pid=1, name=python, Ch 00000008")
    assert ignored.symptom and ignored.incident_class == "transient_software"


def test_xid_overrides_in_a_custom_library_change_the_class() -> None:
    lib = PatternLibrary.from_yaml("xid:\n  regex: 'NVRM: Xid \\((?:PCI:)?(?P<pci>[0-9a-f:.]+)\\): (?P<xid>\\d+)'\n"
                                   "  overrides: {13: job_bug}\n")
    assert lib.classify("NVRM: Xid (PCI:0000:3b:00): 13, pid=1").incident_class == "job_bug"


def test_the_simulators_failure_logs_classify_as_their_fault_kind() -> None:
    from fleetmedic.sim import logs
    lib = default_library()

    def best(lines: list[str]) -> str | None:
        m = lib.strongest(lib.classify_all(lines))
        return m.pattern if m else None

    assert best(logs.nccl_ib_completion_error("node-3", 11, 12, 0, "10.0.0.1", "10.0.0.2", "mlx5_0", 3)) == \
        "nccl_ib_retry_exceeded"
    assert best(logs.nccl_watchdog_timeout(1.79e9, 3, 44, 1000)) == "nccl_watchdog_timeout"
    assert best(logs.cuda_error("uncorrectable ECC error encountered")) == "cuda_uncorrectable_ecc"
    assert best(logs.cuda_oom(0, 2.0, 79.15, 1.2, 4242)) == "cuda_oom"
    assert best(logs.sigterm(1.79e9, 44)) == "preempted"
    assert lib.classify_all(logs.job_bug(0))[-1].incident_class == "job_bug"
    assert best(logs.nccl_peer_lost("node-3", 1, 2, 0, "node-4", 3)) == "nccl_remote_error"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("patterns: [{name: x, class: hardware}]", "patterns[0] (x).regex: required"),
        ("patterns: [{name: x, class: broken, regex: a}]", "patterns[0] (x).class: must be one of"),
        ("patterns: [{name: x, class: hardware, regex: '('}]", "invalid regular expression"),
        ("patterns: [{name: x, class: hardware, regex: a, colour: red}]", "unknown key(s): colour"),
        ("patterns: [{name: x, class: hardware, regex: a}, {name: x, class: network, regex: b}]", "repeated: x"),
        ("rank_patterns: ['rank (\\d+)']", "needs a named group `(?P<rank>...)`"),
        ("[1, 2]", "must be a mapping"),
        ("nonsense: 1", "unknown key(s): nonsense"),
    ],
)
def test_a_bad_library_is_rejected_naming_the_entry_and_reason(text: str, message: str) -> None:
    with pytest.raises(PatternError) as err:
        PatternLibrary.from_yaml(text, "custom.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("custom.yaml")


def test_higher_priority_wins_and_equal_priorities_keep_file_order() -> None:
    lib = PatternLibrary.from_yaml("""
patterns:
  - {name: first, class: unknown, regex: boom, priority: 10}
  - {name: second, class: hardware, regex: boom, priority: 10}
  - {name: strong, class: network, regex: 'big boom', priority: 50}
""")
    assert lib.classify("boom").pattern == "first"
    assert lib.classify("a big boom").pattern == "strong"
