"""A cost is an amount per limit kind: windows of any kind are limited by both backends.

A kind is only a name. The test adds one of its own (``images``) that no proxy code
knows of, and the configured token kinds (``input_tokens``, ``output_tokens``) go from
config through the catalog to the limiter; each is limited on the memory limiter and on
a real Redis, with an injected clock.
"""

from __future__ import annotations

import pytest
from support.limits import RULE, Subject, subjects, window

from proxy.catalog.catalog import deployment_limits, key_limits
from proxy.config.settings import ClientKey, Deployment
from proxy.costs import estimate_cost
from proxy.limiter.base import (
    DeploymentLimits,
    DeploymentSettlement,
    GroupAsk,
    KeyAsk,
    KeyLimits,
    KeySettlement,
)

s = subjects("memory", "redis")


# -- a kind added by the test alone ------------------------------------------------------

IMAGES = window("images", 10, 60.0)  # 10 images a minute


async def test_a_kind_no_code_knows_limits_a_key(s: Subject) -> None:
    key = KeyLimits("painter", windows=(IMAGES,))
    ask = [KeyAsk(key, f"r{i}", {"requests": 1.0, "images": 3.0}) for i in range(4)]
    verdicts = [await s.limiter.acquire_key(a) for a in ask]
    assert [v.allowed for v in verdicts] == [True, True, True, False]  # 9 of 10 taken
    assert verdicts[3].code == "key_images_1m"
    assert verdicts[3].retry_after == pytest.approx(12.0)  # 2 more images: 6 s each
    # A request that made fewer images than estimated gives them back.
    await s.limiter.settle(KeySettlement(key, "r2", {"images": -3.0}))
    assert (
        await s.limiter.acquire_key(KeyAsk(key, "r4", {"requests": 1.0, "images": 3.0}))
    ).allowed


async def test_a_kind_no_code_knows_paces_a_deployment(s: Subject) -> None:
    painter = DeploymentLimits("painter", windows=(window("images", 6, 60.0, 6),))
    cost = {"requests": 1.0, "images": 2.0}
    waits = [(await s.limiter.reserve(GroupAsk("g", [painter], cost, 30.0))).wait for _ in range(4)]
    assert waits == pytest.approx([0.0, 0.0, 0.0, 20.0])  # 6 at once, then 2 per 20 s
    refused = await s.limiter.reserve(GroupAsk("g", [painter], cost, max_wait=0.0))
    assert refused.deployment_id is None and refused.code == "model_capacity"
    # A turn nobody used is given back whole, its images too.
    turn = await s.limiter.reserve(GroupAsk("g", [painter], cost, max_wait=60.0))
    assert turn.wait == pytest.approx(40.0)
    given_back = {"requests": -1.0, "images": -2.0}
    await s.limiter.settle(DeploymentSettlement("g", painter, RULE, cost=given_back))
    again = await s.limiter.reserve(GroupAsk("g", [painter], cost, max_wait=60.0))
    assert again.wait == pytest.approx(40.0)


async def test_a_request_without_the_kind_costs_nothing_there(s: Subject) -> None:
    key = KeyLimits("painter", windows=(window("images", 1, 60.0),))
    for i in range(5):
        assert (await s.limiter.acquire_key(KeyAsk(key, f"t{i}", estimate_cost(100)))).allowed


# -- input and output tokens, configured --------------------------------------------------


def _key(limits: list[dict[str, object]]) -> KeyLimits:
    return key_limits(ClientKey.model_validate({"name": "k", "key": "secret", "limits": limits}))


def _deployment(limits: list[dict[str, object]]) -> DeploymentLimits:
    config = {"id": "d", "base_url": "http://127.0.0.1:1/v1", "limits": limits}
    return deployment_limits(Deployment.model_validate(config))


async def test_a_key_limits_input_tokens_apart_from_output(s: Subject) -> None:
    key = _key([{"input_tokens": 1000, "per": "1m"}])
    [w] = key.windows
    assert (w.name, w.kind) == ("input_tokens_1m", "input_tokens")
    asks = [KeyAsk(key, f"r{i}", estimate_cost(400, 5000)) for i in range(3)]
    verdicts = [await s.limiter.acquire_key(a) for a in asks]  # outputs count nothing here
    assert [v.allowed for v in verdicts] == [True, True, False]
    assert verdicts[2].code == "key_input_tokens_1m"
    # The first used 100 input tokens of its 400: 300 back, room for a third.
    await s.limiter.settle(KeySettlement(key, "r0", {"input_tokens": -300.0}))
    assert (await s.limiter.acquire_key(KeyAsk(key, "r3", estimate_cost(400, 5000)))).allowed


async def test_a_key_limits_output_tokens_apart_from_input(s: Subject) -> None:
    key = _key([{"output_tokens": 500, "per": "1m"}, {"tokens": 100_000, "per": "1d"}])
    asks = [KeyAsk(key, f"r{i}", estimate_cost(9000, 200)) for i in range(3)]
    verdicts = [await s.limiter.acquire_key(a) for a in asks]
    assert [v.allowed for v in verdicts] == [True, True, False]
    assert verdicts[2].code == "key_output_tokens_1m"
    too_large = await s.limiter.acquire_key(KeyAsk(key, "big", estimate_cost(10, 600)))
    assert too_large.code == "request_too_large"


async def test_a_deployment_paces_output_tokens(s: Subject) -> None:
    # 600 output tokens a minute (less the pacing headroom): one request ahead at most.
    d = _deployment([{"output_tokens": 600, "per": "1m"}])
    [w] = d.windows
    assert (w.name, w.kind) == ("output_tokens_1m", "output_tokens")
    cost = estimate_cost(50_000, 100)  # input is not limited here
    waits = [(await s.limiter.reserve(GroupAsk("g", [d], cost, 60.0))).wait for _ in range(3)]
    assert waits == pytest.approx([0.0, 100 * w.rate.interval, 200 * w.rate.interval])
    assert waits[1] == pytest.approx(10.0, rel=0.02)


async def test_a_deployment_paces_input_tokens(s: Subject) -> None:
    d = _deployment([{"input_tokens": 600, "per": "1m"}, {"requests": 600, "per": "1m"}])
    interval = d.windows[0].rate.interval
    cost = estimate_cost(300, 50_000)  # output is not limited here
    waits = [(await s.limiter.reserve(GroupAsk("g", [d], cost, 90.0))).wait for _ in range(3)]
    assert waits == pytest.approx([0.0, 300 * interval, 600 * interval])
    refused = await s.limiter.reserve(GroupAsk("g", [d], cost, max_wait=5.0))
    assert refused.deployment_id is None and refused.code == "model_capacity"
