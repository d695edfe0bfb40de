"""YAML for files many teams write to: plain data only, bounded in time and memory.

Contracts arrive from a shared repository, so a contributor may be hostile. PyYAML's
SafeLoader still allows anchors and aliases (a few hundred bytes that expand
exponentially once anything walks the tree), merge keys, duplicate keys (the last one
silently wins: `tier: 3` then `tier: 1` reads as tier 1) and unbounded nesting (the
composer recurses). This loader refuses each while parsing, at the event or node where it
appears, so nothing is ever expanded, and the caller refuses oversized files before
parsing at all.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, CollectionStartEvent, NodeEvent
from yaml.nodes import MappingNode, Node
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

# A contract is a few hundred bytes (the largest example is 638); 64 KiB leaves room for
# long selector lists and bounds the scanner's work on anything else.
MAX_BYTES = 64 * 1024
# The contract model nests four levels deep; 32 is generous and keeps the composer's
# recursion far from Python's limit.
MAX_DEPTH = 32
MERGE_TAG = "tag:yaml.org,2002:merge"


class RefusedYAML(yaml.MarkedYAMLError):
    """Valid YAML that a contract file may not use; `problem_mark` is where it appears."""

    # Any: libyaml's parser gives its own Mark type with the same fields.
    def __init__(self, problem: str, mark: Any) -> None:
        super().__init__(problem=problem, problem_mark=mark)


class _StrictComposer(Composer):
    def __init__(self) -> None:
        super().__init__()
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()  # type: ignore[attr-defined]  # Parser mixin
        if isinstance(event, AliasEvent):
            raise RefusedYAML(f"alias *{event.anchor} is not allowed", event.start_mark)
        if isinstance(event, NodeEvent) and event.anchor is not None:
            raise RefusedYAML(f"anchor &{event.anchor} is not allowed", event.start_mark)
        if isinstance(event, CollectionStartEvent):
            if self._depth >= MAX_DEPTH:
                raise RefusedYAML(f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
            self._depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1
        return super().compose_node(parent, index)


class _StrictConstructor(SafeConstructor):
    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:
                raise RefusedYAML("merge key << is not allowed", key_node.start_mark)
            key = self.construct_object(key_node, deep=True)
            try:
                seen = first_line.get(key)
            except TypeError:  # an unhashable key; SafeConstructor reports it below
                break
            if seen is not None:
                raise RefusedYAML(
                    f"duplicate key {key!r} (first on line {seen})", key_node.start_mark
                )
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


class PyStrictLoader(Reader, Scanner, Parser, _StrictComposer, _StrictConstructor, Resolver):
    """SafeLoader's pure-Python parts with the refusals above."""

    def __init__(self, stream: str) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        _StrictComposer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)


if yaml.__with_libyaml__:
    # libyaml scans and parses about three times faster than the pure-Python parser
    # (a 256 KiB flow list: 2.2 s against 0.65 s here), so a file at the size limit stays
    # well inside the compiler's time budget; composing stays in Python
    # (_StrictComposer comes first in the MRO) so every event passes the checks above.
    from yaml._yaml import CParser

    class CStrictLoader(_StrictComposer, CParser, _StrictConstructor, Resolver):
        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            _StrictComposer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

    StrictLoader: type[PyStrictLoader] | type[CStrictLoader] = CStrictLoader
else:
    StrictLoader = PyStrictLoader


def load(
    text: str, loader: type[PyStrictLoader] | type[CStrictLoader] = StrictLoader
) -> tuple[Node | None, Any]:
    """One document as (node, data); raises yaml.YAMLError (RefusedYAML for refusals).

    The node is kept so callers can map fields to lines without parsing twice.
    """
    parser = loader(text)
    try:
        node = parser.get_single_node()
        if node is None:
            return None, None
        return node, parser.construct_document(node)
    finally:
        parser.dispose()
