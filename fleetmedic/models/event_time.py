"""Event time with a bound: a record stamped too far ahead of the clock is refused.

The stages run on event time: the decision stage's clock is the newest record time seen, command
expiry is counted from it, stage 1's baselines and windows take each sample's time as given. One
record stamped in 2096 would otherwise move all of it to 2096 for good (every later sample looks
late, every command expires in 2096). So every stage refuses, and dead-letters, a record whose
time lies more than ``streams.max_future_skew_s`` ahead of its clock; it then changes nothing.

"The clock" is the caller's: the Kafka stages pass :func:`reference_clock` of their wall clock and
the record's broker timestamp, the embedded engine the simulation's ``now``. Pure: no clock is
read here.
"""

from __future__ import annotations

from fleetmedic.records import DetectionTelemetry, OperatorCommand, RemediationCommand


def event_time(record: object) -> float:
    """The latest time ``record`` carries that a stage takes as event time: a GPU sample's ``ts``
    and its XIDs' times, a command's ``issued_at``, any other record's ``ts`` (0.0 if none)."""
    if isinstance(record, DetectionTelemetry):
        ts = record.ts
        for x in record.xids:
            ts = max(ts, x.ts)
        return ts
    if isinstance(record, OperatorCommand | RemediationCommand):
        return record.issued_at
    ts = getattr(record, "ts", 0.0)
    return float(ts) if isinstance(ts, int | float) else 0.0


def reference_clock(wall: float, broker_ts_ms: int | None) -> float:
    """The clock a consumed record is judged against: the wall clock, or the record's Kafka
    timestamp when that is earlier. A replay then judges a record as the live run did (its broker
    timestamp has not moved while the wall clock has), whatever the time of the replay."""
    if broker_ts_ms is None or broker_ts_ms <= 0:
        return wall
    return min(wall, broker_ts_ms / 1000.0)


def ahead_of_clock(ts: float, clock: float, max_skew_s: float) -> str | None:
    """Why a record of event time ``ts`` is refused at ``clock``, or None when it may be handled."""
    if ts <= clock + max_skew_s:
        return None
    return (f"event time {ts:.3f} is {ts - clock:.0f}s ahead of the clock ({clock:.3f}), more than "
            f"streams.max_future_skew_s ({max_skew_s:g}s): refused, it moves no clock")


def refuse_future(record: object, clock: float, max_skew_s: float) -> str | None:
    """:func:`ahead_of_clock` of ``record``'s :func:`event_time`."""
    return ahead_of_clock(event_time(record), clock, max_skew_s)
