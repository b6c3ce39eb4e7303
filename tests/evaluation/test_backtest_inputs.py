"""``fleetmedic backtest`` over telemetry as users have it: raw ``/metrics`` scrapes without sample
timestamps (stamped with ``--scrape-time`` or the file's time, and said so), OpenMetrics and
``promtool tsdb dump`` files (series by series, sorted by time), scrapes whose samples differ by a
few milliseconds (one record), values out of range (dropped alone), and honest exits (no
record: exit 1 with the reasons; skips counted per reason and per file)."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

from fleetmedic import records as r
from fleetmedic.cli.main import main
from fleetmedic.config import Settings, parse_config
from fleetmedic.connectors.prometheus.api import parse_duration, parse_time, plan_chunks
from fleetmedic.connectors.prometheus.text import ExpositionReader
from fleetmedic.evaluation.backtest_inputs import InputReader

FIELD = Path(__file__).parents[1] / "data" / "field"
T0 = 1_790_000_000.0
LAB = ('gpu="{g}",UUID="GPU-{g}",pci_bus_id="00000000:{g}1:00.0",device="nvidia{g}",modelName="NVIDIA H100 80GB HBM3",'
       'Hostname="{node}",DCGM_FI_DRIVER_VERSION="550.54.15"')


def scrape(node: str, temp: float = 50.0, ts_ms: int | None = None, gpus: int = 8) -> list[str]:
    """One dcgm-exporter scrape of ``node`` (its real label set), with or without timestamps."""
    out = ["# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).", "# TYPE DCGM_FI_DEV_GPU_TEMP gauge"]
    suffix = "" if ts_ms is None else f" {ts_ms}"
    for series, value in (("DCGM_FI_DEV_GPU_TEMP", temp), ("DCGM_FI_DEV_POWER_USAGE", 312.5),
                          ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0)):
        out += [f"{series}{{{LAB.format(g=g, node=node)}}} {value}{suffix}" for g in range(gpus)]
    return out


def _summary(out: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((out / "summary.json").read_text())  # type: ignore[no-any-return]


def test_a_raw_scrape_without_timestamps_is_stamped_with_the_scrape_time_given(tmp_path: Path) -> None:
    f = tmp_path / "node-1.prom"
    f.write_text("\n".join(scrape("gpu-node-1")) + "\n")
    out = tmp_path / "out"
    assert main(["backtest", "--input", str(f), "--out", str(out), "--scrape-time", "2026-09-01T12:00:00Z"]) == 0
    s = _summary(out)
    assert s["records"] == {"GpuTelemetry": 1}
    assert s["timestamps"] == {str(f): {"samples_without_timestamp": 24, "stamped_with": "--scrape-time",
                                        "scrape_time": "2026-09-01T12:00:00Z"}}


def test_without_a_scrape_time_the_files_modification_time_is_used_and_said(tmp_path: Path) -> None:
    f = tmp_path / "node-1.prom"
    f.write_text("\n".join(scrape("gpu-node-1")) + "\n")
    os.utime(f, (T0, T0))
    out = tmp_path / "out"
    assert main(["backtest", "--input", str(f), "--out", str(out)]) == 0
    assert _summary(out)["timestamps"][str(f)]["stamped_with"] == "file modification time"
    assert _summary(out)["timestamps"][str(f)]["scrape_time"] == "2026-09-21T14:13:20Z"  # T0


def test_more_raw_scrape_files_than_the_open_file_limit_are_all_read(tmp_path: Path) -> None:
    """One file per scrape and target, more of them than the process may hold open: each file is
    read (the merge does not hold them all open), none is lost to "too many open files"."""
    import resource

    files = 300
    for k in range(files):
        f = tmp_path / f"gpu-node-{k % 3}-{k:04d}.prom"
        f.write_text("\n".join(scrape(f"gpu-node-{k % 3}", temp=50.0 + k % 2)) + "\n")
        os.utime(f, (T0 + 30 * (k // 3), T0 + 30 * (k // 3)))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
    try:
        reader = InputReader(Settings())
        recs = list(reader.records([str(tmp_path)]))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert reader.problems() == {}
    assert len(recs) == files and [x.ts for x in recs] == sorted(x.ts for x in recs)
    assert {x.node for x in recs if isinstance(x, r.GpuTelemetry)} == {"gpu-node-0", "gpu-node-1", "gpu-node-2"}


def test_an_input_without_records_exits_1_with_the_reasons_and_counts_them_per_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "node-exporter.prom"  # node-exporter's own output names no node; no --label given
    f.write_text((FIELD / "node-exporter" / "e2e-output-infiniband-v1.12.1.prom").read_text())
    out = tmp_path / "out"
    assert main(["backtest", "--input", str(f), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "the input yielded no records" in err and "no node label (Hostname, hostname, node" in err
    s = _summary(out)
    assert s["records"] == {} and s["skipped_by_file"] == {str(f): s["skipped_total"]} and s["skipped_total"] > 10
    assert list(s["skipped_by_reason"]) == ["no node label (Hostname, hostname, node, kubernetes_node, instance)"]
    assert s["series_not_read"]["node_infiniband_info"] == 2
    # the same file with the target's label, as Prometheus would have added it
    assert main(["backtest", "--input", str(f), "--out", str(out), "--label", "instance=gpu-node-1:9100"]) == 0
    assert _summary(out)["records"] == {"PortTelemetry": 1}


def test_an_empty_or_comment_only_input_is_no_records_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "empty.prom"
    f.write_text("# HELP x y\n")
    assert main(["backtest", "--input", str(f), "--out", str(tmp_path / "o")]) == 1
    assert "no readable lines" in capsys.readouterr().err


def test_one_series_stamped_a_millisecond_apart_stays_in_its_scrapes_record(tmp_path: Path) -> None:
    """One GPU series 1 ms off the rest of its scrape stays in that scrape's record, so the node's
    other GPUs do not look as if they had stopped reporting and no healthy node is drained."""
    ms = int(T0 * 1000)
    lines = []
    for k in range(3):
        one = scrape("gpu-node-1", ts_ms=ms + 30_000 * k)
        one[-1] = one[-1].rsplit(" ", 1)[0] + f" {ms + 30_000 * k + 1}"  # GPU 7's DBE counter, 1 ms later
        lines += one
    recs = list(ExpositionReader.for_settings(Settings()).read(lines))
    assert [(x.ts, x.gpus) for x in recs] == [(T0 + 30 * k, list(range(8))) for k in range(3)]  # type: ignore[union-attr]
    assert all(x.metrics.ecc_dbe_vol_total == [0] * 8 for x in recs)  # type: ignore[union-attr]
    # the tolerance is a setting; at 0 the stray sample is a record of its own, as before
    strict = ExpositionReader.for_settings(parse_config("exporters: {prometheus: {group_tolerance_ms: 0}}"))
    assert len(list(strict.read(lines))) == 6
    # and through the whole backtest: no finding on the healthy node
    f = tmp_path / "scrapes.prom"
    f.write_text("\n".join(lines * 1) + "\n")
    out = tmp_path / "out"
    assert main(["backtest", "--input", str(f), "--out", str(out)]) == 0
    assert _summary(out)["records"] == {"GpuTelemetry": 3} and _summary(out)["findings"] == 0


def test_a_bad_value_drops_that_value_and_keeps_the_8_gpu_record() -> None:
    lines = scrape("gpu-node-2", ts_ms=int(T0 * 1000))
    lines[5] = lines[5].replace("} 50.0 ", "} 9999 ")  # GPU 3's temperature: out of range
    lines[13] = lines[13].replace("} 312.5 ", "} -4 ")  # GPU 3's power: negative
    reader = ExpositionReader.for_settings(Settings())
    (rec,) = list(reader.read(lines))
    assert isinstance(rec, r.GpuTelemetry) and rec.gpus == list(range(8))
    assert rec.metrics.gpu_temp == [50.0, 50.0, 50.0, None, 50.0, 50.0, 50.0, 50.0]
    assert rec.metrics.power_usage == [312.5] * 3 + [None] + [312.5] * 4
    assert dict(reader.skipped) == {"DCGM_FI_DEV_GPU_TEMP: value out of range": 1,
                                    "DCGM_FI_DEV_POWER_USAGE: value out of range": 1}


def test_openmetrics_and_promtool_dump_files_backtest_like_scrapes(tmp_path: Path) -> None:
    """A ``promtool tsdb dump`` lists each series' samples together: read in time order through
    temp files; an OpenMetrics dump has float-second timestamps and ``# EOF``."""
    ms = int(T0 * 1000)
    dump = []  # series by series, as promtool writes it
    for g in range(2):
        for series in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK"):
            for k in range(20):
                value = 40 + k if series.endswith("TEMP") else 1980
                dump.append(f'{{__name__="{series}", Hostname="gpu-node-3", gpu="{g}", instance="10.1.1.3:9400", '
                            f'job="dcgm"}} {value} {ms + 1800_000 * k}')  # 30 min apart: 20 sort buckets
    (tmp_path / "dump.txt").write_text("\n".join(dump) + "\n")
    om = [f'DCGM_FI_DEV_GPU_TEMP{{gpu="{g}",Hostname="gpu-node-4"}} {50 + k} {T0 + 60 * k:.3f}'
          for g in range(2) for k in range(5)] + ["# EOF"]
    (tmp_path / "dump.om").write_text("\n".join(om) + "\n")
    out = tmp_path / "out"
    assert main(["backtest", "--input", str(tmp_path), "--out", str(out)]) == 0
    s = _summary(out)
    assert s["records"] == {"GpuTelemetry": 25} and s["skipped_total"] == 0 and s["timestamps"] == {}


