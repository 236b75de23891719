"""A request's output cap as budgets that clamp see it: the reservation as a function of
the cap (``budgets.reservation(clamp=True)``), where each API shape carries the cap, and
the request sent with a lowered one (``budgets.lower_cap``)."""

from __future__ import annotations

import orjson
import pytest

from proxy.limiter.core import edge
from proxy.money.pricing import Price, bound
from proxy.pipeline.budgets import Reservation, bound_now, lower_cap, reservation
from proxy.request.call import Admission, Arrival, Ask, Call
from proxy.shapes import output_caps
from proxy.shapes.base import Shape
from proxy.shapes.chat import CHAT
from proxy.shapes.completions import COMPLETIONS
from proxy.shapes.embeddings import EMBEDDINGS
from proxy.shapes.gemini import GENERATE_CONTENT
from proxy.shapes.messages import MESSAGES
from proxy.shapes.responses import RESPONSES

PRICE = Price(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75)
MESSAGE = [{"role": "user", "content": "hello"}]


def _clamped(body: dict[str, object], shape: Shape = CHAT, default: int = 256) -> Reservation:
    return reservation(body, orjson.dumps(body), shape, default, PRICE, clamp=True)


def test_the_reservation_is_its_input_bound_plus_each_token_of_cap_in_each_completion() -> None:
    body = {"model": "m", "messages": MESSAGE, "max_tokens": 100, "n": 2}
    raw = orjson.dumps(body)
    made = _clamped(body)
    clamp = made.clamp
    assert clamp is not None
    assert (clamp.most, clamp.least) == (100, 1)
    assert clamp.base["tokens"] == clamp.base["input_tokens"] == len(raw)
    assert clamp.base["usd"] == bound(PRICE, len(raw), 0.0)  # at the dearest input price
    assert clamp.per == {"tokens": 2.0, "output_tokens": 2.0, "usd": 2 * 15.0 / 1e6}
    # The reservation is that at its own cap: what refusing would reserve, to the bit
    # or nearly (the same bound, summed in another order).
    assert made.cost == edge.at(clamp, 100)
    refusing = reservation(body, raw, CHAT, 256, PRICE).cost
    assert made.cost["tokens"] == refusing["tokens"] == len(raw) + 200
    assert made.cost["usd"] == pytest.approx(refusing["usd"], rel=1e-12)


def test_without_a_cap_the_default_is_the_most_and_is_sent() -> None:
    made = _clamped({"model": "m", "messages": MESSAGE}, default=64)
    assert made.clamp is not None and made.clamp.most == 64
    assert (made.cap_field, made.cap) == (("max_tokens",), 64)


def test_each_shape_s_cap_field() -> None:
    chat = _clamped({"model": "m", "messages": MESSAGE, "max_completion_tokens": 40})
    responses = _clamped({"model": "m", "input": "hi", "max_output_tokens": 40}, RESPONSES)
    messages = _clamped({"model": "m", "messages": MESSAGE, "max_tokens": 40}, MESSAGES)
    completions = _clamped({"model": "m", "prompt": "hi", "max_tokens": 40, "n": 3}, COMPLETIONS)
    assert [r.clamp.most if r.clamp else None for r in (chat, responses, messages)] == [40] * 3
    assert completions.clamp is not None and completions.clamp.per["tokens"] == 3.0
    assert responses.clamp is not None and responses.clamp.least == 16  # OpenAI's minimum


def test_a_request_whose_cap_cannot_be_lowered_is_reserved_as_it_always_was() -> None:
    embedding = {"model": "m", "input": "x"}
    assert _clamped(embedding, EMBEDDINGS).clamp is None  # no output to lower
    tiny = {"model": "m", "input": "hi", "max_output_tokens": 16}
    made = _clamped(tiny, RESPONSES)
    assert made.clamp is None  # already at the least the upstream takes
    assert made.cost == reservation(tiny, orjson.dumps(tiny), RESPONSES, 256, PRICE).cost
    thinking = {
        "model": "m",
        "messages": MESSAGE,
        "max_tokens": 3000,
        "thinking": {"type": "enabled", "budget_tokens": 2048},
    }
    made = _clamped(thinking, MESSAGES)
    assert made.clamp is not None and made.clamp.least == 2049  # above thinking's budget


@pytest.mark.parametrize(
    ("shape", "body", "cap", "fields"),
    [
        (CHAT, {"max_tokens": 500}, 120, {"max_tokens": 120}),
        (CHAT, {"max_completion_tokens": 500}, 120, {"max_completion_tokens": 120}),
        (
            CHAT,
            {"max_completion_tokens": 500, "max_tokens": 90},
            120,
            {"max_completion_tokens": 120},  # max_tokens already below it
        ),
        (CHAT, {}, 120, {"max_tokens": 120}),
        (CHAT, {"max_tokens": None}, 120, {"max_tokens": 120}),
        (COMPLETIONS, {"max_tokens": 500}, 7, {"max_tokens": 7}),
        (RESPONSES, {"max_output_tokens": 500}, 16, {"max_output_tokens": 16}),
        (MESSAGES, {"max_tokens": 500}, 1, {"max_tokens": 1}),
        (EMBEDDINGS, {}, 5, {}),
        # Gemini's cap is nested: its top-level object goes, the rest of it kept.
        (
            GENERATE_CONTENT,
            {"generationConfig": {"maxOutputTokens": 500, "temperature": 0.5}},
            30,
            {"generationConfig": {"maxOutputTokens": 30, "temperature": 0.5}},
        ),
        (GENERATE_CONTENT, {}, 30, {"generationConfig": {"maxOutputTokens": 30}}),
        (GENERATE_CONTENT, {"generationConfig": {"maxOutputTokens": 9}}, 30, {}),
    ],
)
def test_the_fields_a_lowered_cap_sets(
    shape: Shape, body: dict[str, object], cap: int, fields: dict[str, object]
) -> None:
    assert output_caps.lowered(body, shape.output_caps, cap) == fields


def test_gemini_s_candidates_multiply_its_cap() -> None:
    body = {"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"candidateCount": 2}}
    made = _clamped(body, GENERATE_CONTENT, default=50)
    assert made.clamp is not None and made.clamp.per["tokens"] == 2.0
    assert made.cap_field == ("generationConfig", "maxOutputTokens")


def test_a_lowered_cap_goes_in_the_body_and_its_bytes() -> None:
    body = {"model": "m", "messages": MESSAGE, "max_tokens": 500, "n": 2}
    raw = orjson.dumps(body)
    ask = Ask(body=dict(body), raw=raw)
    made = reservation(body, raw, CHAT, 256, PRICE, clamp=True)
    admission = Admission(reserved=dict(made.cost), clamp=made.clamp)
    call = Call(Arrival("r", CHAT, 0.0), ask=ask, admission=admission)
    assert bound_now(call) == made.cost
    call.ask, call.admission = lower_cap(ask, admission, CHAT, 120)
    assert call.admission.clamped and not admission.clamped  # a new admission, and ask
    assert call.ask.body["max_tokens"] == 120 and ask.body["max_tokens"] == 500
    assert orjson.loads(call.ask.raw) == {**body, "max_tokens": 120}
    assert call.admission.clamp is not None and call.admission.clamp.most == 120
    # What its budgets would reserve for it now: 120 tokens in each of its 2 choices.
    assert bound_now(call)["tokens"] == len(raw) + 240
    assert call.admission.reserved == made.cost  # its check's reservation is the pipeline's
