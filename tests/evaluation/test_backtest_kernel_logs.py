"""``fleetmedic backtest`` over recorded kernel logs: a ``kern.log``, a saved ``dmesg -T``, a
``journalctl -k -o json`` export. The lines are real ones from the field corpus
(``tests/data/kmsg``, sources in its README), each with the stamp it was published with: the
time and host come from the stamp, the GPU from ``--pci-map``, and the line goes through the same
mapper and stage-1 detector as the kernel-log exporter's records."""

from __future__ import annotations

import calendar
import json
import os
import time
from pathlib import Path

import pytest

from fleetmedic import records as r
from fleetmedic.cli.main import main
from fleetmedic.connectors.kernel.log_lines import stamp

CORPUS = Path(__file__).parents[1] / "data" / "kmsg"


def corpus_line(source: str, contains: str) -> str:
    """The corpus line of ``source`` (D.., H..) containing ``contains``, as it was published."""
    for path in ("patterns-derived-from.txt", "holdout.txt"):
        for row in (CORPUS / path).read_text(encoding="utf-8").splitlines():
            parts = row.split("\t")
            if len(parts) == 3 and parts[1] == source and contains in parts[2]:
                return parts[2]
    raise AssertionError(f"no {source} line with {contains!r} in the corpus")


def utc(text: str) -> float:
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%S")))


@pytest.mark.parametrize(("source", "contains", "year", "ts", "host", "message"), [
    # dmesg -T
    ("H01", "Warp Exception", None, utc("2024-08-30T11:43:09"), "", "NVRM: Xid (PCI:0000:cb:00): 13,"),
    # BSD syslog with the kernel's uptime stamp after "kernel:"
    ("H02", "double bit", 2024, utc("2024-12-02T10:43:35"), "worker4", "NVRM: Xid (PCI:0000:07:00): 48,"),
    # the same without a year to place it
    ("H02", "double bit", None, None, "worker4", "NVRM: Xid (PCI:0000:07:00): 48,"),
    # dmesg -x --time-format=iso: facility and level, then an ISO stamp with a comma
    ("D04", "SXid", None, utc("2025-01-25T10:34:54") + 0.859532, "", "nvidia-nvswitch1: SXid (PCI:0000:84:00.0)"),
    # syslog without a host, two spaces before "kernel:"
    ("D15", "scrubbing", 2025, utc("2025-02-23T03:28:16"), "", "EDAC MC1: 1 CE memory scrubbing error"),
    # syslog without a host, then the uptime stamp
    ("D16", "Bank 4", 2025, utc("2025-09-16T19:51:15"), "", "mce: [Hardware Error]: CPU 0: Machine Check"),
    # a syslog line saved behind dmesg's stamp
    ("D27", "insufficient power", None, utc("2024-12-01T14:54:40"), "ny2g1r12hh2", "mlx5_core 0000:5c:00.0:"),
    # dmesg -T with a one-digit day printed with one space
    ("D27", "ACCESS_REG", None, utc("2024-12-01T14:54:40"), "", "mlx5_core 0000:d2:00.0:"),
])
def test_the_stamps_of_published_kernel_lines(source: str, contains: str, year: int | None, ts: float | None,
                                              host: str, message: str) -> None:
    got = stamp(corpus_line(source, contains), year=year)
    assert got.ts == pytest.approx(ts) if ts is not None else got.ts is None
    assert (got.host, got.message[:len(message)]) == (host, message)


def test_iso_stamps_with_a_zone_and_uptime_stamps_with_a_boot_time() -> None:
    xid = corpus_line("H02", "double bit").split("] ", 1)[1]
    # journalctl -o short-iso writes the zone without a colon
    got = stamp(f"2024-12-02T11:43:35+0100 worker4 kernel: {xid}")
    assert (got.ts, got.host, got.message) == (utc("2024-12-02T10:43:35"), "worker4", xid)
    uptime = corpus_line("D09", "Correctable error message").split("kernel: ", 1)[1]  # "[68183.615790] pcieport..."
    assert stamp(uptime).ts is None
    assert stamp(uptime, boot_time=1_700_000_000.0).ts == pytest.approx(1_700_000_000.0 + 68183.61579)
    assert stamp(uptime).message.startswith("pcieport 0000:00:03.1: AER")
    for unplaced in ("jan. 12 10:00:00 kevin kernel: pcieport", "2024-13-45T99:00:00Z x kernel: y",
                     "Feb 30 10:00:00 host kernel: msg"):
        assert stamp(unplaced, year=2024).ts is None


def _pci_map(tmp_path: Path) -> Path:
    f = tmp_path / "pci-map.csv"
    f.write_text("0, 00000000:07:00.0\n1, 00000000:CB:00.0\n")  # nvidia-smi --query-gpu=index,pci.bus_id
    return f


