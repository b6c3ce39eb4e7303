"""The command line and the published contract: `config check` exit codes, committed JSON Schemas
that are up to date, every listed subcommand works, and the pure core's layering holds."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleetmedic.bus import TOPICS, topic_table_markdown
from fleetmedic.cli.main import build_parser, main
from fleetmedic.cli.schema import render_schemas, stale_schemas

ROOT = Path(__file__).resolve().parents[2]


def test_committed_schemas_are_up_to_date() -> None:
    stale = stale_schemas(ROOT / "deploy" / "schemas")
    assert not stale, f"run `fleetmedic schema --out deploy/schemas`; stale: {stale}"


def test_schema_check_flags_an_edited_file(tmp_path: Path) -> None:
    assert main(["schema", "--out", str(tmp_path)]) == 0
    assert main(["schema", "--out", str(tmp_path), "--check"]) == 0
    victim = tmp_path / TOPICS[0].schema_file
    victim.write_text(victim.read_text().replace('"type"', '"tipe"', 1))
    assert main(["schema", "--out", str(tmp_path), "--check"]) == 1


def test_every_topic_has_a_schema_and_a_row_in_the_readme() -> None:
    assert set(render_schemas()) == {t.schema_file for t in TOPICS}
    readme = (ROOT / "README.md").read_text()
    assert topic_table_markdown() in readme, "README topic table is stale: paste topic_table_markdown()"


def test_config_check_prints_effective_config_and_exits_2_on_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("safety: {max_per_rack: 3}\n")
    assert main(["config", "check", str(good)]) == 0
    assert "max_per_rack: 3" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("safety: {max_per_rack: 3, max_per_racks: 4}\n")
    assert main(["config", "check", str(bad)]) == 2
    assert "safety.max_per_racks: unknown key" in capsys.readouterr().err


def test_every_listed_subcommand_has_working_help() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    names = list(sub.choices)  # type: ignore[union-attr]
    assert {"config", "schema"} <= set(names)
    for name in names:
        with pytest.raises(SystemExit) as exit_:
            main([name, "--help"])
        assert exit_.value.code == 0


def test_the_console_script_runs() -> None:
    exe = shutil.which("fleetmedic", path=str(Path(sys.executable).parent))
    assert exe, "console script `fleetmedic` is not installed"
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
    assert "config" in out


def test_the_pure_core_imports_no_adapter_library() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is not installed"
    proc = subprocess.run([lint], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_help_page_shows_docstring_markup(capsys: pytest.CaptureFixture[str]) -> None:
    """Descriptions come from docstrings written in reST; ``--help`` shows them as plain text."""
    from fleetmedic.cli.common import _parsers, plain_text

    assert plain_text("see :class:`~fleetmedic.records.OperatorCommand` and ``--json``::") == \
        "see OperatorCommand and --json:"
    for parser in _parsers(build_parser()):
        text = parser.format_help()
        for mark in ("``", ":class:`", ":mod:`", ":func:`", ":meth:`", ":data:`"):
            assert mark not in text, f"{parser.prog}: {mark}"


def test_every_command_reads_its_config_the_same_way(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One loader for every subcommand (the file plus FLEETMEDIC__* overrides): ``simulate --kafka``
    once read the file without the overrides and produced to another broker than ``worker`` read."""
    import ast

    from fleetmedic.cli.common import settings_or_none

    cli_dir = Path(__file__).resolve().parents[2] / "fleetmedic" / "cli"
    for path in sorted(cli_dir.glob("*.py")):
        # the loader itself; `config check` reads what it is given; the reference documents the defaults
        if path.name in ("common.py", "config.py", "config_reference.py"):
            continue
        calls = {n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
                 for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)}
        assert not calls & {"read_config", "parse_config", "Settings"}, f"{path.name} loads its config itself"
    config = tmp_path / "c.yaml"
    config.write_text("kafka:\n  bootstrap_servers: file:9092\n")
    monkeypatch.setenv("FLEETMEDIC__KAFKA__BOOTSTRAP_SERVERS", "env:9092")
    for path_arg in (str(config), None):
        settings = settings_or_none(path_arg)
        assert settings is not None and settings.kafka.bootstrap_servers == "env:9092"


def test_bootstrap_names_the_brokers_for_every_kafka_command(tmp_path: Path) -> None:
    """``--bootstrap`` on every command (and verb) that talks to Kafka overrides the config's
    brokers, as the environment override does; without a broker there, one line and a non-zero exit."""
    from fleetmedic.cli.common import KAFKA_COMMANDS, _parsers

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    for name in KAFKA_COMMANDS:
        for p in _parsers(sub.choices[name]):  # type: ignore[attr-defined]
            if any("--config" in a.option_strings for a in p._actions):
                assert any("--bootstrap" in a.option_strings for a in p._actions), p.prog
    config = tmp_path / "c.yaml"
    config.write_text("kafka:\n  bootstrap_servers: 127.0.0.1:9\n")
    run = subprocess.run([sys.executable, "-m", "fleetmedic.cli", "ctl", "audit", "--config", str(config),
                          "--bootstrap", "127.0.0.1:1"], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert "127.0.0.1:1" in line and "127.0.0.1:9" not in line


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path: Path) -> None:
    """``fleetmedic triage classify --json | head -1`` once ended in a BrokenPipeError traceback."""
    lines = tmp_path / "lines.txt"
    lines.write_text("NCCL WARN NET/IB : Got completion with error 12\n" * 20000)
    with lines.open("rb") as stdin:
        proc = subprocess.Popen([sys.executable, "-m", "fleetmedic.cli", "triage", "classify", "--json"],
                                stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"{")
    proc.stdout.close()  # what `head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and "Traceback" not in err, err


def test_every_option_of_every_subcommand_says_what_it_does() -> None:
    from fleetmedic.cli.common import _parsers

    for parser in _parsers(build_parser()):
        for action in parser._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{parser.prog} {'/'.join(action.option_strings)} has no help"


@pytest.mark.parametrize("command", ["worker", "executor"])
def test_dry_run_on_worker_and_executor_observes_whatever_the_file_says(
        command: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib

    from fleetmedic.cli.common import DRY_RUN_ENV, settings_or_none

    config = tmp_path / "c.yaml"
    config.write_text("safety:\n  dry_run: false\n")
    seen: list[bool] = []
    module = importlib.import_module(f"fleetmedic.cli.{command}")
    handler = "run_worker" if command == "worker" else "run_executor"

    def record(args: object) -> int:
        settings = settings_or_none(str(config))
        assert settings is not None
        seen.append(settings.safety.dry_run)
        return 0

    monkeypatch.setattr(module, handler, record)
    monkeypatch.delenv(DRY_RUN_ENV, raising=False)
    assert main([command, "--config", str(config)]) == 0
    assert main([command, "--config", str(config), "--dry-run"]) == 0
    monkeypatch.delenv(DRY_RUN_ENV, raising=False)
    assert seen == [False, True]
