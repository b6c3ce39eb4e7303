"""``fleetmedic whatif``'s outputs: the table on stdout and a self-contained HTML report.

The HTML report has, per policy, the outcome table and a plot of capacity over the history
(schedulable nodes, and GPUs doing useful work) as inline SVG: no script, no external asset.
"""

from __future__ import annotations

import html
from typing import Any

ROWS: tuple[tuple[str, str], ...] = (
    ("ettr", "ETTR, big job"),
    ("ettr_fleet", "ETTR, all jobs"),
    ("interruptions", "interruptions (all jobs)"),
    ("interruptions_big_job", "interruptions, big job"),
    ("gpu_hours_lost.waiting_to_detect", "GPU-h lost waiting to detect"),
    ("gpu_hours_lost.running_degraded", "GPU-h lost running degraded"),
    ("gpu_hours_lost.lost_since_checkpoint", "GPU-h lost since checkpoint"),
    ("gpu_hours_lost.waiting_for_capacity", "GPU-h lost waiting for capacity"),
    ("gpu_hours_lost.restart_overhead", "GPU-h lost to restart overhead"),
    ("gpu_hours_lost.healthy_held_by_false_isolation", "GPU-h healthy, held by false isolation"),
    ("false_isolation_share", "false isolation, share of GPU-h"),
    ("mttr.total.p50_s", "MTTR p50 (s)"),
    ("mttr.detect.p50_s", "  detect p50 (s)"),
    ("mttr.restart.p50_s", "  restart p50 (s)"),
    ("dangerous_schedulable_node_hours", "dangerous-but-schedulable node-h"),
    ("dangerous_past_decision_node_hours", "  past one decision interval"),
    ("dangerous_after_passed_diagnostics_node_hours", "    of those, after diagnostics passed"),
    ("degraded_schedulable_node_hours", "degraded-but-schedulable node-h"),
    ("degraded_past_decision_node_hours", "  past one decision interval"),
    ("silent_schedulable_node_hours", "silent faults, schedulable node-h"),
    ("placements_on_faulty_nodes.total", "placements on faulty nodes"),
    ("placements_on_faulty_nodes.suspected_at_placement", "  suspected at placement"),
    ("isolations", "isolations"),
    ("false_isolations", "  of healthy nodes"),
    ("repairs", "repairs"),
    ("cpu_s", "replay CPU (s)"),
)


def _get(d: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 1 else f"{v:,.1f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def table(result: dict[str, Any]) -> str:
    names = list(result["policies"])
    width = max(len(label) for _, label in ROWS)
    cols = [max(12, len(n)) for n in names]
    lines = [" " * width + "  " + "  ".join(n.rjust(c) for n, c in zip(names, cols, strict=True))]
    for path, label in ROWS:
        vals = [_fmt(_get(result["policies"][n], path)) for n in names]
        lines.append(label.ljust(width) + "  " + "  ".join(v.rjust(c) for v, c in zip(vals, cols, strict=True)))
    h = result["history"]
    lines.append("")
    lines.append(f"history: {h['source']} ({h['format']}), {h['faults']} faults, {h['nodes_named']} nodes named, "
                 f"{h['days']} days; mapping {result['mapping']['name']}")
    if result["unmapped"]:
        lines.append("unmapped (left out): " + ", ".join(f"{k} x{v}" for k, v in sorted(result["unmapped"].items())))
    for n in names:
        refused = result["policies"][n].get("refused_isolations")
        if refused:
            lines.append(f"{n}: refused isolations: " + "; ".join(f"{k} x{v}" for k, v in list(refused.items())[:5]))
    return "\n".join(lines)


def _plot(points: list[list[float]], nodes: int, gpus: int) -> str:
    if len(points) < 2:
        return "<p>(too short to plot)</p>"
    w, h, pad = 900.0, 220.0, 30.0
    t0, t1 = points[0][0], points[-1][0]
    span = max(1.0, t1 - t0)

    def line(idx: int, top: float, color: str) -> str:
        pts = " ".join(f"{pad + (p[0] - t0) / span * (w - 2 * pad):.1f},"
                       f"{h - pad - (p[idx] / top if top else 0) * (h - 2 * pad):.1f}" for p in points)
        return f'<polyline fill="none" stroke="{color}" stroke-width="1" points="{pts}"/>'

    days = span / 86400
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0f}" height="{h:.0f}" role="img">'
            f'<rect x="{pad}" y="{pad}" width="{w - 2 * pad}" height="{h - 2 * pad}" fill="#fafafa" stroke="#ccc"/>'
            + line(1, nodes, "#1f77b4") + line(2, gpus, "#d62728")
            + f'<text x="{pad}" y="{h - 8}" font-size="11">day 0</text>'
            + f'<text x="{w - pad - 60}" y="{h - 8}" font-size="11">day {days:.0f}</text>'
            + f'<text x="{pad + 4}" y="{pad - 8}" font-size="11" fill="#1f77b4">schedulable nodes (of {nodes})</text>'
            + f'<text x="{pad + 260}" y="{pad - 8}" font-size="11" fill="#d62728">GPUs doing useful work '
              f'(of {gpus})</text></svg>')


def html_report(result: dict[str, Any]) -> str:
    e = html.escape
    names = list(result["policies"])
    a = result["assumptions"]
    rows = "".join(
        "<tr><th>" + e(label) + "</th>" + "".join(f"<td>{e(_fmt(_get(result['policies'][n], path)))}</td>"
                                                   for n in names) + "</tr>"
        for path, label in ROWS)
    nodes, gpus = int(a["nodes"]), int(a["nodes"]) * int(a["gpus_per_node"])
    plots = "".join(f"<h3>{e(n)}</h3>" + _plot(result["policies"][n].get("timeline", []), nodes, gpus)
                    for n in names)
    assumptions = "".join(f"<tr><th>{e(str(k))}</th><td>{e(str(v))}</td></tr>" for k, v in a.items())
    mapping = "".join(f"<tr><th>{e(k)}</th><td>{e(v['evidence'])}</td><td>{e(v['effect'])}</td>"
                      f"<td>{e(v['reason'])}</td></tr>" for k, v in result["mapping"]["entries"].items())
    unmapped = ("<p>Unmapped (left out): " + e(", ".join(f"{k} x{v}" for k, v in result["unmapped"].items()))
                + "</p>") if result["unmapped"] else "<p>Every category was mapped.</p>"
    h = result["history"]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>fleetmedic whatif: {e(str(h['source']))}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}th{{text-align:left;font-weight:normal}}</style>
</head><body>
<h1>What if: {e(str(h['source']))}</h1>
<p>{h['faults']} faults on {h['nodes_named']} named nodes over {h['days']} days, replayed on {nodes} nodes
({gpus} GPUs) under {len(names)} policies with the same seed. Mapping: {e(result['mapping']['name'])}.</p>
<h2>Outcomes</h2>
<table id="outcomes"><tr><th></th>{''.join(f'<th>{e(n)}</th>' for n in names)}</tr>{rows}</table>
<h2>Capacity over time</h2>{plots}
<h2>Assumptions</h2><table>{assumptions}</table>
<h2>Mapping</h2>{unmapped}<table><tr><th>category</th><th>evidence</th><th>effect</th><th>why</th></tr>{mapping}</table>
</body></html>
"""
