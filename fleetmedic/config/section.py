"""The base of every config section and the bounded numbers the sections use."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct

PosFloat = Annotated[float, Meta(gt=0.0, le=1.0e9)]
NonNegFloat = Annotated[float, Meta(ge=0.0, le=1.0e9)]
PosInt = Annotated[int, Meta(ge=1, le=1_000_000_000)]
NonNegInt = Annotated[int, Meta(ge=0, le=1_000_000_000)]
Fraction = Annotated[float, Meta(ge=0.0, le=1.0)]


class Section(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every config section: immutable, unknown keys rejected."""
