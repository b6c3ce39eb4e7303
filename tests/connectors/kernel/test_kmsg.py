"""`fleetmedic exporter kmsg`: /dev/kmsg records (continuation lines, escaped newlines), journal
entries and dmesg lines are read; sequence gaps and EPIPE overruns are counted and reading goes on;
a restart resumes after the last record handled without re-reporting; XID lines become KernelEvents
of the GPU their PCI address maps to (NVML or --pci-map), an XID in the driver's own words and its Xid
line are one event; SXids name their NVSwitch, AER errors the GPU or NIC at their address; mlx5 port
state becomes PortTelemetry; classified lines that are no device fault are counted, not published."""

from __future__ import annotations

import asyncio
import errno
import io
import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from fleetmedic import records as r
from fleetmedic.cli.main import main
from fleetmedic.config import Settings
from fleetmedic.connectors.errors import SourceUnavailable
from fleetmedic.connectors.kernel.kmsg import (
    KmsgDevice,
    KmsgOptions,
    KmsgSource,
    gpu_map_from_nvml,
    kmsg_options,
    load_state,
    nic_map_from_sysfs,
)
from fleetmedic.connectors.kernel.kmsg_map import (
    BadRecord,
    KernelRecord,
    KmsgMapper,
    RecordReader,
    SequenceTracker,
    XidJoiner,
    journal_boot_id,
    parse_journal,
    parse_kmsg,
    parse_pci_map,
    pci_key,
)
from fleetmedic.connectors.runtime import ConnectorMetrics, JsonlSink, Outbox, PumpSettings, run_until_stopped
from fleetmedic.remediation.log_patterns import default_library
from tests.connectors.nvml.helpers_fake_pynvml import FakeGpu, FakeNvml

DATA = Path(__file__).resolve().parents[2] / "data" / "kmsg"
BOOT = 1_700_000_000.0
GPUS = {"0000:3b:00": 0, "0000:5e:00": 1, "0000:86:00": 2, "0000:af:00": 3}


# --- parsing ------------------------------------------------------------------------------------------


def test_a_kmsg_record_with_its_dictionary_and_an_escaped_newline() -> None:
    rec = parse_kmsg(b"3,110,2000000500,-;NVRM: The NVIDIA GPU 0000:5e:00.0\\x0a  NVRM: fallen off the bus.\n"
                     b" SUBSYSTEM=pci\n DEVICE=+pci:0000:5e:00.0\n", BOOT)
    assert (rec.seq, rec.level, rec.ts) == (110, 3, BOOT + 2000.0005)
    assert rec.message == "NVRM: The NVIDIA GPU 0000:5e:00.0\n  NVRM: fallen off the bus."
    assert rec.text == "NVRM: The NVIDIA GPU 0000:5e:00.0 NVRM: fallen off the bus."
    assert dict(rec.fields) == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:5e:00.0"}


@pytest.mark.parametrize(("raw", "reason"), [
    (b"not a record", "kmsg: not a PRI,SEQ,TS_USEC,FLAGS;message record"),
    (b"6,1,2,-;msg\nno leading space=1", "kmsg: continuation line is not ' KEY=value'"),
])
def test_what_is_not_a_kmsg_record_says_why(raw: bytes, reason: str) -> None:
    with pytest.raises(BadRecord, match=reason.replace("(", r"\(").replace(")", r"\)")):
        parse_kmsg(raw, BOOT)


def test_a_journal_entry_with_cursor_boot_id_and_a_byte_list_message() -> None:
    line = json.dumps({"MESSAGE": list(b"NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."),
                       "__REALTIME_TIMESTAMP": "1700000123456789", "__CURSOR": "s=abc;i=42",
                       "_BOOT_ID": "0123456789abcdef0123456789abcdef", "PRIORITY": "3"})
    rec = parse_journal(line)
    assert rec.message.startswith("NVRM: Xid") and rec.ts == pytest.approx(1700000123.456789)
    assert (rec.cursor, rec.level) == ("s=abc;i=42", 3)
    assert rec.boot_id == "01234567-89ab-cdef-0123-456789abcdef" == journal_boot_id(rec.boot_id)
    with pytest.raises(BadRecord, match="journal: no MESSAGE"):
        parse_journal('{"__CURSOR": "x"}')


