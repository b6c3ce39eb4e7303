"""The field corpus (tests/data/field/, sources in its README): exporter output as it exists in the
wild, never produced by fleetmedic's simulator. Every file is parsed and must yield the records
written here; the simulator's series and labels are then checked against it."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from fleetmedic import records as r
from fleetmedic.config import Settings, parse_config
from fleetmedic.connectors.prometheus.text import (
    DCGM_FP64_BLANK,
    DCGM_INT64_BLANK,
    DCGM_TO_METRIC,
    NODE_EXPORTER_IB,
    XID_COUNT_SERIES,
    ExpositionReader,
    Sample,
)
from fleetmedic.sim.exposition import GPU_HELP, IB_SERIES, port_meta_lines

FIELD = Path(__file__).parents[2] / "data" / "field"
DCGM = FIELD / "dcgm-exporter"
NODE_EXPORTER = FIELD / "node-exporter"
SCRAPE_TS = 1_760_000_000.0


def _reader(**kw: object) -> ExpositionReader:
    return ExpositionReader.for_settings(Settings(), ignore_unknown=True, **kw)  # type: ignore[arg-type]


def _read(path: Path, reader: ExpositionReader | None = None, instance: str | None = None,
          text: str | None = None) -> tuple[list[r.GpuTelemetry], list[r.PortTelemetry], ExpositionReader]:
    reader = reader or _reader()
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    recs = list(reader.read(lines, default_ts=SCRAPE_TS, extra_labels={"instance": instance} if instance else None))
    return ([x for x in recs if isinstance(x, r.GpuTelemetry)], [x for x in recs if isinstance(x, r.PortTelemetry)],
            reader)


def _all(path: Path) -> tuple[list[Sample], ExpositionReader]:
    reader = ExpositionReader.for_settings(Settings(), keep_all=True)
    return list(reader.parse(path.read_text(encoding="utf-8").splitlines())), reader


def test_every_corpus_file_has_its_provenance_and_parses_without_an_unparsable_line() -> None:
    readme = (FIELD / "README.md").read_text(encoding="utf-8")
    files = [p for p in FIELD.rglob("*") if p.is_file() and p.name != "README.md"]
    assert len(files) >= 20
    for path in files:
        assert f"`{path.relative_to(FIELD)}`" in readme or path.name in readme, f"{path}: no provenance in README.md"
        if path.suffix in (".prom", ".om") or (path.suffix == ".txt" and path.parent.name != "node-exporter"):
            samples, reader = _all(path)
            assert samples, path
            assert not reader.skipped, (path, reader.skipped)


# --- dcgm-exporter -------------------------------------------------------------------------------


def test_gpu_operator_output_on_kops_yields_one_gpu_record_with_its_values() -> None:
    (rec,), ports, reader = _read(DCGM / "kops-l4-gpu-operator.prom")
    assert not ports and not reader.skipped
    assert (rec.node, rec.ts, rec.gpus) == ("i-030791dc5a37cd257", SCRAPE_TS, [0])
    assert rec.sku == "NVIDIA L4" and rec.driver_version == "580.105.08"
    assert rec.uuids == ["GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"]
    m = rec.metrics
    assert (m.gpu_temp, m.memory_temp, m.power_usage, m.sm_clock, m.mem_clock) == ([31.0], [0.0], [16.365], [210.0],
                                                                                   [405.0])
    assert (m.fb_free, m.fb_used, m.pcie_replay_counter, m.uncorrectable_remapped_rows) == ([22563.0], [0.0], [0], [0])
    assert m.row_remap_failure == [0] and m.correctable_remapped_rows == [0]
    assert m.prof_pipe_tensor_active == [0.0] and m.prof_dram_active == [0.0]
    # the series fleetmedic does not read are counted, not skipped
    assert reader.ignored["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == 1
    assert reader.ignored["DCGM_FI_PROF_PCIE_TX_BYTES"] == 1


def test_gpu_operator_v25_output_with_err_code_and_pod_labels_yields_the_xid_gauge() -> None:
    (rec,), _, reader = _read(DCGM / "lke-rtx4000-gpu-operator-v25.10.0.prom")
    assert not reader.skipped
    assert rec.node == "lke529760-766837-0a634ab30000"  # Hostname = the node (NODE_NAME from spec.nodeName)
    assert rec.sku == "NVIDIA RTX 4000 Ada Generation" and rec.driver_version == "580.95.05"
    assert rec.metrics.xid_errors == [0] and rec.metrics.gpu_temp == [48.0] and rec.metrics.power_usage == [40.979]
    assert rec.metrics.sm_clock == [2310.0] and rec.metrics.fb_used == [1.0]
    assert rec.metrics.prof_dram_active == [0.003074]


def test_the_readme_sample_keeps_its_values_and_drops_dcgms_not_supported_sentinel() -> None:
    # no Hostname label (a docker run without --kubernetes): the node is the scrape target's, as
    # Prometheus adds `instance`
    (rec,), _, reader = _read(DCGM / "readme-quickstart-4.5.3-4.8.2.prom", instance="gpu-node-1:9400")
    assert rec.node == "gpu-node-1" and rec.gpus == [0] and rec.uuids == ["GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"]
    assert rec.metrics.sm_clock == [139.0] and rec.metrics.mem_clock == [405.0]
    assert rec.metrics.memory_temp is None, "9223372036854775794 is DCGM_INT64_NOT_SUPPORTED, not a temperature"
    assert reader.skipped == Counter({"DCGM_FI_DEV_MEMORY_TEMP: DCGM blank value (not supported by the GPU)": 1})
    # without a target label the node is unknown: counted, not guessed
    gpu, _, reader = _read(DCGM / "readme-quickstart-4.5.3-4.8.2.prom")
    assert not gpu and sum(reader.skipped.values()) == 3
    assert all("no node label (Hostname, hostname, node, kubernetes_node, instance)" in k for k in reader.skipped)


def test_the_dcgm_blank_sentinels_match_dcgms_header() -> None:
    defines = dict(re.findall(r"^#define (DCGM_(?:INT64|FP64)_BLANK) (\S+)$",
                              (DCGM / "go-dcgm-dcgm_fields-defines.h").read_text(), re.M))
    assert float(int(defines["DCGM_INT64_BLANK"], 16)) == DCGM_INT64_BLANK
    assert float(defines["DCGM_FP64_BLANK"]) == DCGM_FP64_BLANK


def test_a_docker_container_id_hostname_is_not_a_node_and_the_throttle_field_reads_under_its_old_name() -> None:
    gpu, _, reader = _read(DCGM / "datadog-fixture-t4.prom", instance="10.0.0.7:9400")
    # Hostname="424773df46e0" / "551bdf382151": container ids, so the target names the node
    assert [x.node for x in gpu] == ["10.0.0.7", "ip-11111"]
    t4 = gpu[0]
    assert t4.sku == "Tesla T4" and t4.driver_version == "460.106.00"
    m = t4.metrics
    assert (m.sm_clock, m.mem_clock, m.gpu_temp, m.power_usage) == ([300.0], [405.0], [25.0], [8.969])
    assert (m.gpu_util, m.mem_copy_util, m.fb_free, m.fb_used, m.xid_errors) == ([0.0], [0.0], [15109.0], [0.0], [0])
    assert m.clocks_event_reasons == [1], "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS: the older name of the same field"
    assert gpu[1].metrics.prof_dram_active == [3e-06]
    # the fixture's label-less "dummy value" lines have no GPU: counted per series
    assert reader.skipped == Counter({f"{s}: no gpu label": 1 for s in (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_ROW_REMAP_FAILURE")})
    # with the ignore pattern off, Hostname is taken as it is: "nodes" named by container ids
    gpu, _, _ = _read(DCGM / "datadog-fixture-t4.prom", _reader(node_label_ignore=""))
    assert [x.node for x in gpu] == ["424773df46e0", "551bdf382151", "ip-11111"]


@pytest.mark.parametrize(("name", "label"), [
    ("server_test-expected-4.5.3-4.8.2.prom", "Hostname"), ("server_test-expected-main-d5e5f51.prom", "hostname")])
def test_both_spellings_of_dcgm_exporters_host_label_name_the_node(name: str, label: str) -> None:
    text = (DCGM / name).read_text().replace("TEST_METRIC", "DCGM_FI_DEV_GPU_TEMP")  # its test metric, as one we read
    assert f'{label}="testhost"' in text
    (rec,), _, _ = _read(DCGM / name, text=text)
    assert (rec.node, rec.gpus, rec.metrics.gpu_temp, rec.sku) == ("testhost", [0], [42.0], "NVIDIA T400 4GB")


def test_a_pod_named_hostname_falls_through_to_the_relabelled_node() -> None:
    line = ('DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1",Hostname="nvidia-dcgm-exporter-x7k2p",node="gpu-node-3",'
            'instance="10.2.3.4:9400"} 61')
    (rec,), _, _ = _read(DCGM / "none", text=line)
    assert rec.node == "gpu-node-3"
    (rec,), _, _ = _read(DCGM / "none", text=line.replace(',node="gpu-node-3"', ""))
    assert rec.node == "10.2.3.4"  # the last resort: the target's host


def test_the_windowed_xid_count_of_pr_239_reads_under_its_released_name() -> None:
    path = DCGM / "pr239-xid-errors-count.prom"
    gpu, _, reader = _read(path)
    assert not gpu and reader.ignored["DCGM_FI_DEV_XID_ERRORS_ACTIVE"] == 1  # the PR's pre-release name
    text = path.read_text().replace("DCGM_FI_DEV_XID_ERRORS_ACTIVE{", f"{XID_COUNT_SERIES}{{")
    (rec,), _, reader = _read(path, text=text)
    assert (rec.node, rec.gpus, rec.metrics.xid_errors, rec.sku) == ("workstation", [0], [42], "NVIDIA T400 4GB")
    assert not reader.skipped
    # no XID in the window: a 0-valued series without an xid label (and the last-value gauge wins)
    quiet = ('DCGM_EXP_XID_ERRORS_COUNT{gpu="1",Hostname="workstation",window_size_in_ms="300000"} 0\n'
             'DCGM_EXP_XID_ERRORS_COUNT{gpu="0",Hostname="workstation",window_size_in_ms="300000",xid="42"} 1\n'
             'DCGM_FI_DEV_XID_ERRORS{gpu="0",Hostname="workstation",err_code="79",'
             'err_msg="GPU has fallen off the bus"} 79')
    (rec,), _, _ = _read(path, text=quiet)
    assert rec.gpus == [0, 1] and rec.metrics.xid_errors == [79, 0]


def test_every_dcgm_field_fleetmedic_reads_is_a_dcgm_field_and_dcgm_exporter_lists_spell_them_alike() -> None:
    defined = set(re.findall(r"^#define (DCGM_FI_\w+)", (DCGM / "go-dcgm-dcgm_fields-defines.h").read_text(), re.M))
    ours = set(DCGM_TO_METRIC) - {"DCGM_FI_DEV_NVLINK_LINKS_DOWN"}  # fleetmedic's own, from NVML link state
    assert ours <= defined, ours - defined
    listed: set[str] = set()
    for csv in DCGM.glob("*.csv"):
        listed |= set(re.findall(r"^\s*#?\s*(DCGM_\w+)\s*,", csv.read_text(), re.M))
    assert XID_COUNT_SERIES in listed and "DCGM_FI_DEV_XID_ERRORS" in listed
    # what the lists enable by default and fleetmedic reads: read under the same names
    assert {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"} <= listed & set(DCGM_TO_METRIC)
    # and the simulator writes only names DCGM has (or fleetmedic's own)
    assert {f"DCGM_FI_{'PROF' if m.startswith('prof_') else 'DEV'}_" + m.removeprefix("prof_").upper()
            for m in GPU_HELP} - {"DCGM_FI_DEV_NVLINK_LINKS_DOWN"} <= defined


# --- node-exporter --------------------------------------------------------------------------------


def test_node_exporter_infiniband_output_maps_every_counter_under_its_real_name() -> None:
    _, (rec,), reader = _read(NODE_EXPORTER / "e2e-output-infiniband-v1.12.1.prom", instance="gpu-node-1:9100")
    assert not reader.skipped and rec.device == "gpu-node-1" and rec.device_kind == "host" and rec.ts == SCRAPE_TS
    by = {p.port: p for p in rec.ports}
    assert set(by) == {"i40iw0/1", "mlx4_0/1", "mlx4_0/2"}
    p1 = by["mlx4_0/1"]
    assert p1.link_state == "up" and p1.speed_gbps == 40.0  # rate 5e+09 bytes/s; state 4, physical 5
    assert p1.port_xmit_discards == 5, "node_infiniband_port_discards_transmitted_total"
    assert p1.port_xmit_wait == 4294967295 and p1.port_rcv_errors == 0
    assert p1.link_downed_counter == 0 and p1.link_error_recovery_counter == 0
    assert p1.port_rcv_data == 18527668 // 4 and p1.port_xmit_data == 14933760 // 4  # bytes -> 4-byte words
    assert by["mlx4_0/2"].port_rcv_data == 0, "the 64-bit counter wins over the legacy one"
    assert by["i40iw0/1"].speed_gbps == 10.0 and by["i40iw0/1"].link_state == "up"


def test_node_exporter_before_the_state_series_gives_unknown_link_state_and_the_counters() -> None:
    _, (rec,), reader = _read(NODE_EXPORTER / "e2e-output-infiniband-v0.18.1.prom", instance="gpu-node-1:9100")
    by = {p.port: p for p in rec.ports}
    assert not reader.skipped and by["mlx4_0/1"].link_state == "unknown" and by["mlx4_0/1"].speed_gbps is None
    assert by["mlx4_0/1"].port_xmit_discards == 5


def test_the_physical_state_decides_when_the_link_is_not_up() -> None:
    lab = 'device="mlx5_0",port="1",instance="n1:9100"'
    text = f"node_infiniband_state_id{{{lab}}} 4\nnode_infiniband_physical_state_id{{{lab}}} 3\n"
    _, (rec,), _ = _read(NODE_EXPORTER / "none", text=text)
    assert rec.ports[0].link_state == "down"  # physical 3 = disabled


def test_every_infiniband_series_fleetmedic_reads_or_writes_is_one_node_exporter_has() -> None:
    names = set((NODE_EXPORTER / "infiniband_linux-v1.12.1-metric-names.txt").read_text().split())
    e2e_text = (NODE_EXPORTER / "e2e-output-infiniband-v1.12.1.prom").read_text()
    e2e = set(re.findall(r"^(node_infiniband_\w+)\{", e2e_text, re.M))
    assert e2e - names == {"node_infiniband_info"}  # built apart from the map in the collector
    assert set(NODE_EXPORTER_IB) <= names, set(NODE_EXPORTER_IB) - names
    written = set(IB_SERIES) | {line.split()[2] for line in port_meta_lines() if line.startswith("# TYPE")}
    assert written <= names, written - names
    # and the simulator's port file reads back through the same map (labels device, port)
    assert {"node_infiniband_state_id", "node_infiniband_physical_state_id"} <= written


# --- Prometheus and OpenMetrics -------------------------------------------------------------------


def test_promtool_tsdb_dump_lines_give_name_labels_and_millisecond_timestamps() -> None:
    samples, reader = _all(FIELD / "prometheus" / "promtool-dump-test-2.txt")
    assert len(samples) == 10 and not reader.skipped
    assert [(s[0], s[1]["foo"], s[2], s[3]) for s in samples[:2]] == [("heavy_metric", "foo", 5.0, 0.0),
                                                                     ("heavy_metric", "foo", 4.0, 60.0)]
    assert samples[-1][0] == "metric" and samples[-1][1]["baz"] == "abc" and samples[-1][3] == 240.0


def test_promtool_dump_openmetrics_gives_float_second_timestamps() -> None:
    samples, reader = _all(FIELD / "prometheus" / "promtool-dump-openmetrics-test.om")
    assert [s[3] for s in samples[:5]] == [0.0, 60.0, 120.0, 180.0, 240.0] and not reader.skipped
    assert samples[7] == ("my_gauge", {"abc": "baz", "bar": "foo"}, 0.0, 120.0)


def test_openmetrics_spec_examples_parse_with_exemplars_ignored() -> None:
    samples, reader = _all(FIELD / "openmetrics" / "spec-histogram-exemplars.om")
    assert not reader.skipped
    assert [(s[1].get("le"), s[2], s[3]) for s in samples if s[0] == "foo_bucket"] == [
        ("0.01", 0.0, None), ("0.1", 8.0, None), ("1", 11.0, None), ("10", 17.0, None), ("+Inf", 17.0, None)]
    samples, reader = _all(FIELD / "openmetrics" / "spec-counter-timestamp-created.om")
    assert samples == [("foo_total", {}, 17.0, 1520879607.789), ("foo_created", {}, 1520430000.123, 1520879607.789)]
    samples, reader = _all(FIELD / "openmetrics" / "spec-complete-exposition.om")
    assert len(samples) == 8 and not reader.skipped and samples[-1] == ("process_cpu_seconds_total", {}, 4.20072246e06,
                                                                       None)


def test_an_openmetrics_counter_of_a_series_fleetmedic_reads_maps_from_total_and_created_is_ignored() -> None:
    # the spec's counter example, its name as a dcgm counter would be written by an OpenMetrics
    # exposer (e.g. a federating Prometheus or a client library re-exporting it)
    text = (FIELD / "openmetrics" / "spec-counter-timestamp-created.om").read_text()
    text = text.replace("foo_total ", 'DCGM_FI_DEV_PCIE_REPLAY_COUNTER_total{gpu="2",Hostname="n7"} ')
    text = text.replace("foo_created ", 'DCGM_FI_DEV_PCIE_REPLAY_COUNTER_created{gpu="2",Hostname="n7"} ')
    (rec,), _, reader = _read(FIELD / "none", text=text)
    assert (rec.node, rec.ts, rec.gpus, rec.metrics.pcie_replay_counter) == ("n7", 1520879607.789, [2], [17])
    assert not reader.skipped and not reader.ignored


def test_the_node_label_order_is_configurable_in_the_prometheus_section() -> None:
    line = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="h",kubernetes_node="k",instance="i:9400"} 50'
    s = parse_config("exporters: {prometheus: {node_labels: [kubernetes_node, Hostname]}}")
    (rec,), _, _ = _read(FIELD / "none", ExpositionReader.for_settings(s), text=line)
    assert rec.node == "k"
    s = parse_config("ingest: {node_labels: [instance]}")  # the older setting alone still applies
    (rec,), _, _ = _read(FIELD / "none", ExpositionReader.for_settings(s), text=line)
    assert rec.node == "i"


def test_the_gpu_operator_sets_the_hostname_label_from_the_node_name() -> None:
    ds = yaml.safe_load((FIELD / "gpu-operator" / "state-dcgm-exporter-0800_daemonset-v26.7.0.yaml").read_text())
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert Settings().exporters.prometheus.node_labels[0] == "Hostname"


def test_simulated_dcgm_labels_are_the_real_exporters() -> None:
    real = re.search(r"\{(.*)\}", next(line for line in (DCGM / "kops-l4-gpu-operator.prom").read_text().splitlines()
                                       if line.startswith("DCGM_FI_DEV_GPU_TEMP{")))
    assert real is not None
    real_keys = [kv.split("=", 1)[0] for kv in re.findall(r'(\w+="[^"]*")', real.group(1))]
    from fleetmedic.sim.engine import SimConfig, Simulator
    from fleetmedic.sim.exposition import gpu_exposition
    from fleetmedic.sim.fleet import FleetSpec

    out = next(iter(Simulator(SimConfig(fleet=FleetSpec(nodes=2, nodes_per_su=2, spines=1), duration_s=20,
                                        seed=1)).run()))
    sim_line = next(x for x in gpu_exposition(out.gpu).splitlines() if x.startswith("DCGM_FI_DEV_GPU_TEMP{"))
    sim = re.search(r"\{(.*)\}", sim_line)
    assert sim is not None
    assert [kv.split("=", 1)[0] for kv in re.findall(r'(\w+="[^"]*")', sim.group(1))] == real_keys
