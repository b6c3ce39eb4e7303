"""The simulated fleet: nodes with 8 GPUs, racks, NICs, and a rail-optimised leaf/spine fabric.

Topology (deterministic per seed):

- ``nodes`` nodes named ``gpu-node-0000`` …, ``nodes_per_rack`` to a rack (``rack-000`` …);
- every node has ``gpus_per_node`` GPUs of one SKU (:data:`SKUS`), each with its own manufacturing
  variance (thermal offset and resistance, power draw, boost capability, compute speed, and for a
  few GPUs a small background rate of correctable ECC, PCIe replay or NVLink errors);
- every node has ``nics_per_node`` InfiniBand NICs (``mlx5_0`` …, one per rail); nodes are grouped in
  scalable units of ``nodes_per_su`` nodes, and NIC ``k`` of every node in unit ``s`` is cabled to leaf
  ``leaf-su<s>-r<k>`` (rail-optimised, as in DGX SuperPODs), so a leaf failure hits one rail of every
  node behind it; every leaf has one uplink to each of ``spines`` spine switches.

:class:`PortIndex` lists every port of every device (host NIC ports, leaf ports, spine ports) in one
array space; the port telemetry model and :class:`~fleetmedic.sim.batch.PortBatch` use it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Sku:
    """A GPU model as dcgm-exporter reports it, with the physical constants the models use."""

    key: str
    model_name: str
    tdp_w: float
    idle_w: float
    max_sm_clock: float
    idle_sm_clock: float
    mem_clock: float
    fb_total_mib: float
    pcie_gen: int
    pcie_width: int
    nvlinks: int
    nic_gbps: float
    driver_version: str
    slowdown_temp_c: float
    tflops: float  # dense BF16, for the workload's nominal step time


SKUS: dict[str, Sku] = {
    "h100": Sku("h100", "NVIDIA H100 80GB HBM3", 700.0, 72.0, 1980.0, 345.0, 2619.0, 81559.0, 5, 16, 18,
                400.0, "550.90.07", 87.0, 989.0),
    "h200": Sku("h200", "NVIDIA H200", 700.0, 76.0, 1980.0, 345.0, 3201.0, 143771.0, 5, 16, 18,
                400.0, "550.90.07", 87.0, 989.0),
    "a100": Sku("a100", "NVIDIA A100-SXM4-80GB", 400.0, 55.0, 1410.0, 210.0, 1593.0, 81920.0, 4, 16, 12,
                200.0, "550.90.07", 85.0, 312.0),
}

# PCI bus ids of the 8 GPUs of an HGX board (DGX H100 layout); NVRM logs print "PCI:0000:18:00".
PCI_BUS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")


@dataclass(frozen=True)
class FleetSpec:
    nodes: int = 64
    gpus_per_node: int = 8
    skus: tuple[tuple[str, float], ...] = (("h100", 1.0),)
    nodes_per_rack: int = 4
    nodes_per_su: int = 32
    nics_per_node: int = 8
    spines: int = 4
    node_prefix: str = "gpu-node"

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError("a fleet needs at least one node")
        if not 1 <= self.gpus_per_node <= 16:
            raise ValueError("gpus_per_node must be 1..16")
        if not 1 <= self.nics_per_node <= 16:
            raise ValueError("nics_per_node must be 1..16")
        for key, share in self.skus:
            if key not in SKUS:
                raise ValueError(f"unknown SKU {key!r} (known: {', '.join(SKUS)})")
            if share < 0:
                raise ValueError("SKU shares must be >= 0")


@dataclass
class PortIndex:
    """Every port of every device, in one index space (rows grouped by device, devices in order)."""

    device_names: list[str]
    device_is_host: np.ndarray  # (D,) bool
    device_start: np.ndarray  # (D+1,) first port row of each device; ports of d are start[d]:start[d+1]
    name: list[str]  # (P,) port name: "mlx5_3" on hosts, "17" on switches
    device: np.ndarray  # (P,) int32 device index
    node: np.ndarray  # (P,) int32 node the port is or faces (-1: inter-switch link)
    nic: np.ndarray  # (P,) int32 NIC (rail) index on that node (-1: inter-switch link)
    peer: list[str]  # (P,) "device:port" at the other end
    host_port: np.ndarray  # (N, NICS) row of node n's NIC k
    leaf_port: np.ndarray  # (N, NICS) row of the leaf port cabled to node n's NIC k
    leaf_of: np.ndarray  # (N, NICS) leaf device index behind node n's NIC k

    @property
    def size(self) -> int:
        return len(self.name)


@dataclass
class Fleet:
    spec: FleetSpec
    seed: int
    node_names: list[str]
    sku_list: list[Sku]
    node_sku: np.ndarray  # (N,) index into sku_list
    rack_names: list[str]
    node_rack: np.ndarray  # (N,)
    node_su: np.ndarray  # (N,)
    leaf_names: list[str]
    spine_names: list[str]
    ports: PortIndex
    gpu_uuid: list[list[str]]
    node_ip: list[list[str]]  # (N, NICS) IPoIB addresses, as NCCL logs print them
    # per-GPU manufacturing variance, (N, G)
    temp_offset_c: np.ndarray
    thermal_res: np.ndarray  # degC per W
    power_eff: np.ndarray
    clock_cap: np.ndarray
    compute_speed: np.ndarray  # step-time multiplier of that GPU's rank (>1 = slower)
    mem_temp_offset_c: np.ndarray
    sbe_rate: np.ndarray  # background correctable ECC errors per second
    pcie_replay_rate: np.ndarray
    nvlink_err_rate: np.ndarray
    inlet_c: np.ndarray  # (N,)
    port_ber: np.ndarray  # (P,) background effective BER
    port_symbol_rate: np.ndarray  # (P,) background symbol errors per second
    node_index: dict[str, int] = field(default_factory=dict)
    leaf_index: dict[str, int] = field(default_factory=dict)
    _leaf_nodes: dict[int, list[int]] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.node_names)

    @property
    def g(self) -> int:
        return self.spec.gpus_per_node

    def sku_of(self, node: int) -> Sku:
        return self.sku_list[int(self.node_sku[node])]

    def leaf_nodes(self, leaf: int) -> list[int]:
        """Nodes with a NIC cabled to ``leaf`` (every node of its scalable unit)."""
        got = self._leaf_nodes.get(leaf)
        if got is None:
            rows = np.flatnonzero(self.ports.leaf_of == leaf)
            got = self._leaf_nodes[leaf] = sorted({int(r) // self.spec.nics_per_node for r in rows})
        return list(got)

    def pci(self, gpu: int) -> str:
        return PCI_BUS[gpu % len(PCI_BUS)]


def _node_names(prefix: str, n: int) -> list[str]:
    width = max(4, len(str(n - 1)))
    return [f"{prefix}-{i:0{width}d}" for i in range(n)]


def build_fleet(spec: FleetSpec, seed: int) -> Fleet:
    """Build the topology and per-GPU variance for ``spec``; same ``seed``, same fleet."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xF1EE7]))
    n, g, nics = spec.nodes, spec.gpus_per_node, spec.nics_per_node
    names = _node_names(spec.node_prefix, n)

    keys = [k for k, share in spec.skus if share > 0] or ["h100"]
    shares = np.array([s for k, s in spec.skus if s > 0] or [1.0], dtype=float)
    counts = np.floor(shares / shares.sum() * n).astype(int)
    counts[0] += n - counts.sum()
    # contiguous blocks per SKU (whole racks of one model, as fleets are bought)
    node_sku = np.repeat(np.arange(len(keys)), counts).astype(np.int32)
    sku_list = [SKUS[k] for k in keys]

    node_rack = (np.arange(n) // spec.nodes_per_rack).astype(np.int32)
    rack_names = [f"rack-{r:03d}" for r in range(int(node_rack[-1]) + 1)]
    su_size = max(1, min(spec.nodes_per_su, n))
    node_su = (np.arange(n) // su_size).astype(np.int32)
    n_su = int(node_su[-1]) + 1
    leaf_names = [f"leaf-su{s}-r{k}" for s in range(n_su) for k in range(nics)]
    spine_names = [f"spine-{s}" for s in range(spec.spines)]

    # --- ports ---------------------------------------------------------------------------------
    dev_names: list[str] = list(names) + leaf_names + spine_names
    dev_is_host = np.zeros(len(dev_names), dtype=bool)
    dev_is_host[:n] = True
    p_name: list[str] = []
    p_dev: list[int] = []
    p_node: list[int] = []
    p_nic: list[int] = []
    p_peer: list[str] = []
    starts = [0]
    host_port = np.zeros((n, nics), dtype=np.int32)
    leaf_port = np.zeros((n, nics), dtype=np.int32)
    leaf_of = np.zeros((n, nics), dtype=np.int32)
    su_members = [[int(i) for i in np.flatnonzero(node_su == s)] for s in range(n_su)]

    def leaf_idx(s: int, k: int) -> int:
        return s * nics + k

    for i in range(n):
        s = int(node_su[i])
        slot = su_members[s].index(i)
        for k in range(nics):
            host_port[i, k] = len(p_name)
            leaf_of[i, k] = leaf_idx(s, k)
            p_name.append(f"mlx5_{k}")
            p_dev.append(i)
            p_node.append(i)
            p_nic.append(k)
            p_peer.append(f"{leaf_names[leaf_idx(s, k)]}:{slot + 1}")
        starts.append(len(p_name))
    for s in range(n_su):
        for k in range(nics):
            li = leaf_idx(s, k)
            for slot, i in enumerate(su_members[s]):
                leaf_port[i, k] = len(p_name)
                p_name.append(str(slot + 1))
                p_dev.append(n + li)
                p_node.append(int(i))
                p_nic.append(k)
                p_peer.append(f"{names[i]}:mlx5_{k}")
            base = len(su_members[s])
            for sp in range(spec.spines):
                p_name.append(str(base + sp + 1))
                p_dev.append(n + li)
                p_node.append(-1)
                p_nic.append(-1)
                p_peer.append(f"{spine_names[sp]}:{li + 1}")
            starts.append(len(p_name))
    n_leaf = len(leaf_names)
    for sp in range(spec.spines):
        for li in range(n_leaf):
            base = len(su_members[li // nics])
            p_name.append(str(li + 1))
            p_dev.append(n + n_leaf + sp)
            p_node.append(-1)
            p_nic.append(-1)
            p_peer.append(f"{leaf_names[li]}:{base + sp + 1}")
        starts.append(len(p_name))
    ports = PortIndex(
        device_names=dev_names,
        device_is_host=dev_is_host,
        device_start=np.array(starts, dtype=np.int64),
        name=p_name,
        device=np.array(p_dev, dtype=np.int32),
        node=np.array(p_node, dtype=np.int32),
        nic=np.array(p_nic, dtype=np.int32),
        peer=p_peer,
        host_port=host_port,
        leaf_port=leaf_port,
        leaf_of=leaf_of,
    )

    # --- identities ------------------------------------------------------------------------------
    raw = rng.bytes(16 * n * g)
    gpu_uuid = [
        ["GPU-" + str(uuid.UUID(bytes=raw[16 * (i * g + j) : 16 * (i * g + j + 1)], version=4))
         for j in range(g)]
        for i in range(n)
    ]
    node_ip = [[f"10.{k}.{(i + 10) >> 8}.{(i + 10) & 255}" for k in range(nics)] for i in range(n)]

    # --- variance --------------------------------------------------------------------------------
    shape = (n, g)
    sparse = rng.random((3, n, g))
    mags = rng.uniform(-5.0, -3.5, (3, n, g))
    slot_in_rack = np.arange(n) % spec.nodes_per_rack
    fleet = Fleet(
        spec=spec,
        seed=seed,
        node_names=names,
        sku_list=sku_list,
        node_sku=node_sku,
        rack_names=rack_names,
        node_rack=node_rack,
        node_su=node_su,
        leaf_names=leaf_names,
        spine_names=spine_names,
        ports=ports,
        gpu_uuid=gpu_uuid,
        node_ip=node_ip,
        temp_offset_c=rng.normal(0.0, 1.5, shape),
        thermal_res=0.056 * rng.normal(1.0, 0.04, shape),
        power_eff=rng.normal(1.0, 0.025, shape),
        clock_cap=1.0 - np.abs(rng.normal(0.0, 0.004, shape)),
        compute_speed=1.0 + np.abs(rng.normal(0.0, 0.004, shape)),
        mem_temp_offset_c=rng.normal(7.0, 1.5, shape),
        sbe_rate=np.where(sparse[0] < 0.03, 10.0 ** mags[0], 0.0),
        pcie_replay_rate=np.where(sparse[1] < 0.05, 10.0 ** mags[1], 0.0),
        nvlink_err_rate=np.where(sparse[2] < 0.05, 10.0 ** mags[2], 0.0),
        inlet_c=22.0 + 0.8 * slot_in_rack + rng.normal(0.0, 0.7, n),
        port_ber=10.0 ** np.clip(rng.normal(-14.7, 0.4, ports.size), -16.0, -13.3),
        port_symbol_rate=np.where(rng.random(ports.size) < 0.02, 10.0 ** rng.uniform(-5, -4, ports.size), 0.0),
    )
    fleet.node_index = {name: i for i, name in enumerate(names)}
    fleet.leaf_index = {name: i for i, name in enumerate(leaf_names)}
    return fleet
