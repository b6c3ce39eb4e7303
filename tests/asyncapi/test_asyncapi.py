"""deploy/asyncapi.yaml: generated from fleetmedic/bus.py (stale-checked here), covers every topic,
and the official AsyncAPI parser (@asyncapi/parser from npm, pinned in package-lock.json) accepts it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from fleetmedic.bus import TOPICS
from fleetmedic.cli.main import main
from fleetmedic.cli.schema import asyncapi_is_current, render_asyncapi
from fleetmedic.signing import KEY_ID_HEADER, SIGNATURE_HEADER, SIGNED_TOPICS
from tests.asyncapi.helpers_npm import HERE, node_env, tool

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "deploy" / "asyncapi.yaml"


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    env = node_env()
    return subprocess.run([tool("node"), str(HERE / "validate.mjs"), str(path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_committed_asyncapi_is_up_to_date() -> None:
    assert asyncapi_is_current(DOC), "run `fleetmedic schema --asyncapi deploy/asyncapi.yaml`"


def test_schema_check_flags_an_edited_asyncapi_file(tmp_path: Path) -> None:
    doc = tmp_path / "asyncapi.yaml"
    assert main(["schema", "--out", str(tmp_path / "schemas"), "--asyncapi", str(doc)]) == 0
    assert main(["schema", "--out", str(tmp_path / "schemas"), "--asyncapi", str(doc), "--check"]) == 0
    doc.write_text(doc.read_text().replace("fleetmedic.findings", "fleetmedic.findingz", 1))
    assert main(["schema", "--out", str(tmp_path / "schemas"), "--asyncapi", str(doc), "--check"]) == 1


def test_every_topic_is_a_channel_and_signed_topics_declare_their_headers() -> None:
    doc = yaml.safe_load(render_asyncapi())
    assert doc["asyncapi"] == "3.0.0"
    assert {c["address"] for c in doc["channels"].values()} == {f"fleetmedic.{t.name}" for t in TOPICS}
    for t in TOPICS:
        message = doc["components"]["messages"][t.value.__name__]
        assert message["payload"] == {"$ref": f"#/components/schemas/{t.value.__name__}"}
        assert {op["action"] for op in doc["operations"].values() if op["channel"]["$ref"] == f"#/channels/{t.name}"} \
            == {"send", "receive"}
        if t.name in SIGNED_TOPICS:
            assert set(message["headers"]["required"]) == {SIGNATURE_HEADER, KEY_ID_HEADER}
        else:
            assert "headers" not in message


@pytest.mark.node
def test_the_official_parser_accepts_the_document() -> None:
    run = validate(DOC)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{len(TOPICS)} channels" in run.stdout


@pytest.mark.node
def test_the_official_parser_refuses_a_broken_document(tmp_path: Path) -> None:
    """The check has teeth: an AsyncAPI 2 action word and a dangling reference are reported."""
    broken = tmp_path / "asyncapi.yaml"
    broken.write_text(DOC.read_text().replace("action: send", "action: publish", 1))
    run = validate(broken)
    assert run.returncode == 1, run.stdout + run.stderr
    dangling = tmp_path / "dangling.yaml"
    dangling.write_text(DOC.read_text().replace("#/components/schemas/Finding", "#/components/schemas/Nope"))
    run = validate(dangling)
    assert run.returncode == 1, run.stdout + run.stderr
