"""From text to :class:`~.settings.Settings`: the YAML document (:mod:`.loader`), the
``FLEETMEDIC__*`` environment overrides, and every error found at once as a :class:`ConfigError`
naming the field path; back to builtins and YAML."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, get_args, get_origin

import msgspec
import yaml
from msgspec import Struct

from fleetmedic.config.loader import MAX_DEPTH, LimitError, load_yaml
from fleetmedic.config.names import NAMES, Names, did_you_mean
from fleetmedic.config.settings import Settings

ENV_PREFIX = "FLEETMEDIC__"

#: a config file larger than this is refused before it is parsed (a ConfigMap holds at most 1 MiB)
MAX_CONFIG_BYTES = 1 << 20
#: errors listed in one ConfigError; the rest are counted
MAX_LISTED_ERRORS = 50


class ConfigError(ValueError):
    """An invalid config: ``path`` is the dotted field path (``""`` = the document), ``reason`` why.

    ``errors`` lists every problem found (``(path, reason)``, in document order); ``path`` and
    ``reason`` are the first's. ``str()`` gives one line per error, ``source: path: reason``."""

    def __init__(self, path: str, reason: str, source: str = "config",
                 more: Sequence[tuple[str, str]] = ()) -> None:
        self.path = path
        self.reason = reason
        self.source = source
        self.errors: tuple[tuple[str, str], ...] = ((path, reason), *more)
        super().__init__("\n".join(self.messages()))

    @classmethod
    def of(cls, errors: Sequence[tuple[str, str]], source: str) -> ConfigError:
        listed = list(errors[:MAX_LISTED_ERRORS])
        if len(errors) > MAX_LISTED_ERRORS:
            listed.append(("", f"... and {len(errors) - MAX_LISTED_ERRORS} more errors"))
        (path, reason), *more = listed
        return cls(path, reason, source, more)

    def messages(self) -> list[str]:
        """One line per error: ``source: path: reason`` (``source: reason`` for the document)."""
        return [f"{self.source}: {p}: {r}" if p else f"{self.source}: {r}" for p, r in self.errors]


def _load(text: str, path: str, source: str) -> Any:
    try:
        return load_yaml(text)
    except LimitError as exc:
        raise ConfigError(path, f"refused: {exc}", source) from None
    except yaml.YAMLError as exc:
        raise ConfigError(path, f"not valid YAML: {exc}", source) from None
    except RecursionError:  # pragma: no cover - the depth limit comes first
        raise ConfigError(path, f"refused: nested deeper than {MAX_DEPTH} levels", source) from None


_AT = re.compile(r"^(?P<reason>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<key>[^`]*)`$")


_TOKEN = re.compile(r"\.(\w+)|\[(\d+|\.\.\.)\]")


def _dotted(path: str, doc: Any, tp: Any = None) -> str:
    """Turn msgspec's ``.a.b[...][2]`` into ``a.b.<key>.2``; msgspec hides mapping keys as
    ``[...]``, so find the offending key by validating the document with one key at a time."""
    parts: list[str] = []
    node = doc
    trail: list[str | int] = []
    for m in _TOKEN.finditer(path):
        attr, index = m.group(1), m.group(2)
        if attr is not None:
            parts.append(attr)
            trail.append(attr)
            node = node.get(attr) if isinstance(node, dict) else None
        elif index == "...":
            key = _failing_key(doc, trail, node, Settings if tp is None else tp)
            parts.append(str(key) if key is not None else "<key>")
            trail.append(key if key is not None else "")
            node = node.get(key) if isinstance(node, dict) and key is not None else None
        else:
            parts.append(index)
            trail.append(int(index))
            node = node[int(index)] if isinstance(node, list) and int(index) < len(node) else None
    return ".".join(parts)


def _failing_key(doc: Any, trail: list[str | int], mapping: Any, tp: Any) -> Any:
    if not isinstance(mapping, dict) or not trail:
        return None
    for key in mapping:
        trial = _deep_copy(doc)
        holder = trial
        for step in trail[:-1]:
            holder = holder[step]
        holder[trail[-1]] = {key: mapping[key]}
        try:
            msgspec.convert(trial, tp)
        except msgspec.ValidationError:
            return key
    return None


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _error_of(exc: Exception, value: Any, tp: Any, where: str) -> tuple[str, str]:
    """``(path, reason)`` of msgspec's error converting ``value`` (found at ``where``) to ``tp``."""
    m = _AT.match(str(exc))
    reason, rel = (m.group("reason"), _dotted(m.group("path") or "", value, tp)) if m else (str(exc), "")
    path = _join(where, rel) if rel else where
    unknown = _UNKNOWN.match(reason)
    if unknown:
        key = unknown.group("key")
        known = msgspec.structs.fields(tp) if isinstance(tp, type) and issubclass(tp, Struct) else ()
        return _join(path, key), "unknown key" + did_you_mean(key, [f.encode_name for f in known])
    return path, reason


def _error_from(exc: Exception, source: str, doc: Any) -> ConfigError:
    path, reason = _error_of(exc, doc, Settings, "")
    return ConfigError(path, reason, source)


def _convert_errors(value: Any, tp: Any, where: str) -> list[tuple[str, str]]:
    try:
        msgspec.convert(value, tp)
    except msgspec.ValidationError as exc:
        return [_error_of(exc, value, tp, where)]
    return []