def test_a_recorded_log_mixes_kmsg_records_journal_lines_and_dmesg_continuations() -> None:
    lines = [
        "6,7,1000000,-;first", " SUBSYSTEM=pci",
        '{"MESSAGE": "from the journal", "__CURSOR": "c1"}',
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "               NVRM: fallen off the bus and is not responding to commands.",
        "", "{broken json",
    ]
    out = list(RecordReader(BOOT).read_all(lines))
    recs = [o for o in out if isinstance(o, KernelRecord)]
    assert [r_.message.splitlines()[0] for r_ in recs] == ["first", "from the journal",
                                                           "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0"]
    assert recs[0].fields == (("SUBSYSTEM", "pci"),) and recs[1].cursor == "c1"
    assert "fallen off the bus and is not responding" in recs[2].text
    assert [str(o) for o in out if isinstance(o, BadRecord)] == ["journal: not JSON"]


def test_sequence_numbers_skip_what_was_handled_and_count_what_was_lost() -> None:
    t = SequenceTracker(last=104)
    assert t.accept(103) == (False, 0) and t.accept(104) == (False, 0)  # handled before a restart
    assert t.accept(105) == (True, 0)
    assert t.accept(109) == (True, 3)  # 106..108 overwritten
    assert (t.last, t.lost) == (109, 3)
    assert SequenceTracker().accept(5000) == (True, 0)  # a fresh start: the oldest record left is no gap


@pytest.mark.parametrize(("text", "key"), [
    ("00000000:3B:00.0", "0000:3b:00"), ("0000:3b:00", "0000:3b:00"), ("PCI:0000:3b:00", "0000:3b:00"),
    ("3b:00.0", "0000:3b:00"), ("0002:00:00", "0002:00:00"), ("not-a-bus", ""),
])
def test_pci_addresses_are_keyed_the_same_from_nvml_and_from_the_kernel(text: str, key: str) -> None:
    assert pci_key(text) == key


def test_a_pci_map_from_nvidia_smi_csv_or_yaml_and_its_errors() -> None:
    assert parse_pci_map((DATA / "pci-map.csv").read_text()) == GPUS
    assert parse_pci_map("0000:3b:00.0: 0\n'0000:5e:00.0': 1\n") == {"0000:3b:00": 0, "0000:5e:00": 1}
    with pytest.raises(ValueError, match="line 1: 'zz' is not a PCI address"):
        parse_pci_map("0, zz\n")
    with pytest.raises(ValueError, match="GPU index 999 out of range"):
        parse_pci_map("999, 0000:3b:00.0\n")


def test_the_gpu_map_comes_from_nvml_through_the_seam() -> None:
    class Nvml(FakeNvml):
        def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> Any:
            class Info:
                busId = f"00000000:{0x3B + 0x23 * h.index:02X}:00.0".encode()
            return Info()

    nvml = Nvml([FakeGpu(0), FakeGpu(1)])
    assert gpu_map_from_nvml(nvml) == {"0000:3b:00": 0, "0000:5e:00": 1}
    assert not nvml.initialised  # shut down again


def test_the_nic_map_names_ports_as_the_port_connectors_do(tmp_path: Path) -> None:
    dev = tmp_path / "devices" / "0000:18:00.0"
    dev.mkdir(parents=True)
    hca = tmp_path / "class" / "infiniband" / "mlx5_0"
    (hca / "ports" / "1").mkdir(parents=True)
    os.symlink(dev, hca / "device")
    assert nic_map_from_sysfs(str(tmp_path)) == {"0000:18:00.0": "mlx5_0/1"}
    assert nic_map_from_sysfs(str(tmp_path / "none")) == {}


# --- mapping ------------------------------------------------------------------------------------------


def _mapper(**kw: Any) -> KmsgMapper:
    return KmsgMapper("gpu-node-7", default_library(), kw.pop("gpus", GPUS), kw.pop("nics", {}), "boot-1", **kw)


