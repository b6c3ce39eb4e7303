"""The histories that ship with fleetmedic, by name: ``stepfun`` and ``llama3``.

- ``stepfun``: the StepFun trace as the package carries it (``sim/data/stepfun_fault_trace.csv``,
  derived from InfiniteHBD-Trace's ``fault_trace.json``, Apache-2.0): 584 faults on 231 of its 400
  servers over 348 days. Nodes are named ``stepfun-NNN`` by their order of first appearance.
- ``llama3``: the 419 unexpected interruptions of Llama 3 405B's 54-day pre-training on 16,384
  H100 GPUs (2,048 nodes), by the root-cause counts Meta published (The Llama 3 Herd of Models,
  2024, Table 5). Meta published counts, not times, nodes or repair durations: :func:`llama3_faults`
  spreads the interruptions uniformly over the 54 days and the nodes, and draws each repair from the
  StepFun trace's durations of the closest component class (a documented assumption; seeded, so the
  packaged ``sim/data/whatif-llama3.csv`` is what ``llama3_faults(0)`` gives).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from importlib import resources
from typing import Final

from fleetmedic.sim.trace import TRACE_SERVERS, load_trace
from fleetmedic.sim.whatif.history import STEPFUN_EPOCH, History, HistoryFault, parse_history, write_csv

SHIPPED: Final = ("stepfun", "llama3")
LLAMA3_NODES: Final = 2048
LLAMA3_DAYS: Final = 54.0
LLAMA3_EPOCH: Final = datetime(2024, 1, 1, tzinfo=UTC).timestamp()  # the paper gives no dates
#: Table 5: category, its count, and the StepFun classes whose repair durations stand in for its own
LLAMA3_TABLE: Final[tuple[tuple[str, int, tuple[str, ...]], ...]] = (
    ("Faulty GPU", 148, ("GPU",)),
    ("GPU HBM3 Memory", 72, ("GPU",)),
    ("Software Bug", 54, ()),
    ("Network Switch/Cable", 35, ("Parameter Plane Cable",)),
    ("Host Maintenance", 32, ("Change", "Test")),
    ("GPU SRAM Memory", 19, ("GPU",)),
    ("GPU System Processor", 17, ("GPU",)),
    ("NIC", 7, ("NIC",)),
    ("NCCL Watchdog Timeouts", 7, ("Other Failures",)),
    ("Silent Data Corruption", 6, ("GPU",)),
    ("GPU Thermal Interface + Sensor", 6, ("GPU", "Fan")),
    ("SSD", 3, ("File System",)),
    ("Power Supply", 3, ("Power Supply",)),
    ("Server Chassis", 2, ("Motherboard", "Riser Card")),
    ("IO Expansion Board", 2, ("Motherboard", "Riser Card")),
    ("Dependency", 2, ()),
    ("CPU", 2, ("CPU",)),
    ("System Memory", 2, ("Motherboard", "CPU")),
)


def declared_nodes(name: str) -> int:
    return TRACE_SERVERS if name == "stepfun" else LLAMA3_NODES


def stepfun_faults() -> list[HistoryFault]:
    return [HistoryFault(f"stepfun-{f.node:03d}", STEPFUN_EPOCH + f.start_day * 86400.0,
                         STEPFUN_EPOCH + f.end_day * 86400.0, f"{f.cls}: {f.desc}", f.level, i + 1)
            for i, f in enumerate(load_trace())]


def llama3_faults(seed: int = 0) -> list[HistoryFault]:
    rng = random.Random(f"llama3:{seed}")
    durations: dict[str, list[float]] = {}
    for f in load_trace():
        durations.setdefault(f.cls, []).append((f.end_day - f.start_day) * 86400.0)
    out: list[HistoryFault] = []
    for category, count, classes in LLAMA3_TABLE:
        pool = sorted(d for c in classes for d in durations.get(c, []))
        for _ in range(count):
            start = LLAMA3_EPOCH + round(rng.uniform(0.0, LLAMA3_DAYS * 86400.0))
            node = f"llama3-{rng.randrange(LLAMA3_NODES):04d}"
            repair = round(rng.choice(pool)) if pool else 0.0
            out.append(HistoryFault(node, start, start + repair, category, "Table 5"))
    out.sort(key=lambda f: (f.start, f.node))
    return out


def llama3_csv(seed: int = 0) -> str:
    head = ("# Llama 3 405B pre-training: 419 unexpected interruptions in 54 days on 16,384 H100 GPUs, by the\n"
            "# root-cause counts of The Llama 3 Herd of Models (2024), Table 5. Times, nodes and repair durations\n"
            "# are not published: uniform over the 54 days and 2,048 nodes, repairs drawn from the StepFun trace's\n"
            "# durations of the closest class (fleetmedic.sim.whatif.shipped.llama3_faults, seed 0).\n")
    return head + write_csv(llama3_faults(seed))


def shipped_history(name: str) -> History:
    if name == "stepfun":
        faults = stepfun_faults()
        nodes = list(dict.fromkeys(f.node for f in faults))
        end = max(f.end or f.start for f in faults)
        return History(faults, "stepfun", STEPFUN_EPOCH, end, nodes, [], "stepfun (packaged)")
    text = resources.files("fleetmedic.sim").joinpath("data/whatif-llama3.csv").read_text("utf-8")
    h = parse_history(text, "csv", "llama3 (packaged)")
    h.start, h.end = LLAMA3_EPOCH, LLAMA3_EPOCH + LLAMA3_DAYS * 86400.0
    return h