def _bare(tp: Any) -> Any:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _check(value: Any, tp: Any, where: str, names: Names | None = None) -> list[tuple[str, str]]:
    """Every problem of ``value`` (found at ``where``) as a ``tp``: structs and containers are walked
    key by key and item by item, so one bad value does not hide the next (msgspec stops at the
    first); a struct's own checks (``__post_init__``, required fields) run once its fields pass."""
    bare = _bare(tp)
    if isinstance(bare, type) and issubclass(bare, Struct) and isinstance(value, dict):
        fields = {f.encode_name: f for f in msgspec.structs.fields(bare)}
        errors: list[tuple[str, str]] = []
        for key, item in value.items():
            field = fields.get(key) if isinstance(key, str) else None
            if field is None:
                errors.append((_join(where, key), "unknown key" + did_you_mean(key, list(fields))))
            else:
                errors += _check(item, field.type, _join(where, key), NAMES.get((bare, field.name)))
        return errors or _convert_errors(value, tp, where)
    origin = get_origin(bare)
    if origin is dict and isinstance(value, dict):
        key_tp, item_tp = get_args(bare)
        errors = []
        for key, item in value.items():
            here = _join(where, key)
            try:
                msgspec.convert({key: None}, dict[key_tp, Any])  # type: ignore[valid-type]
            except msgspec.ValidationError as exc:
                reason = str(exc).split(" - at `", 1)[0]
                errors.append((here, f"invalid key: {reason}"))
                continue
            problem = names.problem(key if names.of == "keys" else item) if names is not None else None
            if problem is not None:
                errors.append((here, problem))
                continue
            errors += _check(item, item_tp, here)
        return errors
    if origin is list and isinstance(value, list):
        (item_tp,) = get_args(bare)
        errors = []
        for i, item in enumerate(value):
            problem = names.problem(item) if names is not None and names.of == "values" else None
            if problem is not None:
                errors.append((_join(where, i), problem))
            else:
                errors += _check(item, item_tp, _join(where, i), names if names is not None and names.of == "keys"
                                 else None)
        return errors
    return _convert_errors(value, tp, where)


def validate(doc: Any) -> list[tuple[str, str]]:
    """Every problem of a config document (a parsed YAML mapping) as ``(path, reason)``, in
    document order; empty when ``msgspec.convert(doc, Settings)`` succeeds."""
    return _check(doc, Settings, "")


def apply_env_overrides(doc: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """Return a copy of ``doc`` with ``FLEETMEDIC__A__B=v`` applied as ``doc[a][b] = yaml(v)``."""
    out: dict[str, Any] = _deep_copy(doc)
    for name in sorted(env):
        if not name.upper().startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in name[len(ENV_PREFIX) :].split("__") if p]
        if not parts:
            continue
        path = ".".join(parts)
        if len(env[name]) > MAX_CONFIG_BYTES:
            raise ConfigError(path, f"the value of {name} is longer than {MAX_CONFIG_BYTES} characters", "environment")
        try:
            value = load_yaml(env[name])
        except LimitError as exc:
            raise ConfigError(path, f"refused value of {name}: {exc}", "environment") from None
        except yaml.YAMLError as exc:
            reason = f"cannot parse value of {name}: {exc}"
            raise ConfigError(path, reason, "environment") from None
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(".".join(parts[: i + 1]), f"{name} needs a mapping here", "environment")
            node = child
        node[parts[-1]] = value
    return out


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


def parse_config(text: str, env: Mapping[str, str] | None = None, source: str = "config") -> Settings:
    """Settings from YAML ``text`` and ``FLEETMEDIC__*`` overrides in ``env``; raises
    :class:`ConfigError` listing every error (``source`` names the file in its messages)."""
    if len(text) > MAX_CONFIG_BYTES or len(text.encode("utf-8", "replace")) > MAX_CONFIG_BYTES:
        raise ConfigError("", f"refused: larger than {MAX_CONFIG_BYTES} bytes", source)
    doc = _load(text, "", source) if text.strip() else {}
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError("", f"the document must be a mapping, got {type(doc).__name__}", source)
    doc = apply_env_overrides(doc, env or {})
    errors = validate(doc)
    if errors:
        raise ConfigError.of(errors, source)
    try:
        return msgspec.convert(doc, Settings)
    except msgspec.ValidationError as exc:  # pragma: no cover - validate() found nothing
        raise _error_from(exc, source, doc) from None


def read_config(path: str | None, env: Mapping[str, str] | None = None) -> Settings:
    """Load the config file at ``path`` (or only defaults + environment when ``path`` is None).
    The file must be UTF-8 and at most :data:`MAX_CONFIG_BYTES`; every problem is a ConfigError."""
    if path is None:
        return parse_config("", env, "defaults")
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError("", f"cannot read: {exc.strerror or exc}", path) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError("", f"refused: larger than {MAX_CONFIG_BYTES} bytes", path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        reason = (f"not UTF-8: byte 0x{data[exc.start]:02x} at byte offset {exc.start} (line {line}) "
                  f"cannot be decoded ({exc.reason})")
        raise ConfigError("", reason, path) from None
    return parse_config(text, env, path)


def to_builtins(settings: Settings) -> dict[str, Any]:
    result: dict[str, Any] = msgspec.to_builtins(settings)
    return result


def to_yaml(settings: Settings) -> str:
    return yaml.safe_dump(to_builtins(settings), sort_keys=False, default_flow_style=False)
