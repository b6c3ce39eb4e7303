"""Pure part of ``fleetmedic exporter remote-write`` (the HTTP server is
:mod:`fleetmedic.connectors.remote_write.server`, the wire format
:mod:`fleetmedic.connectors.remote_write.codec`): a Prometheus remote-write 1.0 request's series ->
samples -> records, with the mapping of :mod:`fleetmedic.connectors.prometheus.text`.

- **Messages** (:mod:`fleetmedic.connectors.remote_write.codec`: headers, snappy, protobuf):
  Prometheus writes one sample per series, after its
  labels (the queue manager's layout); such a series is its label bytes followed by one
  ``samples`` entry, and when those label bytes are a label set already read, the sample is
  decoded from the tail alone (:func:`~fleetmedic.connectors.remote_write.codec.tail_sample`: a
  double and a varint, strictly in that layout) and the labels are the cached ones. Any other
  series (first seen, several samples, another layout) is parsed whole with ``TimeSeries.labels``
  declared as ``bytes``: its label set is a tuple of byte strings that a :class:`LabelCache` maps
  to its decoded labels (and whose label bytes it then remembers when they were exactly the
  series' labels), so the label sets a sender repeats every request are decoded (and their UTF-8
  checked) once. Both ways give the same samples: protobuf reads a message's bytes as the
  concatenation of its fields.
- **Samples**: a series whose ``__name__`` fleetmedic reads
  (:func:`~fleetmedic.connectors.prometheus.text.known_name`, so OpenMetrics ``_total`` names too)
  gives samples (:func:`read_request`, :func:`write_request_samples` in the form of the exposition
  reader's parser); other series are counted as ignored. Prometheus's staleness markers (a NaN of
  its own bit pattern, written when a series disappears) are counted apart and dropped; other NaNs,
  infinities, label values over :data:`~fleetmedic.connectors.prometheus.text.MAX_LABEL_VALUE_CHARS`
  and out-of-range timestamps are skipped and counted per reason. So are the samples of a series
  fleetmedic reads whose labels a record cannot carry: a label name given twice (never "the last
  one wins"), a control character (NUL, C0, DEL, C1) in a label name or value, a node longer than
  a record's ``node`` (:data:`NODE_NAME_MAX`) or a port longer than a record's port name.
- **Assembly** (:class:`Assembler`): Prometheus spreads the series of one scrape over several
  requests (queues are sharded by series, batches cut at ``max_samples_per_send``), so the samples
  are held per node (its GPU series apart from its port series) and scrape time (within the
  reader's ``group_tolerance_ms`` of the scrape's first sample, the grouping of
  :meth:`ExpositionReader.read_samples
  <fleetmedic.connectors.prometheus.text.ExpositionReader.read_samples>`), and released
  ``assemble_s`` after the first of them arrived; the released scrapes become records through the
  reader's own record making (``_flush``: range checks, DCGM blanks, XIDs, link states), with the
  mapping every other Prometheus path uses (``ExpositionReader._series``: node from
  ``node_labels``, GPU from ``ingest.gpu_label``...). :meth:`Assembler.take` does it in one pass
  per request: what a label set says (series, node, GPU, target field) is worked out once and kept
  on its :class:`LabelCache` entry, so a sample of a known series is its tail decoded, one lookup
  of its label bytes and its value put into its node's open scrape (that commonest case is a C
  loop, :mod:`fleetmedic.connectors.remote_write._remote_write`, where the package was built with a C compiler;
  the Python loop does the same, slower, with equal results). Series the reader cannot map
  (no node label, a GPU label that is not an index) are skipped and counted when they arrive.
  A sample of a scrape already released (a retry of a request whose answer was lost, a WAL replay,
  a shard later than ``assemble_s``) is dropped and counted: a node never gets a second, partial
  record for a scrape time.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from itertools import repeat
from typing import Any, Final, get_args

from fleetmedic.connectors.prometheus.text import (
    MAX_LABEL_VALUE_CHARS,
    SECONDS_AS_MS_HIGH,
    SECONDS_AS_MS_LOW,
    SECONDS_AS_MS_REASON,
    TS_MAX,
    TS_MIN,
    ExpositionReader,
    Sample,
    _Group,
    _Series,
    count,
    known_name,
)
from fleetmedic.connectors.remote_write.codec import (
    VALUED_HEAD,
    VALUED_TAIL,
    ZERO_HEAD,
    BadRequest,
    Label,
    RawTimeSeries,
    is_stale_marker,
    tail_sample,
)
from fleetmedic.records import GpuTelemetry, Name, NodeName, PortTelemetry

_HoldInline = Callable[[Iterator[bytes], dict[bytes, Any], dict[bytes, float]], tuple[bytes | None, int, int, int]]
_native_hold_inline: _HoldInline | None
try:  # _read's commonest case in C (_remote_write.c), built with the package where a C compiler is found
    from fleetmedic.connectors.remote_write._remote_write import hold_inline as _native_hold_inline
except ImportError:  # pragma: no cover - the Python loop does the same, slower
    _native_hold_inline = None

#: characters no label of a series fleetmedic reads may hold: C0 and C1 controls, DEL
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: the longest node (a record's ``node`` or ``device``) and port (``PortSample.port``) a record takes
NODE_NAME_MAX: Final[int] = get_args(NodeName)[1].max_length
PORT_NAME_MAX: Final[int] = get_args(Name)[1].max_length


@dataclass
class SampleCounts:
    """What :func:`read_request` / :meth:`Assembler.take` made of a request's samples."""

    read: int = 0  # samples of series fleetmedic reads, passed on
    ignored: int = 0  # samples of series fleetmedic does not read
    stale: int = 0  # staleness markers
    skipped: int = 0  # bad samples (reasons in the reader's ``skipped``)


