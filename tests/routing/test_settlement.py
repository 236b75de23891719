"""Which reserved turns are stale: a turn is taken again only when the deployment learned
a new pace after it was reserved (health.py's epochs)."""

from __future__ import annotations

from typing import Any, cast

from support.proxy_server import settings_from

from proxy.catalog import Catalog
from proxy.limiter.base import CooldownRule, Sent
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