def test_a_file_grouped_by_metric_family_is_read_whole(tmp_path: Path) -> None:
    """All of one metric's scrapes, then all of the next metric's (a dump grouped by family): the
    second family starts 20 minutes behind the first one's newest sample. Read as a stream (the
    reader flushes what is 120 s behind the newest, every 20,000 samples), the later family was
    dropped as too old; the pass over the timestamps sends the file through the sort instead."""
    ms = int(T0 * 1000)
    lines = []
    for series, value in (("DCGM_FI_DEV_GPU_TEMP", 45), ("DCGM_FI_DEV_SM_CLOCK", 1980)):
        lines.append(f"# TYPE {series} gauge")
        for k in range(120):  # scrape by scrape within the family, 10 s apart: 20 min of history
            lines += [f'{series}{{gpu="{g}",Hostname="gpu-node-{n}"}} {value} {ms + 10_000 * k}'
                      for n in range(25) for g in range(8)]  # 24,000 samples a family
    (tmp_path / "families.prom").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    assert main(["backtest", "--input", str(tmp_path / "families.prom"), "--out", str(out)]) == 0
    s = _summary(out)
    assert s["records"] == {"GpuTelemetry": 25 * 120} and s["skipped_total"] == 0


def test_times_and_steps_parse_as_prometheus_takes_them() -> None:
    assert parse_time("2024-05-01T12:00:00Z") == parse_time("1714564800") == 1714564800.0
    assert parse_time("2024-05-01T14:00:00.250+02:00") == 1714564800.25
    for bad in ("yesterday", "2024-05-01T12:00:00", "1e30", ""):
        with pytest.raises(ValueError):
            parse_time(bad)
    assert parse_duration("1h30m") == 5400 and parse_duration("30s") == parse_duration("30") == 30
    with pytest.raises(ValueError):
        parse_duration("-5s")


