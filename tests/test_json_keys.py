"""``json_keys.duplicate`` against an oracle that reads the document it was written
from: any JSON text, keys drawn from a few names (often twice), written with any
spacing, any character escaped (``\\u0065`` for ``e``, colons as ``\\u003a``), colons
and quotes inside strings, nested deeper than orjson dumps."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.request.json_keys import _by_tokens, duplicate

# A document: a scalar, ("array", [documents]) or ("object", [(key, document)]).
Doc = Any

names = st.sampled_from(["a", "b", "model", "a:b", 'q"', "é", "\\", "😀"])
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(alphabet=st.sampled_from('ab:"\\{}[],é\n😀'), max_size=6),
)
documents = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.tuples(st.just("array"), st.lists(children, max_size=4)),
        st.tuples(st.just("object"), st.lists(st.tuples(names, children), max_size=4)),
    ),
    max_leaves=25,
)
# How each piece is written: spaces, and which characters of strings are escaped.
spacing = st.sampled_from(["", " ", "\n  "])


def _string(text: str, escape: st.DataObject) -> str:
    out = []
    for char in text:
        if escape.draw(st.booleans()):  # as \uXXXX (a surrogate pair beyond the BMP)
            units = char.encode("utf-16-be")
            case = escape.draw(st.sampled_from("xX"))
            for i in range(0, len(units), 2):
                out.append(f"\\u{int.from_bytes(units[i : i + 2]):04{case}}")
        else:
            out.append(json.dumps(char, ensure_ascii=False)[1:-1])
    return '"' + "".join(out) + '"'


def _write(doc: Doc, data: st.DataObject) -> str:
    space = data.draw(spacing)
    if isinstance(doc, tuple) and doc[0] == "array":
        return "[" + space + ("," + space).join(_write(d, data) for d in doc[1]) + space + "]"
    if isinstance(doc, tuple):
        members = (
            _string(k, data) + space + ":" + data.draw(spacing) + _write(v, data) for k, v in doc[1]
        )
        return "{" + space + ("," + space).join(members) + space + "}"
    if isinstance(doc, str):
        return _string(doc, data)
    return json.dumps(doc)


def _oracle(doc: Doc, path: list[str | int]) -> list[str | int] | None:
    """The first key given twice in one object, in the text's order."""
    if isinstance(doc, tuple) and doc[0] == "array":
        for i, item in enumerate(doc[1]):
            found = _oracle(item, [*path, i])
            if found is not None:
                return found
    elif isinstance(doc, tuple):
        keys: set[str] = set()
        for key, value in doc[1]:
            if key in keys:
                return [*path, key]
            keys.add(key)
            found = _oracle(value, [*path, key])
            if found is not None:
                return found
    return None


def _said(parts: list[str | int]) -> str:
    return "".join(
        f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(parts)
    )


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(names, documents), max_size=5), st.data())
def test_the_first_key_given_twice_is_named_and_no_other_body_is_refused(
    members: list[tuple[str, Doc]], data: st.DataObject
) -> None:
    doc = ("object", members)
    raw = _write(doc, data).encode()
    expected = _oracle(doc, [])
    found = duplicate(raw, orjson.loads(raw))
    assert found == (None if expected is None else _said(expected))
    assert _by_tokens(raw) == found  # the last resort reads the same


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        (b'{"model":"a","model":"b"}', "model"),
        (b'{"model":"a","mod\\u0065l":"b"}', "model"),
        (b'{"a":{"b":1},"a":{"c":1}}', "a"),
        (b'{"x":[1,2,3,{"k":1,"k":2}]}', "x[3].k"),
        (b'{"x":[[1, 2], "s,t", 3 , {"k":1,"\\u006b":2}]}', "x[3].k"),
        (b'{"a:b":"c","a\\u003ab":"d"}', "a:b"),
        (b'{"a":"x:y","b":"\\u003a","b":1}', "b"),
    ],
)
def test_named(raw: bytes, path: str) -> None:
    assert duplicate(raw, orjson.loads(raw)) == path


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a":"\\u003a","b":":"}',  # the escaped colon alone: no key dropped
        b'{"a":1,"b":{"a":1},"c":[{"a":1},{"a":2}]}',
        b' {"a" : "b:c" , "\\"a" : 1}\n',
        b'{"a":1e300,"b":18446744073709551617,"c":-1.5}',
    ],
)
def test_not_refused(raw: bytes) -> None:
    assert duplicate(raw, orjson.loads(raw)) is None


def test_deeper_than_orjson_dumps_and_a_long_path_said_by_its_ends() -> None:
    raw = b'{"d":' + b"[" * 600 + b'{"k":1,"k":2}' + b"]" * 600 + b"}"
    path = "d" + "[0]" * 600 + ".k"
    assert duplicate(raw, orjson.loads(raw)) == f"{path[:120]}...{path[-120:]}"
    fine = raw.replace(b'"k":2', b'"j":2')
    assert duplicate(fine, orjson.loads(fine)) is None