class _LabelSet:
    """One label set of a :class:`LabelCache`: the series fleetmedic reads (None: not one), its
    labels without ``__name__`` and why its samples cannot be used ("" when they can). Once an
    :class:`Assembler` (``owner``) has held one of its samples, also what it resolved: the reader's
    :class:`~fleetmedic.connectors.prometheus.text._Series` (node, GPU, target field...), the
    :class:`_Node` its samples are held under (None: the reader cannot map the series, e.g. it has
    no node label) and, for a plain GPU series, ``(index, target field, uuid key, uuid)`` (the
    uuid only where the series of its GPU disagree on it: :attr:`_Node.uuids`)."""

    __slots__ = ("gpu", "labels", "name", "node", "owner", "problem", "series", "usable")

    def __init__(self, name: str | None, labels: dict[str, str], problem: str) -> None:
        self.name = name
        self.labels = labels
        self.problem = problem
        self.usable = name is not None and not problem  # its finite, in-range samples are read
        self.owner: Assembler | None = None
        self.series: _Series | None = None
        self.node: _Node | None = None
        self.gpu: tuple[int, str, str, str] | None = None

    def forget(self) -> None:
        self.owner = self.series = self.node = self.gpu = None


class LabelCache:
    """Encoded label sets -> :class:`_LabelSet`. The labels dict of a set is the same object every
    time it is seen. Cleared when ``max_entries`` or ``max_bytes`` (of encoded labels) are reached.
    ``owner``: the :class:`Assembler` whose resolutions its sets hold."""

    def __init__(self, max_entries: int = 1_000_000, max_bytes: int = 768 << 20) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.clears = 0  # how often a limit was reached (a receiver's cache too small for its senders)
        self.owner: Assembler | None = None
        self._sets: dict[tuple[bytes, ...], _LabelSet] = {}
        #: a series' encoded labels (the bytes before its samples, containing nothing else) -> its set
        self._prefixes: dict[bytes, _LabelSet] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._sets)

    def get(self, key: tuple[bytes, ...]) -> _LabelSet:
        hit = self._sets.get(key)
        if hit is None:
            hit = self._decode(key)
            size = sum(map(len, key))
            if len(self._sets) >= self.max_entries or self._bytes + size > self.max_bytes:
                self._clear()
            self._sets[key] = hit
            self._bytes += size
        return hit

    def remember_prefix(self, prefix: bytes, hit: _LabelSet) -> None:
        """``prefix``: the encoded labels of a series whose label set is ``hit`` (checked by the
        caller: parsed, it holds those labels and no sample). An empty one (no labels, so no
        name: not a series fleetmedic reads) is not kept."""
        if not prefix:
            return
        if len(self._prefixes) >= self.max_entries or self._bytes + len(prefix) > self.max_bytes:
            self._clear()
        self._prefixes[prefix] = hit
        self._bytes += len(prefix)

    def adopt(self, owner: Assembler) -> None:
        """From now on ``owner`` resolves the sets (those another one resolved are forgotten)."""
        if self.owner is not None:
            for hit in self._sets.values():
                hit.forget()
        self.owner = owner

    def _clear(self) -> None:
        self.clears += 1
        self._sets.clear()
        self._prefixes.clear()
        self._bytes = 0

    @staticmethod
    def _decode(key: tuple[bytes, ...]) -> _LabelSet:
        from google.protobuf.message import DecodeError

        label = Label()
        name = ""
        labels: dict[str, str] = {}
        duplicate = control = False
        for encoded in key:
            try:
                label.ParseFromString(encoded)
            except DecodeError as exc:
                raise BadRequest("protobuf", f"a label is not a prometheus.Label: {str(exc)[:200]}") from None
            if label.name == "__name__":
                duplicate |= bool(name)
                name = label.value
            else:
                duplicate |= label.name in labels
                labels[label.name] = label.value
            control = control or bool(_CONTROL.search(label.name) or _CONTROL.search(label.value))
            label.Clear()
        known = known_name(name)
        if known is None:
            return _LabelSet(None, labels, "")
        too_long = next((k for k, v in labels.items() if len(v) > MAX_LABEL_VALUE_CHARS), None)
        problem = (f"{known}: a label name or value has a control character" if control
                   else f"{known}: duplicate label name" if duplicate
                   else f"{known}: label {too_long[:64]} longer than {MAX_LABEL_VALUE_CHARS} characters"
                   if too_long is not None else "")
        return _LabelSet(known, labels, problem)



