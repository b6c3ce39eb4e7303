"""The contract's two vocabularies. fleetmedic.actions: the executor's routes partition Action, the
policy's two tracks cover RuleAction and share only escalate, every class is made of the actions it
names, a command acts on its node unless it is a job action, and a command id is
incident/action/target[/attempt]. fleetmedic.k8s_keys: every key is fleetmedic's own and declared once."""

from __future__ import annotations

from typing import get_args

import msgspec
import pytest

from fleetmedic import actions as a
from fleetmedic import k8s_keys
from fleetmedic.config import ActionStep
from fleetmedic.records import RemediationCommand, RemediationResult


def test_the_routes_partition_action() -> None:
    routes = {"quick node": a.NODE_QUICK, "long node": a.NODE_LONG, "job": a.JOB_ACTIONS}
    assert frozenset(get_args(a.Action)) == a.ACTIONS
    assert frozenset().union(*routes.values()) == a.ACTIONS, "an Action the executor does not route"
    for name, route in routes.items():
        others = frozenset().union(*(r for n, r in routes.items() if n != name))
        assert not route & others, f"{name}: on two routes: {sorted(route & others)}"
        assert route, f"{name}: empty"


def test_commands_results_and_rules_carry_the_vocabulary() -> None:
    for record in (RemediationCommand, RemediationResult):
        schema = msgspec.json.schema(record)["$defs"][record.__name__]
        assert schema["properties"]["action"]["enum"] == sorted(a.ACTIONS), record.__name__
    step = msgspec.json.schema(ActionStep)["$defs"]["ActionStep"]
    assert step["properties"]["action"]["enum"] == sorted(get_args(a.RuleAction))


def test_the_rule_tracks_cover_rule_action_and_share_escalate() -> None:
    rule = frozenset(get_args(a.RuleAction))
    assert rule == a.JOB_TRACK_ACTIONS | a.NODE_TRACK_ACTIONS
    assert rule <= a.ACTIONS
    assert {"escalate"} == a.JOB_TRACK_ACTIONS & a.NODE_TRACK_ACTIONS
    assert {"restart_job", "requeue_job", "retry_in_place", "escalate"} == a.JOB_TRACK_ACTIONS
    assert {"cordon", "taint", "drain", "label", "run_diagnostics", "reset_gpu", "reboot_node",
            "escalate"} == a.NODE_TRACK_ACTIONS


def test_the_classes_hold_the_actions_they_name() -> None:
    assert {"cordon", "taint", "drain"} == a.ISOLATING
    assert {"reset_gpu", "reboot_node"} == a.DISRUPTIVE
    assert {"cordon", "taint", "drain", "run_diagnostics", "reset_gpu", "reboot_node"} == a.TRACKED
    assert {"uncordon", "untaint", "return_to_service"} == a.RELEASING
    assert {"restart_job", "requeue_job"} == a.MOVING
    assert a.ISOLATING | a.DISRUPTIVE <= a.NODE_TRACK_ACTIONS
    assert a.RELEASING <= a.NODE_QUICK - a.NODE_TRACK_ACTIONS
    assert a.MOVING <= a.JOB_ACTIONS


@pytest.mark.parametrize(("action", "node", "on_node"), [
    ("cordon", "n1", True),
    ("drain", "n1", True),
    ("escalate", "n1", True),
    ("escalate", "", False),
    ("restart_job", "n1", False),
    ("cordon", "", False),
])
def test_a_command_acts_on_its_node_unless_it_is_a_job_action(action: str, node: str, on_node: bool) -> None:
    assert a.targets_node(action, node) is on_node


def test_a_command_id_names_incident_action_target_and_attempt() -> None:
    assert a.command_id("hw:n1:5", "cordon", "n1", "e1.2") == "hw:n1:5/cordon/n1/e1.2"
    assert a.command_id("bug:ml/a:5", "restart_job", "ml/a", 3) == "bug:ml/a:5/restart_job/ml/a/3"
    assert a.command_id("bug:ml/a:5", "escalate", "ml/a", None) == "bug:ml/a:5/escalate/ml/a"


def test_k8s_keys_are_fleetmedics_own_and_unique_per_kind() -> None:
    keys = {name: value for name, value in vars(k8s_keys).items() if name.isupper()}
    prefixes = ("LABEL_", "ANNOTATION_", "TAINT_", "CONDITION_")
    assert all(n.startswith(prefixes) or n.endswith("_COMPONENT") for n in keys), sorted(keys)
    for prefix in ("LABEL_", "ANNOTATION_"):
        values = [v for n, v in keys.items() if n.startswith(prefix)]
        assert len(values) == len(set(values)), f"{prefix}*: a key declared twice"
    assert all("fleetmedic" in v.lower() for v in keys.values())