def _summary(out: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((out / "summary.json").read_text())  # type: ignore[no-any-return]


def _jsonl(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_a_kern_log_and_a_dmesg_capture_backtest_a_dbe_as_hardware_and_an_application_xid_as_not(
        tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    # worker4's kern.log: the node's name comes from the syslog stamp
    (logs / "kern.log").write_text("\n".join([
        corpus_line("D08", "Nvlink Core").replace("Apr 19 13:16:41 Kyrios", "Dec  2 10:40:00 worker4"),
        corpus_line("H02", "double bit"),
    ]) + "\n")
    # gpu-node-3's dmesg -T: no host in the lines, so the file's name; an application's XID 13 twice
    (logs / "gpu-node-3.dmesg").write_text("\n".join([
        corpus_line("H01", "invalid context"),
        corpus_line("H01", "Warp Exception"),
        corpus_line("H01", "Global Exception"),
    ]) + "\n")
    out = tmp_path / "out"
    assert main(["backtest", "--input", str(logs), "--out", str(out), "--pci-map", str(_pci_map(tmp_path)),
                 "--log-year", "2024"]) == 0
    s = _summary(out)
    assert s["records"] == {"KernelEvent": 2}  # gpu-node-3's two XID 13 lines, a second apart: one event
    assert s["kernel_lines_not_published"] == {"xid:13: coalesced (the same event within 60 s)": 1}
    findings = _jsonl(out / "findings.jsonl")
    hard = [f for f in findings if f["node"] == "worker4"]
    assert [(f["kind"], f["gpu"], f["severity"], f["evidence"][0]["value"]) for f in hard] == [
        ("hard_fault", 0, "critical", 48.0)]
    assert hard[0]["ts"] == utc("2024-12-02T10:43:35")
    # XID 13 is the application's: no critical finding, no incident, no command for gpu-node-3
    assert {f["severity"] for f in findings if f["node"] == "gpu-node-3"} <= {"info", "warning"}
    incidents = _jsonl(out / "incidents.jsonl")
    named = {(i["class"], s["name"]) for i in incidents for s in i["suspects"] if s["kind"] == "node"}
    assert named == {("hardware", "worker4")}
    assert {c["node"] for c in _jsonl(out / "commands.jsonl") if c["action"] == "cordon"} == {"worker4"}
    # every line was read; those that name no device fault make no record
    assert (s["lines_read"], s["skipped_total"]) == (5, 0)


def test_a_journal_export_names_its_host_and_time_and_jsonl_kernel_events_are_read_too(tmp_path: Path) -> None:
    line = corpus_line("H02", "double bit").split("kernel: [240314.528856] ", 1)[1]
    when = utc("2024-12-02T10:43:35")
    entry = {"MESSAGE": line, "__REALTIME_TIMESTAMP": str(int(when * 1e6)), "_HOSTNAME": "worker4",
             "PRIORITY": "3", "_BOOT_ID": "0123456789abcdef0123456789abcdef", "__CURSOR": "s=1;i=2"}
    journal = tmp_path / "worker4.journal"
    journal.write_text(json.dumps(entry) + "\n")
    # a kernel.events record as a subscriber dumped it (kcat -J ... | jq .payload): another node
    ev = r.KernelEvent(node="gpu-node-9", ts=when + 5, signal="xid", incident_class="hardware", severity="critical",
                       message="NVRM: Xid (PCI:0000:cb:00): 79, GPU has fallen off the bus.", device="gpu",
                       pattern="xid_line", pci="0000:cb:00", gpu=1, xid=79, gpus=[0, 1], source="kmsg")
    dump = tmp_path / "kernel-events.jsonl"
    dump.write_bytes(r.encode(ev) + b"\n")
    out = tmp_path / "out"
    assert main(["backtest", "--input", str(journal), "--input", str(dump), "--out", str(out),
                 "--pci-map", str(_pci_map(tmp_path))]) == 0
    assert _summary(out)["records"] == {"KernelEvent": 2}
    found = {(f["node"], f["gpu"]) for f in _jsonl(out / "findings.jsonl") if f["kind"] == "hard_fault"}
    assert found == {("worker4", 0), ("gpu-node-9", 1)}


def test_without_a_pci_map_an_xid_names_its_pci_address_and_without_stamps_the_run_says_why(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "worker4.log"
    f.write_text(corpus_line("H02", "double bit") + "\n")
    out = tmp_path / "out"
    assert main(["backtest", "--input", str(f), "--out", str(out), "--log-year", "2024"]) == 0
    (finding,) = _jsonl(out / "findings.jsonl")
    assert (finding["gpu"], finding["severity"], finding["detector"]) == (None, "critical", "xid_rules")
    assert "index unknown" in finding["summary"]
    assert {c["node"] for c in _jsonl(out / "commands.jsonl") if c["action"] == "cordon"} == {"worker4"}
    # lines whose stamps cannot be placed: an exit 1 naming the reason, counted for the file
    g = tmp_path / "node.dmesg"
    g.write_text(corpus_line("D09", "Correctable error message").split("kernel: ", 1)[1] + "\n")  # uptime only
    os.utime(g, (1_790_000_000, 1_790_000_000))
    out2 = tmp_path / "out2"
    assert main(["backtest", "--input", str(g), "--out", str(out2)]) == 1
    assert "kernel line without a time" in capsys.readouterr().err
    assert _summary(out2)["skipped_by_file"] == {str(g): 1}
    # with the boot time it is placed (a correctable AER error: a record, info, no finding)
    out3 = tmp_path / "out3"
    assert main(["backtest", "--input", str(g), "--out", str(out3), "--boot-time", "2026-01-01T00:00:00Z"]) == 0
    assert _summary(out3)["records"] == {"KernelEvent": 1}


def test_usage_errors_of_the_kernel_options_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "a.dmesg"
    f.write_text(corpus_line("H01", "Warp Exception") + "\n")
    assert main(["backtest", "--input", str(f), "--out", str(tmp_path / "o"), "--pci-map", str(tmp_path / "no")]) == 2
    assert "--pci-map" in capsys.readouterr().err
    assert main(["backtest", "--input", str(f), "--out", str(tmp_path / "o"), "--log-year", "24"]) == 2
    assert "--log-year" in capsys.readouterr().err
