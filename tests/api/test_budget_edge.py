"""``budget_edge: clamp`` as clients see it, through a real proxy (in this process, the
in-memory limiter) and the fake upstream, with the official SDKs: a request its budget
cannot pay whole goes with the output cap the budget has left (``max_tokens``,
``max_completion_tokens``, ``max_output_tokens``), says so (``x-llm-proxy-clamped: 1``),
and the budget is used to its last output token and never passed; ``refuse`` refuses
as before. Keys of the config, of the admin API, and teams of both."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from support.proxy_server import ProxyInThread, settings_from

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

ADMIN = "admin-secret"
BUDGET = 3000  # tokens a day
ASKED = 1000  # each request's output cap
CLAMPED = "x-llm-proxy-clamped"
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
TOKENS_DAY = [{"tokens": BUDGET, "period": "day"}]


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    # Every answer is as long as its cap lets it be: the cap sent is the output counted.
    config = FakeUpstreamConfig(port=0, completion_tokens=100_000, chunk_delay=0.0)
    with run_in_thread(config) as handle:
        yield handle


def config(upstream: FakeUpstreamHandle) -> dict[str, Any]:
    def key(name: str, **entry: Any) -> dict[str, Any]:
        return {"name": name, "key": f"sk-{name}", **entry}

    return {
        "teams": [{"name": "t", "budgets": TOKENS_DAY, "budget_edge": "clamp"}],
        "keys": [
            key("clamping", budgets=TOKENS_DAY, budget_edge="clamp"),
            key("refusing", budgets=TOKENS_DAY),
            key("member", team="t"),
            key("shadow", budgets=TOKENS_DAY, budget_edge="clamp", shadow=True),
        ],
        "models": [
            {"name": "m", "deployments": [{"id": "d", "base_url": upstream.base_url}]},
            {
                "name": "claude",
                "deployments": [
                    {
                        "id": "a",
                        "provider": "anthropic",
                        "base_url": upstream.url,
                        "api_key": "sk-ant-upstream-key",
                    }
                ],
            },
        ],
        "routing": {"retries": 0},
        "admin": {"keys": [ADMIN]},
    }


@pytest.fixture
def proxy(upstream: FakeUpstreamHandle) -> Iterator[ProxyInThread]:
    with ProxyInThread(settings_from(config(upstream))) as running:
        yield running


# One request's answer: status, whether it says it was clamped, output tokens counted.
Answer = tuple[int, bool, int]


def chat(proxy: ProxyInThread, key: str, field: str = "max_tokens") -> Answer:
    client = openai.OpenAI(base_url=proxy.base_url, api_key=key, max_retries=0)
    cap: dict[str, Any] = {field: ASKED}
    try:
        raw = client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES, **cap)
    except openai.APIStatusError as refused:
        assert refused.status_code == 429, refused
        assert CLAMPED not in refused.response.headers
        return refused.status_code, False, 0
    finally:
        proxy.settled()
    usage = raw.parse().usage
    assert usage is not None
    return raw.status_code, raw.headers.get(CLAMPED) == "1", usage.completion_tokens


def until_refused(send: Callable[[], Answer]) -> list[Answer]:
    answers = [send()]
    while answers[-1][0] == 200:
        answers.append(send())
        assert len(answers) < 20
    return answers


def check_clamped(answers: list[Answer], budget: int = BUDGET) -> None:
    """Used to the end, never passed: whole answers, then the clamped one(s) below the
    cap asked for, each saying so, then the budget's 429."""
    served = answers[:-1]
    assert [clamped for _, clamped, _ in served] == [False, False, True]
    for _, clamped, output in served:
        assert (output < ASKED) == clamped
    assert 0 < served[-1][2] < ASKED


def spent(proxy: ProxyInThread, key: str) -> float:
    state = httpx.get(
        f"{proxy.url}/admin/state", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10
    ).json()
    entry = next(k for k in state["keys"] if k["name"] == key)
    [budget] = entry["budgets"]
    return float(budget["limit"] - budget["remaining"])


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_clamping_key_is_served_to_the_end_of_its_budget(
    proxy: ProxyInThread, field: str
) -> None:
    answers = until_refused(lambda: chat(proxy, "sk-clamping", field))
    check_clamped(answers)
    used = spent(proxy, "clamping")
    print(f"\nclamp ({field}): {answers}, {used:g} of {BUDGET} tokens")
    # What is left cannot pay the next request's input bound (its body's bytes) and one
    # output token: a hundred tokens at most.
    assert BUDGET - 100 <= used <= BUDGET


def test_a_stream_says_it_was_clamped_before_its_first_event(proxy: ProxyInThread) -> None:
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-clamping", max_retries=0)

    def send() -> Answer:
        try:
            raw = client.chat.completions.with_raw_response.create(
                model="m",
                messages=MESSAGES,
                max_tokens=ASKED,
                stream=True,
                stream_options={"include_usage": True},
            )
        except openai.APIStatusError as refused:
            assert refused.status_code == 429
            return refused.status_code, False, 0
        try:
            chunks = list(raw.parse())  # its usage comes last
        finally:
            proxy.settled()
        usage = chunks[-1].usage
        assert usage is not None
        return raw.status_code, raw.headers.get(CLAMPED) == "1", usage.completion_tokens

    check_clamped(until_refused(send))


def test_a_refusing_key_is_refused_as_before(proxy: ProxyInThread) -> None:
    answers = until_refused(lambda: chat(proxy, "sk-refusing"))
    assert answers[:-1] == [(200, False, ASKED)] * 2  # the third no longer fits whole
    assert spent(proxy, "refusing") < BUDGET - 900


def test_a_team_that_clamps_clamps_its_keys_requests(proxy: ProxyInThread) -> None:
    check_clamped(until_refused(lambda: chat(proxy, "sk-member")))


