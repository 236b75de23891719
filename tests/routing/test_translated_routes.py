"""Which deployments a request may take when its group mixes APIs (the dispatcher and the
exchange, without servers): a request is translated only for a deployment that does not
speak its API, and only once that deployment is chosen (beside one that speaks it); a
field the translation refuses takes that deployment out of the candidates (no attempt
counted, its turn given back), and only a group left with none answers the refusal."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from support.journey import Journey, Upstream, config, deployment, ok, status

from proxy.translate import LINKS, Link

MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude",
    "content": [{"type": "text", "text": "Hi"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 5, "output_tokens": 2},
}


def _message(_: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json=MESSAGE)


def _mixed(**routing: object) -> dict[str, Any]:
    anthropic = deployment("b", provider="anthropic", base_url="http://b.test")
    return config([deployment("a"), anthropic], **routing)


@pytest.fixture
def translations(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The chat requests translated to the Messages API, as they are made."""
    made: list[dict[str, Any]] = []
    link = LINKS["chat/completions"][0]

    def counting(body: dict[str, Any], cap: int) -> dict[str, Any]:
        made.append(body)
        return link.request(body, cap)

    counted = Link(link.client, link.upstream, counting, link.answer, link.error, link.stream)
    monkeypatch.setitem(LINKS, "chat/completions", (counted, *LINKS["chat/completions"][1:]))
    return made


async def test_a_request_is_translated_only_for_the_deployment_chosen(
    translations: list[dict[str, Any]],
) -> None:
    upstream = Upstream({"a.test": ok(), "b.test": _message})
    journey = Journey(_mixed(), upstream)
    for _ in range(12):
        assert (await journey.send()).status == 200
    assert set(upstream.sent) == {"a.test", "b.test"}  # both served (least-wait's shuffle)
    assert len(translations) == upstream.sent.count("b.test")


async def test_a_refused_field_takes_the_translating_deployment_out_beside_one_speaking_it(
    translations: list[dict[str, Any]],
) -> None:
    upstream = Upstream({"a.test": ok(), "b.test": _message})
    journey = Journey(_mixed(retries=0), upstream)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2}
    for _ in range(12):
        reply = await journey.send(body)
        assert reply.status == 200, reply.body
    assert upstream.sent == ["a.test"] * 12  # never b, whose turn went back (no retry spent)
    assert len(translations) >= 1  # made when b was chosen, refused, kept for the request


async def test_a_retry_crosses_providers_translated() -> None:
    upstream = Upstream({"a.test": status(500), "b.test": _message})
    journey = Journey(_mixed(), upstream)
    reply = await journey.send()
    assert reply.status == 200
    answer = orjson.loads(reply.body)
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["content"] == "Hi"
    assert upstream.sent[-1] == "b.test"


async def test_a_group_only_translation_reaches_answers_the_refusal_before_any_turn() -> None:
    upstream = Upstream({"b.test": _message})
    anthropic = deployment("b", provider="anthropic", base_url="http://b.test")
    journey = Journey(config([anthropic]), upstream)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": True}
    reply = await journey.send(body)
    error = orjson.loads(reply.body)["error"]
    assert (reply.status, error["param"], error["code"]) == (
        400,
        "logprobs",
        "untranslatable_field",
    )
    assert upstream.sent == []
    assert (await journey.send()).status == 200  # without it: translated and served


async def test_after_the_speaking_deployment_failed_the_refusal_is_not_the_answer() -> None:
    upstream = Upstream({"a.test": status(500), "b.test": _message})
    journey = Journey(_mixed(), upstream)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2}
    reply = await journey.send(body)
    assert reply.status == 502  # a's failure: b could not have served it either
    assert "b.test" not in upstream.sent


@pytest.mark.slow
async def test_a_fallback_crosses_providers_translated() -> None:
    upstream = Upstream({"a.test": status(500), "b.test": _message})
    data = config([deployment("a")], fallbacks={"m": ["claude"]}, retries=1)
    anthropic = deployment("b", provider="anthropic", base_url="http://b.test")
    data["models"].append({"name": "claude", "deployments": [anthropic]})
    journey = Journey(data, upstream)
    reply = await journey.send()
    assert reply.status == 200
    assert orjson.loads(reply.body)["choices"][0]["message"]["content"] == "Hi"
    assert upstream.sent == ["a.test", "b.test"]
