"""Which APIs reach which: chat completions and the Messages API each reach deployments
speaking the other, nothing else is translated; a request is translated once per API
(a retry reuses it) and a refusal is kept to be the answer."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.errors import InvalidRequest
from proxy.translate import LINKS, Translations, link_for, reachable


def test_chat_and_messages_reach_each_other_and_nothing_else() -> None:
    assert reachable(frozenset({"messages"})) == {"messages", "chat/completions"}
    assert reachable(frozenset({"chat/completions", "embeddings"})) == {
        "chat/completions",
        "embeddings",
        "messages",
    }
    assert reachable(frozenset({"embeddings", "responses"})) == {"embeddings", "responses"}
    assert link_for("chat/completions", {"messages"}.__contains__) is LINKS["chat/completions"][0]
    assert link_for("messages", {"chat/completions"}.__contains__) is LINKS["messages"][0]
    for shape in ("responses", "embeddings", "completions", "messages/count_tokens"):
        assert link_for(shape, lambda _: True) is None
    assert link_for("chat/completions", {"embeddings"}.__contains__) is None


def test_a_request_is_translated_once_and_its_refusal_kept() -> None:
    made: list[dict[str, Any]] = []
    link = LINKS["chat/completions"][0]

    def counting(body: dict[str, Any], cap: int) -> dict[str, Any]:
        made.append(body)
        return link.request(body, cap)

    counted = type(link)(link.client, link.upstream, counting, link.answer, link.error, link.stream)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    translations = Translations(300)
    first = translations.body_for(counted, body)
    assert translations.body_for(counted, body) is first and len(made) == 1
    assert first["max_tokens"] == 300
    assert translations.refusal() is None

    refusing = Translations(300)
    for _ in range(2):
        with pytest.raises(InvalidRequest):
            refusing.body_for(link, {**body, "n": 3})
    refusal = refusing.refusal()
    assert refusal is not None and refusal.param == "n"


def test_chat_reaches_bedrocks_converse_and_prefers_the_messages_api() -> None:
    assert reachable(frozenset({"converse"})) == {"converse", "chat/completions"}
    converse = link_for("chat/completions", {"converse"}.__contains__)
    assert converse is not None and converse.upstream.name == "converse"
    both = link_for("chat/completions", {"converse", "messages"}.__contains__)
    assert both is not None and both.upstream.name == "messages"
    assert link_for("messages", {"converse"}.__contains__) is None