def _recs(*lines: str) -> list[KernelRecord]:
    return [KernelRecord(message=line, seq=i, ts=BOOT + i) for i, line in enumerate(lines)]


def test_an_xid_line_becomes_an_xid_event_of_the_gpu_its_pci_address_maps_to() -> None:
    out = _mapper().map(_recs("NVRM: Xid (PCI:0000:5e:00): 48, pid=1, name=python, An uncorrectable double bit "
                              "error (DBE) has been detected on GPU in the framebuffer at partition 6"), BOOT)
    (rec,) = out.records
    assert isinstance(rec, r.KernelEvent)
    assert (rec.node, rec.gpus, rec.source, rec.boot_id) == ("gpu-node-7", [0, 1, 2, 3], "kmsg", "boot-1")
    assert (rec.gpu, rec.xid, rec.pci, rec.device) == (1, 48, "0000:5e:00", "gpu")
    assert rec.message.startswith("NVRM: Xid") and rec.severity == "critical" and rec.incident_class == "hardware"
    assert r.decode(r.KernelEvent, r.encode(rec)) == rec  # valid on the wire
    assert out.events[0].severity == "critical" and out.events[0].incident_class == "hardware"


def test_an_xid_on_a_gpu_no_map_knows_names_its_pci_address_not_a_guessed_index() -> None:
    out = _mapper(gpus={}).map(_recs("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."), BOOT)
    assert [(rec.xid, rec.pci, rec.gpu) for rec in out.records] == [(79, "0000:3b:00", None)]  # type: ignore[attr-defined]
    assert out.unpublished == {}
    out = _mapper().map(_recs("NVRM: _kgspLogXid119: ****** GSP Timeout ******"), BOOT)
    assert out.records == [] and out.unpublished == {"xid: the line names no PCI address": 1}
    assert out.events[0].xid == 119 and out.events[0].incident_class == "hardware"


def test_device_faults_become_kernel_events_naming_their_device() -> None:
    out = _mapper(nics={"0000:18:00.0": "mlx5_0/1"}).map(_recs(
        "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error (First)",
        "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Data {0x00000000, 0x00000000, 0x00000000}",
        "pcieport 0000:00:03.1: AER: Uncorrected (Fatal) error received: 0000:5e:00.0",
        "mlx5_core 0000:18:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer, "
        "(Requester ID)",
        "pcieport 0000:00:03.1: AER: Corrected error received: 0000:00:03.1",
        "mce: [Hardware Error]: Machine check events logged",
        "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready"), BOOT)
    evs = [rec for rec in out.records if isinstance(rec, r.KernelEvent)]
    assert [(e.signal, e.device, e.severity) for e in evs] == [
        ("sxid", "nvswitch", "critical"), ("pcie", "pcie", "critical"), ("pcie", "pcie", "warning"),
        ("pcie_corrected", "pcie", "info"), ("mce", "cpu", "warning")]
    sxid, aer_gpu, aer_nic = evs[:3]
    assert (sxid.switch, sxid.pci, sxid.code, sxid.gpu) == ("nvidia-nvswitch0", "0000:c3:00.0", "24007", None)
    assert (aer_gpu.pci, aer_gpu.gpu, aer_gpu.port) == ("0000:5e:00.0", 1, "")  # the GPU at that address
    assert (aer_nic.pci, aer_nic.gpu, aer_nic.port) == ("0000:18:00.0", None, "mlx5_0/1")  # the NIC port there
    assert all(r.decode(r.KernelEvent, r.encode(e)) == e for e in evs)
    assert out.unpublished == {"sxid (degradation): not a device fault": 1}  # the SXid's register dump


