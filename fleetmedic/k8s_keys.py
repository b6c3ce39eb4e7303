"""Every key fleetmedic writes or reads on Kubernetes objects, in one place (pure; imports nothing).

One naming scheme: ``LABEL_*`` (label keys), ``ANNOTATION_*`` (annotation keys), ``TAINT_*`` (taint
keys), ``CONDITION_*`` (node condition types) and the ``*_COMPONENT`` names Events carry. Each name
spells its key, so ``grep`` finds both. Keys of others (``kubernetes.io/hostname``,
``kueue.x-k8s.io/queue-name``, ...) stay with the code that reads them. Where a setting names a key
(``executor.taint_key``, ``placement.rack_label``, ...), the constant here is its default.
"""

from __future__ import annotations

from typing import Final

# --- labels --------------------------------------------------------------------------------------

#: fleetmedic's lifecycle state of a node (``quarantined``, ``draining``, ``diagnosing``, ``validated``);
#: the default of ``executor.lifecycle_label``.
LABEL_STATE: Final = "fleetmedic.io/state"
#: ``"true"`` on a node or a workload: fleetmedic leaves it alone; the default of ``safety.opt_out_label``.
LABEL_OPT_OUT: Final = "fleetmedic.io/opt-out"
#: on fleetmedic's own pods (diagnostics, hooks): their role; a drain's "node busy" check skips them.
LABEL_ROLE: Final = "fleetmedic.io/role"
#: where a node sits in the fabric (the defaults of the ``triage`` and ``placement`` label settings).
LABEL_RACK: Final = "fleetmedic.io/rack"
LABEL_LEAF: Final = "fleetmedic.io/leaf"
LABEL_SPINE: Final = "fleetmedic.io/spine"
LABEL_NVLINK_DOMAIN: Final = "fleetmedic.io/nvlink-domain"
LABEL_POOL: Final = "fleetmedic.io/pool"
#: a warm-standby node (the key docs/placement.md suggests for ``placement.standby_label``).
LABEL_STANDBY: Final = "fleetmedic.io/standby"
#: ``rails.fleetmedic.io/<nic>: <leaf>``: the leaf switch each of a node's NICs is cabled to.
LABEL_RAIL_PREFIX: Final = "rails.fleetmedic.io/"
#: the dev fleet a kwok node belongs to (``fleetmedic.devenv``), used to clean it up.
LABEL_FLEET: Final = "fleetmedic.io/fleet"

# --- annotations: the executor's durable state on a Node (job-track ids on the ledger ConfigMap) ---

#: ``{command id: expires_at}`` of the commands applied here (a command seen again is a duplicate).
ANNOTATION_COMMANDS: Final = "fleetmedic.io/commands"
#: the long command (drain, diagnostics, hook) in progress, as JSON, so a restarted executor resumes it.
ANNOTATION_INFLIGHT: Final = "fleetmedic.io/inflight"
#: fleetmedic made this cordon / this taint: only these are ever lifted.
ANNOTATION_CORDONED_BY: Final = "fleetmedic.io/cordoned-by"
ANNOTATION_TAINTED_BY: Final = "fleetmedic.io/tainted-by"
#: why fleetmedic last changed the node.
ANNOTATION_REASON: Final = "fleetmedic.io/reason"
#: drain progress (command, start, evicted pods, state).
ANNOTATION_DRAIN: Final = "fleetmedic.io/drain"
#: the diagnostics Job and its verdict (``running``, ``pass``, ``fail``).
ANNOTATION_DIAGNOSTICS: Final = "fleetmedic.io/diagnostics"
#: a hook Job (reset_gpu, reboot_node, escalate) in progress.
ANNOTATION_HOOK: Final = "fleetmedic.io/hook"
#: the last escalation.
ANNOTATION_ESCALATION: Final = "fleetmedic.io/escalation"

# --- annotations: on the diagnostics Job and its pod --------------------------------------------

#: the node the diagnostics run on.
ANNOTATION_NODE: Final = "fleetmedic.io/node"
#: the id of the command that created the Job.
ANNOTATION_COMMAND: Final = "fleetmedic.io/command"

# --- annotations: on a restarted workload (Job, PyTorchJob, JobSet, Kueue Workload) ----------------

#: the last restart as JSON (when, action, by, command, excluded nodes, attempt).
ANNOTATION_LAST_RESTART: Final = "fleetmedic.io/last-restart"
#: how many restarts fleetmedic made (the job watcher reads it as the attempt count).
ANNOTATION_RESTART_ATTEMPTS: Final = "fleetmedic.io/restart-attempts"
#: the id of the command behind the last restart.
ANNOTATION_LAST_COMMAND: Final = "fleetmedic.io/last-command"
#: the nodes fleetmedic keeps the pods off (``hostname NotIn``), comma-separated.
ANNOTATION_EXCLUDED_NODES: Final = "fleetmedic.io/excluded-nodes"
#: the nodes fleetmedic's ``retry_in_place`` preference names, comma-separated.
ANNOTATION_IN_PLACE_NODES: Final = "fleetmedic.io/in-place-nodes"
#: fleetmedic suspended (or deactivated) the workload for a restart not finished yet.
ANNOTATION_RESTART_IN_PROGRESS: Final = "fleetmedic.io/restart-in-progress"
#: what the topology-aware placement added (preferences, tolerations, domain), as JSON.
ANNOTATION_PLACEMENT: Final = "fleetmedic.io/placement"

# --- annotations: dev services ----------------------------------------------------------------------

#: ``"true"`` on a pod of a kwok node: the dev cluster's kwok Stage completes it (``fleetmedic.devenv``).
ANNOTATION_KWOK_COMPLETE: Final = "fleetmedic.io/kwok-complete"

# --- taints and conditions ------------------------------------------------------------------------

#: fleetmedic's quarantine taint; the default of ``executor.taint_key``.
TAINT_QUARANTINE: Final = "fleetmedic.io/quarantine"
#: the warm-standby pool's taint; the default of ``placement.standby_taint_key``.
TAINT_STANDBY: Final = "fleetmedic.io/standby"
#: the node condition that explains a quarantine in ``kubectl describe node``.
CONDITION_QUARANTINE: Final = "FleetmedicQuarantine"
#: per-class node conditions the executor sets (``True``) when it isolates a node, from the incident's
#: class, and clears (``False``) when the node returns to service (docs/executor.md): a hardware fault
#: (a GPU's XID, ECC, a lost GPU; also the node's NVSwitches and PCIe devices), a degradation, a
#: network fault, and a node isolated for another class (repeated failures of unknown cause).
CONDITION_GPU_HARDWARE: Final = "fleetmedic.io/GPUHardware"
CONDITION_GPU_DEGRADED: Final = "fleetmedic.io/GPUDegraded"
CONDITION_NETWORK: Final = "fleetmedic.io/Network"
CONDITION_SUSPECT: Final = "fleetmedic.io/Suspect"
#: set when fleetmedic's diagnostics fail on the node, cleared when they pass or it returns to service.
CONDITION_DIAGNOSTICS_FAILED: Final = "fleetmedic.io/DiagnosticsFailed"

# --- Event components -----------------------------------------------------------------------------

#: ``source.component`` of fleetmedic's Events (and ``reportingComponent`` of those on Nodes).
SOURCE_COMPONENT: Final = "fleetmedic-executor"
#: ``reportingComponent`` of fleetmedic's Events on workloads.
REPORTING_COMPONENT: Final = "fleetmedic.io/executor"
