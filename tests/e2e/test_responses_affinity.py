"""Stored responses across replicas: two proxies sharing a real Redis, one model group
of two deployments that are different accounts (two fake upstreams, each knowing only
the responses it created). A conversation created on one replica and continued on the
other, retrieved here and there (whole or as a stream), always reaches the account that
holds it: the fakes never see an id they did not create. Another key gets 404. With
Redis down, an id this replica did not see is a 503 (the store is unavailable), not a
404."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import openai
import pytest
from support.proxy_server import ProxyInThread, settings_from
from support.redis_server import RedisServer

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

UPSTREAM_KEY = "sk-upstream-accounts"
ALICE = "sk-alice-affinity"
BOB = "sk-bob-affinity"
MODEL = "gpt-4o-mini"


@pytest.fixture
def accounts() -> Iterator[list[FakeUpstreamHandle]]:
    with ExitStack() as stack:
        yield [
            stack.enter_context(
                run_in_thread(FakeUpstreamConfig(port=0, api_key=UPSTREAM_KEY, chunk_delay=0))
            )
            for _ in range(2)
        ]


def _config(accounts: list[FakeUpstreamHandle], redis_url: str) -> dict[str, Any]:
    return {
        "keys": [{"name": "alice", "key": ALICE}, {"name": "bob", "key": BOB}],
        "models": [
            {
                "name": MODEL,
                "deployments": [
                    {"id": f"account-{i}", "base_url": a.base_url, "api_key": UPSTREAM_KEY}
                    for i, a in enumerate(accounts)
                ],
            }
        ],
        "routing": {"strategy": "weighted-random", "retries": 1},
        "redis": {"url": redis_url, "on_error": "local"},
    }


def _sdk(proxy: ProxyInThread, key: str = ALICE) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key=key, max_retries=0)


def test_every_follow_up_reaches_the_account_that_holds_the_response(
    accounts: list[FakeUpstreamHandle], redis_url: str
) -> None:
    settings = settings_from(_config(accounts, redis_url))
    with ProxyInThread(settings) as one, ProxyInThread(settings) as two:
        replicas = [_sdk(one), _sdk(two)]
        chains = 0
        # Six chains at least, and on until both accounts hold one: each is created where
        # the weighted shuffle chooses, so six alone land on one account 1 time in 32.
        while chains < 6 or not all(_created(a) for a in accounts):
            assert chains < 40, "the shuffle never chose one of the accounts"
            chain, chains = chains, chains + 1
            first = replicas[chain % 2]
            previous = first.responses.create(model=MODEL, input=f"chain {chain}")
            for turn in range(1, 4):
                here = replicas[(chain + turn) % 2]
                if turn == 2:  # streamed: its id is remembered from response.created
                    with here.responses.stream(
                        model=MODEL, input=f"turn {turn}", previous_response_id=previous.id
                    ) as stream:
                        nxt = stream.get_final_response()
                else:
                    nxt = here.responses.create(
                        model=MODEL, input=f"turn {turn}", previous_response_id=previous.id
                    )
                assert nxt.previous_response_id == previous.id
                there = replicas[(chain + turn + 1) % 2]
                assert there.responses.retrieve(previous.id).id == previous.id
                replayed = list(there.responses.retrieve(previous.id, stream=True))
                assert replayed[-1].response.id == previous.id  # type: ignore[union-attr]
                assert len(there.responses.input_items.list(nxt.id).data) == 1
                previous = nxt
            with pytest.raises(openai.NotFoundError):
                _sdk(two, BOB).responses.retrieve(previous.id)
            with pytest.raises(openai.NotFoundError):
                _sdk(one, BOB).responses.retrieve(previous.id, stream=True)
            with pytest.raises(openai.NotFoundError):
                _sdk(one, BOB).responses.create(
                    model=MODEL, input="theirs", previous_response_id=previous.id
                )
    stats = [account.stats() for account in accounts]
    assert [s["unknown_response_ids"] for s in stats] == [0, 0]
    assert sum(s["follow_ups"] for s in stats) == chains * 3  # every continuation found its own
    assert all(_created(a) for a in accounts), stats  # both accounts held conversations


def _created(account: FakeUpstreamHandle) -> bool:
    """Whether a conversation was started on ``account`` (a create without a previous id;
    the follow-ups of a chain go where it was created)."""
    stats = account.stats()
    return stats["by_endpoint"].get("POST /v1/responses", 0) > stats["follow_ups"]


def test_with_redis_down_an_id_this_replica_did_not_see_is_a_503(
    accounts: list[FakeUpstreamHandle], disposable_redis: RedisServer
) -> None:
    settings = settings_from(_config(accounts, disposable_redis.url))
    with ProxyInThread(settings) as one, ProxyInThread(settings) as two:
        created = _sdk(one).responses.create(model=MODEL, input="before the outage")
        disposable_redis.kill()
        with pytest.raises(openai.InternalServerError) as raised:
            _sdk(two).responses.retrieve(created.id)
        assert raised.value.status_code == 503
        assert raised.value.code == "affinity_unavailable"  # type: ignore[attr-defined]
        # The replica that created it still knows where it lives.
        assert _sdk(one).responses.retrieve(created.id).id == created.id
    assert [a.stats()["unknown_response_ids"] for a in accounts] == [0, 0]
