"""Bodies an upstream compressed although asked for identity are decoded, and the
decoding is bounded: a buffered body's output stops at its bound (a gzip bomb), a
stream's comes in small pieces; corrupt, cut short or unknown encodings say so."""

from __future__ import annotations

import gzip
import itertools
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.upstream.encoding import PIECE, Reframed, Undecodable, decoder_for
from proxy.upstream.interface import AnswerTooLarge

BODY = b'{"choices": [], "usage": {"prompt_tokens": 5}}' * 100


@pytest.mark.parametrize("coding", [None, "", "identity", " Identity "])
def test_a_body_that_is_not_encoded_needs_no_decoder(coding: str | None) -> None:
    assert decoder_for(coding) is None


@pytest.mark.parametrize(
    ("coding", "packed"),
    [
        ("gzip", gzip.compress(BODY, mtime=0)),
        ("x-gzip", gzip.compress(BODY, mtime=0)),
        ("deflate", zlib.compress(BODY)),
    ],
)
def test_gzip_and_deflate_bodies_are_decoded_whole(coding: str, packed: bytes) -> None:
    decoder = decoder_for(coding)
    assert decoder is not None and decoder.whole(packed, len(BODY)) == BODY


def test_concatenated_gzip_members_decode_as_one_body() -> None:
    decoder = decoder_for("gzip")
    assert decoder is not None
    assert decoder.whole(gzip.compress(BODY) + gzip.compress(b"!"), None) == BODY + b"!"


@pytest.mark.slow
def test_a_gzip_bomb_stops_at_the_bound() -> None:
    bomb = gzip.compress(b"\0" * 50_000_000)  # ~50 KB that would become 50 MB
    decoder = decoder_for("gzip")
    assert decoder is not None
    with pytest.raises(AnswerTooLarge):
        decoder.whole(bomb, 1_000_000)


@pytest.mark.parametrize(
    ("coding", "packed", "words"),
    [
        ("gzip", gzip.compress(BODY, mtime=0)[:-10], "cut short"),
        ("gzip", b"\x1f\x8b\x08\x00 not deflate at all", "corrupt gzip"),
        ("br", b"\x0b\x02\x80", r"does not decode \(br\)"),
    ],
)
def test_bodies_that_do_not_decode_say_why(coding: str, packed: bytes, words: str) -> None:
    with pytest.raises(Undecodable, match=words):
        decoder = decoder_for(coding)
        assert decoder is not None
        decoder.whole(packed, None)


@given(cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_a_stream_decodes_the_same_however_it_is_cut(cuts: list[int]) -> None:
    packed = gzip.compress(BODY)
    bounds = sorted({min(c, len(packed)) for c in cuts} | {0, len(packed)})
    decoder = decoder_for("gzip")
    assert decoder is not None
    pieces = [p for a, b in itertools.pairwise(bounds) for p in decoder.feed(packed[a:b])]
    decoder.end()
    assert b"".join(pieces) == BODY
    assert all(len(p) <= PIECE for p in pieces)


def test_a_streamed_bomb_comes_in_bounded_pieces() -> None:
    decoder = decoder_for("gzip")
    assert decoder is not None
    pieces = decoder.feed(gzip.compress(b"\0" * 5_000_000))
    assert all(len(p) <= PIECE for p in itertools.islice(pieces, 100))


class _Lines:
    """A toy framing: each line is one event (a provider's reframer, as Bedrock's is)."""

    def __init__(self) -> None:
        self.held = b""

    def feed(self, data: bytes) -> list[bytes]:
        *lines, self.held = (self.held + data).split(b"\n")
        return [b"data: " + line + b"\n\n" for line in lines]

    def end(self) -> None:
        if self.held:
            raise Undecodable("a frame cut short")


def test_a_reframed_stream_is_decoded_first_then_reframed() -> None:
    packed = gzip.compress(b"one\ntwo\n")
    reframed = Reframed(decoder_for("gzip"), _Lines())
    out = [event for cut in (packed[:7], packed[7:]) for event in reframed.feed(cut)]
    reframed.end()
    assert out == [b"data: one\n\n", b"data: two\n\n"]


def test_a_reframed_stream_cut_inside_a_frame_is_undecodable() -> None:
    reframed = Reframed(None, _Lines())
    assert list(reframed.feed(b"one\ntw")) == [b"data: one\n\n"]
    with pytest.raises(Undecodable):
        reframed.end()
