"""Pure part of ``fleetmedic exporter remote-write`` (the HTTP server is
:mod:`fleetmedic.connectors.remote_write_server`): a Prometheus remote-write 1.0 request -> samples
-> records, with the mapping of :mod:`fleetmedic.connectors.prometheus_text`.

- **The request** (:func:`decode_request`): ``POST`` with ``Content-Type: application/x-protobuf``
  (a ``proto=`` parameter, when given, must name ``prometheus.WriteRequest``), ``Content-Encoding:
  snappy`` and a snappy *block* (not framed) of a ``prometheus.WriteRequest`` protobuf
  (prompb/remote.proto, prompb/types.proto in the Prometheus repository). The length the snappy
  block announces is checked against the limit before anything is decompressed. Anything else
  raises :class:`BadRequest`: the server answers 400 (415 for a remote-write 2.0 message), which
  the sender must not retry.
- **Messages** are read with the ``protobuf`` runtime from descriptors built here at import (the
  four messages and fields read: ``WriteRequest.timeseries``, ``TimeSeries.labels/samples``,
  ``Label``, ``Sample``); unknown fields (metadata, exemplars, native histograms) are skipped by
  the parser. No generated code, so no protoc and no generated-code/runtime version pairing.
  A request is parsed with ``WriteRequest.timeseries`` declared as ``bytes`` (the same wire
  type), so each series stays one byte string. Prometheus writes one sample per series, after its
  labels (the queue manager's layout); such a series is its label bytes followed by one
  ``samples`` entry, and when those label bytes are a label set already read, the sample is
  decoded from the tail alone (:func:`_tail_sample`: a double and a varint, strictly in that
  layout) and the labels are the cached ones. Any other series (first seen, several samples,
  another layout) is parsed whole with ``TimeSeries.labels`` declared as ``bytes``: its label set
  is a tuple of byte strings that a :class:`LabelCache` maps to its decoded labels (and whose
  label bytes it then remembers when they were exactly the series' labels), so the label sets a
  sender repeats every request are decoded (and their UTF-8 checked) once. Both ways give the
  same samples: protobuf reads a message's bytes as the concatenation of its fields.
- **Samples** (:func:`write_request_samples`): a series whose ``__name__`` fleetmedic reads
  (:func:`~fleetmedic.connectors.prometheus_text.known_name`, so OpenMetrics ``_total`` names too)
  gives ``(name, labels, value, seconds)`` samples, as the exposition reader's parser does; other
  series are counted as ignored. Prometheus's staleness markers (a NaN of its own bit pattern,
  written when a series disappears) are counted apart and dropped; other NaNs, infinities, label
  values over :data:`~fleetmedic.connectors.prometheus_text.MAX_LABEL_VALUE_CHARS` and
  out-of-range timestamps are skipped and counted per reason.
- **Assembly** (:class:`Assembler`): Prometheus spreads the series of one scrape over several
  requests (queues are sharded by series, batches cut at ``max_samples_per_send``), so the samples
  are held per scrape target (node, ``job``, ``instance``) and scrape time (within the reader's
  ``group_tolerance_ms``) and released ``assemble_s`` after the first of them arrived; the released
  samples go through :meth:`ExpositionReader.read_samples
  <fleetmedic.connectors.prometheus_text.ExpositionReader.read_samples>`, the grouping and mapping
  every other Prometheus path uses (node from ``node_labels``, GPU from ``ingest.gpu_label``...).
  A sample of a scrape already released (a retry of a request whose answer was lost, a WAL replay,
  a shard later than ``assemble_s``) is dropped and counted: a node never gets a second, partial
  record for a scrape time.
"""

from __future__ import annotations

import math
import re
import struct
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from fleetmedic.connectors.prometheus_text import (
    MAX_LABEL_VALUE_CHARS,
    TS_MAX,
    TS_MIN,
    ExpositionReader,
    Sample,
    SeriesCache,
    count,
    known_name,
)
from fleetmedic.records import GpuTelemetry, PortTelemetry

#: Prometheus's staleness marker (model/value/value.go StaleNaN): a NaN with this bit pattern
STALE_NAN_BITS: Final = 0x7FF0000000000002
_STALE_BYTES: Final = struct.pack("<Q", STALE_NAN_BITS)
#: the Content-Type of remote write 1.0 (a ``proto`` parameter may name the message)
CONTENT_TYPE: Final = "application/x-protobuf"
WRITE_REQUEST_V1: Final = "prometheus.WriteRequest"