def _parse_series(raw: bytes, cache: LabelCache, tail: tuple[int, float, int] | None
                  ) -> tuple[_LabelSet, list[tuple[float, int]]]:
    """A series parsed whole: its label set and its (value, ms) samples; remembers its label bytes
    when ``tail`` split it into exactly its labels and one sample."""
    from google.protobuf.message import DecodeError

    series = RawTimeSeries()
    try:
        series.ParseFromString(raw)
    except DecodeError as exc:
        raise BadRequest("protobuf", f"a series is not a prometheus.TimeSeries: {str(exc)[:200]}") from None
    key = tuple(series.labels)
    hit = cache.get(key)
    if tail is not None and len(series.samples) == 1:
        head = RawTimeSeries()
        try:
            head.ParseFromString(raw[:tail[0]])
        except DecodeError:
            head = None
        if head is not None and not head.samples and tuple(head.labels) == key:
            cache.remember_prefix(raw[:tail[0]], hit)
    return hit, [(point.value, point.timestamp) for point in series.samples]


@dataclass(slots=True)
class Points:
    """Samples of series fleetmedic reads, column by column: label set, value, timestamp (Unix
    seconds); ``cache``: the :class:`LabelCache` the label sets are from (None: none)."""

    sets: list[_LabelSet] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    cache: LabelCache | None = None

    def __len__(self) -> int:
        return len(self.sets)

    def samples(self) -> Iterator[Sample]:
        """As the exposition reader's parser yields them: (name, labels, value, seconds)."""
        for labels, value, ts in zip(self.sets, self.values, self.times, strict=True):
            assert labels.name is not None
            yield labels.name, labels.labels, value, ts


