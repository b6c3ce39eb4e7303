"""The Kafka connection, the topics, and the keys that sign what travels on them."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from fleetmedic.bus import BY_NAME, DEFAULT_PREFIX
from fleetmedic.config.section import PosFloat, PosInt, Section


class KafkaSettings(Section, frozen=True, kw_only=True):
    bootstrap_servers: str = "127.0.0.1:19092"
    client_id: str = "fleetmedic"
    consumer_group: str = "fleetmedic"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str = ""
    sasl_password_env: str = ""
    sasl_password_file: str = ""
    ssl_cafile: str = ""
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    ssl_check_hostname: bool = True
    acks: Literal["all", "1", "0"] = "all"
    request_timeout_s: PosFloat = 30.0
    # every client refreshes its cluster metadata this often (aiokafka's default is 5 min): a client
    # that keeps asking a partition's old leader learns the new one within this
    metadata_max_age_ms: Annotated[int, Meta(ge=1000, le=3_600_000)] = 30_000

    def __post_init__(self) -> None:
        if self.security_protocol.startswith("SASL") and self.sasl_mechanism is None:
            raise ValueError("`sasl_mechanism` is required when `security_protocol` is SASL_*")


class TopicSettings(Section, frozen=True, kw_only=True):
    prefix: str = DEFAULT_PREFIX
    names: dict[str, str] = {}
    partitions: dict[str, PosInt] = {}
    default_partitions: PosInt = 12
    replication_factor: Annotated[int, Meta(ge=1, le=15)] = 1  # 3 on a production cluster
    # min.insync.replicas of the topics fleetmedic creates: with acks=all a write needs this many
    # replicas; 0: replication_factor - 1, at most 2, at least 1 (3 -> 2: one broker may be lost)
    min_insync_replicas: Annotated[int, Meta(ge=0, le=15)] = 0

    def __post_init__(self) -> None:
        for table in (self.names, self.partitions):
            for key in table:
                if key not in BY_NAME:
                    known = ", ".join(sorted(BY_NAME))
                    raise ValueError(f"unknown topic `{key}` (known: {known})")
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError(f"`min_insync_replicas` ({self.min_insync_replicas}) exceeds `replication_factor` "
                             f"({self.replication_factor}): no write with acks=all could succeed")

    @property
    def min_isr(self) -> int:
        """The ``min.insync.replicas`` topics are created with (``min_insync_replicas``, or derived)."""
        return self.min_insync_replicas or max(1, min(2, self.replication_factor - 1))

    def topic(self, name: str) -> str:
        """Full topic name for a logical topic (``telemetry.gpu`` -> ``fleetmedic.telemetry.gpu``)."""
        if name not in BY_NAME:
            raise KeyError(name)
        return self.names.get(name, self.prefix + name)


class CommandKeySettings(Section, frozen=True, kw_only=True):
    """One more command key the executor accepts (``signing.command_keys``): its id (what the
    ``fleetmedic-key-id`` header names) and where the key is, a file or an environment variable."""

    id: str
    key_file: str = ""
    key_env: str = ""

    def __post_init__(self) -> None:
        if bool(self.key_file) == bool(self.key_env):
            raise ValueError(f"command key {self.id!r}: give exactly one of `key_file` and `key_env`")


class SigningSettings(Section, frozen=True, kw_only=True):
    """Keys by role (:mod:`fleetmedic.signing`): the command keys (the decision stage signs with the
    active one, ``key_file``/``key_env`` under the id ``key_id``; the executor accepts it and every one
    of ``command_keys``, by the id the record's header names) and the operator keys, by id
    (``fleetmedic ctl`` signs with one, the decision stage accepts any, the executor none). A command
    key id is never an operator key id."""

    key_file: str = ""
    key_env: str = "FLEETMEDIC_SIGNING_KEY"
    key_id: str = "command"  # the active command key's id (fleetmedic.signing.DEFAULT_COMMAND_KEY_ID)
    command_keys: list[CommandKeySettings] = []  # more keys the executor accepts: a key rotation's overlap
    command_ttl_s: PosFloat = 300.0
    operator_key_files: dict[str, str] = {}  # key id -> file holding that operator key
    operator_key_dir: str = ""  # or a folder (a mounted Secret): each file one key, its name the id
    operator_key_env: dict[str, str] = msgspec.field(
        default_factory=lambda: {"operator": "FLEETMEDIC_OPERATOR_KEY"})  # key id -> env var (used when set)
    operator_key_id: str = ""  # the key `fleetmedic ctl` signs with ("": the only one configured)
    allow_demo_keys: bool = False  # the published demo keys: only `fleetmedic demo` sets this

    def __post_init__(self) -> None:
        seen = {self.key_id: "`key_id`"}
        for i, k in enumerate(self.command_keys):
            if k.id in seen:
                why = ("the active key (key_file/key_env) has it: list only the other keys here"
                       if k.id == self.key_id else f"given twice (also {seen[k.id]})")
                raise ValueError(f"`command_keys[{i}].id` {k.id!r}: {why}")
            seen[k.id] = f"`command_keys[{i}].id`"
        for field, ids in (("operator_key_files", self.operator_key_files),
                           ("operator_key_env", self.operator_key_env)):
            for kid in ids:
                if kid in seen:
                    raise ValueError(f"`{field}` id {kid!r} is a command key id ({seen[kid]}): a header naming "
                                     f"it must say which role signed, so the ids of the roles never overlap")
