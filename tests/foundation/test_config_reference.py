"""The generated configuration reference (docs/config-reference.md) and the config part of the
Helm chart's values.schema.json: both are what `fleetmedic config reference` writes from the config
types and the shipped example's comments, every setting has a row, and `--check` says when a file
is stale."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest

from fleetmedic.cli.config_reference import (
    CHART_SCHEMA,
    EXAMPLE,
    REFERENCE,
    config_json_schema,
    example_comments,
    reference,
)
from fleetmedic.cli.main import main
from fleetmedic.config import Settings


def test_the_committed_reference_and_chart_schema_are_what_the_generator_writes() -> None:
    assert main(["config", "reference", "--check", "--out", str(REFERENCE), "--chart-schema", str(CHART_SCHEMA)]) == 0


def test_check_names_a_stale_file_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "config-reference.md"
    stale.write_text(REFERENCE.read_text().replace("dry run first", "live first"))
    assert main(["config", "reference", "--check", "--out", str(stale)]) == 1
    assert f"{stale} is stale" in capsys.readouterr().err
    assert main(["config", "reference", "--out", str(stale)]) == 0
    assert stale.read_text() == REFERENCE.read_text()


def test_every_setting_has_a_row_with_its_type_and_default() -> None:
    ref = reference(EXAMPLE.read_text())
    paths = {row.path for row in ref.rows}
    for wanted in ("detection.metrics.<name>.z_warning", "detection.peers.z_threshold", "detection.cusum.threshold_h",
                   "detection.multivariate.distance_threshold", "detection.straggler.slowdown_ratio",
                   "safety.dry_run", "policy.rules[].name"):
        assert wanted in paths
    rows = {row.path: row for row in ref.rows}
    assert rows["detection.peers.z_threshold"].type == "float (> 0)"
    assert rows["detection.peers.z_threshold"].default == "`3.5`"
    assert "unlike its peers" in rows["detection.peers.z_threshold"].description
    assert "shipped example sets `true`" in rows["safety.dry_run"].description


def test_every_top_level_setting_of_the_example_is_described() -> None:
    """A setting the example leaves uncommented would be a row saying nothing."""
    ref = reference(EXAMPLE.read_text())
    bare = [row.path for row in ref.rows if not row.description and "[]" not in row.path and "<name>" not in row.path]
    assert not bare, f"settings without a comment in {EXAMPLE.name}: {bare}"


def test_comments_continue_on_aligned_lines_and_open_with_the_lines_above() -> None:
    text = ("a:                 # section a\n"
            "  # said above b\n"
            "  b: 1             # first part\n"
            "                   # second part\n"
            "  c: {x: 1}\n"
            "  d: \"#not\"        # real\n")
    assert example_comments(text) == {"a": "section a", "a.b": "said above b first part second part", "a.d": "real"}


def test_the_chart_refuses_a_misspelt_config_key_as_the_config_does() -> None:
    schema = config_json_schema()
    safety = schema["properties"]["safety"]
    assert safety["additionalProperties"] is False and safety["properties"]["dry_run"] == {"type": "boolean"}
    chart = json.loads(CHART_SCHEMA.read_text())
    assert chart["properties"]["config"]["properties"]["safety"]["additionalProperties"] is False
    # names the loader checks are checked by the schema too: signals, topics
    metrics = schema["properties"]["detection"]["properties"]["metrics"]
    assert "sm_clock" in metrics["propertyNames"]["enum"] and "sm_clok" not in metrics["propertyNames"]["enum"]
    # every section of the types is in the schema, nothing else
    assert set(schema["properties"]) == {f.encode_name for f in msgspec.structs.fields(Settings)}


def test_the_reference_links_resolve() -> None:
    text = REFERENCE.read_text()
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        assert (REFERENCE.parent / target).exists(), target


def test_the_reference_is_linked_from_the_readme_and_the_tuning_guide() -> None:
    root = REFERENCE.parents[1]
    assert "docs/config-reference.md" in (root / "README.md").read_text()
    assert "config-reference.md" in (root / "docs" / "tuning.md").read_text()