def test_an_xid_in_the_drivers_words_and_its_xid_line_are_one_event() -> None:
    m = _mapper(xid_window_s=30.0)
    words = "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."
    first = m.map(_recs(words), BOOT)
    assert first.records == [] and len(m.joiner) == 1  # waits for its Xid line
    second = m.map(_recs(xid), BOOT + 1)
    assert [rec.xid for rec in second.records] == [79]  # type: ignore[attr-defined]
    assert m.due(BOOT + 100).records == [] and len(m.joiner) == 0
    # the words alone (no Xid line, NVIDIA/NVSentinel#155): published once the window has passed
    alone = m.map([KernelRecord(message=words.replace("3b", "5e"), seq=9, ts=BOOT + 500)], BOOT + 500)
    assert alone.records == []
    (late,) = m.due(BOOT + 531).records
    assert (late.gpu, late.xid, late.signal) == (1, 79, "gpu_lost")  # type: ignore[attr-defined]


def test_xid_joiner_keeps_real_xid_lines_and_forgets_old_ones() -> None:
    j = XidJoiner(10.0)
    assert j.due(0.0) == [] and len(j) == 0


def test_mlx5_port_state_becomes_port_telemetry_named_as_the_port_connectors_name_it() -> None:
    m = _mapper(nics={"0000:18:00.0": "mlx5_0/1"})
    out = m.map(_recs("mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link DOWN",
                      "mlx5_core 0000:18:00.0 ibp24s0: Link down",
                      "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE",
                      "mlx5_core 0000:19:00.0 ens1f0np0: Link up"), BOOT)
    ports = [(rec.device, rec.device_kind, rec.ports[0].port, rec.ports[0].link_state)  # type: ignore[attr-defined]
             for rec in out.records]
    assert ports == [("gpu-node-7", "host", "mlx5_5/1", "down"), ("gpu-node-7", "host", "mlx5_0/1", "down"),
                     ("gpu-node-7", "host", "mlx5_5/1", "up"), ("gpu-node-7", "host", "ens1f0np0", "up")]
    assert out.unpublished == {}


# --- the source: a fake /dev/kmsg -----------------------------------------------------------------------


class FakeKmsg:
    """Serves records like /dev/kmsg: from the oldest still in the 'ring' (the list), one per read;
    ``overrun_at``: indices before which the next read fails with EPIPE once."""

    def __init__(self, records: list[bytes], overrun_at: tuple[int, ...] = ()) -> None:
        self.records = records
        self.pos = 0
        self.overrun_at = set(overrun_at)
        self.closed = False

    def read(self) -> bytes | None:
        if self.pos in self.overrun_at:
            self.overrun_at.discard(self.pos)
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")
        if self.pos >= len(self.records):
            return None
        self.pos += 1
        return self.records[self.pos - 1]

    def fileno(self) -> int | None:
        return None

    def close(self) -> None:
        self.closed = True


def _kmsg_records() -> list[bytes]:
    """tests/data/kmsg/node-a.kmsg as /dev/kmsg returns it: one read per record with its dict lines."""
    out: list[bytes] = []
    for line in (DATA / "node-a.kmsg").read_text().splitlines():
        if line.startswith(" "):
            out[-1] += line.encode() + b"\n"
        else:
            out.append(line.encode() + b"\n")
    return out


class Run:
    def __init__(self, tmp_path: Path, state_file: str = "", **opts: Any) -> None:
        self.tmp_path = tmp_path
        self.out = tmp_path / f"out-{len(list(tmp_path.glob('out-*')))}.jsonl"
        self.registry = CollectorRegistry()
        self.metrics = ConnectorMetrics(self.registry, "kmsg")
        self.opts = {"state_file": state_file, "node": "gpu-node-7", "use_nvml": False,
                     "pci_map": str(DATA / "pci-map.csv"), "boot_time": BOOT, "poll_s": 0.05,
                     "backlog_max_age_s": 1e12, **opts}

    def __call__(self, device: Any, until: Any = None, clock: Any = None) -> list[dict[str, Any]]:
        outbox = Outbox(100, self.metrics)
        source = KmsgSource(Settings(), outbox, self.metrics, KmsgOptions(**self.opts), clock=clock or time.time,
                            open_device=lambda _: device, nics={})
        stop = asyncio.Event()

        async def go() -> None:
            async def stopper() -> None:
                while not (until or (lambda: device.pos >= len(device.records)))():
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.1)
                stop.set()

            task = asyncio.create_task(stopper())
            await run_until_stopped(source.run, outbox, JsonlSink(str(self.out)), self.metrics,
                                    PumpSettings(drain_timeout_s=2.0), stop, handle_signals=False)
            await task

        asyncio.run(asyncio.wait_for(go(), 20))
        self.source = source
        return [json.loads(line) for line in self.out.read_text().splitlines()] if self.out.exists() else []

    def skipped(self, reason: str) -> float:
        return self.registry.get_sample_value("fleetmedic_connector_skipped_total",
                                              {"connector": "kmsg", "reason": reason}) or 0.0

    def errors(self, kind: str) -> float:
        return self.registry.get_sample_value("fleetmedic_connector_errors_total",
                                              {"connector": "kmsg", "kind": kind}) or 0.0


