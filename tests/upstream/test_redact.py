"""The upstream key is replaced wherever an upstream answer quotes it as a credential (a
whole token): bodies, headers, and streams however they are cut into chunks. Keys too
short or too common to be secrets are never replaced (they would rewrite answers)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.config.secrets import redaction_warning
from proxy.upstream.redact import (
    REDACTED,
    StreamRedactor,
    redact,
    redact_headers,
    redactable,
)

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
    odd = {"openai-model": f"modèle ✓ {SECRET.decode()}", "x": "\udcff"}  # any text
    assert redact_headers(odd, SECRET.decode()) == {
        "openai-model": f"modèle ✓ {REDACTED}",
        "x": "\udcff",
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


def test_the_key_is_replaced_only_as_a_whole_token() -> None:
    quoted = b'"Incorrect API key provided: ' + SECRET + b'", "key=' + SECRET + b'&x"'
    assert redact(quoted, SECRET).count(REDACTED.encode()) == 2
    for glued in (b"A" + SECRET, SECRET + b"Z", b"/" + SECRET + b"+", SECRET + b"=="):
        assert redact(glued, SECRET) == glued  # inside a longer word or base64


@pytest.mark.parametrize(
    "key", ["x", "token", "none", "EMPTY", "ollama", "sk-1234", "lm-studio", "not-needed"]
)
def test_keys_too_short_or_too_common_to_be_secrets_are_never_redacted(key: str) -> None:
    assert redactable(key) == b""
    assert redaction_warning(key) is not None
    body = b'{"index": 0, "usage": {"prompt_tokens": 5}, "content": "' + key.encode() + b'"}'
    assert redact(body, redactable(key)) is body


@pytest.mark.parametrize("key", ["placeholder", "xxxxxxxxxxxx", "PASSWORD"])
def test_placeholders_and_repeated_characters_are_no_secrets(key: str) -> None:
    assert redactable(key) == b""


def test_real_looking_keys_are_redacted_and_no_key_warns_nothing() -> None:
    assert redactable(SECRET.decode()) == SECRET
    assert redactable("0123456789abcdef0123456789abcdef") != b""  # an Azure key
    assert redaction_warning(SECRET.decode()) is None
    assert redaction_warning("") is None


def test_a_stream_holds_a_whole_key_at_a_chunk_end_until_the_next_byte_decides() -> None:
    redactor = StreamRedactor(SECRET)
    assert redactor.feed(b"key: " + SECRET) == b"key: "
    assert redactor.feed(b"Z and more") == SECRET + b"Z and more"  # glued: not a key
    assert redactor.feed(b" " + SECRET) == b" "
    assert redactor.feed(b".") == REDACTED.encode() + b"."
    assert redactor.feed(b" " + SECRET) == b" "
    assert redactor.flush() == REDACTED.encode()  # the stream's end ends the token
