"""Wire records: one versioned message type per topic, JSON on the wire.

Every record is a frozen ``msgspec.Struct`` so that decoding and validation happen in one pass.
Rules that other systems can rely on:

- every message carries ``schema_version``; additive changes keep the version, breaking changes
  bump it and consumers reject versions they do not know;
- unknown fields are tolerated (a newer producer may add fields);
- an invalid message raises :class:`InvalidRecord`, which names the field path (``$.gpus[3].gpu``)
  and the reason;
- a message is at most :data:`MAX_RECORD_BYTES` long and nests at most :data:`MAX_NESTING` levels
  (unknown fields included); a longer or deeper one is an :class:`InvalidRecord` before it is
  parsed, the same in every stage whatever its call stack;
- timestamps are Unix epoch seconds (float), gauges are floats, cumulative counters are
  non-negative ints that reset to zero when a node reboots or the driver reloads (``boot_id``
  changes when that happens, where the producer knows it).

This module is part of the pure core: no I/O, no adapters.
"""

from __future__ import annotations

import hashlib
import re
import traceback
from typing import Annotated, Any, Final, Generic, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct, field

from fleetmedic.actions import Action

SCHEMA_VERSION: Final = 1

# --- constrained scalar types -------------------------------------------------------------------
# Bounds are generous physical limits: they reject NaN, infinities and garbage, not odd readings.
Timestamp = Annotated[float, Meta(ge=0.0, le=4.0e9, description="Unix epoch seconds")]
Seconds = Annotated[float, Meta(ge=0.0, le=1.0e9)]
Celsius = Annotated[float, Meta(ge=-60.0, le=300.0)]
Watts = Annotated[float, Meta(ge=0.0, le=10_000.0)]
MHz = Annotated[float, Meta(ge=0.0, le=100_000.0)]
Percent = Annotated[float, Meta(ge=0.0, le=100.0)]
Ratio = Annotated[float, Meta(ge=0.0, le=1.0)]
MiB = Annotated[float, Meta(ge=0.0, le=1.0e9)]
Counter = Annotated[int, Meta(ge=0, le=2**63 - 1, description="cumulative, resets on reboot")]
Bitmask = Annotated[int, Meta(ge=0, le=2**63 - 1)]
Score = Annotated[float, Meta(ge=-1.0e12, le=1.0e12)]
GpuIndex = Annotated[int, Meta(ge=0, le=255)]
Xid = Annotated[int, Meta(ge=0, le=100_000)]
NodeName = Annotated[str, Meta(min_length=1, max_length=253)]
Name = Annotated[str, Meta(min_length=1, max_length=512)]
ShortText = Annotated[str, Meta(max_length=4096)]
JobRef = Annotated[
    str,
    Meta(
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        max_length=317,
        description="namespace/name",
    ),
]
Version = Annotated[int, Meta(ge=1, le=SCHEMA_VERSION, description="schema version of the message")]


class Record(Struct, frozen=True, kw_only=True):
    """Base of every wire record."""

    schema_version: Version = SCHEMA_VERSION


# --- GPU telemetry ------------------------------------------------------------------------------


