"""``fleetmedic exporter kmsg``: this node's kernel log -> kernel events and NIC port state on Kafka.

Runs on every GPU node (a DaemonSet, docs/connectors.md). Reads the kernel log from ``/dev/kmsg``
(default) or from the journal (``--source journal``: ``journalctl -k -o json --follow``), or a
recorded log (``--input FILE``: ``cat /dev/kmsg`` records, ``journalctl -o json`` lines or plain
``dmesg`` lines), classifies each message with the log pattern library and publishes
(:mod:`fleetmedic.connectors.kernel.kmsg_map`) every device fault as a ``KernelEvent`` on
``kernel.events`` keyed by the node: XIDs with their GPU index (from the PCI address, through NVML
or ``--pci-map``), SXids with their NVSwitch, PCIe AER errors with the GPU or NIC port at that
address, machine checks, EDAC, GSP and mlx5 errors; and mlx5 port state as ``PortTelemetry``.
Classified lines that are not a device fault (a symptom, a software line) are counted per signal
(``fleetmedic_connector_skipped_total{reason="<signal> (<class>): not a device fault"}``); faults
are logged, rate-limited.

- **Resuming.** The position handled last (the kmsg sequence number with the boot id, or the
  journal cursor) is written to ``--state-file`` once every record read before it has left the
  outbox (sent, or dropped and counted), at most once a second and on stopping; a restart skips
  what it had handled, so nothing is reported twice (a crash may repeat at most the last second).
  After a reboot (another boot id) every record of the new boot is new. With no state at all (a
  first start on a running node), records older than ``--backlog-max-age`` are skipped.
- **Overruns.** When the kernel overwrote records before they were read, the read fails with EPIPE
  and continues at the oldest record left; the gap in sequence numbers is counted
  (``reason="kmsg: records lost ..."``), and reading goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.connectors.errors import SourceUnavailable
from fleetmedic.connectors.kernel.kmsg_map import (
    BadRecord,
    KernelEvent,
    KernelRecord,
    KmsgMapper,
    Mapped,
    RecordReader,
    SequenceTracker,
    parse_journal,
    parse_kmsg,
    parse_pci_map,
    pci_key,
)
from fleetmedic.connectors.nvml.exporter import node_name, read_boot_id
from fleetmedic.connectors.runtime import ConnectorMetrics, Outbox, Outgoing, sleep_or_stop, telemetry_outgoing
from fleetmedic.remediation.log_patterns import PatternError, load_library

log = logging.getLogger("fleetmedic.connectors.kmsg")

READ_SIZE = 16384  # a /dev/kmsg record is at most 8 KiB (CONSOLE_EXT_LOG_MAX); a smaller buffer is EINVAL
BATCH = 1000
LOG_PER_SIGNAL_PER_MINUTE = 5


@dataclass
class KmsgOptions:
    """The exporter's settings (``fleetmedic exporter kmsg --help``)."""

    source: str = "kmsg"  # kmsg | journal
    device: str = "/dev/kmsg"
    input: str = ""  # a recorded log instead of the live one
    state_file: str = ""
    node: str = ""
    pci_map: str = ""
    use_nvml: bool = True
    patterns: str = ""
    backlog_max_age_s: float = 3600.0
    xid_window_s: float = 30.0
    boot_time: float | None = None  # for kmsg records of a recorded log: when that boot started
    journal_command: list[str] = field(default_factory=lambda: ["journalctl", "-k", "-o", "json", "--follow"])
    checkpoint_s: float = 1.0
    poll_s: float = 1.0


DEFAULT_STATE_FILE = "/var/lib/fleetmedic/kmsg-state.json"


def kmsg_options(args: Any) -> KmsgOptions:
    """Options from ``fleetmedic exporter kmsg``'s arguments (an argparse namespace; ``None``: the
    defaults). The state file defaults to :data:`DEFAULT_STATE_FILE` for the live log, none for
    ``--input``."""
    if args is None:
        return KmsgOptions(state_file=DEFAULT_STATE_FILE)
    inp = getattr(args, "input", "") or ""
    state = getattr(args, "state_file", None)
    return KmsgOptions(
        source=getattr(args, "source", "kmsg"), device=getattr(args, "device", "/dev/kmsg"), input=inp,
        state_file=state if state is not None else ("" if inp else DEFAULT_STATE_FILE),
        node=getattr(args, "node", ""), pci_map=getattr(args, "pci_map", ""),
        use_nvml=not getattr(args, "no_nvml", False), patterns=getattr(args, "patterns", ""),
        backlog_max_age_s=getattr(args, "backlog_max_age", 3600.0), xid_window_s=getattr(args, "xid_window", 30.0),
        boot_time=getattr(args, "boot_time", None))


