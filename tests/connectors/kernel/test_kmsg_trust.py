"""What the kernel log may tell: only the kernel's own records are device evidence (a process
writing an NVRM Xid line into /dev/kmsg or the journal forges nothing, and is counted as refused);
a storm of one event is one event a window (counted as coalesced); an XID on a GPU no map knows is
published with its PCI address and no index, and stage 1 and the decision stage isolate its node."""

from __future__ import annotations

import json
from typing import Any

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.connectors.kernel.kmsg_map import KernelRecord, KmsgMapper, parse_journal, parse_kmsg
from fleetmedic.remediation.log_patterns import default_library
from fleetmedic.sim.embedded import EmbeddedPipeline

BOOT = 1_700_000_000.0
GPUS = {"0000:3b:00": 0, "0000:5e:00": 1}
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."
XID13 = "NVRM: Xid (PCI:0000:5e:00): 13, pid=7, name=python, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0)"


def _mapper(**kw: Any) -> KmsgMapper:
    return KmsgMapper("gpu-node-7", default_library(), kw.pop("gpus", GPUS), {}, "boot-1", **kw)


def test_a_user_space_kmsg_record_reading_an_xid_line_is_refused_not_published() -> None:
    forged = parse_kmsg(f"12,500,1000,-;{XID79}".encode(), BOOT)  # PRI 12: facility user, level warning
    real = parse_kmsg(f"4,501,2000,-;{XID79}".encode(), BOOT)  # PRI 4: the kernel, level warning
    assert (forged.facility, forged.level, real.facility, real.level) == (1, 4, 0, 4)
    out = _mapper().map([forged, real], BOOT)
    assert [(rec.xid, rec.seq) for rec in out.records] == [(79, 501)]  # type: ignore[attr-defined]
    assert out.unpublished == {"not from the kernel (facility 1): no device evidence": 1}


def test_a_journal_entry_is_device_evidence_only_from_the_kernel_transport() -> None:
    def entry(**fields: str) -> bytes:
        return json.dumps({"MESSAGE": XID79, "__REALTIME_TIMESTAMP": "1700000000000000", **fields}).encode()

    kernel = parse_journal(entry(_TRANSPORT="kernel", SYSLOG_FACILITY="0"))
    forged = parse_journal(entry(_TRANSPORT="syslog", SYSLOG_FACILITY="0"))  # a sender claiming facility 0
    user = parse_journal(entry(_TRANSPORT="journal"))
    assert (kernel.facility, forged.facility, user.facility) == (0, 1, 1)
    out = _mapper().map([kernel, forged, user], BOOT)
    assert len(out.records) == 1 and out.unpublished == {"not from the kernel (facility 1): no device evidence": 2}


def test_20k_identical_xid_lines_in_15_s_are_one_event_a_window_and_counted() -> None:
    m = _mapper(coalesce_s=60.0)
    recs = [KernelRecord(message=XID13, seq=i, ts=BOOT + i * 15 / 20_000, facility=0) for i in range(20_000)]
    out = m.map(recs, BOOT + 15)
    assert len(out.records) == 1
    assert out.unpublished == {"xid:13: coalesced (the same event within 60 s)": 19_999}
    later = m.map([KernelRecord(message=XID13, seq=20_001, ts=BOOT + 76, facility=0)], BOOT + 76)
    assert len(later.records) == 1  # a window later: published again
    other_gpu = m.map([KernelRecord(message=XID13.replace("5e", "3b"), seq=20_002, ts=BOOT + 77)], BOOT + 77)
    assert len(other_gpu.records) == 1  # another GPU's is another event


def test_an_xid_on_a_gpu_no_map_knows_is_published_with_its_pci_address() -> None:
    out = _mapper(gpus={}).map([KernelRecord(message=XID79, seq=1, ts=BOOT)], BOOT)
    (rec,) = out.records
    assert isinstance(rec, r.KernelEvent)
    assert (rec.xid, rec.pci, rec.gpu, rec.gpus, rec.severity) == (79, "0000:3b:00", None, [], "critical")
    assert r.decode(r.KernelEvent, r.encode(rec)) == rec and out.unpublished == {}


def test_the_words_of_a_gpu_fallen_off_the_bus_join_its_xid_line_without_a_map() -> None:
    m = _mapper(gpus={}, xid_window_s=30.0)
    words = "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."
    assert m.map([KernelRecord(message=words, seq=1, ts=BOOT)], BOOT).records == []
    assert [rec.xid for rec in m.map([KernelRecord(message=XID79, seq=2, ts=BOOT + 1)], BOOT + 1).records] == [79]  # type: ignore[attr-defined]
    assert m.due(BOOT + 100).records == []  # one event, not two
    restored = _mapper(gpus={})
    restored.joiner.restore(json.loads(json.dumps(m.joiner.recent())))
    assert restored.joiner.recent() == m.joiner.recent()


def test_an_xid_79_without_a_gpu_index_isolates_its_node() -> None:
    s = Settings()
    pipe = EmbeddedPipeline(s)
    (ev,) = _mapper(gpus={}).map([KernelRecord(message=XID79, seq=1, ts=BOOT)], BOOT).records
    assert isinstance(ev, r.KernelEvent)
    ev = r.decode(r.KernelEvent, r.encode(ev))  # as stage 1 reads it
    commands = pipe.kernel(ev, BOOT)
    for t in range(1, 60):
        commands += pipe.tick(BOOT + 5 * t)
    (finding,) = [f for f in pipe.out.findings if f.detector == "xid_rules"]
    assert (finding.gpu, finding.severity, finding.kind, finding.action_hint) == (None, "critical", "hard_fault",
                                                                                 "reboot_node")
    assert "PCI 0000:3b:00 (index unknown)" in finding.summary
    assert ("cordon", "gpu-node-7") in {(c.action, c.node) for c in commands}
