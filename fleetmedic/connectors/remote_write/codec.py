"""The wire format of Prometheus remote write 1.0: the request's headers, its snappy block and its
protobuf messages, read and written (:mod:`fleetmedic.connectors.remote_write.assembler` makes records of
the series; :mod:`fleetmedic.connectors.remote_write.server` is the HTTP server).

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
  :func:`decode_request` returns the request with ``WriteRequest.timeseries`` declared as
  ``bytes`` (the same wire type), so each series stays one byte string; :data:`RawTimeSeries`
  reads one with its labels left as bytes. A series as Prometheus writes it (its labels, then one
  ``samples`` entry) has its sample decoded from the tail alone (:func:`tail_sample`).
- **Staleness markers**: :func:`is_stale_marker` (a NaN of Prometheus's own bit pattern).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any, Final

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

def tail_sample(raw: bytes, times: dict[bytes, int]) -> tuple[int, float, int] | None:
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
#: the last 18 bytes of a series whose one sample has a value: ``0x12 16 0x09``, the double, then
#: ``0x10`` and a 6-byte timestamp varint
VALUED_TAIL = struct.Struct("<3sd7s")
VALUED_HEAD: Final = b"\x12\x10\x09"
#: the last 9 bytes of one whose value is 0.0 (left out): ``0x12 7``, then ``0x10`` and the varint
ZERO_HEAD: Final = b"\x12\x07"

