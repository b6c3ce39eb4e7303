"""The fault library: what each fault does to the fleet, its jobs and its telemetry, and its truth.

A fault is a small object with an onset, a natural end and a target (a GPU, a node, a NIC, a leaf
switch or a job). While active it

- changes the physics of its slice through the telemetry hooks (``gpu_pre``/``gpu_post``,
  ``port_pre``/``port_post``: extra heat, clock multipliers, throttle reasons, counters that climb,
  a GPU that stops answering, a link that goes down, a switch that goes silent),
- slows ranks or links (``slow``: a rank's compute multiplier, a node's communication multiplier),
- emits XID events as the driver would, and
- strikes jobs: a *crash* (the failing rank exits; other ranks see NCCL errors) or a *hang*
  (a collective never completes; every rank aborts when the NCCL watchdog fires after
  ``nccl_timeout_s``). Persistent hardware faults also strike every later attempt placed on the
  node (the repeat failure a missing cordon causes).

Each kind (:data:`KINDS`) declares its class, component, expected response, the remediation that
clears it (``remedy``: ``reset_gpu`` < ``reboot`` < ``repair``; ``switch_repair`` and ``none``
cannot be cleared by a node command), its natural duration, how likely diagnostics are to catch it
and the symptoms it claims (checked by the tests). ``xid<N>`` for any code not listed picks its
behaviour from the XID bucket: isolating buckets crash the job like a hard fault, others are
negative controls.

The package's rooms: :mod:`~fleetmedic.sim.faults.base` (:class:`Fault`, :class:`FaultHost`,
:class:`KindInfo`), the kinds by family (:mod:`~fleetmedic.sim.faults.gpu`,
:mod:`~fleetmedic.sim.faults.network`, :mod:`~fleetmedic.sim.faults.node`,
:mod:`~fleetmedic.sim.faults.jobs`, :mod:`~fleetmedic.sim.faults.controls`) and
:mod:`~fleetmedic.sim.faults.registry` (:data:`KINDS`, :func:`make_fault`, :class:`FaultSet`).
"""

from fleetmedic.sim.faults.base import REMEDY_LEVEL, Fault, FaultHost, KindInfo
from fleetmedic.sim.faults.registry import KINDS, FaultSet, kind_info, leaves_node_dead, make_fault

__all__ = ["KINDS", "REMEDY_LEVEL", "Fault", "FaultHost", "FaultSet", "KindInfo", "kind_info", "leaves_node_dead",
           "make_fault"]