def _read(request: Any, skipped: Counter[str], counts: SampleCounts, cache: LabelCache,
          into: Assembler | None, out: Points) -> int:
    """Reads the series of a (:func:`~.codec.decode_request`) WriteRequest (see the
    module docstring): the samples of series fleetmedic reads are held by ``into`` or, without one,
    collected in ``out``; the others are counted. Returns how many were read (with ``into``: how
    many it took; the others were late or of series the reader cannot map). A series or label that
    cannot be read (not UTF-8...) raises :class:`~.codec.BadRequest`."""
    prefixes = cache._prefixes.get
    #: ``0x10`` + a 6-byte timestamp varint (2004-2109 in ms) -> seconds, for those decoded in this
    #: request (so checked: in range, and a whole varint)
    stamps: dict[bytes, float] = {}
    stamps_get = stamps.get
    varints: dict[bytes, int] = {}  # for tail_sample
    valued_tail = VALUED_TAIL.unpack_from
    hold = into._hold if into is not None else None
    now = into.clock() if into is not None else 0.0
    add_set, add_value, add_time = out.sets.append, out.values.append, out.times.append
    read = ignored = held = late = other = 0  # other: series not held inline
    value = ts = 0.0
    series: Iterable[bytes] = request.timeseries
    native = [0, 0]  # late, ignored: of the series held in C
    if hold is not None and _native_hold_inline is not None:  # the inline case in C, the rest below
        series = _leftovers(_native_hold_inline, iter(series), cache._prefixes, stamps, native)
    for raw in series:
        # the commonest layout first, inline: the label bytes of a label set seen before, then one
        # sample after a value (``0x12 16 0x09 double 0x10 varint``) or none (``0x12 7 0x10 varint``:
        # 0.0), its timestamp one already read in this request. Anything else goes below
        hit = None
        if raw[-16:-15] == b"\x09":
            hit = prefixes(raw[:-18])
            if hit is not None:
                head, value, tail = valued_tail(raw, -18)  # a hit: raw[:-18] is not empty
                ts = stamps_get(tail)  # type: ignore[assignment]
                if ts is None or head != VALUED_HEAD:
                    hit = None
        if hit is None and raw[-9:-7] == ZERO_HEAD:
            hit = prefixes(raw[:-9])
            if hit is not None:
                value, ts = 0.0, stamps_get(raw[-7:])  # type: ignore[assignment]
                if ts is None:
                    hit = None
        if hit is not None:
            node = hit.node  # set once ``into`` resolved the set: fleetmedic reads it and the reader maps it
            if node is not None and node.ts == ts and value - value == 0.0 and hit.gpu is not None \
                    and hold is not None:  # _hold's commonest case (finite value, its node's current scrape), inline
                rows = node.rows
                if rows is None:  # that scrape was released: late
                    late += 1
                    continue
                index, target, uuid_key, uuid = hit.gpu
                row = rows.get(index)
                if row is not None:
                    row[target] = value
                    if uuid:  # only where the series of this GPU disagree on its UUID
                        node.meta[uuid_key] = uuid  # type: ignore[index]
                    continue
            other += 1
            if hit.name is None:
                ignored += 1
                continue
            points: list[tuple[float, float]] = [(value, ts)]
        else:
            other += 1
            one = tail_sample(raw, varints)
            if one is not None:
                start, value0, ms = one
                hit = prefixes(raw[:start])
                seconds = ms / 1000.0
                if len(raw) - start in (9, 18) and TS_MIN <= seconds <= TS_MAX:  # a 6-byte varint
                    stamps[raw[-7:]] = seconds
                ms_points = [(value0, ms)]
            if hit is None:
                hit, ms_points = _parse_series(raw, cache, one)
            points = [(v, ms / 1000.0) for v, ms in ms_points]
        if hit.name is None:
            ignored += len(points)
            continue
        if hit.problem:
            count(skipped, hit.problem, len(points))
            counts.skipped += len(points)
            continue
        known = hit.name
        for value, ts in points:
            # in range, and not a time in seconds read as milliseconds (January 1970)
            if value - value == 0.0 and (SECONDS_AS_MS_HIGH < ts <= TS_MAX or TS_MIN <= ts < SECONDS_AS_MS_LOW):
                read += 1
                if hold is None:
                    add_set(hit)
                    add_value(value)
                    add_time(ts)
                elif hold(hit, value, ts, now):
                    held += 1
            elif value - value != 0.0:
                if value != value and is_stale_marker(value):
                    counts.stale += 1
                    continue
                count(skipped, f"{known}: value is {'NaN' if math.isnan(value) else 'infinite'}")
                counts.skipped += 1
            else:
                seconds = SECONDS_AS_MS_LOW <= ts <= SECONDS_AS_MS_HIGH
                why = SECONDS_AS_MS_REASON if seconds else "timestamp out of range"
                count(skipped, f"{known}: {why}")
                counts.skipped += 1
    other += native[1]
    ignored += native[1]
    inline = len(request.timeseries) - other  # samples held inline (or late)
    late += native[0]
    counts.ignored += ignored
    counts.read += read + inline
    if into is not None:
        into.late += late
        held += inline - late
        into.pending += held
        return held
    return read


