"""Settling turns: which reserved turns are stale (a turn is taken again only when the
deployment learned a new pace after it was reserved: health.py's epochs), and what a
settled request leaves charged."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from support.proxy_server import settings_from

from proxy.background import Background
from proxy.catalog import Catalog
from proxy.limiter.base import SUCCESS, CooldownRule, GroupAsk, Sent
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


@pytest.mark.parametrize(("refund", "left"), [(True, 100_000.0), (False, 2_000.0)])
def test_a_request_the_upstream_did_not_admit_returns_its_token_charge(
    refund: bool, left: float
) -> None:
    """98,000 tokens reserved of 100,000 a minute: refused uncounted (``refund``), they
    come back whole; answered, they stay charged (upstreams never give back what a
    request did not use)."""
    deployment = {"id": "d", "base_url": "http://127.0.0.1:1/v1", "tpm": 100_000}
    catalog = Catalog(settings_from({"models": [{"name": "m", "deployments": [deployment]}]}))
    [route] = catalog.groups["m"].deployments
    limiter = MemoryLimiter(clock=lambda: 0.0)
    background = Background()
    unused = cast(Any, None)  # no health changes to report
    settler = Settler(
        limiter, catalog, CooldownRule(3, 60.0, 30.0), background, unused, least_busy=False
    )

    async def scenario() -> float:
        limits = catalog.limits(route)
        verdict = await limiter.reserve(GroupAsk("m", [limits], 98_000.0, 60.0))
        assert verdict.deployment_id == "d" and verdict.wait == 0.0
        turn = Turn(route, "", sent=verdict.sent)
        settler.settle(turn, SUCCESS, estimate=98_000, real_tokens=None, refund=refund)
        await background.drain()
        [state] = (await limiter.snapshot("m", [limits])).values()
        return state.remaining["tpm"]

    assert asyncio.run(scenario()) == pytest.approx(left)