class KmsgReader(Protocol):
    def read(self) -> bytes | None: ...

    def fileno(self) -> int | None: ...

    def close(self) -> None: ...


class KmsgDevice:
    """``/dev/kmsg`` opened non-blocking: :meth:`read` returns one record, ``None`` when there is
    none yet, and raises :class:`BrokenPipeError` when records were overwritten before being read
    (the next read returns the oldest record left)."""

    def __init__(self, path: str) -> None:
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except PermissionError:
            raise SourceUnavailable(
                f"{path}: permission denied. Reading the kernel log needs CAP_SYSLOG when "
                "kernel.dmesg_restrict=1 (or root); see docs/connectors.md for the DaemonSet") from None
        except FileNotFoundError:
            raise SourceUnavailable(f"{path} not found: mount the host's /dev/kmsg (hostPath, read-only)") from None

    def read(self) -> bytes | None:
        try:
            return os.read(self._fd, READ_SIZE)
        except BlockingIOError:
            return None

    def fileno(self) -> int | None:
        return self._fd

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def host_boot_time() -> float:
    """Unix time of this boot, as /dev/kmsg's timestamps count from it (CLOCK_MONOTONIC)."""
    return time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)


def gpu_map_from_nvml(nvml: Any) -> dict[str, int]:
    """PCI address -> GPU index of this node's GPUs, through the NVML seam (a lost GPU has no PCI info
    and is left out)."""
    from fleetmedic.connectors.nvml.seam import NvmlSeam

    seam = NvmlSeam(nvml)
    seam.init()
    try:
        handles, _ = seam.handles()
        out: dict[str, int] = {}
        for index, handle in handles:
            try:
                bus = nvml.nvmlDeviceGetPciInfo(handle).busId
            except Exception:  # a lost GPU, an old driver: that GPU is not mapped
                continue
            key = pci_key(bus.decode() if isinstance(bus, bytes) else str(bus))
            if key:
                out[key] = index
        return out
    finally:
        seam.shutdown()


def nic_map_from_sysfs(root: str = "/sys") -> dict[str, str]:
    """A NIC's PCI address -> ``<hca>/1`` (``mlx5_0/1``), as the port connectors name its port."""
    out: dict[str, str] = {}
    base = Path(root) / "class" / "infiniband"
    with contextlib.suppress(OSError):
        for hca in sorted(base.iterdir()):
            with contextlib.suppress(OSError):
                pci = Path(os.path.realpath(hca / "device")).name.lower()
                ports = sorted(p.name for p in (hca / "ports").iterdir() if p.name.isdigit())
                out[pci] = f"{hca.name}/{ports[0] if ports else 1}"
    return out


def load_state(path: str) -> dict[str, Any]:
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("state file %s unreadable (%s): starting without it", path, exc)
        return {}
    return doc if isinstance(doc, dict) else {}


