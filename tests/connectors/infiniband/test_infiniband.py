"""InfiniBand counters: perfquery's default and extended (-x) output parsed, mapped to ports by the
configured topology (switch ports by LID, HCA ports by device), node-exporter's infiniband series
read with byte counters converted to IB words; the source runs a perfquery command per port."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from pathlib import Path

from prometheus_client import CollectorRegistry

from fleetmedic import records as r
from fleetmedic.config import InfinibandPortLink, IngestSettings, parse_config
from fleetmedic.connectors.infiniband.exporter import PerfquerySource
from fleetmedic.connectors.infiniband.perfquery import Topology, parse_perfquery, port_records
from fleetmedic.connectors.prometheus.text import ExpositionReader
from fleetmedic.connectors.runtime import ConnectorMetrics, Outbox

DEFAULT = """# Port counters: Lid 214 port 35 (CapMask: 0x5A00)
PortSelect:......................35
CounterSelect:...................0x0000
SymbolErrorCounter:..............12
LinkErrorRecoveryCounter:........1
LinkDownedCounter:...............1
PortRcvErrors:...................3
PortRcvRemotePhysicalErrors:.....0
PortRcvSwitchRelayErrors:........0
PortXmitDiscards:................7
PortXmitConstraintErrors:........0
PortRcvConstraintErrors:.........0
CounterSelect2:..................0x00
LocalLinkIntegrityErrors:........0
ExcessiveBufferOverrunErrors:....0
VL15Dropped:.....................0
PortXmitData:....................4294967295
PortRcvData:.....................1811939328
PortXmitPkts:....................186347289
PortRcvPkts:.....................186366116
PortXmitWait:....................1520
"""

EXTENDED = """ibwarn: [21453] main: PerfMgt ClassPortInfo 0x400 extended counters not indicated
# Port extended counters: Lid 1719 port 1 (CapMask: 0x5300 CapMask2: 0x0000002)
PortSelect:......................1
CounterSelect:...................0x0000
PortXmitData:....................36298026860928
PortRcvData:.....................12279028775751
PortXmitPkts:....................101733204203
PortRcvPkts:.....................32262508468
PortUnicastXmitPkts:.............101708165289
PortUnicastRcvPkts:..............26677661727
PortMulticastXmitPkts:...........25038914
PortMulticastRcvPkts:............5584846741
CounterSelect2:..................0x00000000
SymbolErrorCounter:..............0
LinkErrorRecoveryCounter:........0
LinkDownedCounter:...............0
PortRcvErrors:...................0
PortRcvRemotePhysicalErrors:.....0
PortRcvSwitchRelayErrors:........0
PortXmitDiscards:................0
PortXmitConstraintErrors:........0
PortRcvConstraintErrors:.........0
LocalLinkIntegrityErrors:........0
ExcessiveBufferOverrunErrors:....0
VL15Dropped:.....................0
PortXmitWait:....................48213
QP1Dropped:......................0
"""

EXTENDED_DATA_ONLY = """# Port extended counters: Lid 996 port 1 (CapMask: 0x200)
PortSelect:......................1
CounterSelect:...................0x0000
PortXmitData:....................5602171943357
PortRcvData:.....................foo
PortXmitPkts:....................11149272223
"""


def test_default_and_extended_formats_parse_to_counters() -> None:
    skipped: Counter[str] = Counter()
    (d,) = parse_perfquery(DEFAULT, skipped)
    assert (d.lid, d.port, d.extended) == (214, 35, False)
    assert d.counters["SymbolErrorCounter"] == 12 and d.counters["PortXmitData"] == 4294967295
    assert d.counters["PortXmitWait"] == 1520 and "PortXmitPkts" not in d.counters
    (x,) = parse_perfquery(EXTENDED, skipped)
    assert (x.lid, x.port, x.extended) == (1719, 1, True)
    assert x.counters["PortXmitData"] == 36298026860928 and x.counters["PortXmitWait"] == 48213
    assert x.counters["SymbolErrorCounter"] == 0
    assert not skipped, "the ibwarn line and counters fleetmedic does not read are not errors"
    (bad,) = parse_perfquery(EXTENDED_DATA_ONLY, skipped)
    assert bad.counters == {"PortXmitData": 5602171943357}
    assert skipped == Counter({"perfquery PortRcvData: value is not a number": 1})


def test_topology_names_switch_ports_and_hca_ports() -> None:
    switch_port = InfinibandPortLink(lid=214, port=35, device="leaf-07", node="gpu-node-12", peer="gpu-node-12:mlx5_0")
    hca = InfinibandPortLink(device="mlx5_0", port=1, node="gpu-node-3", device_kind="host")
    skipped: Counter[str] = Counter()
    (d,) = parse_perfquery(DEFAULT, skipped)
    (x,) = parse_perfquery(EXTENDED, skipped)
    host, leaf = port_records([(switch_port, d), (hca, x)], 1_700_000_000.0, skipped)
    assert (leaf.device, leaf.device_kind, leaf.source) == ("leaf-07", "switch", "perfquery")
    p = leaf.ports[0]
    assert (p.port, p.node, p.peer) == ("35", "gpu-node-12", "gpu-node-12:mlx5_0")
    assert (p.symbol_error_counter, p.link_downed_counter, p.port_xmit_discards, p.port_xmit_wait) == (12, 1, 7, 1520)
    assert p.port_xmit_data == 4294967295, "perfquery counts 4-byte words, as PortSample does"
    assert (host.device, host.device_kind, host.ports[0].port) == ("gpu-node-3", "host", "mlx5_0/1")
    topo = Topology.of([switch_port, hca])
    assert topo.by_lid[(214, 35)] is switch_port and topo.by_device[("mlx5_0", 1)] is hca


def test_node_exporter_infiniband_bytes_become_ib_words() -> None:
    text = (
        'node_infiniband_port_data_transmitted_bytes_total{device="mlx5_0",port="1",node="n4"} '
        '4.096e+06 1700000000000\n'
        'node_infiniband_port_transmit_wait_total{device="mlx5_0",port="1",node="n4"} 77 1700000000000\n'
        'node_infiniband_link_downed_total{device="mlx5_0",port="1",node="n4"} 2 1700000000000\n'
    )
    (rec,) = ExpositionReader(IngestSettings()).read(text.splitlines())
    assert isinstance(rec, r.PortTelemetry)
    p = rec.ports[0]
    assert (p.port_xmit_data, p.port_xmit_wait, p.link_downed_counter) == (1_024_000, 77, 2)


def test_the_source_runs_perfquery_per_port_and_counts_what_it_cannot_use(tmp_path: Path) -> None:
    fake_perfquery = tmp_path / "perfquery.py"
    fake_perfquery.write_text(
        "import sys\n"
        f"DEFAULT = {DEFAULT!r}\nEXTENDED = {EXTENDED!r}\n"
        "args = sys.argv[1:]\n"
        "if args[-2:] == ['214', '35']: print(DEFAULT)\n"
        "elif args[-4:] == ['-C', 'mlx5_0', '-P', '1']: print(EXTENDED)\n"
        "elif args[-2:] == ['9', '9']: print(DEFAULT)\n"  # answers for another port than asked
        "else: sys.exit('ibwarn: port not found')\n"
    )
    settings = parse_config(
        "exporters:\n  infiniband:\n"
        f"    perfquery_command: ['{sys.executable}', '{fake_perfquery}', '-x']\n"
        "    topology:\n"
        "      - {lid: 214, port: 35, device: leaf-07, node: gpu-node-12}\n"
        "      - {device: mlx5_0, port: 1, node: gpu-node-3, device_kind: host}\n"
        "      - {lid: 9, port: 9, device: spine-1}\n"
        "      - {lid: 5, port: 1, device: spine-2}\n")
    registry = CollectorRegistry()
    metrics = ConnectorMetrics(registry, "infiniband")
    outbox = Outbox(10, metrics)
    src = PerfquerySource(settings, outbox, metrics, clock=lambda: 1_700_000_000.0)
    assert asyncio.run(src.tick()) == 2
    devices = [o.record.device for o in outbox.peek(10) if isinstance(o.record, r.PortTelemetry)]
    assert devices == ["gpu-node-3", "leaf-07"]
    assert [o.topic for o in outbox.peek(10)] == ["fleetmedic.telemetry.port"] * 2
    assert registry.get_sample_value("fleetmedic_connector_errors_total",
                                     {"connector": "infiniband", "kind": "perfquery_exit"}) == 1
    assert registry.get_sample_value("fleetmedic_connector_skipped_total", {
        "connector": "infiniband", "reason": "perfquery: no block for the requested port"}) == 1
