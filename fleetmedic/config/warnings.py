"""Settings that are valid but dangerous (:func:`config_warnings`): ``fleetmedic config check``
prints them; the long-running roles log them at startup."""

from __future__ import annotations

from typing import Final

from fleetmedic.config.decisions import BreakerSettings
from fleetmedic.config.settings import Settings

#: ``config_warnings`` thresholds (see its docstring)
WARN_QUARANTINED_FRACTION = 0.25
WARN_BREAKER_FRACTION = 0.5
WARN_BREAKER_MIN_NODES = 1_000
WARN_BREAKER_WINDOW_S = 60.0
WARN_COMMAND_TTL_S = 3_600.0


def config_warnings(settings: Settings) -> list[str]:
    """Settings that are valid but dangerous, one line each as ``path: why`` (empty: none).

    While fleetmedic acts (``safety.dry_run: false``):

    - ``safety.max_quarantined_fraction`` above 0.25 (:data:`WARN_QUARANTINED_FRACTION`): more than a
      quarter of the fleet may be taken out of service, bounded only by ``max_quarantined_count``;
    - a rule of the circuit breaker effectively off: a ``*_fraction`` above 0.5 (it opens only once
      more than half of its nodes are suspect at once) or a ``*_min_nodes`` of 1,000 or more (it never
      opens in a smaller storm), for the fleet-share, one-signature and one-domain rules alike; each
      warning names the rules left on (or says none is), and the fleet-share one says that with
      ``scope: evidence`` nothing then stops all isolation at once; or ``breaker.window_s`` under 60 s
      (suspicions are forgotten before a storm that unfolds over minutes reaches the trip level).

    Always:

    - a zero budget: ``safety.max_quarantined_count``, ``max_quarantined_fraction`` or
      ``max_new_isolations`` of 0 (no node is ever isolated: faults stay in service while the
      decisions look normal; ``dry_run: true`` is the way to observe only), ``max_per_rack`` or
      ``max_per_switch`` of 0 (no node in a labelled rack / behind a labelled leaf is ever isolated);
    - ``signing.command_ttl_s`` above one hour (:data:`WARN_COMMAND_TTL_S`): a signed command stays
      valid, and can be replayed or applied late on stale evidence, that long (the default is 300 s);
    - ``cluster.accept_unlabeled_commands`` with a ``cluster.name``: the executor acts on commands
      that name no cluster, which on a topic clusters share may be any cluster's (meant for the
      switch to a name, then off).
    """
    s = settings.safety
    b = s.breaker
    out: list[str] = []
    if not s.dry_run:
        if s.max_quarantined_fraction > WARN_QUARANTINED_FRACTION:
            out.append(f"safety.max_quarantined_fraction: {s.max_quarantined_fraction:g} with dry_run false lets "
                       f"fleetmedic take up to {s.max_quarantined_fraction:.0%} of the fleet out of service (only "
                       f"max_quarantined_count {s.max_quarantined_count} bounds it; above "
                       f"{WARN_QUARANTINED_FRACTION:g} is dangerous)")
        out += _breaker_rule_warnings(b, s.max_quarantined_count)
        if b.window_s < WARN_BREAKER_WINDOW_S:
            out.append(f"safety.breaker.window_s: {b.window_s:g}s: suspicions are forgotten before a storm that "
                       f"unfolds over minutes reaches the trip level (effectively off; under "
                       f"{WARN_BREAKER_WINDOW_S:g}s is dangerous)")
    never = "no node is ever isolated: faulty nodes stay in service (use dry_run: true to only observe)"
    if s.max_quarantined_count == 0:
        out.append(f"safety.max_quarantined_count: 0: {never}")
    if s.max_quarantined_fraction == 0:
        out.append(f"safety.max_quarantined_fraction: 0: {never}")
    if s.max_new_isolations == 0:
        out.append(f"safety.max_new_isolations: 0: {never}")
    if s.max_per_rack == 0:
        out.append("safety.max_per_rack: 0: no node with a rack label is ever isolated")
    if s.max_per_switch == 0:
        out.append("safety.max_per_switch: 0: no node with a leaf label is ever isolated")
    if settings.signing.command_ttl_s > WARN_COMMAND_TTL_S:
        out.append(f"signing.command_ttl_s: {settings.signing.command_ttl_s:g}s: a signed command stays valid "
                   f"(replayable, or applied late on stale evidence) that long; over {WARN_COMMAND_TTL_S:g}s is "
                   f"dangerous (default 300s)")
    if settings.cluster.name and settings.cluster.accept_unlabeled_commands:
        out.append(f"cluster.accept_unlabeled_commands: true: the executor of {settings.cluster.name!r} also acts on "
                   "commands that name no cluster, which on a topic clusters share may be another cluster's (turn "
                   "it off once every decision stage has its cluster.name)")
    if settings.signing.allow_demo_keys:
        out.append("signing.allow_demo_keys: true: the demo's published keys are accepted; anyone can sign "
                   "commands and operator commands (only the demo may set this)")
    return out


#: the breaker's rules: (name, what it counts, the min_nodes setting, the fraction setting)
BREAKER_RULES: Final = (
    ("fleet-share", "suspect nodes across the fleet", "trip_min_nodes", "trip_suspect_fraction"),
    ("one-signature", "suspect nodes with the same evidence", "signature_min_nodes", "signature_fraction"),
    ("one-domain", "suspect nodes of one rack or leaf", "domain_min_nodes", "domain_fraction"),
)


def _breaker_rule_warnings(b: BreakerSettings, max_count: int) -> list[str]:
    """One warning per breaker rule a setting turns off (its level ``WARN_BREAKER_MIN_NODES`` nodes or
    more, or a fraction above ``WARN_BREAKER_FRACTION``), naming the rules left on: none claims a
    rule that is off still protects."""
    off: dict[str, str] = {}
    for name, counts, min_key, fraction_key in BREAKER_RULES:
        min_nodes, fraction = getattr(b, min_key), getattr(b, fraction_key)
        if min_nodes >= WARN_BREAKER_MIN_NODES:
            off[name] = (f"safety.breaker.{min_key}: {min_nodes}: the {name} rule of the circuit breaker never "
                         f"opens for fewer {counts} at once (effectively off)")
        elif fraction > WARN_BREAKER_FRACTION:
            off[name] = (f"safety.breaker.{fraction_key}: {fraction:g}: the {name} rule of the circuit breaker "
                         f"opens only once more than {WARN_BREAKER_FRACTION:.0%} of its nodes are suspect at once "
                         "(effectively off)")
    on = [name for name, *_ in BREAKER_RULES if name not in off]
    left = (f"; only the {' and the '.join(on)} rule{'s' if len(on) > 1 else ''} can still open it" if on else
            "; no rule can open the breaker: a storm of one cause is isolated up to the budgets")
    out = []
    for name, why in off.items():
        extra = (f"; the budget for distinct evidence follows its level, up to max_quarantined_count {max_count}"
                 + ("; with scope: evidence nothing stops all isolation at once (each tripped signature or "
                    "domain stops only its own)" if b.scope == "evidence" else "")
                 if name == "fleet-share" else "")
        out.append(why + extra + left)
    return out
