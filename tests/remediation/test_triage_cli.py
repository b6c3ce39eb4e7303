"""`fleetmedic triage classify`: per stdin line the class and the matching pattern, JSON lines with
--json, a custom library with --patterns, a self-check with --check, exit 2 on a bad library."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from fleetmedic.cli.main import main

LOG = """\
[rank3]:[E ProcessGroupNCCL.cpp:563] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1)
RuntimeError: CUDA error: uncorrectable ECC error encountered
step 100 loss 2.3
"""


def _run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str],
         stdin: str = LOG) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_classify_prints_class_and_pattern_per_line(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(monkeypatch, capsys, ["triage", "classify"])
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3
    assert lines[0].split()[:2] == ["transient_software", "nccl_watchdog_timeout*"]  # * marks a symptom
    assert lines[1].split()[:2] == ["hardware", "cuda_uncorrectable_ecc"]
    assert lines[2].split()[:2] == ["unknown", "-"]


def test_classify_json_gives_one_object_per_line_and_a_summary(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(monkeypatch, capsys, ["triage", "classify", "--json", "--summary", "--only-matches"])
    docs = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert [d.get("pattern") for d in docs[:2]] == ["nccl_watchdog_timeout", "cuda_uncorrectable_ecc"]
    assert docs[0]["rank"] == 3 and docs[0]["symptom"] is True
    assert docs[-1]["summary"]["pattern"] == "cuda_uncorrectable_ecc"


def test_a_custom_library_replaces_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    lib = tmp_path / "p.yaml"
    lib.write_text("patterns:\n  - {name: our_loader_crash, class: job_bug, regex: 'loader exploded',"
                   " examples: ['the loader exploded']}\n")
    code, out, _ = _run(monkeypatch, capsys, ["triage", "classify", "--json", "--patterns", str(lib)],
                        "the loader exploded\nRuntimeError: CUDA error: uncorrectable ECC error encountered\n")
    docs = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert (docs[0]["class"], docs[0]["pattern"]) == ("job_bug", "our_loader_crash")
    assert docs[1]["pattern"] is None


def test_check_validates_the_librarys_own_examples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(monkeypatch, capsys, ["triage", "classify", "--check"])[0] == 0
    lib = tmp_path / "p.yaml"
    lib.write_text("patterns:\n  - {name: a, class: unknown, regex: 'x+', examples: ['no match here']}\n")
    code, _, err = _run(monkeypatch, capsys, ["triage", "classify", "--check", "--patterns", str(lib)])
    assert code == 1 and "pattern `a`: example classified as `None`" in err


def test_a_bad_library_exits_2_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    lib = tmp_path / "p.yaml"
    lib.write_text("patterns:\n  - {name: a, class: sometimes, regex: x}\n")
    code, _, err = _run(monkeypatch, capsys, ["triage", "classify", "--patterns", str(lib)])
    assert code == 2 and "class: must be one of" in err
    code, _, err = _run(monkeypatch, capsys, ["triage", "classify", "--patterns", str(tmp_path / "missing.yaml")])
    assert code == 2 and "cannot read" in err
