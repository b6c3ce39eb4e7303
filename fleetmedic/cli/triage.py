"""``fleetmedic triage classify``: classify job log lines with the failure-pattern library.

Reads log lines on stdin and prints, per line, the class the line suggests and the pattern that
matched (``-`` when none did), so operators can test and tune a library before deploying it::

    kubectl logs job/llama-70b-worker-3 | fleetmedic triage classify --summary
    fleetmedic triage classify --json --patterns my-patterns.yaml < job.log
    fleetmedic triage classify --check --patterns my-patterns.yaml   # the library's own examples
"""

from __future__ import annotations

import argparse
import json
import sys

from fleetmedic.remediation.log_patterns import LineMatch, PatternError, PatternLibrary, load_library

EXIT_INVALID = 2


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    triage = sub.add_parser("triage", help="test the triage rules' inputs (failure-log patterns)")
    triage_sub = triage.add_subparsers(dest="triage_command", metavar="ACTION")
    triage_sub.required = True
    classify = triage_sub.add_parser(
        "classify", help="classify log lines read on stdin: per line, the class and the pattern that matched")
    classify.add_argument("--json", action="store_true", help="one JSON object per line")
    classify.add_argument("--patterns", default="", metavar="FILE",
                          help="pattern library (YAML); default: the shipped library")
    classify.add_argument("--only-matches", action="store_true", help="print only lines a pattern matched")
    classify.add_argument("--summary", action="store_true",
                          help="finally print the failure's signature: the strongest distinctive match")
    classify.add_argument("--check", action="store_true",
                          help="check the library's own examples instead of reading stdin; exit 1 on a problem")
    classify.set_defaults(handler=run_classify)


def run_classify(args: argparse.Namespace) -> int:
    try:
        library = load_library(args.patterns)
    except PatternError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if args.check:
        problems = library.self_check()
        for problem in problems:
            print(problem, file=sys.stderr)
        if not problems:
            print(f"ok: {len(library.patterns)} patterns, every example classifies as its pattern")
        return 1 if problems else 0
    matches: list[LineMatch] = []
    for raw in sys.stdin:
        m = library.classify(raw)
        matches.append(m)
        if args.only_matches and m.pattern is None:
            continue
        _print(m, args.json)
    if args.summary:
        best = PatternLibrary.strongest(matches)
        if args.json:
            print(json.dumps({"summary": best.to_dict() if best else None}))
        elif best is None:
            print("summary: no pattern matched")
        else:
            kind = "symptom only" if best.symptom else "distinctive"
            print(f"summary: {best.incident_class} ({best.pattern}, {kind}): {best.line}")
    return 0


def _print(m: LineMatch, as_json: bool) -> None:
    if as_json:
        print(json.dumps(m.to_dict()))
    else:
        tag = f"{m.pattern}*" if m.symptom else (m.pattern or "-")
        print(f"{m.incident_class:<18} {tag:<28} {m.line}")
