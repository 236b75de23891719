"""Budgets in dollars and tokens through a real proxy, with the in-memory limiter and a
real Redis: never exceeded by concurrency, refused with the budget's code until the
reset, every priced answer's cost said, counted and reported alike."""

from __future__ import annotations

import asyncio
import csv
import io
import logging
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from support.proxy_server import ProxyInThread, settings_from
from support.waiting import wait_until

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

KEY = "sk-budgeted"
ADMIN = "admin-secret"
HEADERS = {"authorization": f"Bearer {KEY}"}
OUTPUT = 100  # tokens every answer holds (the fake upstream's completion length)
# Output dominates: a request's reservation (its body's bytes at the input price plus
# its cap at the output price) is close to its real cost, ~0.1 USD.
PRICE = {"input": 1.0, "output": 1000.0}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": OUTPUT}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    config = FakeUpstreamConfig(port=0, completion_tokens=OUTPUT, chunk_delay=0.001)
    with run_in_thread(config) as handle:
        yield handle


@pytest.fixture(params=["memory", "redis"])
def redis(request: pytest.FixtureRequest) -> str:
    return "" if request.param == "memory" else str(request.getfixturevalue("redis_url"))


def config(upstream: FakeUpstreamHandle, redis: str, **key: Any) -> dict[str, Any]:
    return {
        "redis": {"url": redis},
        "keys": [{"name": "alice", "key": KEY, **key}],
        "models": [
            {
                "name": "m",
                "price": PRICE,
                "deployments": [{"id": "d1", "base_url": upstream.base_url}],
            }
        ],
        "routing": {"retries": 0},
        "server": {"default_max_tokens": 50},
        "admin": {"keys": [ADMIN]},
    }


def priced(answer: dict[str, Any]) -> float:
    usage = answer["usage"]
    return (usage["prompt_tokens"] * PRICE["input"] + usage["completion_tokens"] * 1000.0) / 1e6


async def burst(url: str, n: int, body: dict[str, Any] = CHAT) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=n)) as client:
        return await asyncio.gather(
            *(client.post(f"{url}/chat/completions", json=body, headers=HEADERS) for _ in range(n))
        )


def spend_report(proxy: ProxyInThread, **query: str) -> httpx.Response:
    """The report once it counts every request answered 200: with Redis, a replica
    writes its spend once a second (ledger.py)."""
    proxy.settled()
    admin = {"authorization": f"Bearer {ADMIN}"}
    url = f"{proxy.url}/admin/spend"
    period = {"period": query.get("period", "month")}
    text = httpx.get(f"{proxy.url}/metrics", timeout=5).text
    pattern = r'^llmproxy_requests_total\{[^}]*status="200"[^}]*\} (\S+)$'
    served = sum(float(n) for n in re.findall(pattern, text, re.M))
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        current = httpx.get(url, params=period, headers=admin, timeout=10)
        if current.status_code != 200:
            break
        if sum(r["requests"] for r in current.json()["current"]["spend"]) >= served:
            break
        time.sleep(0.1)
    return httpx.get(url, params=query, headers=admin, timeout=10)


def metric(proxy: ProxyInThread, name: str, labels: str) -> float:
    text = httpx.get(f"{proxy.url}/metrics", timeout=5).text
    match = re.search(rf"^{name}\{{{labels}\}} (\S+)$", text, re.M)
    assert match is not None, f"no series {name}{{{labels}}}"
    return float(match.group(1))


