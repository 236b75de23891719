"""One request's journey through the pipeline and the dispatcher, without servers: the
memory limiter on an injected clock and a scripted upstream (support/journey.py).

Each scenario says what the client gets and what its key and the upstream were charged."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest
from support.journey import REQUEST, USAGE, Journey, Upstream, config, deployment, ok, status

from proxy.costs import TOKENS
from proxy.keys.memory_backend import MemoryKeyBackend
from proxy.keys.store import RuntimeKeys
from proxy.limiter.base import DeploymentVerdict, GroupAsk
from proxy.limiter.memory import MemoryLimiter
from proxy.providers import PROVIDERS
from proxy.providers.openai import OpenAICompatible
from proxy.request.call import Reply
from proxy.shapes.chat import CHAT
from proxy.shapes.embeddings import EMBEDDINGS


def remaining_tokens(reply: Reply) -> int:
    return int(reply.headers["x-ratelimit-remaining-tokens"])


def error_code(reply: Reply) -> str:
    return str(orjson.loads(reply.body)["error"]["code"])


async def test_a_200_whose_usage_cannot_be_read_is_charged_its_estimate_not_refunded() -> None:
    read = Journey(config([deployment("a")], {"tpm": 100_000}), Upstream({"a.test": ok()}))
    await read.send()
    after_read = remaining_tokens(await read.send())
    blind = Journey(config([deployment("a")], {"tpm": 100_000}), Upstream({"a.test": ok(None)}))
    await blind.send()
    after_blind = remaining_tokens(await blind.send())
    estimate = int(CHAT.estimate(REQUEST, 0)[TOKENS])
    # Each reply shows the key after its own estimate is held: the first request was
    # settled to its real usage (10), or kept its whole estimate.
    assert after_read == 100_000 - 10 - estimate
    assert after_blind == 100_000 - 2 * estimate
    assert blind.counted("llmproxy_usage_unreadable_total", shape="chat/completions") == 2
    assert read.counted("llmproxy_usage_unreadable_total") == 0


async def test_a_failing_deployment_is_retried_on_the_next() -> None:
    calls: list[int] = []

    def first_fails(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return status(500)(request) if len(calls) == 1 else ok()(request)

    upstream = Upstream({"a.test": first_fails, "b.test": first_fails})
    reply = await Journey(config([deployment("a"), deployment("b")]), upstream).send()
    assert reply.status == 200
    assert sorted(upstream.sent) == ["a.test", "b.test"]  # not the failed one again


async def test_a_fallback_group_serves_what_its_own_group_cannot() -> None:
    data = config([deployment("a")], retries=1)
    data["models"].append({"name": "backup", "deployments": [deployment("b")]})
    data["routing"]["fallbacks"] = {"m": ["backup"]}
    upstream = Upstream({"a.test": status(503), "b.test": ok()})
    reply = await Journey(data, upstream).send()
    assert reply.status == 200
    assert upstream.sent == ["a.test", "b.test"]


async def test_a_fallback_that_fails_too_gives_back_what_it_took_for_the_next() -> None:
    """``m`` fails, then its first fallback ``b``; ``c`` serves. The key's windows of each
    model: ``c``'s counts the request's usage; ``m``'s and ``b``'s keep what a failure
    leaves (its tokens back, its request counted)."""
    windows = [
        {kind: amount, "per": "1d", "models": [model]}
        for model in ("m", "b", "c")
        for kind, amount in (("tokens", 1000), ("requests", 10))
    ]
    data = config([deployment("a")], {"limits": windows}, retries=2)
    data["models"] += [{"name": g, "deployments": [deployment(g)]} for g in ("b", "c")]
    data["routing"]["fallbacks"] = {"m": ["b", "c"]}
    upstream = Upstream({"a.test": status(503), "b.test": status(503), "c.test": ok()})
    journey = Journey(data, upstream)
    reply = await journey.send()
    assert reply.status == 200
    assert upstream.sent == ["a.test", "b.test", "c.test"]
    limits = journey.pipeline.catalog.key_limits["k"]
    left = (await journey.pipeline.limiter.key_snapshot(limits)).remaining
    assert left == {
        "tpd@m": 1000,
        "rpd@m": 9,
        "tpd@b": 1000,
        "rpd@b": 9,
        "tpd@c": 1000 - USAGE["total_tokens"],
        "rpd@c": 9,
    }


async def test_a_key_refused_sends_nothing_and_leaves_the_deployments_turn_free() -> None:
    upstream = Upstream({"a.test": ok()})
    journey = Journey(config([deployment("a", rpm=60, burst=2)], {"rpm": 1}), upstream)
    assert (await journey.send()).status == 200
    reserved: list[GroupAsk] = []
    limiter = journey.pipeline.limiter
    assert isinstance(limiter, MemoryLimiter)
    real_reserve_now = limiter.reserve_now

    def reserve_now(ask: GroupAsk) -> DeploymentVerdict:
        reserved.append(ask)
        return real_reserve_now(ask)

    limiter.reserve_now = reserve_now  # type: ignore[method-assign]
    refused = await journey.send()
    # Judged at once (in memory): refused before any turn was asked for.
    assert reserved == []
    assert (refused.status, error_code(refused)) == (429, "key_rpm")
    assert upstream.sent == ["a.test"]
    # The refused request's turn went back: the deployment's second turn is still free.
    limits = journey.pipeline.catalog.limits(journey.pipeline.catalog.groups["m"].deployments[0])
    state = await journey.pipeline.limiter.snapshot("m", [limits])
    assert state["a"].remaining["rpm"] >= 0.9


async def test_a_full_queue_refuses_a_request_that_would_wait() -> None:
    upstream = Upstream({"a.test": ok()})
    journey = Journey(config([deployment("a", rpm=60)], max_queue=0, max_wait="10s"), upstream)
    assert (await journey.send()).status == 200
    refused = await journey.send()  # its turn is a second away; no room to wait
    assert (refused.status, error_code(refused)) == (429, "queue_full")
    assert upstream.sent == ["a.test"]


class RoundTrip(MemoryLimiter):
    """Reservations answered on a later loop turn, as Redis answers them: other requests
    ask meanwhile."""

    async def reserve(self, ask: GroupAsk) -> DeploymentVerdict:
        await asyncio.sleep(0)
        return await super().reserve(ask)


async def test_a_turn_granted_once_the_queue_filled_is_given_back() -> None:
    """B and C ask together with room for one waiting request: B's turn comes first and
    B waits for it; C's turn, granted as the queue filled, goes back (429 queue_full),
    so the next turn after B's is free for whoever asks next."""
    data = config([deployment("a", rpm=60)], max_queue=1, max_wait="10s", lookahead="0s")
    journey = Journey(data, Upstream({"a.test": ok()}), RoundTrip)
    assert (await journey.send()).status == 200
    catalog = journey.pipeline.catalog
    limits = [catalog.limits(d) for d in catalog.groups["m"].deployments]
    spacing = (await journey.pipeline.limiter.snapshot("m", limits))["a"].next_turn
    b, c = await asyncio.gather(journey.send(), journey.send())
    assert b.status == 200
    assert (c.status, error_code(c)) == (429, "queue_full")
    # B took the turn after A's; C's, after B's, is free again (the limiter's clock stood).
    after = (await journey.pipeline.limiter.snapshot("m", limits))["a"].next_turn
    assert after == pytest.approx(2 * spacing)