def save_state(path: str, doc: dict[str, Any]) -> None:
    """Atomically: a crash leaves the old state or the new one, never half of one."""
    tmp = f"{path}.tmp"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class _Limiter:
    """At most ``n`` log lines per key per minute."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._seen: dict[str, deque[float]] = {}

    def allow(self, key: str, now: float) -> bool:
        q = self._seen.setdefault(key, deque())
        while q and now - q[0] > 60.0:
            q.popleft()
        if len(q) >= self.n:
            return False
        q.append(now)
        return True


class KmsgSource:
    """The reading loop (see the module docstring). ``open_device`` opens the kmsg device (tests
    pass a fake with the same ``read``/``fileno``/``close``); ``nvml`` is the pynvml module, or
    ``None`` to import it when ``use_nvml``; ``nics``: the NIC map (default: from /sys)."""

    def __init__(self, settings: Settings, outbox: Outbox, metrics: ConnectorMetrics, options: KmsgOptions,
                 clock: Callable[[], float] = time.time, open_device: Callable[[str], KmsgReader] = KmsgDevice,
                 nvml: Any = None, nics: dict[str, str] | None = None) -> None:
        self.settings = settings
        self.outbox = outbox
        self.metrics = metrics
        self.opt = options
        self.clock = clock
        self.open_device = open_device
        if options.source not in ("kmsg", "journal"):
            raise ValueError(f"--source: must be kmsg or journal, got {options.source!r}")
        try:
            library = load_library(options.patterns)
        except PatternError as exc:
            raise ValueError(str(exc)) from None
        self.node = node_name(options.node)
        self.boot_id = "" if options.input else read_boot_id()
        if nics is None:
            nics = {} if options.input else nic_map_from_sysfs()
        kind = "file" if options.input else options.source
        self.mapper = KmsgMapper(self.node, library, self._gpu_map(nvml), nics, self.boot_id, options.xid_window_s,
                                 source=kind, coalesce_s=settings.exporters.kmsg.coalesce_s)
        state = load_state(options.state_file)
        same_boot = not state.get("boot_id") or not self.boot_id or state.get("boot_id") == self.boot_id
        resumed = state.get("source") == kind and same_boot
        self.first_start = not state
        self.tracker = SequenceTracker(int(state["seq"]) if resumed and isinstance(state.get("seq"), int) else None)
        self.cursor: str = str(state.get("cursor") or "") if resumed else ""
        if resumed and isinstance(state.get("xids"), list):
            self.mapper.joiner.restore(state["xids"])
        if state and not resumed:
            log.info("state file %s is from another %s: reading this one from its start", options.state_file,
                     "boot" if not same_boot else "source")
        self._kind = kind
        self._resumed_gap_pending = self.tracker.last is not None
        self._read_pos: dict[str, Any] = self._position()
        # records sent to the outbox, with the position before the records they came from
        self._batches: deque[tuple[dict[str, Any], list[Outgoing]]] = deque()
        self._saved: dict[str, Any] | None = None
        self._last_checkpoint = 0.0
        self._limiter = _Limiter(LOG_PER_SIGNAL_PER_MINUTE)
        self.events = 0

    # --- setup ------------------------------------------------------------------------------------

    def _gpu_map(self, nvml: Any) -> dict[str, int]:
        if self.opt.pci_map:
            try:
                with open(self.opt.pci_map, encoding="utf-8") as fh:
                    return parse_pci_map(fh.read())
            except OSError as exc:
                raise ValueError(f"--pci-map {self.opt.pci_map}: cannot read: {exc.strerror}") from None
            except ValueError as exc:
                raise ValueError(f"--pci-map {self.opt.pci_map}: {exc}") from None
        if not self.opt.use_nvml or self.opt.input:
            return {}
        try:
            if nvml is None:
                from fleetmedic.connectors.nvml.exporter import import_pynvml

                nvml = import_pynvml()
            gpus = gpu_map_from_nvml(nvml)
        except SourceUnavailable as exc:
            log.warning("no GPU map from NVML (%s): XIDs are published with their PCI address and no GPU index; "
                        "give --pci-map to map PCI addresses to GPU indices", exc)
            return {}
        log.info("GPU map from NVML: %s", gpus)
        return gpus

    # --- running ----------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        if not self.mapper.gpus:
            log.warning("%s: no GPU map (NVML or --pci-map): XIDs are published with their PCI address and no GPU "
                        "index", self.node)
        try:
            if self.opt.input:
                await self._run_file(stop)
            elif self.opt.source == "journal":
                await self._run_journal(stop)
            else:
                await self._run_kmsg(stop)
        finally:
            await self._emit(self.mapper.due(self.clock(), flush=True), None)
            await self._drained(self.settings.exporters.drain_timeout_s)
            self.checkpoint(force=True)

    async def _run_file(self, stop: asyncio.Event) -> None:
        boot_time = self.opt.boot_time if self.opt.boot_time is not None else host_boot_time()
        reader = RecordReader(boot_time)
        batch: list[KernelRecord] = []
        with open(self.opt.input, encoding="utf-8", errors="replace") as fh:
            for item in reader.read_all(fh):
                if stop.is_set():
                    return
                if isinstance(item, BadRecord):
                    self.metrics.skipped(str(item))
                    continue
                batch.append(item)
                if len(batch) >= BATCH:
                    await self.handle(batch)
                    batch = []
        await self.handle(batch)

    async def _run_kmsg(self, stop: asyncio.Event) -> None:
        dev = await asyncio.to_thread(self.open_device, self.opt.device)
        readable = asyncio.Event()
        loop = asyncio.get_running_loop()
        fd = dev.fileno()
        watching = False
        if fd is not None:
            try:
                loop.add_reader(fd, readable.set)
                watching = True
            except (OSError, ValueError, NotImplementedError):
                watching = False  # not pollable: read every poll_s
        log.info("reading %s on %s (resuming after seq %s)", self.opt.device, self.node, self.tracker.last)
        boot_time = host_boot_time() if self.opt.boot_time is None else self.opt.boot_time
        try:
            while not stop.is_set():
                readable.clear()
                batch = self._read_available(dev, boot_time)
                if batch:
                    await self.handle(batch)
                    if len(batch) >= BATCH:
                        continue
                await self._emit(self.mapper.due(self.clock()), None)
                self.checkpoint()
                if watching:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(_first(readable, stop), self.opt.poll_s)
                elif await sleep_or_stop(stop, self.opt.poll_s):
                    break
        finally:
            if watching and fd is not None:
                loop.remove_reader(fd)
            dev.close()

    def _read_available(self, dev: KmsgReader, boot_time: float) -> list[KernelRecord]:
        batch: list[KernelRecord] = []
        while len(batch) < BATCH:
            try:
                raw = dev.read()
            except BrokenPipeError:  # overwritten before read: the next read goes on; seq counts the gap
                self.metrics.error("kmsg_overrun")
                continue
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    break
                self.metrics.error(f"kmsg_read_{errno.errorcode.get(exc.errno or 0, 'error')}")
                log.warning("reading %s failed: %s", self.opt.device, exc)
                break
            if raw is None:
                break
            try:
                batch.append(parse_kmsg(raw, boot_time))
            except BadRecord as exc:
                self.metrics.skipped(str(exc))
        return batch

    async def _run_journal(self, stop: asyncio.Event) -> None:
        e = self.settings.exporters
        delay = e.reconnect_min_s
        while not stop.is_set():
            argv = [*self.opt.journal_command, f"--after-cursor={self.cursor}" if self.cursor else "--lines=all"]
            try:
                proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                            stderr=asyncio.subprocess.DEVNULL)
            except FileNotFoundError:
                raise SourceUnavailable(f"{argv[0]} not found: --source journal needs journalctl and the host's "
                                        "journal (/var/log/journal, /run/log/journal) mounted") from None
            assert proc.stdout is not None
            try:
                await self._read_journal(proc.stdout, stop)
            finally:
                if proc.returncode is None:
                    proc.terminate()
                    with contextlib.suppress(ProcessLookupError):
                        await asyncio.wait_for(proc.wait(), 5.0)
            if stop.is_set():
                return
            self.metrics.error("journalctl_exit")
            log.warning("journalctl exited (%s); restarting in %.1fs", proc.returncode, delay)
            if await sleep_or_stop(stop, delay):
                return
            delay = min(e.reconnect_max_s, delay * 2)

    async def _read_journal(self, stdout: asyncio.StreamReader, stop: asyncio.Event) -> None:
        batch: list[KernelRecord] = []
        while not stop.is_set():
            try:
                line = await asyncio.wait_for(stdout.readline(), self.opt.poll_s if not batch else 0.05)
            except TimeoutError:
                line = None
            if line == b"":  # journalctl exited
                break
            if line:
                try:
                    batch.append(parse_journal(line))
                except BadRecord as exc:
                    self.metrics.skipped(str(exc))
                if len(batch) < BATCH:
                    continue
            if batch:
                await self.handle(batch)
                batch = []
            await self._emit(self.mapper.due(self.clock()), None)
            self.checkpoint()
        if batch:
            await self.handle(batch)

    # --- handling ---------------------------------------------------------------------------------

    async def handle(self, recs: Iterable[KernelRecord]) -> None:
        """Skip what was handled before, count gaps, classify, publish; then the read position moves."""
        now = self.clock()
        fresh: list[KernelRecord] = []
        old = 0
        for rec in recs:
            if rec.seq is not None:
                new, lost = self.tracker.accept(rec.seq)
                if not new:
                    continue
                if lost:
                    why = "while the exporter was stopped" if self._resumed_gap_pending else "ring buffer overrun"
                    self.metrics.skipped(f"kmsg: records lost ({why})", lost)
                    log.warning("%d kernel log records lost (%s) before seq %d", lost, why, rec.seq)
                self._resumed_gap_pending = False
            if rec.cursor:
                self.cursor = rec.cursor
            if (self.first_start and rec.ts is not None and not self.opt.input
                    and now - rec.ts > self.opt.backlog_max_age_s):
                old += 1
                continue
            fresh.append(rec)
        if old:
            self.metrics.skipped("kmsg: older than --backlog-max-age at first start", old)
        before = self._read_pos
        self._read_pos = self._position()
        await self._emit(self.mapper.map(fresh, now), before)

    async def _emit(self, mapped: Mapped, before: dict[str, Any] | None) -> None:
        """Publish ``mapped``; ``before``: the read position before the records it came from (None:
        from the sequence numbers it carries, for the XIDs the joiner held)."""
        for reason, n in mapped.unpublished.items():
            self.metrics.skipped(reason, n)
        for ev in mapped.events:
            self._log_event(ev)
        self.events += len(mapped.events)
        items = [Outgoing(self.settings.topics.topic("kernel.events"), rec.node, rec) if isinstance(rec, r.KernelEvent)
                 else telemetry_outgoing(rec, self.settings) for rec in mapped.records]
        for item in items:
            await self.outbox.put(item)
        if items:
            if mapped.first_seq is not None and (before is None or "cursor" not in before):
                before = {**self._read_pos, "seq": mapped.first_seq - 1}
            self._batches.append((dict(before if before is not None else self._read_pos), items))

    def _log_event(self, ev: KernelEvent) -> None:
        if ev.incident_class not in ("hardware", "network", "degradation"):
            return
        if not self._limiter.allow(ev.signal, self.clock()):
            return
        where = f"GPU {ev.gpu}" if ev.gpu is not None else ev.pci or ev.device or "node"
        level = logging.WARNING if ev.severity == "critical" else logging.INFO
        log.log(level, "%s: %s %s on %s: %s", self.node, ev.incident_class, ev.signal, where, ev.message[:300])

    # --- the state file ---------------------------------------------------------------------------

    def _position(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"version": 1, "source": self._kind, "boot_id": self.boot_id}
        if self.tracker.last is not None:
            doc["seq"] = self.tracker.last
        if self.cursor:
            doc["cursor"] = self.cursor
        return doc

    def safe_position(self) -> dict[str, Any]:
        """The position up to which every record has been dealt with: its records left the outbox
        (sent, or dropped and counted) and no XID of it waits in the joiner."""
        present = {id(o) for o in self.outbox.peek(len(self.outbox))}
        self._batches = deque(b for b in self._batches if any(id(o) in present for o in b[1]))
        pos = self._read_pos
        if self._batches:
            befores = [b[0] for b in self._batches]
            seqs = [p for p in befores if "seq" in p]
            pos = min(seqs, key=lambda p: int(p["seq"])) if len(seqs) == len(befores) else befores[0]
        held = self.mapper.joiner.earliest_seq()
        if held is not None and "seq" in pos and held - 1 < pos["seq"]:
            pos = {**pos, "seq": held - 1}
        return {**pos, "xids": self.mapper.joiner.recent()}

    def checkpoint(self, force: bool = False) -> None:
        if not self.opt.state_file:
            return
        now = time.monotonic()
        if not force and now - self._last_checkpoint < self.opt.checkpoint_s:
            return
        self._last_checkpoint = now
        pos = self.safe_position()
        if pos == self._saved or ("seq" not in pos and "cursor" not in pos):
            return
        try:
            save_state(self.opt.state_file, pos)
        except OSError as exc:
            self.metrics.error("state_write")
            log.warning("cannot write state file %s: %s", self.opt.state_file, exc)
            return
        self._saved = dict(pos)
        self.first_start = False

    async def _drained(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self._batches and time.monotonic() < deadline:
            self.safe_position()
            if not self._batches:
                break
            await asyncio.sleep(0.05)


async def _first(*events: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()