def _leftovers(hold_inline: _HoldInline, series: Iterator[bytes], prefixes: dict[bytes, Any],
               stamps: dict[bytes, float], counted: list[int]) -> Iterator[bytes]:
    """The series ``hold_inline`` (:mod:`fleetmedic.connectors.remote_write._remote_write`) hands back: those
    that are not ``_read``'s inline case; the late and ignored series it counted are added to
    ``counted``."""
    while True:
        raw, _, late, ignored = hold_inline(series, prefixes, stamps)
        counted[0] += late
        counted[1] += ignored
        if raw is None:
            return
        yield raw


def read_request(request: Any, skipped: Counter[str], counts: SampleCounts, cache: LabelCache | None = None
                 ) -> Points:
    """The samples of a (:func:`~.codec.decode_request`) WriteRequest's series
    fleetmedic reads; the rest counted (see the module docstring)."""
    cache = LabelCache() if cache is None else cache
    out = Points(cache=cache)
    _read(request, skipped, counts, cache, None, out)
    return out


def write_request_samples(request: Any, skipped: Counter[str], counts: SampleCounts,
                          cache: LabelCache | None = None) -> Iterator[Sample]:
    """:func:`read_request` as samples (labels without ``__name__``, one dict per label set;
    timestamps in seconds), the form of the exposition reader's parser."""
    return read_request(request, skipped, counts, cache).samples()


# --- assembly -------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Scrape(_Group):
    """One node's samples of one scrape (its GPU or its port series) held so far."""

    arrived: float = 0.0  # when the first arrived (monotonic): released ``assemble_s`` later
    newest: float = 0.0  # the newest sample's timestamp

    def size(self) -> int:
        """The values held."""
        return sum(map(len, self.gpu.values())) + sum(map(len, self.xid_counts.values())) \
            + sum(map(len, self.ports.values()))


_NodeKey = tuple[str, bool]  # (node, GPU series)
_UNSEEN: Final = object()


@dataclass(slots=True, eq=False)
class _Node:
    """What is held of one node's GPU (or port) series: its open scrapes, the newest time released,
    and the scrape its last sample went to (``ts``; None: none yet, or forgotten at a release)."""

    key: _NodeKey
    scrapes: list[_Scrape] = field(default_factory=list)  # open, oldest first
    released: float = -math.inf  # the newest timestamp released: samples up to it (+ tolerance) are late
    ts: float | None = None  # the last sample's timestamp, then its scrape (None: it was late)
    scrape: _Scrape | None = None
    rows: dict[int, dict[str, float]] | None = None  # the scrape's ``gpu`` and ``meta``
    meta: dict[str, str] | None = None
    #: GPU index -> the UUID all its series have (then it is written once, when the GPU's row is
    #: made), None when they disagree (then it is written with each value: the last one wins)
    uuids: dict[int, str | None] = field(default_factory=dict)
    dead: bool = False  # forgotten (``max_targets``): a label set pointing here looks its node up again

    def settle(self) -> None:
        """Forgets the scrape its last sample went to."""
        self.ts = self.scrape = self.rows = self.meta = None


