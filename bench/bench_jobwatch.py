"""Job-events tracker throughput: watch events/s through JobTracker, against JSON decoding alone.

    .venv/bin/python bench/bench_jobwatch.py [--jobs 200] [--ranks 64] [--updates 5]

Builds the watch stream a busy cluster sends for ``jobs`` Indexed GPU Jobs of ``ranks`` pods each:
the Job, then every pod Pending -> scheduled -> Running, ``updates`` more status updates per pod
(what kubelets send), a failure of one rank per job and its replacement, as raw JSON lines. Times
(a) ``json.loads`` of every line (the floor: the watcher decodes each line once) and (b) decode +
``JobTracker``; prints events/s for both, their ratio, and the JobEvents produced. Single thread,
process CPU time.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from fleetmedic.connectors.kube.jobs_map import JobTracker


def _pod(job: int, rank: int, node: str, phase: str, uid_suffix: str = "", failed: bool = False) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if failed:
        status["containerStatuses"] = [{"name": "t", "restartCount": 0,
                                        "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]
    return {"metadata": {"name": f"j{job}-{rank}{uid_suffix}", "namespace": "ml", "uid": f"u{job}-{rank}{uid_suffix}",
                         "labels": {"batch.kubernetes.io/job-name": f"j{job}",
                                    "batch.kubernetes.io/job-completion-index": str(rank)}},
            "spec": {"nodeName": node, "containers": [{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
            "status": status}


def stream(jobs: int, ranks: int, updates: int) -> list[str]:
    lines = []
    for j in range(jobs):
        job = {"metadata": {"name": f"j{j}", "namespace": "ml", "uid": f"job{j}"},
               "spec": {"parallelism": ranks, "completions": ranks, "completionMode": "Indexed"}}
        lines.append(json.dumps({"kind": "Job", "type": "ADDED", "object": job}))
        for r in range(ranks):
            node = f"n{(j * ranks + r) % 4096:04d}"
            for phase, where in (("Pending", ""), ("Pending", node), ("Running", node)):
                lines.append(json.dumps({"kind": "Pod", "type": "MODIFIED", "object": _pod(j, r, where, phase)}))
            lines += [json.dumps({"kind": "Pod", "type": "MODIFIED", "object": _pod(j, r, node, "Running")})] * updates
        lines.append(json.dumps({"kind": "Pod", "type": "MODIFIED", "object": _pod(j, 0, "n0000", "Failed",
                                                                                    failed=True)}))
        lines.append(json.dumps({"kind": "Pod", "type": "ADDED", "object": _pod(j, 0, "n4095", "Running", "-b")}))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--updates", type=int, default=5)
    args = ap.parse_args()
    lines = stream(args.jobs, args.ranks, args.updates)

    t0 = time.process_time()
    for line in lines:
        json.loads(line)
    decode_s = time.process_time() - t0

    tracker, produced = JobTracker(), 0
    t0 = time.process_time()
    for line in lines:
        ev = json.loads(line)
        if ev["kind"] == "Pod":
            produced += len(tracker.observe_pod(ev["type"], ev["object"], 0.0))
        else:
            produced += len(tracker.observe_workload(ev["kind"], ev["type"], ev["object"], 0.0))
    full_s = time.process_time() - t0

    n = len(lines)
    print(f"{n} watch events ({args.jobs} jobs x {args.ranks} ranks, {args.updates} status updates per pod)")
    print(f"  json decode only        {n / decode_s:12,.0f} events/s")
    print(f"  decode + JobTracker     {n / full_s:12,.0f} events/s   -> {produced} JobEvents")
    print(f"ratio (tracker path / decode only): {decode_s / full_s:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