class BadRequest(ValueError):
    """A request that cannot be read and must not be retried. ``status``: 400, or 415 for a
    content type naming a message other than remote write 1.0's; ``kind``: a short metric label;
    the message says why (never quoting the body)."""

    def __init__(self, kind: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


# --- the protobuf messages ----------------------------------------------------------------------


def _message_classes(package: str, labels_as_bytes: bool, series_as_bytes: bool = False) -> tuple[Any, Any, Any]:
    """The ``WriteRequest``, ``Label`` and ``TimeSeries`` classes, built from descriptors (the
    field numbers and types of prompb/remote.proto and prompb/types.proto); ``labels_as_bytes``: a
    series' labels are left as their encoded bytes; ``series_as_bytes``: so are whole series."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name=f"fleetmedic/{package}.proto", package=package, syntax="proto3")
    labels = ("labels", 1, f.TYPE_BYTES, f.LABEL_REPEATED, "") if labels_as_bytes else (
        "labels", 1, f.TYPE_MESSAGE, f.LABEL_REPEATED, f".{package}.Label")
    series = ("timeseries", 1, f.TYPE_BYTES, f.LABEL_REPEATED, "") if series_as_bytes else (
        "timeseries", 1, f.TYPE_MESSAGE, f.LABEL_REPEATED, f".{package}.TimeSeries")
    fields: dict[str, list[tuple[str, int, int, int, str]]] = {
        "WriteRequest": [series],
        "TimeSeries": [labels, ("samples", 2, f.TYPE_MESSAGE, f.LABEL_REPEATED, f".{package}.Sample")],
        "Label": [("name", 1, f.TYPE_STRING, f.LABEL_OPTIONAL, ""), ("value", 2, f.TYPE_STRING, f.LABEL_OPTIONAL, "")],
        "Sample": [("value", 1, f.TYPE_DOUBLE, f.LABEL_OPTIONAL, ""),
                   ("timestamp", 2, f.TYPE_INT64, f.LABEL_OPTIONAL, "")],
    }
    for message, its in fields.items():
        m = proto.message_type.add(name=message)
        for name, number, kind, label, type_name in its:
            extra = {"type_name": type_name} if type_name else {}
            m.field.add(name=name, number=number, type=kind, label=label, **extra)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
                 for name in ("WriteRequest", "Label", "TimeSeries"))


#: ``prometheus.WriteRequest`` as senders write it (:func:`encode_request`)
WriteRequest, Label, _ = _message_classes("prometheus", labels_as_bytes=False)
#: the same wire format, each series' labels left encoded
RawWriteRequest, _, RawTimeSeries = _message_classes("fleetmedic_prompb_raw", labels_as_bytes=True)
#: the same wire format, each series left encoded (what :func:`decode_request` returns; each series is
#: read by :func:`write_request_samples`)
WireWriteRequest, _, _ = _message_classes("fleetmedic_prompb_wire", labels_as_bytes=True, series_as_bytes=True)


# --- the request ----------------------------------------------------------------------------------


def snappy_length(body: bytes) -> int:
    """The uncompressed length a snappy block starts with (a little-endian base-128 varint of at
    most 32 bits). Raises :class:`BadRequest` when there is none."""
    length, shift = 0, 0
    for i, byte in enumerate(body[:5]):
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if length >= 1 << 32 or (i == 4 and byte > 0x0F):
                break
            return length
        shift += 7
    raise BadRequest("snappy", "body is not snappy-compressed (no block length header)")


def check_headers(headers: Mapping[str, str]) -> None:
    """Content-Type and Content-Encoding as remote write 1.0 has them, or :class:`BadRequest`."""
    ctype = headers.get("Content-Type", "")
    media, _, params = ctype.partition(";")
    if media.strip().lower() != CONTENT_TYPE:
        raise BadRequest("content_type", f"Content-Type must be {CONTENT_TYPE} (got {ctype[:100]!r})")
    for param in params.split(";"):
        key, _, value = param.strip().partition("=")
        if key.strip().lower() == "proto" and value.strip().strip('"') != WRITE_REQUEST_V1:
            raise BadRequest("unsupported_proto",
                             f"only remote write 1.0 ({WRITE_REQUEST_V1}) is read; got proto={value.strip()[:100]}",
                             status=415)
    encoding = headers.get("Content-Encoding", "")
    if encoding.strip().lower() != "snappy":
        raise BadRequest("content_encoding", f"Content-Encoding must be snappy (got {encoding[:100]!r})")


def decode_request(body: bytes, headers: Mapping[str, str], max_body_bytes: int,
                   max_decompressed_bytes: int) -> Any:
    """A remote-write 1.0 request's ``WriteRequest`` message, or :class:`BadRequest` saying why
    not (headers, sizes, snappy, protobuf; in that order, each checked before the next costs)."""
    import cramjam
    from google.protobuf.message import DecodeError

    check_headers(headers)
    if len(body) > max_body_bytes:
        raise BadRequest("too_large", f"body of {len(body)} bytes, over the limit of {max_body_bytes}")
    length = snappy_length(body)
    if length > max_decompressed_bytes:
        raise BadRequest("too_large",
                         f"body decompresses to {length} bytes, over the limit of {max_decompressed_bytes}")
    try:
        raw = cramjam.snappy.decompress_raw(body)
    except Exception as exc:  # cramjam.DecompressionError (and whatever a corrupt block raises)
        raise BadRequest("snappy", f"body is not a valid snappy block: {str(exc)[:200]}") from None
    request = WireWriteRequest()
    try:
        request.ParseFromString(memoryview(raw))
    except DecodeError as exc:
        raise BadRequest("protobuf", f"body is not a prometheus.WriteRequest: {str(exc)[:200]}") from None
    return request


def encode_request(series: Iterable[tuple[Mapping[str, str], Iterable[tuple[float, int]]]]) -> bytes:
    """A snappy-compressed WriteRequest of ``(labels, [(value, timestamp_ms), ...])`` series (the
    labels include ``__name__``): what a remote-write sender posts (benchmarks, tests)."""
    import cramjam

    request = WriteRequest()
    for labels, points in series:
        ts = request.timeseries.add()
        for key, text in sorted(labels.items()):
            ts.labels.add(name=key, value=text)
        for value, ms in points:
            ts.samples.add(value=value, timestamp=ms)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


def is_stale_marker(value: float) -> bool:
    return value != value and struct.pack("<d", value) == _STALE_BYTES


@dataclass
class SampleCounts:
    """What :func:`write_request_samples` made of a request's samples."""

    read: int = 0  # samples of series fleetmedic reads, passed on
    ignored: int = 0  # samples of series fleetmedic does not read
    stale: int = 0  # staleness markers
    skipped: int = 0  # bad samples (reasons in the reader's ``skipped``)


_LabelSet = tuple[str | None, dict[str, str], str]  # known series name (None: not read), labels, problem


class LabelCache:
    """Encoded label sets -> (the series fleetmedic reads or None, labels without ``__name__``,
    why its samples cannot be used or ""). The labels dict of a set is the same object every time
    it is seen (the mapping's per-series caches key on it). Cleared when ``max_entries`` or
    ``max_bytes`` (of encoded labels) are reached."""

    def __init__(self, max_entries: int = 200_000, max_bytes: int = 64 << 20) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
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
        caller: parsed, it holds those labels and no sample)."""
        if len(self._prefixes) >= self.max_entries or self._bytes + len(prefix) > self.max_bytes:
            self._clear()
        self._prefixes[prefix] = hit
        self._bytes += len(prefix)

    def _clear(self) -> None:
        self._sets.clear()
        self._prefixes.clear()
        self._bytes = 0

    @staticmethod
    def _decode(key: tuple[bytes, ...]) -> _LabelSet:
        from google.protobuf.message import DecodeError

        label = Label()
        name = ""
        labels: dict[str, str] = {}
        for encoded in key:
            try:
                label.ParseFromString(encoded)
            except DecodeError as exc:
                raise BadRequest("protobuf", f"a label is not a prometheus.Label: {str(exc)[:200]}") from None
            if label.name == "__name__":
                name = label.value
            else:
                labels[label.name] = label.value
            label.Clear()
        known = known_name(name)
        too_long = next((k for k, v in labels.items() if len(v) > MAX_LABEL_VALUE_CHARS), None)
        problem = "" if known is None or too_long is None else (
            f"{known}: label {too_long[:64]} longer than {MAX_LABEL_VALUE_CHARS} characters")
        return known, labels, problem


def _tail_sample(raw: bytes, times: dict[bytes, int]) -> tuple[int, float, int] | None:
    """A series ending in one ``samples`` entry as Prometheus writes it (``0x12 len [0x09 double]
    0x10 varint``, the value left out when it is 0.0): (where that entry starts, value, timestamp
    in ms); None when the tail is not exactly that. ``times``: varints decoded so far (the series
    of one scrape share their timestamp)."""
    n = len(raw)
    if n < 4 or raw[-1] & 0x80:
        return None
    j = raw.rfind(b"\x10", max(0, n - 11), n - 1)  # the timestamp's tag: its varint's other bytes are >= 0x80
    if j < 2 or (j < n - 2 and min(raw[j + 1:n - 1]) < 0x80):
        return None
    if j >= 11 and raw[j - 9] == 0x09 and raw[j - 11] == 0x12 and raw[j - 10] == n - j + 9:
        start, value = j - 11, _DOUBLE.unpack_from(raw, j - 8)[0]
    elif raw[j - 2] == 0x12 and raw[j - 1] == n - j:
        start, value = j - 2, 0.0
    else:
        return None
    varint = raw[j + 1:]
    ms = times.get(varint)
    if ms is None:
        ms, shift = 0, 0
        for byte in varint:
            ms |= (byte & 0x7F) << shift
            shift += 7
        if ms >= 1 << 63:  # int64: a negative timestamp
            ms -= 1 << 64
        times[varint] = ms
    return start, value, ms


_DOUBLE = struct.Struct("<d")


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


def write_request_samples(request: Any, skipped: Counter[str], counts: SampleCounts,
                          cache: LabelCache | None = None) -> Iterator[Sample]:
    """The samples of a (:func:`decode_request`) WriteRequest's series fleetmedic reads (labels
    without ``__name__``, one dict per label set; timestamps in seconds); the rest counted. A
    series or label that cannot be read (not UTF-8...) raises :class:`BadRequest`."""
    cache = LabelCache() if cache is None else cache
    prefixes = cache._prefixes
    times: dict[bytes, int] = {}
    unpack_double = _DOUBLE.unpack_from
    isfinite = math.isfinite
    read = 0
    try:
        for raw in request.timeseries:
            # the commonest tail first, inline: a 6-byte timestamp varint (2004-2109 in ms) already
            # decoded in this request (so checked), after a value (``0x12 16 0x09 double 0x10``) or
            # none (``0x12 7 0x10``: 0.0); _tail_sample reads any other
            n = len(raw)
            ms = times.get(raw[-6:]) if n >= 9 else None
            hit = None
            if ms is not None and raw[-7] == 0x10:
                if n >= 18 and raw[-16] == 0x09 and raw[-17] == 16 and raw[-18] == 0x12:
                    hit, point = prefixes.get(raw[:-18]), (unpack_double(raw, n - 15)[0], ms)
                elif raw[-8] == 7 and raw[-9] == 0x12:
                    hit, point = prefixes.get(raw[:-9]), (0.0, ms)
            if hit is None:
                tail = _tail_sample(raw, times)
                if tail is not None:
                    hit, point = prefixes.get(raw[:tail[0]]), (tail[1], tail[2])
            if hit is not None:
                (known, labels, problem), points = hit, (point,)
            else:
                (known, labels, problem), points = _parse_series(raw, cache, tail)  # type: ignore[assignment]
            if known is None:
                counts.ignored += len(points)
                continue
            if problem:
                count(skipped, problem, len(points))
                counts.skipped += len(points)
                continue
            for value, ms in points:
                ts = ms / 1000.0
                if isfinite(value) and TS_MIN <= ts <= TS_MAX:
                    read += 1
                    yield known, labels, value, ts
                elif not isfinite(value):
                    if value != value and is_stale_marker(value):
                        counts.stale += 1
                        continue
                    count(skipped, f"{known}: value is {'NaN' if math.isnan(value) else 'infinite'}")
                    counts.skipped += 1
                else:
                    count(skipped, f"{known}: timestamp out of range")
                    counts.skipped += 1
    finally:
        counts.read += read


# --- assembly -------------------------------------------------------------------------------------


@dataclass
class _Scrape:
    """The samples of one target's scrape received so far."""

    anchor: float  # the first sample's timestamp: later ones within the tolerance of it join
    arrived: float  # when the first arrived (monotonic): released ``assemble_s`` later
    samples: list[Sample] = field(default_factory=list)


