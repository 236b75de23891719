"""A fallback counts where it is served: the official OpenAI SDK through one proxy on the
memory limiter, one on a real Redis, then two sharing it. ``gpt-4o``'s upstream fails
every request (a fake upstream answering 500) and ``routing.fallbacks`` sends it on to
``gpt-4o-mini`` (a healthy fake). The key's windows and budgets scoped to
``gpt-4o-mini`` count the requests it serves as a fallback, and refuse them when they
are spent (the client gets ``gpt-4o``'s failure, and ``gpt-4o-mini``'s upstream sees
nothing); what ``gpt-4o-mini`` serves is reported and counted under it, and the windows
and budgets scoped to ``gpt-4o`` keep only what a failure there leaves (issue 51, N4:
8 of 8 answered 200 past both limits)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import openai
import pytest
from support.proxy_server import ProxyInThread, settings_from
from support.redis_server import redis_available

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

pytestmark = pytest.mark.skipif(not redis_available(), reason="needs redis-server")

KEY = "sk-fallbacks"
ADMIN = "admin-fallbacks"
BIG, MINI = "gpt-4o", "gpt-4o-mini"
# Output dominates: a request's reservation (~80 bytes in, its 4-token cap out) is
# ~0.0041 USD and its real cost ~0.0040; two fit in 0.01 USD, a third does not.
PRICE = {"input": 1.0, "output": 1000.0}
MAX_TOKENS = 4
# Days, not minutes: nothing refills while the test runs, however slow the machine.
MINI_WINDOW = {"limits": [{"requests": 2, "per": "1d", "models": [MINI]}]}
MINI_BUDGET = {"budgets": [{"usd": 0.01, "period": "day", "models": [MINI]}]}


@pytest.fixture
def upstreams() -> Iterator[tuple[FakeUpstreamHandle, FakeUpstreamHandle]]:
    """``gpt-4o``'s (every request answered 500) and ``gpt-4o-mini``'s."""
    failing = FakeUpstreamConfig(port=0, fail_rate=1.0, fail_status=500)
    with (
        run_in_thread(failing) as big,
        run_in_thread(FakeUpstreamConfig(port=0, chunk_delay=0.001)) as mini,
    ):
        yield big, mini


# (the limiter's Redis or none, replicas)
SETUPS = pytest.mark.parametrize(
    ("redis", "replicas"),
    [(False, 1), (True, 1), (True, 2)],
    ids=["memory", "redis", "redis-2-replicas"],
)


def _proxies(stack: ExitStack, data: dict[str, Any], replicas: int) -> list[ProxyInThread]:
    settings = settings_from(data)
    return [stack.enter_context(ProxyInThread(settings)) for _ in range(replicas)]


def _config(
    upstreams: tuple[FakeUpstreamHandle, FakeUpstreamHandle], redis_url: str, **key: Any
) -> dict[str, Any]:
    big, mini = upstreams
    return {
        "redis": {"url": redis_url},
        "keys": [{"name": "alice", "key": KEY, **key}],
        "models": [
            {
                "name": name,
                "price": PRICE,
                "deployments": [{"id": f"{name}-d", "base_url": upstream.base_url}],
            }
            for name, upstream in ((BIG, big), (MINI, mini))
        ],
        # Failures never cool gpt-4o down here: each request meets its upstream's 500.
        "routing": {
            "retries": 1,
            "fallbacks": {BIG: [MINI]},
            "cooldown": {"allowed_fails": 1000, "window": "1s", "time": "1s"},
        },
        "admin": {"keys": [ADMIN]},
    }


def _ask(
    proxy: ProxyInThread, model: str
) -> openai.types.chat.ChatCompletion | openai.APIStatusError:
    client = openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0)
    try:
        return client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=MAX_TOKENS
        )
    except openai.APIStatusError as error:
        return error
    finally:
        proxy.settled()
        client.close()


def _priced(answer: openai.types.chat.ChatCompletion) -> float:
    assert answer.usage is not None
    used = answer.usage
    return (used.prompt_tokens * PRICE["input"] + used.completion_tokens * PRICE["output"]) / 1e6


def _admin(proxy: ProxyInThread, path: str) -> Any:
    answer = httpx.get(
        f"{proxy.url}/admin/{path}", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def _key_state(proxy: ProxyInThread) -> dict[str, Any]:
    """The key's windows and budgets once the settlements sent to Redis are in: once
    gpt-4o's token window, which the fallbacks' failures there leave as it was, is full
    (or as they stand after 10 s)."""
    deadline = time.monotonic() + 10.0
    while True:
        [alice] = _admin(proxy, "state")["keys"]
        state: dict[str, Any] = alice
        tokens = _scoped(state["windows"], BIG, "tokens")
        if tokens["remaining"] == tokens["limit"] or time.monotonic() > deadline:
            return state
        time.sleep(0.1)


def _scoped(entries: list[dict[str, Any]], model: str | None, kind: str) -> dict[str, Any]:
    """The window or budget of ``kind`` that counts ``model`` only (None: every model)."""
    [entry] = [
        e
        for e in entries
        if e["kind"] == kind and e["models"] == (None if model is None else [model])
    ]
    return entry


@SETUPS
@pytest.mark.parametrize(
    ("limit", "code"), [(MINI_WINDOW, "key_rpd"), (MINI_BUDGET, "key_budget_usd_day")]
)
def test_a_fallback_is_refused_by_the_spent_limits_of_the_model_that_would_serve_it(
    upstreams: tuple[FakeUpstreamHandle, FakeUpstreamHandle],
    redis_url: str,
    redis: bool,
    replicas: int,
    limit: dict[str, Any],
    code: str,
) -> None:
    big, mini = upstreams
    # Beside the limit under test: the key's own window over every model, and a token
    # window of gpt-4o's, whose estimates a failure there gives back. (Parallel slots: a
    # key with them takes no lease of its windows, so Redis holds what the key took.)
    windows = [{"requests": 100, "per": "1d"}, {"tokens": 100_000, "per": "1d", "models": [BIG]}]
    key = {**limit, "limits": [*limit.get("limits", []), *windows], "max_parallel": 10}
    with ExitStack() as stack:
        proxies = _proxies(stack, _config(upstreams, redis_url if redis else "", **key), replicas)
        direct = [_ask(proxies[n % replicas], MINI) for n in range(3)]
        assert [getattr(a, "status_code", 200) for a in direct] == [200, 200, 429]
        assert isinstance(direct[2], openai.APIStatusError) and direct[2].code == code
        fallbacks = [_ask(proxies[n % replicas], BIG) for n in range(8)]
        state = _key_state(proxies[-1])
    statuses = [getattr(a, "status_code", 200) for a in fallbacks]
    print(f"\n{code} spent, {replicas} replica(s): asking {BIG}, answered {statuses}")
    # gpt-4o's own failure, each time; nothing reached gpt-4o-mini past its limit.
    assert statuses == [502] * 8
    assert mini.stats()["requests"] == 2
    assert big.stats()["requests"] == 8
    # Nothing leaked: the refused fallbacks took nothing of gpt-4o-mini's limit, gpt-4o's
    # token estimates came back, and the key's window over every model counted each
    # request once (as it counts any request that failed upstream).
    if limit is MINI_WINDOW:
        assert _scoped(state["windows"], MINI, "requests")["remaining"] < 1
    else:
        [budget] = state["budgets"]
        assert budget["remaining"] < 0.0041
    tokens = _scoped(state["windows"], BIG, "tokens")
    assert tokens["remaining"] == tokens["limit"]
    assert _scoped(state["windows"], None, "requests")["remaining"] == pytest.approx(90, abs=0.5)


@SETUPS
def test_a_fallback_counts_and_is_reported_under_the_model_that_served_it(
    upstreams: tuple[FakeUpstreamHandle, FakeUpstreamHandle],
    redis_url: str,
    redis: bool,
    replicas: int,
) -> None:
    big, mini = upstreams
    key = {
        "limits": [
            {"requests": 3, "per": "1d", "models": [MINI]},
            {"tokens": 100_000, "per": "1d", "models": [BIG]},
        ],
        "budgets": [
            {"usd": 1.0, "period": "day", "models": [BIG]},
            {"usd": 1.0, "period": "day", "models": [MINI]},
        ],
    }
    with ExitStack() as stack:
        proxies = _proxies(stack, _config(upstreams, redis_url if redis else "", **key), replicas)
        served = _ask(proxies[0], BIG)
        assert not isinstance(served, openai.APIStatusError), served
        cost = _priced(served)
        state = _key_state(proxies[-1])
        rows = _spend(proxies[-1], cost)
        metrics = httpx.get(f"{proxies[0].url}/metrics", timeout=5).text
        # gpt-4o-mini's window counted it: two more fit, not three.
        direct = [_ask(proxies[n % replicas], MINI) for n in range(3)]
    assert (big.stats()["requests"], mini.stats()["requests"]) == (1, 3)
    assert _scoped(state["windows"], MINI, "requests")["remaining"] == pytest.approx(2, abs=0.01)
    assert [getattr(a, "status_code", 200) for a in direct] == [200, 200, 429]
    # Its dollars are gpt-4o-mini's, in its budget, the report and the metric; gpt-4o's
    # budget and token window hold what its failure left: nothing.
    assert _scoped(state["budgets"], MINI, "usd")["spent"] == pytest.approx(cost)
    assert _scoped(state["budgets"], BIG, "usd")["spent"] == 0
    tokens = _scoped(state["windows"], BIG, "tokens")
    assert tokens["remaining"] == tokens["limit"]
    assert [(r["model"], r["requests"]) for r in rows] == [(MINI, 1)]
    assert rows[0]["usd"] == pytest.approx(cost)
    assert f'llmproxy_spend_usd_total{{key="alice",model="{MINI}",team=""}}' in metrics
    assert f'model="{BIG}"' not in _lines(metrics, "llmproxy_spend_usd_total")


def _spend(proxy: ProxyInThread, cost: float) -> list[dict[str, Any]]:
    """The day's spend rows once they hold ``cost`` (each replica writes its spend once a
    second), or as they stand after 10 s."""
    deadline = time.monotonic() + 10.0
    while True:
        rows: list[dict[str, Any]] = _admin(proxy, "spend?period=day")["current"]["spend"]
        if sum(r["usd"] for r in rows) == pytest.approx(cost) or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def _lines(text: str, name: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.startswith(name + "{"))