def test_a_shadow_key_is_never_clamped(proxy: ProxyInThread) -> None:
    answers = [chat(proxy, "sk-shadow") for _ in range(4)]
    assert answers == [(200, False, ASKED)] * 4  # its budget counted, not enforced


def test_an_anthropic_client_s_max_tokens_is_lowered(proxy: ProxyInThread) -> None:
    client = anthropic.Anthropic(base_url=proxy.url, api_key="sk-clamping", max_retries=0)

    def send() -> Answer:
        try:
            raw = client.messages.with_raw_response.create(
                model="claude", max_tokens=ASKED, messages=MESSAGES
            )
        except anthropic.APIStatusError as refused:
            assert refused.status_code == 429
            assert refused.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
            return refused.status_code, False, 0
        finally:
            proxy.settled()
        message = raw.parse()
        if raw.headers.get(CLAMPED):
            assert message.stop_reason == "max_tokens"
        return raw.status_code, raw.headers.get(CLAMPED) == "1", message.usage.output_tokens

    check_clamped(until_refused(send))


def test_a_responses_client_s_max_output_tokens_is_lowered(proxy: ProxyInThread) -> None:
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-clamping", max_retries=0)

    def send() -> Answer:
        try:
            raw = client.responses.with_raw_response.create(
                model="m", input="hi", max_output_tokens=ASKED
            )
        except openai.APIStatusError as refused:
            assert refused.status_code == 429
            return refused.status_code, False, 0
        finally:
            proxy.settled()
        usage = raw.parse().usage
        assert usage is not None
        return raw.status_code, raw.headers.get(CLAMPED) == "1", usage.output_tokens

    answers = until_refused(send)
    check_clamped(answers)
    assert answers[-2][2] >= 16  # never below what the Responses API takes


@pytest.mark.slow
def test_keys_and_teams_of_the_admin_api_take_budget_edge(proxy: ProxyInThread) -> None:
    with httpx.Client(
        base_url=f"{proxy.url}/admin", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10
    ) as api:
        bad = api.post("/keys", json={"name": "x", "budget_edge": "trim"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "budget_edge"
        entry = {"name": "api-key", "budgets": TOKENS_DAY, "budget_edge": "clamp"}
        secret = api.post("/keys", json=entry).json()["key"]
        listed = {k["name"]: k for k in api.get("/keys").json()["keys"]}
        assert listed["api-key"]["budget_edge"] == "clamp"
        assert listed["clamping"]["budget_edge"] == "clamp"  # a config key's, listed too
        check_clamped(until_refused(lambda: chat(proxy, secret)))

        # Changed to refuse: a fresh budget (another name for the same key) refuses.
        patched = api.patch("/keys/api-key", json={"budget_edge": "refuse"})
        assert patched.status_code == 200 and patched.json()["budget_edge"] == "refuse"
        week = [{"tokens": BUDGET, "period": "week"}]
        assert api.patch("/keys/api-key", json={"budgets": week}).status_code == 200
        assert [a[:2] for a in until_refused(lambda: chat(proxy, secret))] == [
            (200, False),
            (200, False),
            (429, False),
        ]

        team = {"name": "api-team", "budgets": TOKENS_DAY, "budget_edge": "clamp"}
        assert api.post("/teams", json=team).status_code == 201
        listed_teams = {t["name"]: t for t in api.get("/teams").json()["teams"]}
        assert listed_teams["api-team"]["budget_edge"] == "clamp"
        assert listed_teams["t"]["budget_edge"] == "clamp"
        member = api.post("/keys", json={"name": "api-member", "team": "api-team"}).json()["key"]
        check_clamped(until_refused(lambda: chat(proxy, member)))
        bad_team = api.patch("/teams/api-team", json={"budget_edge": 3})
        assert bad_team.status_code == 400 and bad_team.json()["error"]["param"] == "budget_edge"


def test_a_fallback_s_budget_clamps_the_request_it_serves(upstream: FakeUpstreamHandle) -> None:
    """``big`` fails every request and falls back to ``m``; the key's budget counts
    ``m`` only: the fallback takes it before it serves, at the cap it can pay, and
    settles its own reservation (the request asked for ``big`` was reserved nothing)."""
    failing = FakeUpstreamConfig(port=0, fail_rate=1.0, fail_status=500)
    with run_in_thread(failing) as big:
        data = config(upstream)
        data["models"].append(
            {"name": "big", "deployments": [{"id": "big-d", "base_url": big.base_url}]}
        )
        scoped = [{"tokens": BUDGET, "period": "day", "models": ["m"]}]
        data["keys"] = [{"name": "scoped", "key": "sk-scoped", "budgets": scoped}]
        data["keys"][0]["budget_edge"] = "clamp"
        data["routing"] = {
            "retries": 1,
            "fallbacks": {"big": ["m"]},
            "cooldown": {"allowed_fails": 1000, "window": "1s", "time": "1s"},
        }
        with ProxyInThread(settings_from(data)) as proxy:
            client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-scoped", max_retries=0)

            def send() -> Answer:
                try:
                    raw = client.chat.completions.with_raw_response.create(
                        model="big", messages=MESSAGES, max_tokens=ASKED
                    )
                except openai.APIStatusError as failed:
                    # big's own failure: the fallback its budget refused was not tried
                    assert failed.status_code >= 500, failed
                    return failed.status_code, False, 0
                finally:
                    proxy.settled()
                completion = raw.parse()
                assert completion.usage is not None
                output = completion.usage.completion_tokens
                return raw.status_code, raw.headers.get(CLAMPED) == "1", output

            answers = until_refused(send)
            check_clamped(answers)
            used = spent(proxy, "scoped")
    assert BUDGET - 100 <= used <= BUDGET
