"""Configuration: the shipped example documents every option, environment variables override any
value, and every error names the field path and the reason. Hostile files (alias bombs, deep nesting,
bad encodings, oversize) are refused with a ConfigError, every error of a file is listed at once, keys
under maps are checked against what they name, and dangerous-but-valid settings are warned about."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from fleetmedic.cli.main import main
from fleetmedic.config import (
    DETECTION_SIGNALS,
    MAX_CONFIG_BYTES,
    ConfigError,
    Settings,
    config_warnings,
    load_yaml,
    parse_config,
    read_config,
    to_builtins,
)

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


def test_the_example_config_is_valid_and_equals_the_defaults_but_starts_in_dry_run() -> None:
    example = read_config(str(EXAMPLE), {})
    assert example.safety.dry_run is True
    assert example == msgspec.structs.replace(Settings(), safety=msgspec.structs.replace(Settings().safety,
                                                                                           dry_run=True))


def test_the_example_config_and_the_chart_state_one_dry_run_default() -> None:
    import yaml

    values = yaml.safe_load((EXAMPLE.parents[1] / "helm" / "fleetmedic" / "values.yaml").read_text())
    assert values["config"]["safety"]["dry_run"] is read_config(str(EXAMPLE), {}).safety.dry_run is True


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
        ("topics: {partitions: {telemetry.cpu: 3}}", "topics.partitions.telemetry.cpu",
         "unknown topic `telemetry.cpu`"),
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


# --- hostile files ------------------------------------------------------------------

# 9 levels of 9 aliases: ~390 million strings once expanded (before: minutes, then MemoryError)
BILLION_LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))


def _file(tmp_path: Path, data: bytes | str, name: str = "fleetmedic.yaml") -> str:
    path = tmp_path / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return str(path)


def _refused(path: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        read_config(path, {})
    assert err.value.source == path
    return err.value


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path: Path) -> None:
    assert len(BILLION_LAUGHS) < 450
    err = _refused(_file(tmp_path, BILLION_LAUGHS))
    assert "alias" in err.reason and err.path == ""


def test_an_alias_that_contains_itself_is_refused() -> None:
    with pytest.raises(ConfigError, match="refers to the node that contains it"):
        parse_config("a: &a [*a]")


def test_reasonable_aliases_still_work() -> None:
    s = parse_config("policy:\n  rules:\n    - {name: a, job: &steps [{action: restart_job}]}\n"
                     "    - {name: b, job: *steps}\n")
    assert s.policy.rules[0].job == s.policy.rules[1].job


@pytest.mark.parametrize(
    "text",
    ["kafka: " + "[" * 5000 + "]" * 5000,  # before: RecursionError
     "kafka: " + "{a: " * 5000 + "1" + "}" * 5000,
     "".join(" " * i + f"k{i}:\n" for i in range(200))],  # block style, one space deeper per level
)
def test_deep_nesting_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="nested deeper than 64 levels"):
        parse_config(text)


def test_a_non_utf8_file_names_the_file_and_byte_offset(tmp_path: Path) -> None:
    path = _file(tmp_path, b"kafka:\n  client_id: caf\xe9\n")  # before: UnicodeDecodeError traceback
    err = _refused(path)
    assert "not UTF-8" in err.reason and "byte offset 23" in err.reason and "line 2" in err.reason
    assert str(err).startswith(path)


def test_an_oversize_file_is_refused_unread(tmp_path: Path) -> None:
    err = _refused(_file(tmp_path, "#" * (MAX_CONFIG_BYTES + 1)))
    assert "larger than" in err.reason


@pytest.mark.parametrize(("text", "reason"), [
    ("safety: {max_per_rack: " + "9" * 5000 + "}", "Exceeds the limit"),  # before: ValueError traceback
    ("kafka: {client_id: 2001-13-45}", "month must be in 1..12"),
])
def test_a_value_yaml_cannot_build_is_a_config_error_with_its_line(text: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason) as err:
        parse_config(text)
    assert "line 1" in err.value.reason


def test_an_environment_override_is_held_to_the_same_limits() -> None:
    with pytest.raises(ConfigError, match="nested deeper") as err:
        parse_config("", {"FLEETMEDIC__KAFKA__CLIENT_ID": "[" * 5000})
    assert err.value.path == "kafka.client_id"


# --- every error at once, names under maps ------------------------------------------------------


def test_every_error_of_a_file_is_listed_at_once() -> None:
    text = """
