"""Top-level fields set in a JSON object's bytes, the rest untouched (pure)."""

from __future__ import annotations

import orjson
import pytest

from proxy.request.json_splice import set_fields

DEEP = b"[" * 300 + b'"x"' + b"]" * 300  # deeper than orjson dumps


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"model":"a","n":1}', {"model": "up", "n": 1}),
        (b' { "n" : 1 , "model" : "a" } ', {"model": "up", "n": 1}),
        (b'{"m\\u006fdel":"a"}', {"model": "up"}),  # an escaped key is the same key
        (b'{"model":"a","model":"b"}', {"model": "up"}),  # every occurrence
        (b"{}", {"model": "up"}),
        (b'{"n":1}', {"n": 1, "model": "up"}),
        (b'{"text":"\\"model\\": x, }","model":null}', {"text": '"model": x, }', "model": "up"}),
        (
            b'{"messages":[{"model":"inner"}],"model":1}',
            {"messages": [{"model": "inner"}], "model": "up"},
        ),
    ],
)
def test_the_field_is_set_and_the_rest_reads_the_same(raw: bytes, expected: object) -> None:
    assert orjson.loads(set_fields(raw, {"model": "up"})) == expected


def test_a_body_too_deep_to_dump_keeps_its_bytes_around_the_changed_fields() -> None:
    raw = b'{"model":"m","messages":[{"role":"user","content":' + DEEP + b"}]}"
    out = set_fields(raw, {"model": "up", "stream_options": {"include_usage": True}})
    assert out == (
        b'{"model":"up","messages":[{"role":"user","content":'
        + DEEP
        + b'}],"stream_options":{"include_usage":true}}'
    )
    assert orjson.loads(out)["model"] == "up"
