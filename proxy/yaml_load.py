"""A YAML document built straight from libyaml's events (*pure*): the same values as
``yaml.load(text, CSafeLoader)``, in about a third of its time on a long key list.

PyYAML's own load builds a node for every scalar and collection, asks its resolver's
regular expressions about each scalar and walks the nodes again with its constructor's
generators: at 100,000 client keys (a million events) that Python side was two thirds of
the load. Here each event goes straight into a list; a mapping is made from its list of
keys and values when it ends; a plain scalar is resolved only if its first character is
one PyYAML has an implicit rule for (digits, ``~``, ``y``/``n``/``t``/``f``/``o``...),
and then by PyYAML's own resolver and constructor, remembered per text.

Anything beyond plain data (an anchor, an alias, a tag, a merge key ``<<``, a
collection as a mapping key, a second document, a tag the safe constructor does not
know) is handed to PyYAML's own load instead, which gives its values or its error.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

import yaml
from yaml.events import (
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
)
from yaml.nodes import ScalarNode

__all__ = ["load", "load_from_events"]

# libyaml's loader when PyYAML was built with it; the pure-Python one otherwise.
SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_C_PARSER: Any = getattr(getattr(yaml, "_yaml", None), "CParser", None)

_RESOLVER: Any = yaml.resolver.Resolver()
_CONSTRUCTOR: Any = yaml.constructor.SafeConstructor()
_STR_TAG = "tag:yaml.org,2002:str"
# The tags a plain scalar may resolve to that the safe constructor builds (the merge
# key ``<<`` and the value key ``=`` are not among them: PyYAML's load decides those).
_SCALAR_TAGS = frozenset(
    f"tag:yaml.org,2002:{name}" for name in ("null", "bool", "int", "float", "timestamp")
)


class _Fallback(Exception):
    """The document uses something only PyYAML's own load handles."""


def load(text: str) -> Any:
    """The document of ``text``, as ``yaml.load(text, CSafeLoader)`` gives it (its
    ``yaml.YAMLError`` too)."""
    if _C_PARSER is None:  # PyYAML without libyaml: its own (slower) load
        return yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506 (a safe loader)
    try:
        return load_from_events(_C_PARSER(text))
    except _Fallback:
        return yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506 (a safe loader)


def load_from_events(parser: Any) -> Any:
    """The single document of ``parser``'s events (an object with ``get_event``), or
    ``_Fallback`` for a document that needs PyYAML's composer and constructor."""
    get_event = parser.get_event
    get_event()  # StreamStart
    event = get_event()
    if type(event) is not yaml.DocumentStartEvent:
        return None  # an empty stream
    rules: Container[str | None] = _RESOLVER.yaml_implicit_resolvers
    if None in rules:  # a resolver added for any first character: always ask
        rules = _EVERY_FIRST
    resolved: dict[str, Any] = {}
    # Each open collection's items so far, innermost last; a mapping's alternate keys
    # and values. ``kinds`` says which of them are mappings.
    top: list[Any] = []
    current = top
    stack: list[list[Any]] = []
    kinds: list[bool] = []
    while True:
        event = get_event()
        kind = type(event)
        if kind is ScalarEvent:
            if event.anchor is not None or event.tag is not None:
                raise _Fallback
            value = event.value
            if event.implicit[0] and (value[:1] in rules):
                value = resolved[value] if value in resolved else _resolve(value, resolved)
            current.append(value)
        elif kind is MappingStartEvent or kind is SequenceStartEvent:
            if event.anchor is not None or event.tag is not None:
                raise _Fallback
            stack.append(current)
            kinds.append(kind is MappingStartEvent)
            current = []
        elif kind is MappingEndEvent or kind is SequenceEndEvent:
            items = current
            current = stack.pop()
            if kinds.pop():
                pairs = iter(items)
                try:
                    current.append(dict(zip(pairs, pairs)))  # noqa: B905 (pairs: even)
                except TypeError:  # a collection as a key: PyYAML's load says so
                    raise _Fallback from None
            else:
                current.append(items)
        elif kind is yaml.DocumentEndEvent:
            break
        else:  # an alias
            raise _Fallback
    if type(get_event()) is not yaml.StreamEndEvent:
        raise _Fallback  # a second document: PyYAML's load says it expected one
    return top[0]


class _EveryFirst:
    """Stands in for the first characters with rules when one rule has none."""

    def __contains__(self, first: object) -> bool:
        return True


_EVERY_FIRST = _EveryFirst()


def _resolve(text: str, resolved: dict[str, Any]) -> Any:
    """The value of the plain scalar ``text`` by PyYAML's rules, remembered in
    ``resolved`` (every value it gives is immutable: shared safely)."""
    tag = _RESOLVER.resolve(ScalarNode, text, (True, False))
    if tag == _STR_TAG:
        value: Any = text
    elif tag in _SCALAR_TAGS:
        value = _CONSTRUCTOR.yaml_constructors[tag](_CONSTRUCTOR, ScalarNode(tag, text))
    else:
        raise _Fallback
    resolved[text] = value
    return value
