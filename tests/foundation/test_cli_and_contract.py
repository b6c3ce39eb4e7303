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


# --- one grammar for every command -------------------------------------------------------------------


def _all_parsers() -> list[tuple[str, object]]:
    from fleetmedic.cli.common import _parsers

    return [(p.prog, p) for p in _parsers(build_parser())]


def test_every_help_page_ends_with_examples_that_parse_as_that_command() -> None:
    import argparse
    import shlex

    for prog, parser in _all_parsers():
        assert isinstance(parser, argparse.ArgumentParser)
        text = parser.format_help()
        assert "\nexamples:\n" in text, f"{prog}: no examples"
        lines = text.rsplit("\nexamples:\n", 1)[1].strip().splitlines()
        assert lines, prog
        for line in lines:
            command = line[line.index("fleetmedic "):].split(" | ")[0]
            assert command.startswith(prog), f"{prog}: an example of another command: {line}"
            if command.endswith("--help"):
                continue
            build_parser().parse_args(shlex.split(command)[1:])  # exits 2 on an option that does not exist


def test_no_help_page_names_a_module() -> None:
    import re

    for prog, parser in _all_parsers():
        text = parser.format_help()  # type: ignore[attr-defined]
        found = re.findall(r"\bfleetmedic\.(?!io/|yaml\b)[a-z_]+\.[a-z_]+", text)
        assert not found, f"{prog}: {found}"


def test_every_config_option_is_spelt_config_file() -> None:
    for prog, parser in _all_parsers():
        for action in parser._actions:  # type: ignore[attr-defined]
            if "--config" in action.option_strings:
                assert action.metavar == "FILE", prog


def test_config_check_takes_config_file_as_every_command_does(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("safety: {dry_run: true}\n")
    assert main(["config", "check", "--quiet", "--config", str(config)]) == 0
    assert main(["config", "check", "--quiet", str(config)]) == 0
    assert main(["config", "check", "--quiet"]) == 2


def test_the_older_spellings_still_work_and_are_not_shown() -> None:
    parser = build_parser()
    assert parser.parse_args(["demo", "--kafka", "b:9092"]).bootstrap == "b:9092"
    assert parser.parse_args(["demo", "--bootstrap", "b:9092"]).bootstrap == "b:9092"
    assert parser.parse_args(["kafka", "acls", "--bootstrap-server", "b:9093"]).bootstrap_server == "b:9093"
    assert parser.parse_args(["kafka", "acls", "--bootstrap", "b:9093"]).bootstrap_server == "b:9093"
    for prog, p in _all_parsers():
        text = p.format_help()  # type: ignore[attr-defined]
        assert "--bootstrap-server" not in text and "--kafka BOOTSTRAP" not in text, prog


def test_durations_read_90s_10m_2h_and_times_rfc3339_or_epoch_everywhere() -> None:
    parser = build_parser()
    assert parser.parse_args(["exporter", "kmsg", "--duration", "10m", "--backlog-max-age", "2h",
                              "--boot-time", "2026-05-01T00:00:00Z"]).duration == 600.0
    args = parser.parse_args(["exporter", "kmsg", "--duration", "90", "--backlog-max-age", "2h",
                              "--boot-time", "1777593600"])
    assert (args.duration, args.backlog_max_age, args.boot_time) == (90.0, 7200.0, 1777593600.0)
    assert parser.parse_args(["ctl", "audit", "--since", "2h"]).since == 7200.0
    assert parser.parse_args(["demo", "--duration", "90m"]).duration == 5400.0
    assert parser.parse_args(["simulate", "--start", "2026-05-01T00:00:00Z"]).start == 1777593600.0
    with pytest.raises(SystemExit):
        parser.parse_args(["exporter", "nvml", "--duration", "soon"])


def test_every_seed_has_the_same_default() -> None:
    from fleetmedic.cli.common import DEFAULT_SEED

    seeds = {prog: a.default for prog, p in _all_parsers() for a in p._actions  # type: ignore[attr-defined]
             if "--seed" in a.option_strings}
    assert set(seeds) >= {"fleetmedic demo", "fleetmedic simulate"}
    assert set(seeds.values()) == {DEFAULT_SEED}


def test_exporter_help_lists_all_seven_connectors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["exporter", "--help"])
    text = capsys.readouterr().out
    for name in ("nvml", "prometheus", "remote-write", "kafka", "infiniband", "logs", "kmsg"):
        assert f"fleetmedic exporter {name} " in text and f"\n    {name}" in text, name
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert "nvml, prometheus, remote-write, kafka, infiniband, logs, kmsg" in " ".join(top.split())


@pytest.mark.parametrize("command", ["executor", "watch-jobs"])
def test_without_a_kubeconfig_one_line_and_exit_2(command: str, tmp_path: Path) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETMEDIC", "KUBE"))}
    env.update(HOME=str(tmp_path), KUBECONFIG=str(tmp_path / "nowhere"),
               FLEETMEDIC_SIGNING_KEY="k" * 40)
    run = subprocess.run([sys.executable, "-m", "fleetmedic.cli", command], capture_output=True, text=True,
                         timeout=120, env=env)
    assert run.returncode == 2, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("error: no kubeconfig at ") and str(tmp_path / "nowhere") in line
    in_cluster = subprocess.run([sys.executable, "-m", "fleetmedic.cli", command], capture_output=True, text=True,
                                timeout=120, env={**env, "FLEETMEDIC__EXECUTOR__IN_CLUSTER": "true",
                                                  "FLEETMEDIC__JOBWATCH__IN_CLUSTER": "true"})
    assert in_cluster.returncode == 2
    (line,) = in_cluster.stderr.strip().splitlines()
    assert "in_cluster is true, but this is not a pod" in line


def test_every_duration_option_reads_90s_10m_2h() -> None:
    """Options named for a span of time take the one shared duration type (plain seconds still work)."""
    from fleetmedic.cli.common import duration

    words = ("duration", "since", "timeout", "interval", "grace", "early", "every", "age", "window")
    for prog, parser in _all_parsers():
        for action in parser._actions:  # type: ignore[attr-defined]
            names = " ".join(action.option_strings)
            if any(w in names for w in words) and action.type is not None:
                assert action.type is duration, f"{prog} {names}"
