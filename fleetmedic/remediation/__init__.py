"""fleetmedic.remediation: the decision side — triage, policy, node lifecycle, safety, accounting.

Pure (no I/O, no clock): :class:`~fleetmedic.remediation.engine.DecisionEngine` takes findings, job
events, executor results and node observations with ``now`` and returns incidents, remediation
commands and audit records.

===================  ========================================================================
module               what it decides
===================  ========================================================================
``topology``         where a node sits: rack, leaf switch(es) per rail, pool
``log_patterns``     what a job-failure log line shows (library: ``data/log_patterns.yaml``)
``triage``           is it the node, the link, or the job: findings x failures -> incidents
``policy``           which ordered actions each track takes (rules from the config)
``lifecycle``        the per-node escalation state machine, from suspect to probation
``safety``           budgets, rate and topology limits, cooldowns, circuit breaker
``accounting``       failures with their own denominators, node-time, the MTTR split
``engine``           all of the above behind one object: finding -> incident -> decision -> command
``engine_state``     the engine's values and its whole state, serialised to bytes (msgpack)
``job_track``        the engine's job steps: restart, retry in place after a backoff, escalate
``node_track``       the engine's node steps: isolation through the safety gate, the lifecycle plan
``incident_tracks``  what an acted-on incident still waits for, its status and publication
``issuer``           audit records and commands with deterministic ids, each issued once
``operator``         signed operator commands (clear, repaired, resume the breaker) applied
===================  ========================================================================
"""