def _xids(lines: list[dict[str, Any]]) -> list[tuple[int, int]]:
    return [(d["record"]["gpu"], d["record"]["xid"]) for d in lines
            if d["record"]["type"] == "kernel_event" and d["record"].get("xid") is not None]


def test_the_exporter_reads_kmsg_counts_the_sequence_gap_and_publishes_xids_and_port_state(tmp_path: Path) -> None:
    run = Run(tmp_path)
    dev = FakeKmsg(_kmsg_records())
    out = run(dev)
    assert dev.closed
    assert sorted(_xids(out)) == [(0, 79), (1, 79), (2, 13)]  # 3b's words line joins its Xid line; 5e's stands
    topics = {d["topic"] for d in out}
    assert topics == {"fleetmedic.kernel.events", "fleetmedic.telemetry.port"}
    assert all(d["key"] == "gpu-node-7" for d in out)
    ports = [(p["port"], p["link_state"]) for d in out if d["record"]["type"] == "port_telemetry"
             for p in d["record"]["ports"]]
    assert ports == [("mlx5_5/1", "down"), ("ibp24s0", "down"), ("mlx5_5/1", "up")]  # no NIC map: the netdev
    assert run.skipped("kmsg: records lost (ring buffer overrun)") == 3  # seq 106..108
    faults = [(d["record"]["signal"], d["record"]["pci"]) for d in out
              if d["record"]["type"] == "kernel_event" and d["record"].get("xid") is None]
    assert faults == [("sxid", "0000:c3:00.0"), ("pcie", "0000:5e:00.0")]  # the SXid and the AER error
    assert run.skipped("sxid (degradation): not a device fault") == 1  # its register dump


def test_an_overrun_fails_a_read_with_epipe_and_reading_goes_on(tmp_path: Path) -> None:
    records = _kmsg_records()
    # the kernel overwrote records 3..5 while the reader was away: EPIPE, then the oldest record left
    dev = FakeKmsg(records[:3] + records[6:], overrun_at=(3,))
    run = Run(tmp_path)
    out = run(dev)
    assert run.errors("kmsg_overrun") == 1
    assert run.skipped("kmsg: records lost (ring buffer overrun)") == 6  # 103..105 and 106..108
    assert (1, 79) in _xids(out) and (2, 13) in _xids(out)


def test_a_restart_in_the_middle_resumes_without_re_reporting(tmp_path: Path) -> None:
    state = str(tmp_path / "kmsg-state.json")
    records = _kmsg_records()
    first = Run(tmp_path, state)(FakeKmsg(records[:6]))  # up to seq 105, then SIGTERM
    assert _xids(first) == [(0, 79)]
    assert load_state(state)["seq"] == 105
    # the exporter starts again; /dev/kmsg serves the whole buffer from its oldest record again
    second_run = Run(tmp_path, state)
    second = second_run(FakeKmsg(records))
    assert sorted(_xids(second)) == [(1, 79), (2, 13)]  # nothing of the first run again
    assert second_run.skipped("kmsg: records lost (while the exporter was stopped)") == 3
    assert load_state(state)["seq"] == 114
    # and a third start with nothing new publishes nothing
    assert Run(tmp_path, state)(FakeKmsg(records)) == []