_Target = tuple[str, str, str]  # node ("" = none found: the reader counts it), job, instance


@dataclass
class Assembler:
    """Holds samples per scrape until the whole scrape is likely in (see the module docstring);
    ``clock`` is monotonic seconds."""

    reader: ExpositionReader
    assemble_s: float
    max_pending: int
    max_targets: int = 100_000
    clock: Callable[[], float] = time.monotonic
    pending: int = 0
    #: samples dropped because their scrape was already released
    late: int = 0
    _open: dict[_Target, list[_Scrape]] = field(default_factory=dict)
    _released: OrderedDict[_Target, float] = field(default_factory=OrderedDict)
    _targets: dict[int, tuple[dict[str, str], _Target]] = field(default_factory=dict)  # id(labels) -> target
    #: what each series says, kept across releases: with one sample per series a scrape, a cache
    #: per release would work every series out again each scrape
    _series: SeriesCache = field(default_factory=dict)

    def room_for(self, n: int) -> bool:
        return self.pending + n <= self.max_pending

    def add(self, samples: Iterable[Sample]) -> int:
        """Hold ``samples``; returns how many were taken (the others were late)."""
        tol = max(0.0, self.reader.group_tolerance_s)
        now = self.clock()
        taken = 0
        last_labels: dict[str, str] | None = None
        target: _Target = ("", "", "")
        released = -math.inf
        targets = self._targets
        for sample in samples:
            labels = sample[1]
            if labels is not last_labels:  # the samples of one series share their labels dict
                last_labels = labels
                hit = targets.get(id(labels))
                if hit is None or hit[0] is not labels:  # the entry holds the dict: its id is not reused meanwhile
                    if len(targets) >= 200_000:
                        targets.clear()
                    hit = targets[id(labels)] = (labels, (self.reader.node_of(labels) or "", labels.get("job", ""),
                                                          labels.get("instance", "")))
                target = hit[1]
                released = self._released.get(target, -math.inf)
            ts = sample[3]
            assert ts is not None
            if ts <= released + tol:
                self.late += 1
                continue
            scrapes = self._open.get(target)
            if scrapes is None:
                scrapes = self._open[target] = []
            for scrape in reversed(scrapes):
                if abs(ts - scrape.anchor) <= tol:
                    break
            else:
                scrape = _Scrape(ts, now)
                scrapes.append(scrape)
            scrape.samples.append(sample)
            taken += 1
        self.pending += taken
        return taken

    def release(self, everything: bool = False) -> list[Sample]:
        """The samples of the scrapes held for ``assemble_s`` (all with ``everything``), oldest
        scrape first; their targets are marked released up to their newest scrape time."""
        cutoff = math.inf if everything else self.clock() - self.assemble_s
        out: list[tuple[float, list[Sample]]] = []
        for target in list(self._open):
            scrapes = self._open[target]
            due = [s for s in scrapes if s.arrived <= cutoff]
            if not due:
                continue
            keep = [s for s in scrapes if s.arrived > cutoff]
            if keep:
                self._open[target] = keep
            else:
                del self._open[target]
            newest = max(max(x[3] or 0.0 for x in s.samples) for s in due)
            mark = max(self._released.pop(target, -math.inf), newest)
            self._released[target] = mark  # most recently released last: the oldest are forgotten first
            out += [(s.anchor, s.samples) for s in due]
        while len(self._released) > self.max_targets:
            self._released.popitem(last=False)
        out.sort(key=lambda x: x[0])
        samples = [x for _, batch in out for x in batch]
        self.pending -= len(samples)
        return samples

    def records(self, everything: bool = False) -> list[GpuTelemetry | PortTelemetry]:
        """The records of the released scrapes, mapped by the reader."""
        samples = self.release(everything)
        return list(self.reader.read_samples(samples, flush_lag_s=math.inf, series_cache=self._series)) if samples \
            else []


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
