"""The executor's routes partition the action vocabulary of fleetmedic.records: every Action is a quick
node action, a long node action or a job action, and exactly one of them; and every Kubernetes key in
fleetmedic.k8s_keys is fleetmedic's own and declared once."""

from __future__ import annotations

from typing import get_args

from fleetmedic import k8s_keys
from fleetmedic.executor.vocabulary import ACTIONS, JOB_ACTIONS, NODE_LONG, NODE_QUICK
from fleetmedic.records import Action


def test_the_routes_partition_records_action() -> None:
    routes = {"quick node": NODE_QUICK, "long node": NODE_LONG, "job": JOB_ACTIONS}
    assert frozenset(get_args(Action)) == ACTIONS
    assert frozenset().union(*routes.values()) == ACTIONS, "an Action the executor does not route"
    for name, route in routes.items():
        others = frozenset().union(*(r for n, r in routes.items() if n != name))
        assert not route & others, f"{name}: on two routes: {sorted(route & others)}"
        assert route, f"{name}: empty"


def test_k8s_keys_are_fleetmedics_own_and_unique_per_kind() -> None:
    keys = {name: value for name, value in vars(k8s_keys).items() if name.isupper()}
    prefixes = ("LABEL_", "ANNOTATION_", "TAINT_", "CONDITION_")
    assert all(n.startswith(prefixes) or n.endswith("_COMPONENT") for n in keys), sorted(keys)
    for prefix in ("LABEL_", "ANNOTATION_"):
        values = [v for n, v in keys.items() if n.startswith(prefix)]
        assert len(values) == len(set(values)), f"{prefix}*: a key declared twice"
    assert all("fleetmedic" in v.lower() for v in keys.values())