@pytest.mark.slow
def test_sixty_at_once_then_one_by_one_never_pass_the_budget_and_reach_it(
    upstream: FakeUpstreamHandle, redis: str
) -> None:
    budget = 1.0  # about ten requests' cost
    with ProxyInThread(
        settings_from(config(upstream, redis, budgets=[{"usd": budget, "period": "month"}]))
    ) as proxy:
        answers = asyncio.run(burst(proxy.base_url, 60))
        for _ in range(5):
            proxy.settled()
            answers += asyncio.run(burst(proxy.base_url, 1))
        passed = [a for a in answers if a.status_code == 200]
        refused = [a for a in answers if a.status_code != 200]
        spent = sum(priced(a.json()) for a in passed)
        one = priced(passed[0].json())
        assert spent <= budget
        assert spent >= budget - 2 * one
        for a in refused:
            assert a.status_code == 429
            assert a.json()["error"]["code"] == "key_budget_usd_month"
            assert "left" in a.json()["error"]["message"]
            assert float(a.headers["retry-after"]) > 0
        # Every answer's cost, said on it, is its usage priced.
        for a in passed:
            assert float(a.headers["x-llm-proxy-cost-usd"]) == pytest.approx(priced(a.json()))
        # The metric and the report agree with the upstream's usage.
        assert metric(proxy, "llmproxy_spend_usd_total", 'key="alice",model="m",team=""') == (
            pytest.approx(spent)
        )
        report = spend_report(proxy).json()
        [row] = report["current"]["spend"]
        assert (row["key"], row["team"], row["model"]) == ("alice", "", "m")
        assert row["usd"] == pytest.approx(spent)
        assert row["requests"] == len(passed)
        assert row["output_tokens"] == OUTPUT * len(passed)
        assert report["current"]["total_usd"] == pytest.approx(spent)


def test_a_request_without_a_cap_is_sent_with_the_one_it_reserved(
    upstream: FakeUpstreamHandle,
) -> None:
    uncapped = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    key = {"budgets": [{"tokens": 1_000_000, "period": "day"}]}
    with ProxyInThread(settings_from(config(upstream, "", **key))) as proxy:
        [answer] = asyncio.run(burst(proxy.base_url, 1, uncapped))
    assert answer.status_code == 200
    assert answer.json()["usage"]["completion_tokens"] == 50  # server.default_max_tokens


def test_a_token_budget_refuses_with_its_code(upstream: FakeUpstreamHandle, redis: str) -> None:
    key = {"budgets": [{"tokens": 300, "period": "day"}]}
    with ProxyInThread(settings_from(config(upstream, redis, **key))) as proxy:
        first = asyncio.run(burst(proxy.base_url, 1))[0]
        proxy.settled()
        answers = asyncio.run(burst(proxy.base_url, 3))
    assert first.status_code == 200
    codes = {a.json()["error"]["code"] for a in answers if a.status_code == 429}
    assert codes == {"key_budget_tokens_day"}


def test_a_budget_scoped_to_other_models_does_not_count_this_one(
    upstream: FakeUpstreamHandle,
) -> None:
    data = config(upstream, "", budgets=[{"usd": 0.0001, "period": "day", "models": ["other"]}])
    data["models"].append(
        {"name": "other", "deployments": [{"id": "d2", "base_url": upstream.base_url}]}
    )
    with ProxyInThread(settings_from(data)) as proxy:
        answers = asyncio.run(burst(proxy.base_url, 3))
    assert [a.status_code for a in answers] == [200, 200, 200]


def test_a_shadow_key_s_budget_is_counted_not_enforced(upstream: FakeUpstreamHandle) -> None:
    key = {"shadow": True, "budgets": [{"usd": 0.25, "period": "week"}]}
    with ProxyInThread(settings_from(config(upstream, "", **key))) as proxy:
        answers = asyncio.run(burst(proxy.base_url, 5))
        assert [a.status_code for a in answers] == [200] * 5
        count = metric(
            proxy, "llmproxy_shadow_rejections_total", 'key="alice",limit="key_budget_usd_week"'
        )
    assert count == 3  # two fit in 0.25 USD


def test_the_spend_report_as_csv(upstream: FakeUpstreamHandle) -> None:
    with ProxyInThread(settings_from(config(upstream, ""))) as proxy:
        answers = asyncio.run(burst(proxy.base_url, 2))
        answer = spend_report(proxy, format="csv", period="day")
        bad = spend_report(proxy, period="year")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(answer.text)))
    assert [(r["key"], r["model"], r["requests"]) for r in rows] == [("alice", "m", "2")]
    assert float(rows[0]["usd"]) == pytest.approx(sum(priced(a.json()) for a in answers))
    assert bad.status_code == 400