def test_the_state_never_passes_a_record_still_waiting_to_be_sent(tmp_path: Path) -> None:
    metrics = ConnectorMetrics(CollectorRegistry(), "kmsg")
    outbox = Outbox(100, metrics)
    opts = KmsgOptions(state_file=str(tmp_path / "s.json"), node="n", use_nvml=False, boot_time=BOOT,
                       pci_map=str(DATA / "pci-map.csv"), backlog_max_age_s=1e12)
    source = KmsgSource(Settings(), outbox, metrics, opts, open_device=lambda _: FakeKmsg([]), nics={})

    async def go() -> None:
        await source.handle([parse_kmsg(b"6,1,1,-;nothing to publish", BOOT)])
        await source.handle([parse_kmsg(b"4,2,2,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
                                        BOOT)])
        await source.handle([parse_kmsg(b"6,3,3,-;nothing either", BOOT)])

    asyncio.run(go())
    source.checkpoint(force=True)
    assert load_state(opts.state_file)["seq"] == 1  # seq 2's XID is still in the outbox
    outbox.remove(outbox.peek(10))  # sent
    source.checkpoint(force=True)
    assert load_state(opts.state_file)["seq"] == 3


def test_a_first_start_skips_the_old_backlog_but_a_new_boot_is_read_whole(tmp_path: Path) -> None:
    now = BOOT + 10_000
    recs = [b"4,1,100000000,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n",  # 9900 s old
            b"4,2,9990000000,-;NVRM: Xid (PCI:0000:5e:00): 79, GPU has fallen off the bus.\n"]  # 10 s old
    run = Run(tmp_path, str(tmp_path / "s.json"), backlog_max_age_s=3600.0)
    out = run(FakeKmsg(list(recs)), clock=lambda: now)
    assert _xids(out) == [(1, 79)]
    assert run.skipped("kmsg: older than --backlog-max-age at first start") == 1
    # the state says another boot: every record of this boot is new, whatever its age
    (tmp_path / "s.json").write_text(json.dumps({"source": "kmsg", "boot_id": "another-boot", "seq": 99}))
    again = Run(tmp_path, str(tmp_path / "s.json"), backlog_max_age_s=3600.0)
    out2 = again(FakeKmsg(list(recs)), clock=lambda: now)
    assert sorted(_xids(out2)) == [(0, 79), (1, 79)]


def test_a_device_that_cannot_be_opened_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailable, match="not found"):
        KmsgDevice(str(tmp_path / "kmsg"))
    locked = tmp_path / "locked"
    locked.write_text("")
    locked.chmod(0)
    if os.geteuid() != 0:
        with pytest.raises(SourceUnavailable, match="CAP_SYSLOG"):
            KmsgDevice(str(locked))


def test_the_real_dev_kmsg_when_this_machine_lets_us_read_it() -> None:
    path = "/dev/kmsg"
    if not os.path.exists(path) or not stat.S_ISCHR(os.stat(path).st_mode):
        pytest.skip("no /dev/kmsg here")
    try:
        dev = KmsgDevice(path)
    except SourceUnavailable as exc:
        pytest.skip(str(exc))
    try:
        raws = [raw for raw in iter(dev.read, None)][:50]
    except OSError as exc:  # e.g. EPERM in a restricted container
        pytest.skip(f"reading /dev/kmsg: {exc}")
    finally:
        dev.close()
    recs = [parse_kmsg(raw, 0.0) for raw in raws]
    assert recs and all(rec.seq is not None for rec in recs)
    seqs = [rec.seq for rec in recs]
    assert seqs == sorted(seqs)


