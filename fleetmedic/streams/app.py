"""The Faust app and the topics it needs, built from :class:`~fleetmedic.config.Settings`.

- :func:`build_app`: broker from ``kafka.bootstrap_servers``, app id (= consumer group)
  ``kafka.consumer_group``, in-memory store, web server off (and bound to 127.0.0.1 should anyone
  turn it on). Topic values are raw bytes: :mod:`fleetmedic.records` decodes and validates them,
  so an invalid message reaches our code and the dead-letter topic instead of faust's logs.
- :func:`ensure_topics`: creates every topic of :data:`fleetmedic.bus.TOPICS` that is missing,
  with its partition count (compacted where the table says so: ``cluster.nodes``), plus the
  pipeline's own: the compacted engine-state and stage-1 state topics, the decision stage's
  fleet-inputs topic and its tick log (named in :mod:`fleetmedic.bus`); faust itself creates only its
  internal topics and ignores a source topic that is missing when it subscribes
  (docs/development.md). Each with ``topics.replication_factor`` replicas and ``min.insync.replicas``
  from ``topics.min_insync_replicas`` (3 and 2 on a production cluster: with ``acks=all`` one
  broker may be lost without losing a write). Idempotent: existing topics are left as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import faust
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code

from fleetmedic.bus import (
    MAX_STATE_BYTES,
    TOPICS,
    client_options,
    detect_state_topic,
    faust_options,
    partitions_of,
    state_topic,
    summaries_topic,
    ticks_topic,
)
from fleetmedic.config import Settings

log = logging.getLogger(__name__)


def build_app(settings: Settings, *, datadir: str, app_id: str | None = None, **overrides: Any) -> faust.App:
    """A Faust app; ``app_id`` (the consumer group) defaults to ``kafka.consumer_group``."""
    k = settings.kafka
    conf: dict[str, Any] = dict(
        broker=f"kafka://{k.bootstrap_servers}",
        store="memory://",
        datadir=datadir,
        topic_partitions=settings.topics.default_partitions,
        topic_replication_factor=settings.topics.replication_factor,
        web_enabled=False,
        web_bind="127.0.0.1",
        **faust_options(k),
    )
    if k.security_protocol != "PLAINTEXT":
        conf["broker_credentials"] = _credentials(settings)
    conf.update(overrides)
    return faust.App(app_id or k.consumer_group, **conf)


def _credentials(settings: Settings) -> Any:
    k = settings.kafka
    opts = client_options(settings.kafka)
    if k.security_protocol.startswith("SASL"):
        return faust.SASLCredentials(username=k.sasl_username, password=opts["sasl_plain_password"],
                                     mechanism=k.sasl_mechanism, ssl_context=opts.get("ssl_context"))
    return faust.SSLCredentials(opts["ssl_context"])


def _raise_creation_errors(response: Any) -> None:
    """The broker answers CreateTopics per topic, and aiokafka raises none of those errors: the first
    other than "already exists" (a replication factor above the brokers, an ACL) is raised here."""
    for err in response.to_object().get("topic_errors", []):
        kind = for_code(err["error_code"])
        if err["error_code"] and kind is not TopicAlreadyExistsError:
            raise kind(f"creating topic {err['topic']}: {err.get('error_message') or kind.__name__}")


async def ensure_topics(settings: Settings, timeout: float = 30.0) -> list[str]:
    """Create the missing topics, with ``topics.replication_factor`` and ``min.insync.replicas``
    (``topics.min_insync_replicas``); return the names created. A topic the broker refuses raises
    its error (:mod:`aiokafka.errors`); a replication factor below the cluster's size (up to 3) is
    logged as a warning."""
    rf = settings.topics.replication_factor
    wanted = [NewTopic(settings.topics.topic(t.name), num_partitions=partitions_of(settings, t.name),
                       replication_factor=rf, topic_configs={"cleanup.policy": "compact"} if t.compacted else {})
              for t in TOPICS]
    wanted.append(NewTopic(state_topic(settings), num_partitions=1, replication_factor=rf,
                           topic_configs={"cleanup.policy": "compact", "max.message.bytes": str(MAX_STATE_BYTES)}))
    # the multivariate model's rows of a partition's nodes are one record: up to max_training_windows x 44 B x 2
    wanted.append(NewTopic(detect_state_topic(settings), num_partitions=partitions_of(settings, "telemetry.gpu"),
                           replication_factor=rf, topic_configs={"cleanup.policy": "compact",
                                                                 "max.message.bytes": str(MAX_STATE_BYTES)}))
    wanted.append(NewTopic(summaries_topic(settings), num_partitions=1, replication_factor=rf,
                           topic_configs={"retention.ms": str(6 * 3600 * 1000)}))
    # read back from the latest snapshot on (every engine_snapshot_every_s): a week is plenty
    wanted.append(NewTopic(ticks_topic(settings), num_partitions=1, replication_factor=rf,
                           topic_configs={"retention.ms": str(7 * 24 * 3600 * 1000)}))
    for t in wanted:  # with acks=all a write needs this many replicas: one broker may go, no write is lost
        t.topic_configs["min.insync.replicas"] = str(settings.topics.min_isr)
    admin = AIOKafkaAdminClient(**client_options(settings.kafka), request_timeout_ms=int(timeout * 1000))
    await admin.start()
    try:
        brokers = len((await admin.describe_cluster())["brokers"])
        if rf < min(3, brokers):
            log.warning("topics.replication_factor is %d on a cluster of %d brokers: losing one broker loses "
                        "the data of the partitions it holds; 3 is the production setting", rf, brokers)
        existing = set(await admin.list_topics())
        missing = [t for t in wanted if t.name not in existing]
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):  # another worker won the race
                _raise_creation_errors(await admin.create_topics(missing))
        # the broker answers before every partition has a leader; wait until metadata shows them
        deadline = asyncio.get_running_loop().time() + timeout
        names = [t.name for t in wanted]
        while True:
            desc = await admin.describe_topics(names)
            ready = all(d.get("error_code", 0) == 0 and d.get("partitions")
                        and all(p.get("leader", -1) >= 0 for p in d["partitions"]) for d in desc)
            if ready or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.2)
        return [t.name for t in missing]
    finally:
        await admin.close()
