"""Configuration: the shipped example documents every option, environment variables override any
value, and every error names the field path and the reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetmedic.config import ConfigError, Settings, parse_config, read_config, to_builtins

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "config" / "fleetmedic.yaml"


def _paths(doc: Any, prefix: str = "") -> set[str]:
    if not isinstance(doc, dict):
        return {prefix}
    out: set[str] = set()
    for key, value in doc.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        # open-ended mappings (per-metric, per-topic...) are documented by their entries
        out |= _paths(value, path) if isinstance(value, dict) and value else {path}
    return out


def test_the_example_config_is_valid_and_equals_the_defaults() -> None:
    assert read_config(str(EXAMPLE), {}) == Settings()


def test_the_example_config_spells_out_every_option() -> None:
    import yaml

    example = yaml.safe_load(EXAMPLE.read_text())
    missing = _paths(to_builtins(Settings())) - _paths(example)
    assert not missing, f"options missing from {EXAMPLE.name}: {sorted(missing)}"


def test_an_empty_file_gives_the_defaults() -> None:
    assert parse_config("") == Settings()


@pytest.mark.parametrize(
    ("text", "path", "reason"),
    [
        ("kafka: {bootstrap: x}", "kafka.bootstrap", "unknown key"),
        ("nonsense: 1", "nonsense", "unknown key"),
        ("safety: {max_quarantined_fraction: 1.5}", "safety.max_quarantined_fraction", "<= 1.0"),
        ("safety: {max_per_rack: two}", "safety.max_per_rack", "Expected `int`, got `str`"),
        ("detection: {metrics: {gpu_temp: {z_warning: 1}, sm_clock: {z_warning: -3}}}",
         "detection.metrics.sm_clock.z_warning", "> 0.0"),
        ("detection: {xid: {action_overrides: {79: sometimes}}}", "detection.xid.action_overrides.79", "enum"),
        ("executor: {diagnostics_command: [dcgmi, 3]}", "executor.diagnostics_command.1", "Expected `str`"),
        ("executor: {taint_effect: Sometimes}", "executor.taint_effect", "Invalid enum value"),
        ("kafka: {security_protocol: SASL_SSL}", "kafka", "sasl_mechanism"),
        ("topics: {partitions: {telemetry.cpu: 3}}", "topics", "unknown topic `telemetry.cpu`"),
        ("[1, 2]", "", "must be a mapping"),
        ("kafka: [", "", "not valid YAML"),
    ],
)
def test_invalid_config_names_the_field_path_and_reason(text: str, path: str, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    assert err.value.path == path
    assert reason in err.value.reason


def test_environment_overrides_any_value_with_yaml_typing() -> None:
    env = {
        "FLEETMEDIC__KAFKA__BOOTSTRAP_SERVERS": "broker-0:9092,broker-1:9092",
        "FLEETMEDIC__SAFETY__MAX_QUARANTINED_FRACTION": "0.02",
        "FLEETMEDIC__SAFETY__BREAKER__RESUME": "auto",
        "FLEETMEDIC__DETECTION__XID__REPEAT_XIDS": "[13, 43]",
        "fleetmedic__executor__dry_run_is_not_here": "x",
        "UNRELATED": "1",
    }
    env.pop("fleetmedic__executor__dry_run_is_not_here")
    s = parse_config("safety: {max_quarantined_fraction: 0.1}", env)
    assert s.kafka.bootstrap_servers == "broker-0:9092,broker-1:9092"
    assert s.safety.max_quarantined_fraction == 0.02
    assert s.safety.breaker.resume == "auto"
    assert s.detection.xid.repeat_xids == [13, 43]


def test_a_bad_environment_override_names_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config("", {"FLEETMEDIC__EXECUTOR__DRAIN_TIMEOUT_S": "soon"})
    assert err.value.path == "executor.drain_timeout_s"
    with pytest.raises(ConfigError) as err:
        parse_config("", {"FLEETMEDIC__EXECUTOR__NO_SUCH_KNOB": "1"})
    assert err.value.path == "executor.no_such_knob"


def test_settings_are_immutable() -> None:
    s = Settings()
    with pytest.raises(AttributeError):
        s.safety.dry_run = True  # type: ignore[misc]


def test_topic_names_use_the_prefix_and_overrides() -> None:
    s = parse_config("topics: {prefix: 'prod.', names: {findings: shared.gpu-findings}}")
    assert s.topics.topic("telemetry.gpu") == "prod.telemetry.gpu"
    assert s.topics.topic("findings") == "shared.gpu-findings"
    with pytest.raises(KeyError):
        s.topics.topic("nope")


def test_an_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        read_config(str(tmp_path / "missing.yaml"))
