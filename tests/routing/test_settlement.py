"""Settling turns: which reserved turns are stale (a turn is taken again only when the
deployment learned a new pace after it was reserved: health.py's epochs), and what a
settled request leaves charged."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from support.proxy_server import settings_from

from proxy.background import Background
from proxy.catalog.catalog import Catalog, pacing_headroom
from proxy.costs import estimate_cost
from proxy.limiter.base import SUCCESS, CooldownRule, DeploymentState, GroupAsk, Sent
from proxy.limiter.memory import MemoryLimiter
from proxy.routing.settlement import Settler, Turn

CATALOG = Catalog(
    settings_from(
        {
            "models": [
                {"name": "m", "deployments": [{"id": "d", "base_url": "http://127.0.0.1:1/v1"}]}
            ]
        }
    )
)
ROUTE = CATALOG.groups["m"].deployments[0]


def _settler() -> Settler:
    unused = cast(Any, None)  # saw/stale use none of the collaborators
    return Settler(unused, CATALOG, CooldownRule(3, 60.0, 30.0), unused, unused, least_busy=False)


def _turn(epoch: int) -> Turn:
    return Turn(ROUTE, "lease", sent=Sent(epoch=epoch))


def test_a_turn_of_an_older_epoch_is_stale() -> None:
    settler = _settler()
    settler.saw("d", 2)
    assert settler.stale(_turn(1))
    assert not settler.stale(_turn(2))
    assert not settler.stale(Turn(ROUTE, "lease"))  # nothing known of its turn


def test_epochs_that_start_again_make_no_turn_stale_forever() -> None:
    """A forgotten health, a restarted Redis or the local fallback count from 0 again:
    the latest epoch seen is what counts, not the largest ever."""
    settler = _settler()
    settler.saw("d", 5)
    settler.saw("d", 0)
    assert not settler.stale(_turn(0))
    assert not settler.stale(_turn(4))


TOKENS_CATALOG = Catalog(
    settings_from(
        {
            "models": [
                {
                    "name": "m",
                    "deployments": [
                        {"id": "d", "base_url": "http://127.0.0.1:1/v1", "tpm": 100_000}
                    ],
                }
            ],
            "routing": {"pacing_margin": "50ms"},  # fixed: the rate checked below
        }
    )
)


def _settled(estimate: int, real_tokens: int | None, refund: bool = False) -> DeploymentState:
    """The deployment of 100,000 tokens a minute, at the same instant, after one request
    of ``estimate`` tokens was reserved and settled so (a real in-memory limiter)."""
    [route] = TOKENS_CATALOG.groups["m"].deployments
    limiter = MemoryLimiter(clock=lambda: 0.0)
    background = Background()
    unused = cast(Any, None)  # no health changes to report
    rule = CooldownRule(3, 60.0, 30.0)
    settler = Settler(limiter, TOKENS_CATALOG, rule, background, unused, least_busy=False)

    async def scenario() -> DeploymentState:
        limits = TOKENS_CATALOG.limits(route)
        verdict = await limiter.reserve(
            GroupAsk("m", [limits], estimate_cost(float(estimate)), 60.0)
        )
        assert verdict.deployment_id == "d" and verdict.wait == 0.0
        turn = Turn(route, "", sent=verdict.sent)
        used = None if real_tokens is None else {"tokens": float(real_tokens)}
        settler.settle(turn, SUCCESS, estimate=estimate_cost(estimate), used=used, refund=refund)
        await background.drain()
        [state] = (await limiter.snapshot("m", [limits])).values()
        return state

    return asyncio.run(scenario())


@pytest.mark.parametrize(("refund", "left"), [(True, 100_000.0), (False, 2_000.0)])
def test_a_request_the_upstream_did_not_admit_returns_its_token_charge(
    refund: bool, left: float
) -> None:
    """98,000 tokens reserved of 100,000 a minute: refused uncounted (``refund``), they
    come back whole; answered, they stay charged (upstreams never give back what a
    request did not use)."""
    assert _settled(98_000, None, refund).remaining["tpm"] == pytest.approx(left)


def test_a_usage_beyond_what_one_request_can_take_is_charged_only_that() -> None:
    """An answer that says 10**18 tokens were used, on a deployment of 100,000 a minute:
    charged 100,000 at most (its window is full again within a minute)."""
    paced = 1.0 - pacing_headroom(TOKENS_CATALOG.pacing_margin)  # refilled that far below
    assert _settled(100, 10**18).reset["tpm"] == pytest.approx(60.0 / paced)
    assert _settled(100, 5_000).remaining["tpm"] == pytest.approx(95_000.0)  # believed


async def test_requests_sleeping_on_a_deployment_are_woken_when_it_learns() -> None:
    """A newer epoch seen (a 429 settled here, or told by a reservation) sets the
    deployment's learning event, so requests sleeping on turns reserved before wake at
    once to take new ones, ahead of later arrivals; the same or an older epoch does not."""
    settler = _settler()
    settler.saw("d", 1)
    woken = settler.learning("d")
    settler.saw("d", 1)
    settler.saw("d", 0)
    assert not woken.is_set()
    settler.saw("d", 2)
    assert woken.is_set() and settler.stale(_turn(1))
    assert not settler.learning("d").is_set()  # a fresh event for the turns taken now
