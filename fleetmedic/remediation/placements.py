"""A job's placement read as a change of the one read before it.

A lock-step job of thousands of ranks is placed again and again with a node or two swapped (its pods
go back where they ran but for the nodes excluded since). What differs is found in one pass over
the two lists, at the speed of a C loop; the readers (triage's job board, the nodes seen, the
engine's placed nodes) then update what they derived from the last placement instead of deriving it
again from every rank. Pure."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from itertools import compress, count, islice
from operator import is_not, ne
from typing import Final, TypeVar

T = TypeVar("T")

#: the most positions that may differ for a placement to be read as a change (beyond, read whole)
MOST_CHANGED: Final = 64


def changed_at(before: Sequence[T], after: Sequence[T], most: int = MOST_CHANGED) -> list[int] | None:
    """The positions where ``after`` differs from ``before``, in order; None when their lengths
    differ or more than ``most`` positions do (the caller reads ``after`` whole)."""
    if len(before) != len(after):
        return None
    # the records kept are most often the same objects: the positions where they are not, looked at
    # one by one, are a few; otherwise every position is compared
    found = list(islice(compress(count(), map(is_not, before, after)), most + 1))
    if len(found) <= most:
        return [i for i in found if before[i] != after[i]]
    found = list(islice(compress(count(), map(ne, before, after)), most + 1))
    return found if len(found) <= most else None


def swapped(before: Sequence[T], after: Sequence[T], at: Sequence[int], members: AbstractSet[T]
            ) -> tuple[set[T], set[T]] | None:
    """For ``before``, a list of distinct values (``members``, their set), and ``after``, which
    differs from it at ``at``: the values ``after`` no longer has and those it gained. None when
    ``after``'s values are not distinct (one at a changed position is repeated there or stays at a
    position that did not change): the caller reads it whole."""
    old = {before[i] for i in at}
    new = [after[i] for i in at]
    fresh = set(new)
    gained = fresh - old
    if len(fresh) != len(new) or any(v in members for v in gained):
        return None
    return old - fresh, gained


def among(ordered: Sequence[str], name: str) -> bool:
    """Whether ``name`` is in ``ordered`` (sorted): a bisection, not a walk over it."""
    i = bisect_left(ordered, name)
    return i < len(ordered) and ordered[i] == name