# --- the CLI --------------------------------------------------------------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[dict[str, Any]]]:
    code = main(["exporter", "kmsg", "--output", "-", "--node", "gpu-node-7", "--no-nvml", "--boot-time",
                 str(BOOT), "--loglevel", "error", *argv])
    out = capsys.readouterr().out
    return code, [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_the_cli_replays_a_recorded_log_as_jsonl(capsys: pytest.CaptureFixture[str]) -> None:
    code, docs = _cli(capsys, "--input", str(DATA / "node-a.kmsg"), "--pci-map", str(DATA / "pci-map.csv"))
    assert code == 0
    assert sorted(_xids(docs)) == [(0, 79), (1, 79), (2, 13)]
    assert all(r.decode(r.KernelEvent if d["record"]["type"] == "kernel_event" else r.PortTelemetry,
                        json.dumps(d["record"])) for d in docs)


def test_the_cli_resumes_a_recorded_log_with_a_state_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = (DATA / "node-a.kmsg").read_text().splitlines(keepends=True)
    half = tmp_path / "half.kmsg"
    half.write_text("".join(lines[:5]))  # up to seq 102 (the first XID) and its dictionary
    state = str(tmp_path / "state.json")
    common = ["--pci-map", str(DATA / "pci-map.csv"), "--state-file", state]
    assert _xids(_cli(capsys, "--input", str(half), *common)[1]) == [(0, 79)]
    assert sorted(_xids(_cli(capsys, "--input", str(DATA / "node-a.kmsg"), *common)[1])) == [(1, 79), (2, 13)]


def test_the_cli_refuses_a_bad_pci_map(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "map.csv"
    bad.write_text("0, nonsense\n")
    code = main(["exporter", "kmsg", "--input", str(DATA / "node-a.kmsg"), "--output", "-", "--pci-map", str(bad)])
    assert code == 2 and "is not a PCI address" in capsys.readouterr().err


def test_kmsg_options_default_to_a_state_file_only_for_the_live_log() -> None:
    assert kmsg_options(None).state_file == "/var/lib/fleetmedic/kmsg-state.json"

    class Args:
        input = "x.log"
        state_file = None

    assert kmsg_options(Args()).state_file == ""


# --- the journal, through a stand-in journalctl ---------------------------------------------------------


@pytest.fixture
def fake_journalctl(tmp_path: Path) -> Iterator[Path]:
    """A script that prints journal entries after the --after-cursor it is given, records its
    arguments, then stays up like `--follow` until killed."""
    entries = [{"MESSAGE": "NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=python, DBE", "__CURSOR": f"c{i}",
                "__REALTIME_TIMESTAMP": str(int((BOOT + i) * 1e6)), "_BOOT_ID": "ab" * 16} for i in range(1, 3)]
    entries[1]["MESSAGE"] = "NVRM: Xid (PCI:0000:5e:00): 79, pid=1, name=python, GPU has fallen off the bus."
    (tmp_path / "entries.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    script = tmp_path / "journalctl"
    script.write_text(f"""#!/bin/sh
echo "$@" >> {tmp_path}/argv
after=""
for a in "$@"; do case "$a" in --after-cursor=*) after="${{a#--after-cursor=}}";; esac; done
python3 - "$after" <<'EOF'
import json, sys
after = sys.argv[1]
seen = not after
for line in open("{tmp_path}/entries.jsonl"):
    if seen:
        print(line, end="", flush=True)
    elif json.loads(line)["__CURSOR"] == after:
        seen = True
EOF
exec sleep 30
""")
    script.chmod(0o755)
    yield script


def test_the_journal_source_resumes_from_its_cursor(tmp_path: Path, fake_journalctl: Path) -> None:
    state = str(tmp_path / "state.json")
    argv_file = tmp_path / "argv"

    def once(done: Any) -> list[dict[str, Any]]:
        run = Run(tmp_path, state, source="journal", journal_command=[str(fake_journalctl)], boot_time=None)
        t0 = time.monotonic()
        return run(io.BytesIO(), until=lambda: done(run) or time.monotonic() - t0 > 10)

    first = once(lambda run: run.out.exists() and len(_xids(
        [json.loads(line) for line in run.out.read_text().splitlines()])) >= 2)
    assert _xids(first) == [(0, 48), (1, 79)]
    assert load_state(state)["cursor"] == "c2"
    started = time.monotonic()
    assert once(lambda run: len(argv_file.read_text().splitlines()) >= 2 and time.monotonic() - started > 0.5) == []
    argv = argv_file.read_text().splitlines()
    assert argv[0].endswith("--lines=all") and argv[-1].endswith("--after-cursor=c2")
