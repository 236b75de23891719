"""What a budget reserves for a request (an upper bound of its real cost) and what it
settles to."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.costs import TokenUsage
from proxy.money.pricing import Price, format_usd, usd
from proxy.pipeline.budgets import correction, reservation, settled_cost
from proxy.request.call import Admission, Arrival, Call
from proxy.shapes.base import Shape
from proxy.shapes.chat import CHAT
from proxy.shapes.embeddings import EMBEDDINGS
from proxy.shapes.responses import RESPONSES

PRICE = Price(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75)


def _reserve(body: dict[str, object], shape: Shape = CHAT) -> dict[str, float]:
    return dict(reservation(body, orjson.dumps(body), shape, 256, PRICE).cost)


def test_input_is_bounded_by_the_body_s_bytes_and_output_by_its_cap_times_n() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "héllo"}], "max_tokens": 10}
    raw = orjson.dumps(body)
    cost = _reserve({**body, "n": 3})
    assert cost["input_tokens"] == len(orjson.dumps({**body, "n": 3}))
    assert cost["output_tokens"] == 30
    assert cost["requests"] == 1
    assert cost["usd"] == (len(raw) + len(b',"n":3')) * 3.75 / 1e6 + 30 * 15.0 / 1e6


def test_a_request_without_a_cap_is_given_the_default_one() -> None:
    body = {"model": "m", "messages": []}
    made = reservation(body, orjson.dumps(body), CHAT, 64, PRICE)
    assert (made.cap_field, made.cap) == (("max_tokens",), 64)
    assert made.cost["output_tokens"] == 64
    capped = {**body, "max_completion_tokens": 5}
    assert reservation(capped, orjson.dumps(capped), CHAT, 64, PRICE).cap_field is None
    embedding = {"model": "m", "input": "x"}
    made = reservation(embedding, orjson.dumps(embedding), EMBEDDINGS, 64, PRICE)
    assert made.cap_field is None and made.cost["output_tokens"] == 0


def test_a_follow_up_reserves_the_conversation_the_upstream_reads_again() -> None:
    body = {
        "model": "m",
        "input": "and?",
        "previous_response_id": "resp_1",
        "max_output_tokens": 16,
    }
    raw = orjson.dumps(body)
    made = reservation(body, raw, RESPONSES, 64, PRICE, context=1_500)
    assert made.cost["input_tokens"] == len(raw) + 1_500
    assert made.cost["tokens"] == len(raw) + 1_500 + 16
    assert made.cost["usd"] == pytest.approx((len(raw) + 1_500) * 3.75 / 1e6 + 16 * 15.0 / 1e6)


@pytest.mark.slow
@given(st.text(max_size=200), st.integers(min_value=1, max_value=500))
def test_the_reservation_bounds_any_real_usage_of_the_request(text: str, cap: int) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": cap}
    cost = _reserve(body)
    # At most a token per byte of the body's text, at most its cap out, at any cache mix.
    prompt = len(text.encode())
    real = usd(PRICE, TokenUsage(input_tokens=prompt, cache_write=prompt, output_tokens=cap))
    assert real <= cost["usd"]


def _call(usage: TokenUsage | None = None, unreported: int | None = None) -> Call:
    reserved = {"usd": 1.0, "tokens": 100.0, "requests": 1.0}
    call = Call(Arrival("r", CHAT, 0.0), admission=Admission(reserved=reserved))
    call.trip.reported(usage)
    call.trip.unreported_tokens = unreported
    return call


def test_settled_to_the_real_cost_or_given_back_or_kept() -> None:
    answered = settled_cost(_call(TokenUsage(input_tokens=10, output_tokens=20)), PRICE)
    assert answered is not None and answered["tokens"] == 30
    assert answered["usd"] == (10 * 3.0 + 20 * 15.0) / 1e6
    assert settled_cost(_call(), PRICE) is None  # no usage: everything back
    cut = settled_cost(_call(unreported=7), PRICE)  # a stream cut before its usage
    assert cut == {"usd": 1.0, "tokens": 100.0, "requests": 1.0}


def test_a_correction_is_real_minus_reserved_per_kind() -> None:
    reserved = {"usd": 1.0, "tokens": 100.0}
    assert correction({"usd": 0.25, "tokens": 40.0}, reserved) == {"usd": -0.75, "tokens": -60.0}
    assert correction(None, reserved) == {"usd": -1.0, "tokens": -100.0}


def test_dollars_are_written_as_plain_decimals() -> None:
    assert format_usd(0.0001375) == "0.0001375"
    assert format_usd(12.5) == "12.5"
    assert format_usd(0.0) == "0"