kafka: {bootstrap: x, acks: some}
safety: {max_per_racks: 1, max_quarantined_fraction: 1.5, breaker: {window_s: -1}}
detection: {metrics: {sm_clok: {}, gpu_temp: {z_warning: 0}}}
policy: {rules: [{name: x, job: [{action: cordon}]}, {name: y, node: [{action: nap}]}]}
nonsense: 1
"""
    with pytest.raises(ConfigError) as err:
        parse_config(text, source="f.yaml")
    assert [path for path, _ in err.value.errors] == [
        "kafka.bootstrap", "kafka.acks",
        "safety.max_per_racks", "safety.max_quarantined_fraction", "safety.breaker.window_s",
        "detection.metrics.sm_clok", "detection.metrics.gpu_temp.z_warning",
        "policy.rules.0", "policy.rules.1.node.0.action",
        "nonsense",
    ]
    assert (err.value.path, err.value.reason) == err.value.errors[0]
    assert str(err.value).splitlines()[2] == "f.yaml: safety.max_per_racks: unknown key (did you mean `max_per_rack`?)"


def test_a_file_with_a_thousand_errors_lists_fifty_and_counts_the_rest() -> None:
    text = "safety: {" + ", ".join(f"x{i}: 1" for i in range(1000)) + "}"
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    assert len(err.value.errors) == 51 and err.value.errors[-1] == ("", "... and 950 more errors")


@pytest.mark.parametrize(
    ("text", "path", "reason"),
    [
        ("detection: {metrics: {sm_clok: {direction: down}}}", "detection.metrics.sm_clok",
         "unknown signal `sm_clok` (did you mean `sm_clock`?)"),
        ("detection: {ib_thresholds: {link_downed_count: 1}}", "detection.ib_thresholds.link_downed_count",
         "unknown counter `link_downed_count` (did you mean `link_downed_counter`?)"),
        ("triage: {congestion_metrics: [port_xmit_wiat]}", "triage.congestion_metrics.0",
         "unknown port metric `port_xmit_wiat` (did you mean `port_xmit_wait`?)"),
        ("topics: {names: {finding: x}}", "topics.names.finding", "unknown topic `finding` (did you mean `findings`?)"),
        ("policy: {rules: [{name: x, node: [{action: escalate, params: {escalaton: repair}}]}]}",
         "policy.rules.0.node.0.params.escalaton", "unknown step parameter `escalaton` (did you mean `escalation`?)"),
        ("executor: {diagnostics_tolerations: [{key: a, operater: Exists}]}",
         "executor.diagnostics_tolerations.0.operater",
         "unknown toleration field `operater` (did you mean `operator`?)"),
        ("executor: {namespace_policies: {Batch_Jobs: evict_now}}", "executor.namespace_policies.Batch_Jobs",
         "is not a valid namespace"),
        ("executor: {diagnostics_pod_annotations: {'a b': x}}", "executor.diagnostics_pod_annotations.a b",
         "is not a valid annotation key"),
        ("exporters: {kafka: {metric_map: {temp: gpu_tmp}}}", "exporters.kafka.metric_map.temp",
         "`gpu_tmp` is not a GPU metric nor port.<PortSample field> (did you mean `gpu_temp`?)"),
        ("detection: {xid: {action_overrides: {abc: ignore}}}", "detection.xid.action_overrides.abc", "invalid key"),
        ("safety: {breakr: {}}", "safety.breakr", "unknown key (did you mean `breaker`?)"),
    ],
)
def test_keys_under_maps_are_checked_against_what_they_name(text: str, path: str, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    assert err.value.errors == ((path, err.value.reason),)
    assert reason in err.value.reason


def test_the_signal_names_match_the_gpu_detector() -> None:
    from fleetmedic.models.gpu_signals import KNOWN_SIGNALS

    assert DETECTION_SIGNALS == KNOWN_SIGNALS


# --- dangerous but valid ------------------------------------------------------------------------


def test_the_defaults_and_the_example_warn_about_nothing() -> None:
    assert config_warnings(Settings()) == []
    assert config_warnings(read_config(str(EXAMPLE), {})) == []


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("safety: {dry_run: false, max_quarantined_fraction: 1.0}", "safety.max_quarantined_fraction"),
        ("safety: {breaker: {trip_suspect_fraction: 1.0}}", "safety.breaker.trip_suspect_fraction"),
        ("safety: {breaker: {trip_min_nodes: 1000000}}", "safety.breaker.trip_min_nodes"),
        ("safety: {breaker: {window_s: 1}}", "safety.breaker.window_s"),
        ("signing: {command_ttl_s: 946080000}", "signing.command_ttl_s"),  # 30 years
        ("safety: {max_quarantined_count: 0}", "safety.max_quarantined_count"),
        ("safety: {max_quarantined_fraction: 0}", "safety.max_quarantined_fraction"),
        ("safety: {max_new_isolations: 0}", "safety.max_new_isolations"),
        ("safety: {max_per_rack: 0}", "safety.max_per_rack"),
        ("safety: {max_per_switch: 0}", "safety.max_per_switch"),
    ],
)
def test_dangerous_but_valid_settings_are_warned_about(text: str, path: str) -> None:
    warnings = config_warnings(parse_config(text))
    assert len(warnings) == 1 and warnings[0].startswith(f"{path}: ")


@pytest.mark.parametrize(("text", "path"), [
    ("safety: {breaker: {signature_min_nodes: 100000}}", "safety.breaker.signature_min_nodes"),
    ("safety: {breaker: {signature_fraction: 0.9}}", "safety.breaker.signature_fraction"),
    ("safety: {breaker: {domain_min_nodes: 5000}}", "safety.breaker.domain_min_nodes"),
    ("safety: {breaker: {domain_fraction: 0.75}}", "safety.breaker.domain_fraction"),
])
def test_a_setting_that_turns_a_breaker_rule_off_is_warned_about(text: str, path: str) -> None:
    (warning,) = config_warnings(parse_config(text))
    assert warning.startswith(f"{path}: ") and "effectively off" in warning


def test_no_warning_claims_a_rule_that_is_off_still_protects() -> None:
    text = "safety: {breaker: {trip_min_nodes: 100000, signature_min_nodes: 100000}}"
    warnings = config_warnings(parse_config(text))
    assert len(warnings) == 2
    for w in warnings:
        assert "only the one-domain rule can still open it" in w and "signature" not in w.split("; only")[1]
    everything_off = ("safety: {breaker: {trip_min_nodes: 100000, signature_min_nodes: 100000, "
                      "domain_min_nodes: 100000}}")
    warnings = config_warnings(parse_config(everything_off))
    assert len(warnings) == 3 and all("no rule can open the breaker" in w for w in warnings)


def test_turning_the_fleet_share_off_says_what_scope_evidence_then_leaves() -> None:
    (warning,) = config_warnings(parse_config("safety: {breaker: {trip_min_nodes: 100000}}"))
    assert "nothing stops all isolation at once" in warning
    (warning,) = config_warnings(parse_config("safety: {breaker: {trip_min_nodes: 100000, scope: all}}"))
    assert "nothing stops all isolation" not in warning


@pytest.mark.parametrize("text", [
    "safety: {dry_run: true, max_quarantined_fraction: 1.0}",
    "safety: {dry_run: true, breaker: {trip_suspect_fraction: 1.0, trip_min_nodes: 5000, window_s: 1}}",
    "safety: {max_quarantined_fraction: 0.25}\nsigning: {command_ttl_s: 3600}",
])
def test_what_is_not_dangerous_is_not_warned_about(text: str) -> None:
    assert config_warnings(parse_config(text)) == []


# --- fleetmedic config check --------------------------------------------------------------------


def test_config_check_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in __import__("os").environ if n.upper().startswith("FLEETMEDIC__")]:
        monkeypatch.delenv(name)
    good = _file(tmp_path, "safety: {dry_run: true}\n", "good.yaml")
    risky = _file(tmp_path, "safety: {dry_run: false, max_quarantined_fraction: 1.0}\n", "risky.yaml")
    bad = _file(tmp_path, "safety: {max_per_racks: 1, dry_run: maybe}\n", "bad.yaml")
    binary = _file(tmp_path, b"\xff\xfe\x00", "binary.yaml")

    assert main(["config", "check", good]) == 0
    out, err = capsys.readouterr()
    assert "dry_run: true" in out and err == ""
    assert main(["config", "check", "--strict", "--quiet", good]) == 0
    assert capsys.readouterr() == ("", "")

    assert main(["config", "check", risky]) == 0
    out, err = capsys.readouterr()
    assert out and err.startswith(f"warning: {risky}: safety.max_quarantined_fraction: ")
    assert main(["config", "check", "--strict", "--quiet", risky]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "warning:" in err

    assert main(["config", "check", bad]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [
        f"error: {bad}: safety.max_per_racks: unknown key (did you mean `max_per_rack`?)",
        f"error: {bad}: safety.dry_run: Expected `bool`, got `str`",
    ]
    assert main(["config", "check", binary]) == 2
    assert "not UTF-8" in capsys.readouterr().err


def test_every_command_loading_a_config_prints_its_warnings_and_still_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fleetmedic.cli.common import settings_or_none

    path = tmp_path / "c.yaml"
    path.write_text("safety:\n  max_per_rack: 0\n")
    settings = settings_or_none(str(path))
    assert settings is not None and settings.safety.max_per_rack == 0
    err = capsys.readouterr().err
    assert "warning: " in err and "max_per_rack" in err


def test_demo_keys_allowed_outside_the_demo_is_a_warning() -> None:
    from fleetmedic.config import config_warnings, parse_config

    warnings = config_warnings(parse_config("signing:\n  allow_demo_keys: true\n", env={}))
    assert any(w.startswith("signing.allow_demo_keys") for w in warnings)
    assert not any("allow_demo_keys" in w for w in config_warnings(parse_config("", env={})))


# --- a key given twice ---------------------------------------------------------------------------

DRY_THEN_LIVE = "safety:\n  dry_run: true\ndetection:\n  sample_interval_s: 10\nsafety:\n  dry_run: false\n"


def test_a_key_given_twice_is_a_config_error_naming_both_lines() -> None:
    """YAML readers keep the last of two equal keys: here the second ``safety`` would run live."""
    with pytest.raises(ConfigError, match=r"the key 'safety' is given twice in one mapping \(line 1, column 1 and "
                                          r"line 5, column 1\)"):
        parse_config(DRY_THEN_LIVE, env={})
    with pytest.raises(ConfigError, match="'dry_run' is given twice"):
        parse_config("safety: {dry_run: true, dry_run: false}", env={})
    with pytest.raises(ConfigError, match="'max_per_rack' is given twice"):  # in an override's value too
        parse_config("", env={"FLEETMEDIC__SAFETY": "{max_per_rack: 1, max_per_rack: 9}"})


def test_config_check_strict_exits_2_for_a_key_given_twice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(DRY_THEN_LIVE)
    assert main(["config", "check", "--strict", "--quiet", str(f)]) == 2
    assert "given twice" in capsys.readouterr().err


def test_a_merged_key_may_still_be_given() -> None:
    doc = load_yaml("defaults: &d {dry_run: true, max_per_rack: 3}\nsafety:\n  <<: *d\n  max_per_rack: 5\n")
    assert doc["safety"] == {"dry_run": True, "max_per_rack": 5}


@pytest.mark.parametrize(("yaml_text", "field", "why"), [
    ("admission: {enabled: true}", "admission.enabled", "HTTPS only"),
    ("admission: {cert_file: /c.pem}", "admission", "go together"),
    ("admission: {listen: '8443'}", "admission.listen", "host:port"),
    ("admission: {listen: 'h:99999'}", "admission.listen", "host:port"),
    ("admission: {path: binding}", "admission.path", "start with /"),
])
def test_the_bind_time_check_needs_https_and_a_listen_address(yaml_text: str, field: str, why: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(yaml_text, env={})
    assert field.split(".")[0] in str(err.value) and why in str(err.value), str(err.value)
    ok = parse_config("admission: {enabled: true, cert_file: /c.pem, key_file: /k.pem, listen: '[::]:9443'}", env={})
    assert ok.admission.enabled and ok.admission.listen == "[::]:9443"