async def test_a_model_none_of_whose_deployments_speaks_the_api_is_a_400(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class ChatOnly(OpenAICompatible):
        shapes = frozenset({"chat/completions"})

    monkeypatch.setitem(PROVIDERS, "openai", ChatOnly())
    upstream = Upstream({"a.test": ok()})
    journey = Journey(config([deployment("a")]), upstream)
    reply = await journey.send({"model": "m", "input": "hello"}, EMBEDDINGS)
    body = orjson.loads(reply.body)["error"]
    assert (reply.status, body["code"], body["param"]) == (400, "unsupported_api", "model")
    assert "embeddings" in body["message"] and "'m'" in body["message"]
    assert upstream.sent == []
    assert (await journey.send()).status == 200  # chat, which it speaks


async def test_a_budget_over_other_models_costs_a_request_nothing() -> None:
    """No reservation and no budget in the key's step: a request without an output cap
    goes as it was sent (one the budget counts goes with the cap it was reserved for),
    and the budget is not charged."""
    budget = {"tokens": 1000, "period": "day", "models": ["other"]}
    data = config([deployment("a")], {"budgets": [budget]})
    data["models"].append({"name": "other", "deployments": [deployment("b")]})
    sent: list[dict[str, object]] = []

    def recording(request: httpx.Request) -> httpx.Response:
        sent.append(orjson.loads(request.content))
        return ok()(request)

    journey = Journey(data, Upstream({"a.test": recording, "b.test": recording}))
    uncapped = {"model": "m", "messages": REQUEST["messages"]}
    assert (await journey.send(uncapped)).status == 200
    assert (await journey.send({**uncapped, "model": "other"})).status == 200
    assert ["max_tokens" in body for body in sent] == [False, True]
    limits = journey.pipeline.catalog.key_limits["k"]
    [(quota, left)] = (await journey.pipeline.limiter.key_snapshot(limits)).budgets
    assert quota.models == ("other",)
    assert left.remaining == 1000 - USAGE["total_tokens"]  # the one request to "other"


async def test_a_revoked_api_keys_limits_leave_the_catalog_in_force() -> None:
    keys = RuntimeKeys(MemoryKeyBackend(), shared=False)
    data = {**config([deployment("a")]), "teams": [{"name": "t", "rpm": 100}]}
    journey = Journey(data, Upstream({"a.test": ok()}), runtime_keys=keys)
    _, secret = await keys.create("svc", {"team": "t"}, None)
    assert (await journey.send(bearer=f"Bearer {secret}")).status == 200
    catalog = journey.pipeline.catalog
    held = len(catalog.held())  # its limits for model "m", with its team's
    await keys.revoke("svc")
    assert len(catalog.held()) == held - 1
