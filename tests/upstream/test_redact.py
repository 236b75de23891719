"""The upstream key is replaced wherever an upstream answer quotes it: bodies, headers,
and streams however they are cut into chunks."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from proxy.upstream.redact import REDACTED, StreamRedactor, redact, redact_headers

SECRET = b"sk-deploy-secret-0123456789"


def test_a_body_quoting_the_key_has_it_replaced() -> None:
    body = b'{"error": {"message": "Incorrect API key provided: Bearer ' + SECRET + b'."}}'
    assert SECRET not in redact(body, SECRET)
    assert REDACTED.encode() in redact(body, SECRET)
    plain = b'{"ok": true}'
    assert redact(plain, SECRET) is plain  # nothing copied when the key is absent
    assert redact(body, b"") is body  # a deployment without a key


def test_headers_quoting_the_key_have_it_replaced() -> None:
    headers = {"openai-model": f"echo Bearer {SECRET.decode()}", "content-type": "x"}
    assert redact_headers(headers, SECRET.decode()) == {
        "openai-model": f"echo Bearer {REDACTED}",
        "content-type": "x",
    }


@given(
    before=st.binary(max_size=40),
    after=st.binary(max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=120), max_size=6),
)
def test_a_stream_cut_anywhere_never_lets_the_key_through(
    before: bytes, after: bytes, cuts: list[int]
) -> None:
    data = before + b" " + SECRET + b"." + after + SECRET[:5]
    bounds = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    redactor = StreamRedactor(SECRET)
    out = b"".join(redactor.feed(data[a:b]) for a, b in itertools.pairwise(bounds))
    out += redactor.flush()
    assert out == redact(data, SECRET)
    assert SECRET not in out


def test_a_chunk_that_cannot_begin_the_key_is_passed_on_whole() -> None:
    """SSE events end with a blank line: nothing is held back in practice."""
    redactor = StreamRedactor(SECRET)
    event = b'data: {"choices": []}\n\n'
    assert redactor.feed(event) == event
    assert redactor.flush() == b""