@dataclass
class Assembler:
    """Holds samples per node and scrape until the whole scrape is likely in (see the module
    docstring); ``clock`` is monotonic seconds."""

    reader: ExpositionReader
    assemble_s: float
    max_pending: int
    max_targets: int = 100_000
    clock: Callable[[], float] = time.monotonic
    pending: int = 0
    #: samples dropped because their scrape was already released
    late: int = 0
    _nodes: dict[_NodeKey, _Node] = field(default_factory=dict)
    _open: dict[_NodeKey, _Node] = field(default_factory=dict)  # those holding scrapes, in first-held order
    _released: OrderedDict[_NodeKey, None] = field(default_factory=OrderedDict)  # most recently released last

    def room_for(self, n: int) -> bool:
        return self.pending + n <= self.max_pending

    def take(self, request: Any, skipped: Counter[str], counts: SampleCounts, cache: LabelCache) -> int | None:
        """Reads a (:func:`~.codec.decode_request`) WriteRequest and holds its samples;
        returns how many were taken (the others were late, or of series the reader cannot map), or
        None when they would take the samples held past ``max_pending`` (nothing is held). A request
        with room for as many samples as it has series (Prometheus writes one sample per series) is
        read and held in one pass; otherwise it is read, then held if its samples fit (a sender
        writing several samples per series can take the samples held past ``max_pending`` by those
        of one request)."""
        if cache.owner is not self:
            cache.adopt(self)
        if self.room_for(len(request.timeseries)):
            return _read(request, skipped, counts, cache, self, Points())
        points = read_request(request, skipped, counts, cache)
        return self.add(points) if self.room_for(len(points)) else None

    def add(self, points: Points | Iterable[Sample]) -> int:
        """Hold ``points`` (:func:`read_request`'s, or samples); returns how many were taken (the
        others were late, counted in :attr:`late`, or of a series the reader cannot map, e.g.
        without a node label, counted in the reader's ``skipped``)."""
        if not isinstance(points, Points):
            points = _points_of(points)
        elif points.cache is not None and points.cache.owner is not self:
            points.cache.adopt(self)
        now = self.clock()
        hold = self._hold
        taken = sum(map(hold, points.sets, points.values, points.times, repeat(now)))
        self.pending += taken
        return taken

    def _hold(self, labels: _LabelSet, value: float, ts: float, now: float) -> bool:
        """Holds one sample in its node's scrape (True), or counts it: late, or of a series the
        reader cannot map (False)."""
        if labels.owner is not self:
            self._resolve(labels)
        node = labels.node
        if node is None:
            assert labels.series is not None
            count(self.reader.skipped, labels.series.problem)
            return False
        if node.dead:
            self._resolve(labels)
            node = labels.node
            assert node is not None
        if ts != node.ts:
            self._place(node, labels, ts, now)
        scrape = node.scrape
        if scrape is None:
            self.late += 1
            return False
        if labels.gpu is not None:  # _put's GPU branch
            assert labels.series is not None
            index, target, uuid_key, _ = labels.gpu
            scrape.gpu[index][target] = value
            if labels.series.uuid:
                scrape.meta[uuid_key] = labels.series.uuid
        else:
            assert labels.series is not None
            self.reader._put(scrape, labels.series, value)
        return True

    def _resolve(self, labels: _LabelSet) -> None:
        """What ``labels`` says to the reader, and the node its samples are held under."""
        assert labels.name is not None
        series = self.reader._series(labels.name, labels.labels)
        if not series.problem and len(series.node) > NODE_NAME_MAX:
            series = replace(series, problem=f"{series.name}: node label longer than {NODE_NAME_MAX} characters")
        elif not series.problem and series.index < 0 and len(series.port) > PORT_NAME_MAX:
            series = replace(series, problem=f"{series.name}: port labels longer than {PORT_NAME_MAX} characters")
        labels.series = series
        labels.owner = self
        if series.problem:
            labels.node = labels.gpu = None
            return
        key = (series.node, series.index >= 0)
        node = self._nodes.get(key)
        if node is None:
            node = self._nodes[key] = _Node(key)
        labels.gpu = None
        if series.index >= 0:
            index = series.index
            seen = node.uuids.get(index, _UNSEEN)
            if seen is _UNSEEN:
                node.uuids[index] = series.uuid
            elif seen is not None and seen != series.uuid:  # the series of this GPU disagree on its UUID
                node.uuids[index] = None
                node = self._renew(node)
            if series.xid < 0:  # the UUID is written with each value only where they disagree
                labels.gpu = (index, series.target, f"uuid{index}", "" if node.uuids[index] is not None
                              else series.uuid)
        labels.node = node

    def _renew(self, node: _Node) -> _Node:
        """A new :class:`_Node` in place of ``node`` (with what it holds), which is marked dead:
        the label sets resolved to it resolve again (so that they take what changed)."""
        new = _Node(node.key, scrapes=node.scrapes, released=node.released, uuids=node.uuids)
        node.settle()
        node.dead = True
        self._nodes[node.key] = new
        if node.key in self._open:
            self._open[node.key] = new
        return new

    def _place(self, node: _Node, labels: _LabelSet, ts: float, now: float) -> None:
        """Points ``node`` at the open scrape a sample at ``ts`` joins (one within the reader's
        tolerance of its first sample, the newest first, as the reader groups), at a new one, or
        at none (late)."""
        node.settle()
        node.ts = ts
        tol = max(0.0, self.reader.group_tolerance_s)
        if ts <= node.released + tol:
            return
        for scrape in reversed(node.scrapes):
            if abs(ts - scrape.anchor) <= tol:
                if ts < scrape.ts:
                    scrape.ts = ts
                if ts > scrape.newest:
                    scrape.newest = ts
                break
        else:
            scrape = _Scrape(anchor=ts, ts=ts, arrived=now, newest=ts)
            series = labels.series
            assert series is not None
            if series.index >= 0:  # the first GPU series of a scrape gives the record's sku and driver
                scrape.meta["sku"], scrape.meta["driver"] = series.sku, series.driver
            if not node.scrapes:
                self._open[node.key] = node
            node.scrapes.append(scrape)
        node.scrape, node.rows, node.meta = scrape, scrape.gpu, scrape.meta

    def release(self, everything: bool = False) -> dict[_NodeKey, list[_Scrape]]:
        """The scrapes held for ``assemble_s`` (all with ``everything``), per node; their nodes are
        marked released up to their newest timestamp."""
        cutoff = math.inf if everything else self.clock() - self.assemble_s
        due: dict[_NodeKey, list[_Scrape]] = {}
        for key, node in list(self._open.items()):
            scrapes = node.scrapes
            k = 0
            while k < len(scrapes) and scrapes[k].arrived <= cutoff:  # oldest first: the due ones lead
                k += 1
            if not k:
                continue
            node.settle()
            due[key], node.scrapes = scrapes[:k], scrapes[k:]
            if not node.scrapes:
                del self._open[key]
            node.released = max(node.released, max(s.newest for s in due[key]))
            self._released.pop(key, None)
            self._released[key] = None
        if due:  # the values held now (a sample that replaced one of its series' counted once)
            self.pending = sum(s.size() for node in self._open.values() for s in node.scrapes)
        while len(self._released) > self.max_targets:
            key, _ = self._released.popitem(last=False)
            node = self._nodes[key]
            node.released = -math.inf
            node.settle()
            if not node.scrapes:
                del self._nodes[key]
                node.dead = True
        return due

    def records(self, everything: bool = False) -> list[GpuTelemetry | PortTelemetry]:
        """The records of the released scrapes, made by the reader."""
        due = self.release(everything)
        return list(self.reader._flush(due, before=math.inf)) if due else []  # type: ignore[arg-type]


def _points_of(samples: Iterable[Sample]) -> Points:
    """Samples (the exposition reader's form) as :class:`Points`: one label set per series."""
    out = Points()
    sets: dict[tuple[str, int], _LabelSet] = {}  # each holds its labels: their id is not reused meanwhile
    for name, labels, value, ts in samples:
        hit = sets.get((name, id(labels)))
        if hit is None:
            hit = sets[(name, id(labels))] = _LabelSet(known_name(name), labels, "")
        assert ts is not None and hit.usable
        out.sets.append(hit)
        out.values.append(value)
        out.times.append(ts)
    return out


# --- the listen address -----------------------------------------------------------------------------

_LISTEN = re.compile(r"^(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d{1,5})$")


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``; an empty host: every interface) -> (host, port). Raises
    ValueError naming the option."""
    m = _LISTEN.match(text.strip())
    port = int(m.group("port")) if m else -1
    if m is None or not 0 <= port <= 65535:
        raise ValueError(f"--listen / exporters.remote_write.listen: expected HOST:PORT, e.g. 0.0.0.0:9201 "
                         f"(got {text[:100]!r})")
    return (m.group("v6") or m.group("host") or "0.0.0.0"), port
