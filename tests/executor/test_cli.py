"""``fleetmedic executor``: registered in the CLI, refuses to start without a signing key, with an
empty, short or published demo key (exit 2) or with an invalid config, naming the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetmedic.cli.main import build_parser, main
from fleetmedic.signing import DEMO_COMMAND_KEY


def test_executor_subcommand_is_registered() -> None:
    args = build_parser().parse_args(["executor", "--config", "x.yaml", "--identity", "a"])
    assert args.command == "executor" and args.identity == "a"


def test_refuses_to_start_without_a_signing_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("FLEETMEDIC_SIGNING_KEY", raising=False)
    config = tmp_path / "c.yaml"
    config.write_text("executor: {lease_duration_s: 5.0}\n")
    assert main(["executor", "--config", str(config)]) == 2
    assert "signing key" in capsys.readouterr().err


def test_refuses_an_invalid_executor_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("executor: {taint_effect: Sometimes}\n")
    assert main(["executor", "--config", str(config)]) == 2
    assert "executor.taint_effect" in capsys.readouterr().err


@pytest.mark.parametrize(("key", "why"), [
    ("short-key", "at least 32 bytes"),
    (DEMO_COMMAND_KEY.decode(), "published demo key"),
    ("compose-demo-signing-key-not-for-production-use", "published demo key"),
])
def test_refuses_to_start_with_an_unusable_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str], key: str, why: str) -> None:
    monkeypatch.setenv("FLEETMEDIC_SIGNING_KEY", key)
    config = tmp_path / "c.yaml"
    config.write_text("executor: {lease_duration_s: 5.0}\n")
    assert main(["executor", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "command key $FLEETMEDIC_SIGNING_KEY" in err and why in err
