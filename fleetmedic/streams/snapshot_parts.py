"""A decision snapshot larger than one Kafka record, written in parts.

The decision stage keeps its state under the key ``engine`` of a compacted topic whose records
must each fit the topic's ``max.message.bytes``. A snapshot that fits is written as it is. One that
does not is cut into parts of ``streams.snapshot_part_bytes``, each under its own key
(``engine.part.<slot>.<i>``), followed by a *manifest* under ``engine``: the slot, the number of
parts, the size and the SHA-256 of the whole. The parts are written before the manifest, so a
reader that goes through the topic in offset order puts each manifest together from the parts it
has seen so far: exactly the ones written for it.

Two slots take turns: the parts of one snapshot never overwrite those of the one before it, so a
writer that dies halfway leaves the previous snapshot whole, even after compaction (which keeps
only the latest value of each key). A manifest whose parts are missing or do not add up to its
hash is *unreadable* and the stage falls back to the snapshot before it, as with a corrupt one.

The value under ``engine`` is a manifest when it starts with :data:`MANIFEST_MAGIC`, else a whole
snapshot (which starts with ``FMSNAP1``, or with a msgpack map header when written without a
checksum).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Final

import msgspec

SNAPSHOT_KEY: Final = b"engine"
PART_PREFIX: Final = b"engine.part."
MANIFEST_MAGIC: Final = b"FMPARTS1\n"


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    slot: int
    parts: int
    size: int
    sha256: str


class SnapshotUnreadable(Exception):
    """A manifest whose parts could not be put together."""


def part_key(slot: int, index: int) -> bytes:
    return PART_PREFIX + f"{slot}.{index}".encode()


def split(value: bytes, part_bytes: int, slot: int) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The ``(key, part)`` records and then the manifest value that store ``value`` in ``slot``."""
    if part_bytes <= 0:
        raise ValueError(f"part_bytes must be positive, not {part_bytes}")
    parts = [(part_key(slot, i), value[start:start + part_bytes])
             for i, start in enumerate(range(0, len(value), part_bytes))]
    manifest = Manifest(slot=slot, parts=len(parts), size=len(value), sha256=hashlib.sha256(value).hexdigest())
    return parts, MANIFEST_MAGIC + msgspec.msgpack.encode(manifest)


def is_manifest(value: bytes) -> bool:
    return value.startswith(MANIFEST_MAGIC)


def decode_manifest(value: bytes) -> Manifest:
    try:
        return msgspec.msgpack.decode(value[len(MANIFEST_MAGIC):], type=Manifest)
    except msgspec.DecodeError as exc:
        raise SnapshotUnreadable(f"manifest: {exc}") from None


def parse_part_key(key: bytes) -> tuple[int, int] | None:
    """``(slot, index)`` of a part's key, or None for any other key."""
    if not key.startswith(PART_PREFIX):
        return None
    slot, _, index = key[len(PART_PREFIX):].partition(b".")
    try:
        return int(slot), int(index)
    except ValueError:
        return None


@dataclass
class SnapshotScan:
    """Goes through the state topic's records in offset order (:meth:`take`) and keeps the latest
    ``keep`` snapshots, each as its bytes or the :class:`SnapshotUnreadable` that says why not."""

    keep: int
    latest: list[tuple[int, bytes | SnapshotUnreadable]] = field(default_factory=list)
    parts: dict[tuple[int, int], bytes] = field(default_factory=dict)  # (slot, index) -> latest part
    manifest_slots: dict[int, int] = field(default_factory=dict)  # offset of a manifest -> its slot

    def take(self, offset: int, key: bytes, value: bytes | None) -> None:
        where = parse_part_key(key)
        if where is not None:
            if value is None:
                self.parts.pop(where, None)
            else:
                self.parts[where] = value
            return
        if key != SNAPSHOT_KEY or value is None:
            return
        item: bytes | SnapshotUnreadable = self.assemble(offset, value) if is_manifest(value) else value
        self.latest.append((offset, item))
        for old, _ in self.latest[:-self.keep]:
            self.manifest_slots.pop(old, None)
        del self.latest[:-self.keep]

    def assemble(self, offset: int, value: bytes) -> bytes | SnapshotUnreadable:
        try:
            m = decode_manifest(value)
        except SnapshotUnreadable as exc:
            return exc
        self.manifest_slots[offset] = m.slot
        missing = [i for i in range(m.parts) if (m.slot, i) not in self.parts]
        if missing:
            return SnapshotUnreadable(f"{len(missing)} of its {m.parts} parts in slot {m.slot} are not on the topic "
                                      f"(first: {missing[0]})")
        whole = b"".join(self.parts[(m.slot, i)] for i in range(m.parts))
        if len(whole) != m.size or hashlib.sha256(whole).hexdigest() != m.sha256:
            return SnapshotUnreadable(f"its {m.parts} parts in slot {m.slot} make {len(whole)} bytes that do not match "
                                      f"its size ({m.size}) and SHA-256")
        return whole

    def newest_first(self) -> list[tuple[int, bytes | SnapshotUnreadable]]:
        return list(reversed(self.latest))

    def slots_in_use(self) -> dict[int, int]:
        """Slot -> the number of part keys seen in it (what a writer must clear or overwrite)."""
        out: dict[int, int] = {}
        for slot, index in self.parts:
            out[slot] = max(out.get(slot, 0), index + 1)
        return out
