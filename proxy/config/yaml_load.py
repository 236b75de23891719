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

The top-level ``keys`` list, when every entry is a block mapping of one-line scalars
(as ``yaml.dump`` writes 100,000 keys), is read line by line with one regular
expression (``split_key_list``) instead: half the time of the events, the scalars
resolved the same way; the rest of the text goes through the events.
"""

from __future__ import annotations

import re
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

__all__ = ["load", "load_from_events", "split_key_list"]

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
        split = split_key_list(text)
    except _Fallback:  # a scalar only PyYAML's load builds
        split = None
    if split is not None:
        rest, keys = split
        try:
            document = load_from_events(_C_PARSER(rest))
        except (_Fallback, yaml.YAMLError):
            document = None  # the whole text decides (its error names the right line)
        if isinstance(document, dict) and "keys" in document and document["keys"] is None:
            document["keys"] = keys
            return document
    try:
        return load_from_events(_C_PARSER(text))
    except _Fallback:
        return yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506 (a safe loader)


# The top-level key list in its commonest form, read by line: each entry a block mapping
# of one-line scalars (``- name: a`` then ``  rpm: 60``, at one indentation), each plain
# of letters, digits and ``_ . -`` or quoted (printable ASCII) without escapes. 0.25 s
# instead of 0.7 s for 100,000 keys; anything else in the list (a comment, a nested
# list, a flow collection, a tab) leaves the whole text to the events.
_KEYS_LINE = re.compile(r"^keys:\n", re.MULTILINE)
_SPACES = re.compile(" *")
# A top-level key that may be ``keys`` too (quoted, or a complex key): then it is not read here.
_KEYS_ANYWHERE = re.compile(r"^(?:keys\s*:|[\"'?])", re.MULTILINE)
_FIELD = (
    r"([A-Za-z_][A-Za-z0-9_]*): (?:([A-Za-z0-9_][A-Za-z0-9_.\-]*)"
    r"|'([ -&(-~]*)'|\"([ !#-\[\]-~]*)\")\n"
)


def split_key_list(text: str) -> tuple[str, list[dict[Any, Any]]] | None:
    """The text without its top-level ``keys`` list (``keys:`` left, now null), and the
    list; None unless the list is entirely of the form above."""
    found = _KEYS_LINE.search(text)
    if found is None or len(_KEYS_ANYWHERE.findall(text)) != 1:
        return None
    start = found.end()
    read = _key_entries(text, start)
    if read is None:
        return None
    keys, pos = read
    if not keys or not _at_top_level_key(text, pos):
        return None
    return text[:start] + text[pos:], keys


def _key_entries(text: str, start: int) -> tuple[list[dict[Any, Any]], int] | None:
    """The entries of the key list starting at ``start``, read line by line while the
    lines are of the form above, and where they stop; None if a field's line comes
    before any entry's."""
    indent = _SPACES.match(text, start).end() - start  # type: ignore[union-attr]
    line = re.compile(" " * indent + "(- |  )" + _FIELD)
    rules = _first_characters_with_rules()
    resolved = _Resolved()
    fields: dict[str, Any] = {}  # a field's name as written: as resolved (few distinct)
    keys: list[dict[Any, Any]] = []
    entry: dict[Any, Any] | None = None
    pos = start
    for got in line.finditer(text, start):
        if got.start() != pos:
            break  # the next match is past the list's end
        lead, key, plain, single, double = got.groups()
        if lead == "- ":
            entry = {}
            keys.append(entry)
        elif entry is None:
            return None  # a continuation before any entry
        try:
            field = fields[key]
        except KeyError:
            field = fields[key] = resolved[key] if key[:1] in rules else key
        if plain is not None:
            value: Any = plain
            if plain[:1] in rules:
                value = resolved[plain]
        else:
            value = single if single is not None else double
        entry[field] = value
        pos = got.end()
    return keys, pos


def _at_top_level_key(text: str, pos: int) -> bool:
    """Whether a top-level key (or the end of the text) begins at ``pos``: where the
    list must end."""
    return pos >= len(text) or text[pos].isalpha() or text[pos] == "_"


def load_from_events(parser: Any) -> Any:
    """The single document of ``parser``'s events (an object with ``get_event``), or
    ``_Fallback`` for a document that needs PyYAML's composer and constructor."""
    get_event = parser.get_event
    get_event()  # StreamStart
    if type(get_event()) is not yaml.DocumentStartEvent:
        return None  # an empty stream
    document = _document(get_event, _first_characters_with_rules(), _Resolved())
    if type(get_event()) is not yaml.StreamEndEvent:
        raise _Fallback  # a second document: PyYAML's load says it expected one
    return document


_OPENS = frozenset((MappingStartEvent, SequenceStartEvent))
_CLOSES = frozenset((MappingEndEvent, SequenceEndEvent))


def _document(get_event: Any, rules: Container[str | None], resolved: _Resolved) -> Any:
    """The node of a document whose start was read, from its events up to its end. A
    scalar is handled in place (a million of them in 100,000 keys), a collection's start
    and end by helpers."""
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
                value = resolved[value]
            current.append(value)
        elif kind in _OPENS:
            _refuse_anchor_or_tag(event)
            stack.append(current)
            kinds.append(kind is MappingStartEvent)
            current = []
        elif kind in _CLOSES:
            items = current
            current = stack.pop()
            current.append(_collection(items, kinds.pop()))
        elif kind is yaml.DocumentEndEvent:
            return top[0]
        else:  # an alias
            raise _Fallback


def _refuse_anchor_or_tag(event: Any) -> None:
    """``_Fallback`` for a node with an anchor or a tag: PyYAML's load builds those."""
    if event.anchor is not None or event.tag is not None:
        raise _Fallback


def _collection(items: list[Any], is_mapping: bool) -> Any:
    """A closed collection from its items (a mapping's: alternate keys and values)."""
    if not is_mapping:
        return items
    pairs = iter(items)
    try:
        return dict(zip(pairs, pairs))  # noqa: B905 (pairs: even)
    except TypeError:  # a collection as a key: PyYAML's load says so
        raise _Fallback from None


def _first_characters_with_rules() -> Container[str | None]:
    """The first characters PyYAML's resolver has implicit rules for: only a plain
    scalar starting with one is resolved; all of them if a rule has none."""
    rules: Container[str | None] = _RESOLVER.yaml_implicit_resolvers
    return _EVERY_FIRST if None in rules else rules


class _Resolved(dict[str, Any]):
    """Plain scalars' values by their text, each resolved on first sight (``_resolve``):
    one look-up for the texts seen before (``true``, a repeated number)."""

    def __missing__(self, text: str) -> Any:
        value = self[text] = _resolve(text)
        return value


class _EveryFirst:
    """Stands in for the first characters with rules when one rule has none."""

    def __contains__(self, first: object) -> bool:
        return True


_EVERY_FIRST = _EveryFirst()


def _resolve(text: str) -> Any:
    """The value of the plain scalar ``text`` by PyYAML's rules (every value it gives is
    immutable: remembered and shared safely, ``_Resolved``)."""
    tag = _RESOLVER.resolve(ScalarNode, text, (True, False))
    if tag == _STR_TAG:
        return text
    if tag in _SCALAR_TAGS:
        return _CONSTRUCTOR.yaml_constructors[tag](_CONSTRUCTOR, ScalarNode(tag, text))
    raise _Fallback
