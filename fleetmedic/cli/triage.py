"""``fleetmedic triage classify``: classify job log lines with the failure-pattern library.

Reads log lines on stdin and prints, per line, the class the line suggests and the pattern that
matched (``-`` when none did), so operators can test and tune a library before deploying it::

    kubectl logs job/llama-70b-worker-3 | fleetmedic triage classify --summary
    fleetmedic triage classify --json --patterns my-patterns.yaml < job.log
    fleetmedic triage classify --check --patterns my-patterns.yaml   # the library's own examples
    fleetmedic triage classify --evaluate tests/data/kmsg/holdout.txt  # figures on a labelled corpus

``--evaluate FILE`` reads a labelled corpus (``label<TAB>source<TAB>line`` per line, ``#`` comments;
labels hardware, degradation, network, software) and prints, per label, how many lines the library
classified as labelled, the recall on hardware lines, the share of software lines it called hardware,
and every line it got wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from fleetmedic.cli.common import examples
from fleetmedic.remediation.log_patterns import LineMatch, PatternError, PatternLibrary, load_library

EXIT_INVALID = 2


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    triage = sub.add_parser("triage", help="test the triage rules' inputs (failure-log patterns)",
                            epilog=examples("kubectl logs job/train-7 | fleetmedic triage classify --summary"))
    triage_sub = triage.add_subparsers(dest="triage_command", metavar="ACTION")
    triage_sub.required = True
    classify = triage_sub.add_parser(
        "classify", help="classify log lines read on stdin: per line, the class and the pattern that matched",
        epilog=examples("kubectl logs job/train-7 | fleetmedic triage classify --only-matches --summary",
                        "fleetmedic triage classify --check --patterns my-patterns.yaml",
                        "fleetmedic triage classify --evaluate labelled.tsv --json"))
    classify.add_argument("--json", action="store_true", help="one JSON object per line")
    classify.add_argument("--patterns", default="", metavar="FILE",
                          help="pattern library (YAML); default: the shipped library")
    classify.add_argument("--only-matches", action="store_true", help="print only lines a pattern matched")
    classify.add_argument("--summary", action="store_true",
                          help="finally print the failure's signature: the strongest distinctive match")
    classify.add_argument("--check", action="store_true",
                          help="check the library's own examples instead of reading stdin; exit 1 on a problem")
    classify.add_argument("--evaluate", metavar="FILE", default="",
                          help="figures on a labelled corpus (label<TAB>source<TAB>line) instead of reading stdin")
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
    if args.evaluate:
        try:
            with open(args.evaluate, encoding="utf-8") as fh:
                report = evaluate(library, fh)
        except (OSError, ValueError) as exc:
            print(f"error: {args.evaluate}: {exc}", file=sys.stderr)
            return EXIT_INVALID
        print(json.dumps(report.to_dict()) if args.json else report.text())
        return 0
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


LABELS = ("hardware", "degradation", "network", "software")


@dataclass
class CorpusReport:
    """How a library classifies a labelled corpus. A line is right when its class is its label, or,
    for a software line, when the class is none of hardware, degradation and network."""

    lines: Counter[str] = field(default_factory=Counter)
    right: Counter[str] = field(default_factory=Counter)
    called_hardware: Counter[str] = field(default_factory=Counter)
    wrong: list[tuple[str, str, str, str]] = field(default_factory=list)  # label, class, pattern, line

    @property
    def hardware_recall(self) -> float:
        return self.called_hardware["hardware"] / self.lines["hardware"] if self.lines["hardware"] else 0.0

    @property
    def false_hardware_rate(self) -> float:
        return self.called_hardware["software"] / self.lines["software"] if self.lines["software"] else 0.0

    def to_dict(self) -> dict[str, object]:
        return {"lines": dict(self.lines), "right": dict(self.right), "called_hardware": dict(self.called_hardware),
                "hardware_recall": self.hardware_recall, "false_hardware_rate": self.false_hardware_rate,
                "wrong": [dict(zip(("label", "class", "pattern", "line"), w, strict=True)) for w in self.wrong]}

    def text(self) -> str:
        out = [f"{label:<12} {self.right[label]:>4}/{self.lines[label]:<4} right, "
               f"{self.called_hardware[label]} called hardware" for label in LABELS if self.lines[label]]
        out.append(f"recall on hardware lines: {self.called_hardware['hardware']}/{self.lines['hardware']} "
                   f"({self.hardware_recall:.1%})")
        out.append(f"software lines called hardware: {self.called_hardware['software']}/{self.lines['software']} "
                   f"({self.false_hardware_rate:.1%})")
        out += [f"  {label} -> {klass} ({pattern}): {line}" for label, klass, pattern, line in self.wrong]
        return "\n".join(out)


def evaluate(library: PatternLibrary, lines: Iterable[str]) -> CorpusReport:
    """Classify every ``label<TAB>source<TAB>line`` of a corpus; raises ValueError on a line that is
    not one."""
    report = CorpusReport()
    for n, raw in enumerate(lines, 1):
        if not raw.strip() or raw.startswith("#"):
            continue
        parts = raw.rstrip("\r\n").split("\t", 2)
        if len(parts) != 3 or parts[0] not in LABELS:
            raise ValueError(f"line {n}: expected <{'|'.join(LABELS)}><TAB><source><TAB><log line>")
        label, _, line = parts
        m = library.classify(line)
        report.lines[label] += 1
        report.called_hardware[label] += m.incident_class == "hardware"
        right = (m.incident_class == label if label != "software"
                 else m.incident_class not in ("hardware", "degradation", "network"))
        report.right[label] += right
        if not right:
            report.wrong.append((label, m.incident_class, m.pattern or "-", line))
    return report
