"""The multivariate model's persisted form: plain arrays in msgpack, no pickle, no code.

:class:`ModelPart` holds what :class:`~fleetmedic.models.multivariate.MultivariateModel` needs to
be restored for the windows of some nodes; the helpers pack rows (window time, node, features)
into arrays and back, and keep the newest rows in a canonical order (time, node), so that rows
split by node and merged again come out the same.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
import numpy as np
from numpy.typing import NDArray


class ModelPart(msgspec.Struct, kw_only=True, array_like=True):
    """What a model needs to be restored, for the windows of some nodes: plain arrays, no code.

    ``trained_*``: the rows of the last fit; ``pending_*``: rows learned since. Each row is a
    window's time (float64), its node (uint32 index into ``nodes``) and its features (float32,
    row-major: the model learns them rounded to float32, so they restore exactly); 44 bytes."""

    format: int
    features: list[str]
    version: int
    trained_on: int
    fitted_at: float
    nodes: list[str]
    trained_ts: bytes
    trained_node: bytes
    trained_x: bytes
    pending_ts: bytes
    pending_node: bytes
    pending_x: bytes
    # robust_covariance's fit itself (float64): loaded as it is, no refit (a MinCovDet fit of 20,000
    # rows takes seconds); isolation_forest's trees are refitted from the trained rows (~1 s)
    ref: bytes = b""
    spread: bytes = b""
    location: bytes = b""
    precision: bytes = b""


PART_FORMAT = 1
decode_part = msgspec.msgpack.Decoder(ModelPart).decode
Row = tuple[float, str, NDArray[np.float64]]  # (window time, node, features)


def _key(row: Row) -> tuple[float, str]:
    return row[0], row[1]


def newest(rows: Iterable[Row], cap: int) -> list[Row]:
    """The ``cap`` newest rows in canonical order (time, node): the same set however they were split."""
    ordered = sorted(rows, key=_key)
    return ordered[-cap:] if cap else []


def pack_rows(rows: list[Row], index: dict[str, int], width: int) -> tuple[bytes, bytes, bytes]:
    """Rows as three arrays' bytes (times, node indices into ``index``, features); adds to ``index``."""
    ts = np.array([row[0] for row in rows], dtype="<f8")
    node = np.array([index.setdefault(row[1], len(index)) for row in rows], dtype="<u4")
    x = np.array([row[2] for row in rows], dtype="<f4").reshape(len(rows), width)
    return ts.tobytes(), node.tobytes(), x.tobytes()


def raw(a: NDArray[np.float64] | None) -> bytes:
    return b"" if a is None else np.ascontiguousarray(a, dtype="<f8").tobytes()


def array_of(data: bytes, size: int) -> NDArray[np.float64]:
    a = np.frombuffer(data, dtype="<f8")
    if len(a) != size:
        raise ValueError(f"model part: a fitted array of {len(a)} values, not {size}")
    return a.astype(np.float64)


def unpack_rows(ts: bytes, node: bytes, x: bytes, nodes: list[str], width: int) -> list[Row]:
    """What :func:`pack_rows` wrote; ValueError if the arrays do not fit together."""
    t = np.frombuffer(ts, dtype="<f8")
    n = np.frombuffer(node, dtype="<u4")
    v = np.frombuffer(x, dtype="<f4")
    if len(n) != len(t) or len(v) != len(t) * width:
        raise ValueError(f"model part: {len(t)} times, {len(n)} nodes, {len(v)} values: inconsistent")
    if len(n) and int(n.max()) >= len(nodes):
        raise ValueError(f"model part: node index {int(n.max())} beyond its {len(nodes)} node names")
    vals = v.reshape(len(t), width).astype(np.float64)
    return [(float(t[i]), nodes[int(n[i])], vals[i]) for i in range(len(t))]


