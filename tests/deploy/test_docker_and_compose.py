"""The Dockerfile and the compose file (no Docker engine here): what they reference exists, the
versions match what the tests run, and the compose demo is a valid fleetmedic command line."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from fleetmedic.cli import main as cli
from fleetmedic.devenv.settings import read_versions

ROOT = Path(__file__).resolve().parents[2]


def test_compose_runs_the_tested_kafka_version_and_a_valid_demo_command() -> None:
    doc = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    kafka, demo = doc["services"]["kafka"], doc["services"]["demo"]
    assert kafka["image"] == f"apache/kafka:{read_versions()['KAFKA_VERSION']}"
    args = cli.build_parser().parse_args(demo["command"])
    assert args.command == "demo" and args.bootstrap == "kafka:9092"
    assert (ROOT / "deploy" / demo["build"]["context"] / demo["build"]["dockerfile"]).resolve() == ROOT / "Dockerfile"
    # no key of its own: the demo signs with its built-in demo keys, which nothing outside the demo accepts
    assert not [k for k in demo.get("environment") or {} if "KEY" in k]
    assert demo["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_dockerfile_copies_what_exists_and_runs_unprivileged() -> None:
    text = (ROOT / "Dockerfile").read_text()
    for src in re.findall(r"^COPY (?!--from)(\S+)", text, flags=re.M):
        assert (ROOT / src).exists(), src
    assert re.search(r"^USER 10001$", text, flags=re.M)
    assert "'.[nvml]'" in text  # the NVML exporter runs from the same image
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored
