"""The hardened YAML loader: PyYAML's safe loader within limits (nesting depth, aliases, alias
expansion), a key given twice an error, a value that cannot be built an error naming its line."""

from __future__ import annotations

from typing import Any, cast

import yaml

#: deepest nesting of mappings and lists (through aliases too); the deepest option is 6 levels down
MAX_DEPTH = 64
#: aliases (``*name``) a document may use
MAX_ALIASES = 1_000
#: nodes that aliases may repeat in all (an alias of a 10-node list repeats 10): refuses alias
#: expansion bombs ("billion laughs") before anything is built
MAX_ALIAS_NODES = 100_000


class LimitError(Exception):
    """The YAML document is over one of the limits (raised by :class:`_Loader`)."""


class _DuplicateKey(LimitError):
    """A mapping of the YAML document gives one key twice (raised by :class:`_Loader`)."""


def _at(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "somewhere"


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with limits: nesting depth and aliases counted while composing, the
    alias expansion measured on the composed graph before any object is built, and a value that
    cannot be built (an integer of 5,000 digits, a bad date) a load error naming its line. A key
    given twice in one mapping is an error naming both lines (PyYAML keeps the last one silently:
    ``safety: {dry_run: true}`` then ``safety: {dry_run: false}`` would run live); a key a merge
    (``<<: *defaults``) brings in may still be given."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:
        # the scanner looks ahead for simple keys across every open ``[``/``{``: stop before that
        # gets quadratic (5,000 ``[`` would take seconds before the composer sees the depth)
        if self.flow_level >= MAX_DEPTH:
            raise LimitError(f"nested deeper than {MAX_DEPTH} levels ({_at(cast(Any, self).get_mark())})")
        super().fetch_flow_collection_start(TokenClass)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                mark = cast(Any, self).peek_event().start_mark
                raise LimitError(f"more than {MAX_ALIASES} aliases ({_at(mark)})")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = cast(Any, self).peek_event().start_mark
                raise LimitError(f"nested deeper than {MAX_DEPTH} levels ({_at(mark)})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError, TypeError) as exc:
            raise LimitError(f"cannot read the value at {_at(node.start_mark)}: {exc}") from None

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                try:
                    earlier = first.setdefault(key, key_node)
                except TypeError:  # an unhashable key: the constructor names it
                    continue
                if earlier is not key_node:
                    raise _DuplicateKey(f"the key {key!r} is given twice in one mapping ({_at(earlier.start_mark)} "
                                        f"and {_at(key_node.start_mark)}): keep one")
        return super().construct_mapping(node, deep)


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a graph whose aliases would repeat more than :data:`MAX_ALIAS_NODES` nodes, nest
    deeper than :data:`MAX_DEPTH` once expanded, or refer to themselves. Linear in the composed
    nodes (memoized per node); its recursion is bounded by the composed depth, because an alias
    always refers to a node composed (and so walked) before it."""
    seen: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded size, expanded depth)
    active: set[int] = set()

    def walk(node: yaml.Node) -> tuple[int, int]:
        key = id(node)
        done = seen.get(key)
        if done is not None:
            return done
        if key in active:
            raise LimitError(f"an alias refers to the node that contains it ({_at(node.start_mark)})")
        active.add(key)
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            children = []
        size, depth = 1, 0
        for child in children:
            s, d = walk(child)
            size += s
            depth = max(depth, d)
            if size - len(seen) > MAX_ALIAS_NODES + 1:
                raise LimitError(f"aliases repeat more than {MAX_ALIAS_NODES} nodes (an alias expansion "
                                  f"bomb?) ({_at(node.start_mark)})")
        if depth + 1 > MAX_DEPTH:
            raise LimitError(f"nested deeper than {MAX_DEPTH} levels once aliases are expanded "
                              f"({_at(node.start_mark)})")
        active.discard(key)
        seen[key] = (size, depth + 1)
        return seen[key]

    walk(root)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` within the limits above: raises ``yaml.YAMLError`` for invalid YAML and
    :class:`LimitError` for a document over a limit or with a key given twice in one mapping.
    ``None`` for an empty document."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()