class DetectionMetrics(Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """The metrics stage 1 reads (detectors, windows, peer summaries): :class:`GpuMetrics` minus the
    ones no detector uses. The detect worker decodes telemetry as :class:`DetectionTelemetry`, so it
    never builds the Python lists of columns it would throw away (valgrind: 116k instead of 152k
    instructions per 8-GPU message, docs/streams.md). A metric a detector starts to read must move
    here (a test checks).

    Telemetry holds numbers and strings only, so it can be in no reference cycle: its structs (this
    one, :class:`XidEvent`, :class:`DetectionTelemetry` and their subclasses) are not tracked by the
    garbage collector (``gc=False``), which a worker decoding tens of thousands of them a second
    would otherwise scan."""

    gpu_temp: list[Celsius | None] | None = None
    memory_temp: list[Celsius | None] | None = None
    power_usage: list[Watts | None] | None = None
    sm_clock: list[MHz | None] | None = None
    mem_clock: list[MHz | None] | None = None
    gpu_util: list[Percent | None] | None = None
    clocks_event_reasons: list[Bitmask | None] | None = None
    power_violation: list[Counter | None] | None = None
    thermal_violation: list[Counter | None] | None = None
    ecc_sbe_vol_total: list[Counter | None] | None = None
    ecc_dbe_vol_total: list[Counter | None] | None = None
    uncorrectable_remapped_rows: list[Counter | None] | None = None
    row_remap_failure: list[Counter | None] | None = None
    row_remap_pending: list[Counter | None] | None = None
    pcie_replay_counter: list[Counter | None] | None = None
    pcie_link_width: list[Annotated[int, Meta(ge=0, le=64)] | None] | None = None
    nvlink_crc_flit_error_count_total: list[Counter | None] | None = None
    nvlink_crc_data_error_count_total: list[Counter | None] | None = None
    nvlink_replay_error_count_total: list[Counter | None] | None = None
    nvlink_recovery_error_count_total: list[Counter | None] | None = None
    nvlink_links_down: list[Annotated[int, Meta(ge=0, le=64)] | None] | None = None
    xid_errors: list[Xid | None] | None = None


class GpuMetrics(DetectionMetrics, frozen=True, kw_only=True, omit_defaults=True):
    """The dcgm-exporter field set of a node's GPUs, one list per metric (column-major).

    Each list holds one value per GPU, in the order of :attr:`GpuTelemetry.gpus`; ``null`` means the
    GPU did not report it, an absent metric means no GPU did. Column-major keeps a node's message
    small (each key once, not once per GPU) and decodes straight into a ``[metrics, gpus]`` array:
    measured 1.6 KB vs 6.2 KB per 8-GPU message, and about 3x faster to decode into numpy than one
    object per GPU (bench/bench_detection.py). Names are dcgm-exporter's without ``DCGM_FI_DEV_`` /
    ``DCGM_FI_PROF_`` (see :data:`DCGM_NAMES`); counters are cumulative and reset on reboot."""

    # the fields of DetectionMetrics come first, then these

    mem_copy_util: list[Percent | None] | None = None
    fb_used: list[MiB | None] | None = None
    fb_free: list[MiB | None] | None = None
    retired_sbe: list[Counter | None] | None = None
    retired_dbe: list[Counter | None] | None = None
    retired_pending: list[Counter | None] | None = None
    correctable_remapped_rows: list[Counter | None] | None = None
    pcie_link_gen: list[Annotated[int, Meta(ge=0, le=16)] | None] | None = None
    prof_sm_active: list[Ratio | None] | None = None
    prof_pipe_tensor_active: list[Ratio | None] | None = None
    prof_dram_active: list[Ratio | None] | None = None


GPU_METRICS: Final[tuple[str, ...]] = GpuMetrics.__struct_fields__
#: the first fields of GPU_METRICS: a detection metric has the same index in both
DETECTION_METRICS: Final[tuple[str, ...]] = DetectionMetrics.__struct_fields__

#: metric -> the dcgm-exporter series name
DCGM_NAMES: Final[dict[str, str]] = {
    m: ("DCGM_FI_PROF_" + m[len("prof_") :] if m.startswith("prof_") else "DCGM_FI_DEV_" + m).upper()
    for m in GPU_METRICS
}
DCGM_NAMES["nvlink_links_down"] = "DCGM_FI_DEV_NVLINK_LINKS_DOWN"  # fleetmedic's own (from NVML link state)

#: cumulative counters that reset to zero when the node reboots or the driver reloads
COUNTER_METRICS: Final[frozenset[str]] = frozenset(
    {
        "power_violation",
        "thermal_violation",
        "ecc_sbe_vol_total",
        "ecc_dbe_vol_total",
        "pcie_replay_counter",
        "nvlink_crc_flit_error_count_total",
        "nvlink_crc_data_error_count_total",
        "nvlink_replay_error_count_total",
        "nvlink_recovery_error_count_total",
    }
)
#: counts kept by the GPU across reboots (InfoROM): retired pages and remapped rows
PERSISTENT_COUNT_METRICS: Final[frozenset[str]] = frozenset(
    {"retired_sbe", "retired_dbe", "retired_pending", "uncorrectable_remapped_rows", "correctable_remapped_rows",
     "row_remap_failure", "row_remap_pending"}
)


class XidEvent(Struct, frozen=True, kw_only=True, gc=False):
    """One XID as NVML reports it (an event, unlike dcgm-exporter's last-value gauge)."""

    gpu: GpuIndex
    xid: Xid
    ts: Timestamp
    message: ShortText = ""


class DetectionTelemetry(Record, frozen=True, kw_only=True, tag="gpu_telemetry", tag_field="type", gc=False):
    """What stage 1 reads of a :class:`GpuTelemetry` message (its :class:`DetectionMetrics`; no
    ``uuids``, ``driver_version`` or ``source``), validated as strictly. A full :class:`GpuTelemetry`
    is one too: everything that detects takes this type."""

    node: NodeName
    ts: Timestamp
    gpus: Annotated[list[GpuIndex], Meta(min_length=1, max_length=256)]  # none: nothing to detect on
    metrics: DetectionMetrics
    xids: list[XidEvent] = []
    sku: str = ""
    boot_id: str = ""

    def __post_init__(self) -> None:
        n = len(self.gpus)
        if len(set(self.gpus)) != n:
            raise ValueError("`gpus` has duplicate indices")
        columns = msgspec.structs.astuple(self.metrics)
        # every column reported has n values: checked without a Python loop (it runs for every
        # message decoded; the loop cost a quarter of decoding), then the culprit is looked for.
        # An exporter reporting every metric (the usual case) needs no filter
        try:
            if set(map(len, columns)) == {n}:
                return
        except TypeError:  # a metric no GPU reported (None)
            if set(map(len, filter(None, columns))) <= {n} and not (n and [] in columns):
                return
        for name, column in zip(self.metrics.__struct_fields__, columns, strict=True):
            if column is not None and len(column) != n:
                raise ValueError(f"`metrics.{name}` has {len(column)} values for {n} GPUs")


class GpuTelemetry(DetectionTelemetry, frozen=True, kw_only=True, tag="gpu_telemetry", tag_field="type"):
    """Every GPU of one node at one timestamp, plus XID events since the previous message.

    ``gpus`` lists the GPU indices; every list in ``metrics`` (and ``uuids`` when given) is aligned
    with it."""

    # the fields of DetectionTelemetry come first (with the full metrics), then these

    metrics: GpuMetrics
    uuids: list[str] = []
    driver_version: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.uuids and len(self.uuids) != len(self.gpus):
            raise ValueError(f"`uuids` has {len(self.uuids)} entries for {len(self.gpus)} GPUs")

    def gpu_values(self, position: int) -> dict[str, float | int | None]:
        """One GPU's metrics (by position in ``gpus``), for readers that want a per-GPU view."""
        return {
            name: column[position]
            for name, column in zip(GPU_METRICS, msgspec.structs.astuple(self.metrics), strict=True)
            if column is not None
        }


# --- switch and NIC port counters ---------------------------------------------------------------


class PortSample(Struct, frozen=True, kw_only=True):
    """InfiniBand/Ethernet port counters (cumulative) and state of one port."""

    port: Name
    node: str = ""  # the node whose NIC this port is or faces ("" for inter-switch links)
    peer: str = ""  # "device:port" at the other end of the cable, when known
    link_state: Literal["up", "down", "init", "unknown"] = "unknown"
    speed_gbps: Annotated[float, Meta(ge=0.0, le=10_000.0)] | None = None
    width: Annotated[int, Meta(ge=0, le=64)] | None = None
    symbol_error_counter: Counter | None = None
    link_error_recovery_counter: Counter | None = None
    link_downed_counter: Counter | None = None
    port_rcv_errors: Counter | None = None
    port_rcv_remote_physical_errors: Counter | None = None
    port_xmit_discards: Counter | None = None
    local_link_integrity_errors: Counter | None = None
    excessive_buffer_overrun_errors: Counter | None = None
    port_xmit_wait: Counter | None = None
    port_xmit_data: Counter | None = None  # 4-byte words, as InfiniBand counts them
    port_rcv_data: Counter | None = None  # 4-byte words
    effective_ber: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None


class PortTelemetry(Record, frozen=True, kw_only=True, tag="port_telemetry", tag_field="type"):
    """Ports of one device (a switch, or a host's NICs) at one timestamp."""

    device: NodeName
    device_kind: Literal["switch", "host"]
    ts: Timestamp
    ports: list[PortSample]
    boot_id: str = ""
    source: str = ""


# --- job events ---------------------------------------------------------------------------------


class RankPlacement(Struct, frozen=True, kw_only=True):
    rank: Annotated[int, Meta(ge=0, le=10_000_000)]
    node: NodeName
    gpus: list[GpuIndex] = []


JobEventKind = Literal["placement", "start", "progress", "failure", "completion", "restart"]


class JobEvent(Record, frozen=True, kw_only=True, tag="job_event", tag_field="type"):
    """A training job's life: where its ranks run, its progress, its failures and completion.

    ``progress`` carries the job's step time, or one rank's when ``rank`` is set (stragglers).
    ``failure`` carries the exit code, reason and an excerpt of the log as the framework printed it.
    """

    job: JobRef
    event: JobEventKind
    ts: Timestamp
    attempt: Annotated[int, Meta(ge=0, le=1_000_000)] = 0
    workload_kind: str = ""  # Job, PyTorchJob, JobSet, ...
    world_size: Annotated[int, Meta(ge=0, le=10_000_000)] | None = None
    placement: list[RankPlacement] = []
    step: Annotated[int, Meta(ge=0)] | None = None
    step_time_s: Seconds | None = None
    rank: Annotated[int, Meta(ge=0, le=10_000_000)] | None = None
    node: str = ""
    exit_code: Annotated[int, Meta(ge=-1024, le=1024)] | None = None
    reason: ShortText = ""
    log_excerpt: list[ShortText] = []


# --- findings and incidents ---------------------------------------------------------------------


class Evidence(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a detector saw: the metric, its value against the baseline, the score and the window."""

    detector: Name
    metric: str = ""
    value: Score | None = None
    baseline: Score | None = None
    score: Score | None = None
    threshold: Score | None = None
    window_s: Seconds | None = None
    gpu: GpuIndex | None = None
    port: str = ""
    ts: Timestamp | None = None
    note: ShortText = ""


FindingKind = Literal["hard_fault", "degradation", "network", "job", "telemetry"]
Severity = Literal["info", "warning", "critical"]


class Finding(Record, frozen=True, kw_only=True, tag="finding", tag_field="type"):
    """One detector's verdict on one node (and GPU or port) at one time."""

    id: Name
    ts: Timestamp
    node: NodeName
    detector: Name
    kind: FindingKind
    severity: Severity
    summary: ShortText
    evidence: list[Evidence]
    gpu: GpuIndex | None = None
    port: str = ""
    job: str = ""
    action_hint: str = ""  # e.g. the XID catalog's bucket: RESET_GPU, RESTART_BM, ...


IncidentClass = Literal["hardware", "degradation", "network", "transient_software", "job_bug", "unknown"]
SuspectKind = Literal["node", "gpu", "link", "switch", "job"]
IncidentStatus = Literal["open", "mitigating", "resolved", "dismissed"]


class Suspect(Struct, frozen=True, kw_only=True):
    kind: SuspectKind
    name: Name


class Incident(Record, frozen=True, kw_only=True, tag="incident", tag_field="type"):
    """A correlated failure: its class, what is suspected, how sure, and the evidence chain."""

    id: Name
    incident_class: IncidentClass = field(name="class")
    suspects: list[Suspect]
    confidence: Ratio
    evidence: list[Evidence]
    first_seen: Timestamp
    status: IncidentStatus
    last_seen: Timestamp | None = None
    severity: Severity = "warning"
    summary: ShortText = ""
    jobs: list[str] = []
    finding_ids: list[str] = []


# --- remediation --------------------------------------------------------------------------------

Track = Literal["job", "node"]


class RemediationCommand(Record, frozen=True, kw_only=True, tag="remediation_command", tag_field="type"):
    """A signed instruction to an executor. ``id`` is the idempotency key: executors apply a given
    id at most once. ``signature`` is HMAC-SHA256 over the canonical encoding (see
    :mod:`fleetmedic.signing`)."""

    id: Name
    action: Action
    incident_id: str
    reason: ShortText
    issued_at: Timestamp
    expires_at: Timestamp
    node: str = ""
    job: str = ""  # namespace/name
    track: Track = "node"
    dry_run: bool = False
    exclude_nodes: list[str] = []
    params: dict[str, str] = {}
    signature: str = ""

    def __post_init__(self) -> None:
        if not self.node and not self.job:
            raise ValueError("a command needs a target: `node` or `job`")
        if self.expires_at < self.issued_at:
            raise ValueError("`expires_at` is before `issued_at`")


Outcome = Literal["applied", "skipped", "failed"]


class RemediationResult(Record, frozen=True, kw_only=True, tag="remediation_result", tag_field="type"):
    """What an executor did with a command."""

    command_id: Name
    action: Action
    outcome: Outcome
    ts: Timestamp
    reason: ShortText = ""
    node: str = ""
    job: str = ""
    executor: str = ""
    dry_run: bool = False
    details: dict[str, str] = {}


OperatorAction = Literal["resume_breaker", "clear_node", "node_repaired"]
NODE_OPERATOR_ACTIONS: Final[frozenset[str]] = frozenset({"clear_node", "node_repaired"})


class OperatorCommand(Record, frozen=True, kw_only=True, tag="operator_command", tag_field="type"):
    """A person's instruction to the decision stage (``fleetmedic ctl``), signed like a
    :class:`RemediationCommand`: resume the circuit breaker, clear a node (return it to service
    without diagnostics), or report a node repaired (validate it with diagnostics, then return it).
    Every one is audited with its ``actor`` and ``reason``; ``id`` is the idempotency key."""

    id: Name
    action: OperatorAction
    actor: Name
    reason: Annotated[str, Meta(min_length=1, max_length=4096)]
    issued_at: Timestamp
    expires_at: Timestamp
    node: str = ""
    signature: str = ""

    def __post_init__(self) -> None:
        if self.action in NODE_OPERATOR_ACTIONS and not self.node:
            raise ValueError(f"`node` is required for {self.action}")
        if self.expires_at < self.issued_at:
            raise ValueError("`expires_at` is before `issued_at`")


class NodeObservation(Record, frozen=True, kw_only=True, tag="node_observation", tag_field="type"):
    """What the cluster says about a node, as far as the decision stage cares (``watch-jobs``'s Node
    watch): its cordon, whether fleetmedic made it (the ``fleetmedic.io/cordoned-by`` annotation),
    the labels that place it (rack, leaf, pool, ``rails.fleetmedic.io/*``) or opt it out, and
    whether it was deleted. Published only when one of these changed; keyed by node."""

    node: NodeName
    ts: Timestamp
    cordoned: bool = False
    cordoned_by_fleetmedic: bool = False
    labels: dict[str, Annotated[str, Meta(max_length=63)]] = {}
    deleted: bool = False


KernelDevice = Literal["gpu", "nvswitch", "pcie", "nic", "cpu", "memory", ""]


class KernelEvent(Record, frozen=True, kw_only=True, tag="kernel_event", tag_field="type"):
    """One classified line of a node's kernel log (``fleetmedic exporter kmsg``): an XID, an SXid,
    a PCIe AER error, a machine check, an EDAC or mlx5 driver error, as the log pattern library
    (``fleetmedic/data/log_patterns.yaml``) named it. Keyed by node.

    ``signal``, ``class``, ``severity``, ``device`` and ``pattern`` are the pattern's; ``pci`` is the
    PCI address the line names (the device an AER error was received from, the NVSwitch of an
    SXid, the GPU of an XID); ``gpu`` and ``port`` are the GPU index and the NIC port that address
    maps to on this node (from NVML or ``--pci-map``, and /sys), when it does; ``xid`` the XID a
    line reports (an Xid line, or one in the driver's own words), ``code`` another error code (an
    SXid's number), ``switch`` the NVSwitch device (``nvidia-nvswitch3``). ``gpus`` lists the GPU
    indices of the node's map (what the node's GPU telemetry reports). ``seq`` is the kernel's
    sequence number of the record, ``source`` where it was read (``kmsg``, ``journal``, ``file``)."""

    node: NodeName
    ts: Timestamp
    signal: Annotated[str, Meta(min_length=1, max_length=128)]
    incident_class: IncidentClass = field(name="class")
    severity: Severity
    message: ShortText
    device: KernelDevice = ""
    pattern: Annotated[str, Meta(max_length=128)] = ""
    pci: Annotated[str, Meta(max_length=64)] = ""
    gpu: GpuIndex | None = None
    port: Annotated[str, Meta(max_length=128)] = ""
    xid: Xid | None = None
    code: Annotated[str, Meta(max_length=64)] = ""
    switch: Annotated[str, Meta(max_length=128)] = ""
    gpus: Annotated[list[GpuIndex], Meta(max_length=256)] = []
    seq: Annotated[int, Meta(ge=0)] | None = None
    boot_id: str = ""
    source: str = ""


#: the bytes of the original message a dead letter keeps (base64 in JSON: 4/3 of it): a dead letter
#: stays far below the broker's 1 MiB limit whatever it carries (keeping all of an undecodable 770 KB
#: command would make a 1.03 MB dead letter that the broker refuses)
MAX_DEAD_LETTER_ORIGINAL: Final = 64 * 1024
MAX_DEAD_LETTER_KEY: Final = 1024  # characters of the original key kept


class DeadLetter(Record, frozen=True, kw_only=True, tag="dead_letter", tag_field="type"):
    """A message a stage could not process, with the reason and the original bytes (base64).

    ``original`` keeps the first 64 KiB of the message at most (:data:`MAX_DEAD_LETTER_ORIGINAL`);
    ``original_sha256`` and ``original_length`` describe the whole of it (filled in from
    ``original`` when a dead letter is made without them). A message the stage decoded but could
    not handle also names the exception's type and the frame that raised it (``file:line in
    function``); ``error`` then holds ``Type: message``."""

    ts: Timestamp
    topic: str
    stage: str
    error: ShortText
    original: bytes  # base64 in JSON; truncated, see original_length
    partition: int | None = None
    offset: int | None = None
    key: str | None = None
    original_sha256: str = ""  # hex SHA-256 of the whole original message
    original_length: Annotated[int, Meta(ge=0)] = 0  # bytes of the whole original message
    exception: str = ""  # the exception's type, when handling (not decoding) the message raised
    frame: str = ""  # where it was raised: the traceback's last frame

    def __post_init__(self) -> None:
        # made here, not by each of its builders (the stages, the executor, the connectors)
        set_ = msgspec.structs.force_setattr
        if not self.original_sha256:
            set_(self, "original_sha256", hashlib.sha256(self.original).hexdigest())
            set_(self, "original_length", len(self.original))
        if len(self.original) > MAX_DEAD_LETTER_ORIGINAL:
            set_(self, "original", bytes(self.original[:MAX_DEAD_LETTER_ORIGINAL]))
        if len(self.error) > 4096:
            set_(self, "error", self.error[:4096])
        if self.key is not None and len(self.key) > MAX_DEAD_LETTER_KEY:
            set_(self, "key", self.key[:MAX_DEAD_LETTER_KEY])

    @staticmethod
    def describe(exc: BaseException) -> tuple[str, str, str]:
        """An exception as a dead letter names it: ``(exception, message, frame)``: its type, its
        message and its traceback's last frame (``path:line in function``, the path from the
        package on)."""
        frames = traceback.extract_tb(exc.__traceback__)
        where = ""
        if frames:
            last = frames[-1]
            path = last.filename.replace("\\", "/")
            cut = path.rfind("/fleetmedic/")
            where = f"{path[cut + 1:] if cut >= 0 else path.rsplit('/', 1)[-1]}:{last.lineno} in {last.name}"
        return type(exc).__name__, str(exc), where


RECORD_TYPES: Final[tuple[type[Record], ...]] = (
    GpuTelemetry,
    PortTelemetry,
    JobEvent,
    Finding,
    Incident,
    RemediationCommand,
    RemediationResult,
    OperatorCommand,
    NodeObservation,
    DeadLetter,
    KernelEvent,
)

# --- encoding and decoding ----------------------------------------------------------------------

R = TypeVar("R", bound=Record)

def _plain(obj: Any) -> Any:
    """A numpy scalar (a float64 that slipped into a field) as the Python number it holds; anything
    else unsupported is an error naming its type. Only called for types msgspec cannot encode."""
    item = getattr(obj, "item", None)
    if callable(item) and getattr(obj, "shape", None) == ():
        return item()
    raise NotImplementedError(f"cannot encode a {type(obj).__name__}")


_ENCODER = msgspec.json.Encoder(enc_hook=_plain)
_PATH = re.compile(r"^(?P<reason>.*?)(?: - at `(?P<path>[^`]*)`)?$", re.DOTALL)

#: the longest message any stage decodes: Kafka's default ``max.message.bytes`` (1 MiB)
MAX_RECORD_BYTES: Final = 1 << 20
#: the deepest nesting of arrays and objects a message may have, unknown fields included. The
#: records themselves nest 4 levels at most; the rest is room for a newer producer's fields. Far
#: below the interpreter's recursion limit, so a message decodes or is refused the same way however
#: deep the call stack of the stage that reads it.
MAX_NESTING: Final = 64

#: keeps the quotes and brackets of a JSON text, every bracket as ``[`` or ``]``: the depth of a
#: text is that of its brackets whatever their kinds
_BRACKETS = bytes.maketrans(b"{}", b"[]"), bytes(b for b in range(256) if b not in b'[]{}"')


def json_limit_error(data: bytes | bytearray | memoryview | str, max_bytes: int = MAX_RECORD_BYTES,
                     max_nesting: int = MAX_NESTING) -> str | None:
    """Why the JSON text ``data`` is refused before it is parsed (longer than ``max_bytes``, or
    arrays and objects nested deeper than ``max_nesting``), or ``None`` when it is within both.

    The nesting is read without parsing and without recursion: a text with at most ``max_nesting``
    brackets is within it; otherwise its strings are taken out and the brackets left are paired,
    innermost first, one level a round. A text whose brackets do not pair is let through only when
    it cannot nest deeper than the bound either (the parser then names what is wrong with it)."""
    if len(data) > max_bytes:
        return f"the message is {len(data)} bytes, above the limit of {max_bytes}"
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    elif isinstance(data, memoryview):
        data = data.tobytes()
    if data.count(b"[") + data.count(b"{") <= max_nesting:
        return None
    if b"\\" in data:  # escaped backslashes, then escaped quotes: neither is a string's boundary
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = data.translate(*_BRACKETS)
    if b'"' in brackets:
        # a string without brackets is now an adjacent pair of quotes; when they all are, taking
        # the pairs out takes the strings out. Otherwise the strings are cut out one by one
        unquoted = brackets.replace(b'""', b"")
        brackets = unquoted if b'"' not in unquoted else b"".join(brackets.split(b'"')[::2])
    for level in range(max_nesting):
        inner = brackets.replace(b"[]", b"")  # one pass: the pairs innermost now, one level
        if not inner:
            return None
        if inner == brackets:  # brackets that do not pair: at most this deep
            if level + len(inner) <= max_nesting:
                return None
            return f"brackets do not pair, or nest deeper than {max_nesting} levels"
        brackets = inner
    return f"arrays and objects nest deeper than {max_nesting} levels"


class InvalidRecord(ValueError):
    """A message that does not match its schema. ``path`` names the field (``$`` = the message)."""

    def __init__(self, record_type: str, path: str, reason: str) -> None:
        self.record_type = record_type
        self.path = path
        self.reason = reason
        super().__init__(f"invalid {record_type}: {path}: {reason}")


def encode(record: Record) -> bytes:
    return _ENCODER.encode(record)


class RecordDecoder(Generic[R]):
    """Decodes and validates messages of one record type: :meth:`decode` returns the record or
    raises :class:`InvalidRecord`, for a message over :data:`MAX_RECORD_BYTES` or
    :data:`MAX_NESTING` as for one that does not match the schema."""

    __slots__ = ("_decode", "record_type")

    def __init__(self, record_type: type[R]) -> None:
        self.record_type = record_type
        self._decode = msgspec.json.Decoder(record_type).decode

    def decode(self, data: bytes | bytearray | memoryview | str) -> R:
        # the common case inline (a message with few brackets), the rest in json_limit_error
        if not (type(data) is bytes and len(data) <= MAX_RECORD_BYTES
                and data.count(b"[") + data.count(b"{") <= MAX_NESTING):
            refused = json_limit_error(data)
            if refused is not None:
                raise InvalidRecord(self.record_type.__name__, "$", f"refused: {refused}")
        try:
            return self._decode(data)
        except msgspec.ValidationError as exc:
            raise _invalid(self.record_type, exc) from None
        except msgspec.DecodeError as exc:
            raise InvalidRecord(self.record_type.__name__, "$", f"not valid JSON ({exc})") from None
        except RecursionError:  # pragma: no cover - the nesting limit comes first
            raise InvalidRecord(self.record_type.__name__, "$", "refused: nested too deeply") from None


_DECODERS: dict[type[Any], RecordDecoder[Any]] = {}


def decoder_for(record_type: type[R]) -> RecordDecoder[R]:
    dec = _DECODERS.get(record_type)
    if dec is None:
        dec = _DECODERS[record_type] = RecordDecoder(record_type)
    return dec


def decode(record_type: type[R], data: bytes | bytearray | memoryview | str) -> R:
    """Decode and validate one message, or raise :class:`InvalidRecord` naming field and reason."""
    return decoder_for(record_type).decode(data)


def convert(record_type: type[R], obj: Any) -> R:
    """Validate an already-parsed object (e.g. from YAML) into a record."""
    try:
        return msgspec.convert(obj, record_type)
    except msgspec.ValidationError as exc:
        raise _invalid(record_type, exc) from None


def to_builtins(record: Record) -> Any:
    return msgspec.to_builtins(record)


def _invalid(record_type: type[Any], exc: Exception) -> InvalidRecord:
    m = _PATH.match(str(exc))
    reason, path = (m.group("reason"), m.group("path")) if m else (str(exc), None)
    return InvalidRecord(record_type.__name__, path or "$", reason)


# --- audit --------------------------------------------------------------------------------------

NodeState = Literal["healthy", "suspect", "quarantined", "diagnosing", "repair_needed", "probation"]
AuditDecision = Literal[
    "incident",  # an incident opened or changed
    "command",  # commands issued on the job or node track
    "blocked",  # a node-track isolation refused by safety (then escalated)
    "escalated",  # handed to a human: breaker, budget, ladder exhausted, opted-out node, failed executor
    "skipped",  # nothing done on purpose: opt-out, someone else's cordon, a failure fleetmedic caused
    "state_change",  # a node's lifecycle moved
    "breaker_tripped",
    "breaker_resumed",
    "cleared",  # an operator cleared or repaired a node, or resumed the breaker
    "result",  # an executor's result changed what fleetmedic believes
    "repeat_placement",  # a job was placed on a node fleetmedic holds out of service
]


class BudgetSnapshot(Struct, frozen=True, kw_only=True):
    """The isolation budget when a decision was made."""

    held: Annotated[int, Meta(ge=0)]
    max_held: Annotated[int, Meta(ge=0)]
    new_in_window: Annotated[int, Meta(ge=0)]
    max_new_in_window: Annotated[int, Meta(ge=0)]
    fleet_size: Annotated[int, Meta(ge=0)]
    breaker_open: bool


class AuditRecord(Record, frozen=True, kw_only=True, tag="audit", tag_field="type"):
    """Why fleetmedic decided what it did: every incident, command, refusal, escalation and node
    lifecycle change, with the rule that matched and the budget at that moment."""

    id: Name
    ts: Timestamp
    decision: AuditDecision
    explanation: ShortText
    node: str = ""
    job: str = ""
    incident_id: str = ""
    incident_class: IncidentClass | None = None
    command_ids: list[str] = []
    rule: str = ""
    track: Track | None = None
    state_from: NodeState | None = None
    state_to: NodeState | None = None
    actor: str = "fleetmedic"
    budget: BudgetSnapshot | None = None
    dry_run: bool = False