def test_range_queries_stay_under_the_servers_points_limit_and_cover_the_range_once() -> None:
    week, step = 7 * 86400.0, 15.0
    chunks = plan_chunks(T0, T0 + week, step, 11_000)
    assert all((b - a) / step + 1 <= 11_000 for a, b in chunks)
    assert chunks[0][0] == T0 and chunks[-1][1] == T0 + week
    assert all(a2 == b1 + step for (_, b1), (a2, _) in itertools.pairwise(chunks))  # no point twice, none missed
    small = plan_chunks(0, 100, 1, 11)
    assert all(b - a <= 10 for a, b in small) and sum(b - a + 1 for a, b in small) == 101


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "o")
    assert main(["backtest", "--out", out]) == 2
    assert main(["backtest", "--prometheus", "http://127.0.0.1:1", "--start", "1", "--out", out]) == 2
    assert main(["backtest", "--prometheus", "http://127.0.0.1:1", "--start", "x", "--end", "2", "--out", out]) == 2
    assert main(["backtest", "--input", out, "--label", "no-equals", "--out", out]) == 2
    err = capsys.readouterr().err
    assert "--input" in err and "--start and --end" in err and "RFC 3339" in err and "KEY=VALUE" in err


def node_exporter_scrape(errors: int) -> str:
    """A raw node-exporter answer (infiniband families only): no node label, no timestamps."""
    lines = ["# TYPE node_infiniband_state_id gauge", "# TYPE node_infiniband_symbol_error_total counter"]
    for port in ("mlx5_0", "mlx5_1"):
        lines.append(f'node_infiniband_state_id{{device="{port}",port="1"}} 4')
        lines.append(f'node_infiniband_symbol_error_total{{device="{port}",port="1"}} {errors}')
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("layout", ["file", "dir"])
def test_raw_node_exporter_scrapes_take_their_node_from_where_they_were_saved(tmp_path: Path, layout: str) -> None:
    """node-exporter's answer names no node (Prometheus adds ``instance``): ``--node-from-path``
    names it after the file (``gpu-node-1.prom``) or its directory (``gpu-node-1/node-0.prom``);
    a sample that names its node keeps it; without the option they are skipped, counted and said."""
    scrapes = tmp_path / "scrapes"
    for k in range(3):
        for node in ("gpu-node-1", "gpu-node-2"):
            f = (scrapes / f"t{k}" / f"{node}.prom") if layout == "file" else (scrapes / node / f"node-{k}.prom")
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(node_exporter_scrape(10 * k))
            os.utime(f, (1.79e9 + 30 * k, 1.79e9 + 30 * k))
    named = scrapes / "t0" / "dcgm.prom" if layout == "file" else scrapes / "gpu-node-1" / "dcgm-0.prom"
    named.write_text("\n".join(scrape("gpu-node-9")) + "\n")  # dcgm's Hostname names the node: kept
    out = tmp_path / "out"
    assert main(["backtest", "--input", str(scrapes), "--out", str(out), "--node-from-path", layout]) == 0
    reader = InputReader(Settings(), node_from_path=layout)
    recs = list(reader.records([str(scrapes)]))
    ports = sorted({(x.device, x.ts) for x in recs if isinstance(x, r.PortTelemetry)})
    assert ports == [(n, 1.79e9 + 30 * k) for n in ("gpu-node-1", "gpu-node-2") for k in range(3)]
    assert {x.node for x in recs if isinstance(x, r.GpuTelemetry)} == {"gpu-node-9"}
    assert _summary(out)["records"]["PortTelemetry"] == 6
    without = tmp_path / "without"
    assert main(["backtest", "--input", str(scrapes), "--out", str(without)]) == 0  # the GPU record is read
    s = _summary(without)
    assert "PortTelemetry" not in s["records"] and s["skipped_total"] == 6 * 4
    assert any("no node label" in reason for reason in json.dumps(s).split('"'))