def test_a_key_made_through_the_admin_api_has_its_budgets(upstream: FakeUpstreamHandle) -> None:
    with ProxyInThread(settings_from(config(upstream, ""))) as proxy:
        made = httpx.post(
            f"{proxy.url}/admin/keys",
            json={"name": "bob", "budgets": [{"requests": 2, "period": "day"}]},
            headers={"authorization": f"Bearer {ADMIN}"},
            timeout=10,
        )
        assert made.status_code == 201, made.text
        headers = {"authorization": f"Bearer {made.json()['key']}"}
        codes = []
        for _ in range(3):
            answer = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, headers=headers)
            codes.append(answer.status_code)
            proxy.settled()
        assert codes == [200, 200, 429]
        assert answer.json()["error"]["code"] == "key_budget_requests_day"


def test_the_admin_state_and_page_show_what_is_left_and_when_it_resets(
    upstream: FakeUpstreamHandle, redis: str
) -> None:
    key = {"rpm": 100, "budgets": [{"usd": 1.0, "period": "month"}]}
    with ProxyInThread(settings_from(config(upstream, redis, **key))) as proxy:
        [answer] = asyncio.run(burst(proxy.base_url, 1))
        proxy.settled()
        admin = {"authorization": f"Bearer {ADMIN}"}
        state = httpx.get(f"{proxy.url}/admin/state", headers=admin, timeout=10).json()
        page = httpx.get(f"{proxy.url}/admin", headers=admin, timeout=10).text
        # At its check: what was left once this request's bound was reserved.
        gauge = metric(
            proxy, "llmproxy_budget_remaining", 'budget="key_budget_usd_month",owner="alice"'
        )
    [alice] = state["keys"]
    [budget] = alice["budgets"]
    assert (budget["name"], budget["kind"], budget["period"]) == (
        "budget_usd_month",
        "usd",
        "month",
    )
    assert budget["spent"] == pytest.approx(priced(answer.json()))
    assert budget["remaining"] == pytest.approx(1.0 - priced(answer.json()))
    assert budget["resets"]["at"].endswith("T00:00:00.000Z")
    assert budget["resets"]["at"][8:10] == "01"  # the first of a month
    assert 'data-budget="budget_usd_month"' in page and "resets" in page
    assert 0.85 < gauge < 1.0 - priced(answer.json())


def test_a_stream_s_cost_is_logged_and_counted_when_it_ends(
    upstream: FakeUpstreamHandle, caplog: pytest.LogCaptureFixture
) -> None:
    key = {"budgets": [{"usd": 1.0, "period": "day"}]}
    with (
        caplog.at_level(logging.INFO, logger="proxy.access"),
        ProxyInThread(settings_from(config(upstream, "", **key))) as proxy,
    ):
        client = openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0)
        chunks = list(
            client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=OUTPUT,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        usage = chunks[-1].usage
        assert usage is not None
        cost = (usage.prompt_tokens * PRICE["input"] + usage.completion_tokens * 1000.0) / 1e6
        proxy.settled()
        assert metric(proxy, "llmproxy_spend_usd_total", 'key="alice",model="m",team=""') == (
            pytest.approx(cost)
        )
        [row] = spend_report(proxy, period="day").json()["current"]["spend"]
        state = httpx.get(
            f"{proxy.url}/admin/state", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10
        ).json()
    logged = [r.cost_usd for r in caplog.records if r.name == "proxy.access"]
    assert logged == [pytest.approx(cost)]
    assert row["usd"] == pytest.approx(cost)
    # Its reservation was settled to its real cost.
    assert state["keys"][0]["budgets"][0]["spent"] == pytest.approx(cost)


@pytest.mark.slow
def test_a_team_s_budget_is_shared_by_its_keys_and_reported_under_the_team(
    upstream: FakeUpstreamHandle, redis: str
) -> None:
    data = config(upstream, redis, team="research")
    data["keys"].append({"name": "bob", "key": "sk-bob", "team": "research"})
    data["teams"] = [{"name": "research", "budgets": [{"usd": 0.25, "period": "month"}]}]
    bob = {"authorization": "Bearer sk-bob"}
    with ProxyInThread(settings_from(data)) as proxy:
        answers = []
        for headers in (HEADERS, bob, HEADERS, bob):
            answers.append(
                httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, headers=headers)
            )
            proxy.settled()
        rows = spend_report(proxy).json()["current"]["spend"]
        spent = metric(proxy, "llmproxy_spend_usd_total", 'key="bob",model="m",team="research"')
    assert [a.status_code for a in answers] == [200, 200, 429, 429]  # two fit in 0.25
    assert {a.json()["error"]["code"] for a in answers[2:]} == {"team_budget_usd_month"}
    assert "team" in answers[2].json()["error"]["message"]
    assert [(r["key"], r["team"]) for r in rows] == [("alice", "research"), ("bob", "research")]
    assert spent == pytest.approx(priced(answers[1].json()))


