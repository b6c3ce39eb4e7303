"""What the NVML exporter read on a real GPU machine: the python part of scripts/device/nvml_check.sh.

    python scripts/device/nvml_summary.py probe            # every field NVML gives, per GPU, now
    python scripts/device/nvml_summary.py summary FILE     # the exporter's JSONL output, per GPU

``probe`` reads each GPU once through fleetmedic's NVML seam and prints the values, the fields kept
off the wire record (aggregate ECC, NVLink count), what was not supported and any problem.
``summary`` prints, per node and GPU, how many records there were, the range of each metric, the
metrics never reported and the XID events. Both exit 1 when nothing was read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from typing import Any, TextIO


def probe(nvml: Any, out: TextIO) -> int:
    from fleetmedic.connectors.nvml.seam import GpuLost, NvmlSeam
    from fleetmedic.records import GPU_METRICS

    seam = NvmlSeam(nvml)
    seam.init()
    try:
        handles, unusable = seam.handles()
        print(f"driver {seam.driver_version()}, {len(handles)} GPU(s)", file=out)
        for index, reason in unusable.items():
            print(f"GPU {index}: cannot be opened: {reason}", file=out)
        read = 0
        for index, handle in handles:
            try:
                g = seam.read_gpu(index, handle)
            except GpuLost as exc:
                print(f"GPU {index}: LOST ({exc})", file=out)
                continue
            read += 1
            print(f"GPU {index} {g.name} {g.uuid}", file=out)
            for name in GPU_METRICS:
                if name in g.values:
                    print(f"  {name:36s} {g.values[name]}", file=out)
            for name, value in sorted(g.extra.items()):
                print(f"  {name:36s} {value}   (not on the wire record)", file=out)
            missing = [m for m in GPU_METRICS if m not in g.values and not m.startswith("prof_") and m != "xid_errors"]
            print(f"  not supported here: {', '.join(missing) or '-'}", file=out)
            for name, problem in sorted(g.problems.items()):
                print(f"  PROBLEM {name}: {problem}", file=out)
        return 0 if read else 1
    finally:
        seam.shutdown()


def summary(lines: TextIO, out: TextIO) -> int:
    from fleetmedic.records import GPU_METRICS, GpuTelemetry, convert

    ranges: dict[tuple[str, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    counts: dict[tuple[str, int], int] = defaultdict(int)
    xids: list[str] = []
    records = 0
    for line in lines:
        if not line.strip():
            continue
        doc = json.loads(line)
        rec = convert(GpuTelemetry, doc["record"])
        records += 1
        for pos, gpu in enumerate(rec.gpus):
            counts[(rec.node, gpu)] += 1
            for name, value in rec.gpu_values(pos).items():
                if value is not None:
                    ranges[(rec.node, gpu)][name].append(float(value))
        xids += [f"{rec.node} GPU {x.gpu}: XID {x.xid} at {x.ts:.3f} ({x.message})" for x in rec.xids]
    print(f"{records} record(s)", file=out)
    for key in sorted(counts):
        node, gpu = key
        print(f"{node} GPU {gpu}: {counts[key]} sample(s)", file=out)
        for name in GPU_METRICS:
            vals = ranges[key].get(name)
            if vals:
                print(f"  {name:36s} min {min(vals):g}  max {max(vals):g}  ({len(vals)} values)", file=out)
        never = [m for m in GPU_METRICS if m not in ranges[key]]
        print(f"  never reported: {', '.join(never) or '-'}", file=out)
    print(f"XID events: {len(xids)}", file=out)
    for x in xids:
        print(f"  {x}", file=out)
    return 0 if records else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    sub.add_parser("probe")
    s = sub.add_parser("summary")
    s.add_argument("file")
    args = p.parse_args(argv)
    if args.what == "probe":
        import pynvml

        from fleetmedic.connectors.runtime import SourceUnavailable

        try:
            return probe(pynvml, sys.stdout)
        except SourceUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 3
    with open(args.file, encoding="utf-8") as fh:
        return summary(fh, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