def test_an_anthropic_answer_is_priced_with_its_cache_reads_and_writes(
    upstream: FakeUpstreamHandle,
) -> None:
    sonnet = {"input": 3.0, "output": 15.0, "cache_read": 0.3, "cache_write": 3.75}
    data = config(upstream, "", budgets=[{"usd": 10, "period": "day"}])
    data["models"] = [
        {
            "name": "claude",
            "price": sonnet,
            "deployments": [
                {"id": "a1", "provider": "anthropic", "base_url": upstream.url, "api_key": "sk-a"}
            ],
        }
    ]
    upstream.control(cache_read_tokens=1000, cache_write_tokens=200)
    try:
        with ProxyInThread(settings_from(data)) as proxy:
            body = {
                "model": "claude",
                "max_tokens": 20,
                "messages": [{"role": "user", "content": "hi"}],
            }
            answer = httpx.post(
                f"{proxy.url}/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=10
            )
            proxy.settled()
            rows = spend_report(proxy, period="day").json()["current"]["spend"]
    finally:
        upstream.control(cache_read_tokens=0, cache_write_tokens=0)
    assert answer.status_code == 200, answer.text
    [row] = rows
    usage = answer.json()["usage"]
    assert (usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]) == (1000, 200)
    expected = (
        usage["input_tokens"] * 3.0 + 200 * 3.75 + 1000 * 0.3 + usage["output_tokens"] * 15.0
    ) / 1e6
    assert float(answer.headers["x-llm-proxy-cost-usd"]) == pytest.approx(expected)
    assert row["usd"] == pytest.approx(expected)


@pytest.mark.slow
def test_a_background_response_is_reported_as_its_estimate_until_read_then_settled_once(
    upstream: FakeUpstreamHandle, redis: str
) -> None:
    """Answered before it has run (no usage): its budgets keep the reservation and the
    report shows it, marked estimated; read once it is over, both become its usage,
    and reading it again changes nothing."""
    key = {"budgets": [{"usd": 1.0, "period": "month"}]}
    admin = {"authorization": f"Bearer {ADMIN}"}

    def kept() -> float:
        state = httpx.get(f"{proxy.url}/admin/state", headers=admin, timeout=10).json()
        spent: float = state["keys"][0]["budgets"][0]["spent"]
        return spent

    with ProxyInThread(settings_from(config(upstream, redis, **key))) as proxy:
        client = openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0)
        queued = client.responses.create(model="m", input="later", background=True)
        assert queued.usage is None
        [estimate] = spend_report(proxy).json()["current"]["spend"]
        reserved = kept()
        done = client.responses.retrieve(queued.id)
        assert done.usage is not None
        client.responses.retrieve(queued.id)  # again: nothing more
        wait_until(lambda: not proxy.app.state.pipeline.background._tasks, what="settled")

        def report_settled() -> bool:  # with Redis: once the correction's write is in
            [row] = spend_report(proxy).json()["current"]["spend"]
            return row["estimated"] == 0 and row["requests"] == 3

        wait_until(report_settled, what="the correction reported")
        [row] = spend_report(proxy).json()["current"]["spend"]
        settled = kept()
        spent = metric(proxy, "llmproxy_spend_usd_total", 'key="alice",model="m",team=""')
    assert (estimate["requests"], estimate["estimated"]) == (1, 1)
    assert estimate["usd"] == pytest.approx(reserved)
    cost = (done.usage.input_tokens * PRICE["input"] + done.usage.output_tokens * 1000.0) / 1e6
    assert (row["requests"], row["estimated"]) == (3, 0)  # two reads: requests of no cost
    assert (row["input_tokens"], row["output_tokens"]) == (
        done.usage.input_tokens,
        done.usage.output_tokens,
    )
    assert row["usd"] == pytest.approx(cost)
    assert settled == pytest.approx(cost)
    assert spent == pytest.approx(cost)
