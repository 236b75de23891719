"""The admin state's shape (pure): health words, times both ways, replicas added up."""

from __future__ import annotations

import math

import pytest
from support.proxy_server import settings_from

from proxy.api.admin_state_view import LONGEST_SHOWN, Reading, health_state, moment, state
from proxy.catalog.catalog import Catalog
from proxy.limiter.base import Activity, DeploymentState, KeyState, LimiterMode

NOW = 1_700_000_000.0


def test_moments_are_relative_and_absolute() -> None:
    assert moment(2.5, NOW) == {"in": 2.5, "at": "2023-11-14T22:13:22.500Z"}


def test_a_moment_beyond_any_date_is_shown_at_the_farthest() -> None:
    """Whatever a stored state says (a hold of 1e12 s written before holds were bounded,
    a non-finite figure), the admin views answer."""
    farthest = moment(LONGEST_SHOWN, NOW)
    assert moment(1e12, NOW) == moment(math.inf, NOW) == farthest
    assert farthest["in"] == LONGEST_SHOWN and farthest["at"].startswith("2123-")
    assert moment(math.nan, NOW) == moment(0.0, NOW)
    assert moment(-math.inf, NOW)["at"] == "1970-01-01T00:00:00.000Z"


def test_health_states() -> None:
    def s(**kw: float | bool) -> DeploymentState:
        return DeploymentState(0.0, {}, **kw)  # type: ignore[arg-type]

    assert health_state(s()) == "healthy"
    assert health_state(s(hold_for=1.0)) == "held"
    assert health_state(s(cooling=True, cool_for=3.0)) == "cooling"
    assert health_state(s(cooling=True, probe_for=60.0)) == "probing"
    assert health_state(s(cooling=True)) == "probe_next"


SETTINGS = settings_from(
    {
        "keys": [{"name": "a", "key": "sk-a", "rpm": 10, "max_parallel": 2}],
        "models": [
            {"name": "m", "deployments": [{"id": "d1", "base_url": "http://127.0.0.1:1/v1"}]}
        ],
    }
)


def test_every_replicas_counts_are_added_up() -> None:
    replica = Activity(
        waiting={"m": 2}, waiting_on={"d1": 2}, waiting_keys={"a": 1, "": 1}, in_flight={"d1": 1}
    )
    reading = Reading(
        NOW,
        LimiterMode.SHARED,
        {"m": {"d1": DeploymentState(0.0, {}, next_turn=1.0)}},
        {"a": KeyState({"rpm": 7.0}, {"rpm": 18.0}, 1)},
        [replica, replica],
    )
    view = state(SETTINGS, Catalog(SETTINGS), reading)
    pacing = view["limiter"].pop("pacing")
    assert view["limiter"] == {"mode": "shared", "scope": "all replicas", "replicas_reporting": 2}
    assert (pacing["mode"], pacing["margin_seconds"]) == ("auto", 0.052)  # none measured yet
    assert pacing["paced_at"] == pytest.approx(1 / 1.052, abs=1e-6)
    assert view["waiting"] == 4

    [model] = view["models"]
    [d1] = model["deployments"]
    assert (model["waiting"], d1["waiting"], d1["in_flight"]) == (4, 4, 2)
    assert model["waiting_for_any_deployment"] == 0
    assert d1["next_turn"]["in"] == 1.0 and d1["learned"] is None
    [key] = view["keys"]
    assert (key["waiting"], key["slots_held"], key["max_parallel"]) == (2, 1, 2)
    [rpm] = key["windows"]
    assert (rpm["configured"], rpm["limit"], rpm["remaining"]) == (10, 10, 7.0)
    assert rpm["capacity"] == 10  # a key's window holds its whole limit at once
    assert rpm["full_in"]["in"] == 18.0
    assert view["without_key"] == {"waiting": 2, "in_flight": 0}


def test_teams_are_shown_like_keys_and_a_key_names_its_team() -> None:
    settings = settings_from(
        {
            "teams": [{"name": "t", "rpm": 100, "max_parallel": 4}],
            "keys": [
                {
                    "name": "a",
                    "key": "sk-a",
                    "team": "t",
                    "limits": [{"requests": 3, "per": "1m", "models": ["m"]}],
                }
            ],
            "models": [
                {"name": "m", "deployments": [{"id": "d1", "base_url": "http://127.0.0.1:1/v1"}]}
            ],
        }
    )
    reading = Reading(
        NOW,
        LimiterMode.MEMORY,
        {},
        {"a": KeyState({"rpm@m": 1.0}, {"rpm@m": 40.0})},
        [],
        teams={"t": KeyState({"rpm": 97.0}, {"rpm": 1.8}, 3)},
    )
    view = state(settings, Catalog(settings), reading)
    [team] = view["teams"]
    assert (team["name"], team["max_parallel"], team["slots_held"]) == ("t", 4, 3)
    [rpm] = team["windows"]
    assert (rpm["name"], rpm["configured"], rpm["remaining"], rpm["models"]) == (
        "rpm",
        100,
        97.0,
        None,
    )
    [key] = view["keys"]
    assert key["team"] == "t"
    [scoped] = key["windows"]
    assert (scoped["name"], scoped["configured"], scoped["models"]) == ("rpm@m", 3, ["m"])
    assert scoped["remaining"] == 1.0


def test_a_models_waiting_requests_are_those_on_its_deployments_turns_and_the_rest() -> None:
    """Requests deferred for fair share (or waiting while every deployment cools down)
    wait on the model without a turn on any deployment: shown apart, so the model's
    count is its deployments' counts plus them."""
    settings = settings_from(
        {
            "keys": [{"name": "a", "key": "sk-a"}],
            "models": [
                {
                    "name": "m",
                    "deployments": [
                        {"id": "d1", "base_url": "http://127.0.0.1:1/v1", "rpm": 6},
                        {"id": "d2", "base_url": "http://127.0.0.1:1/v1"},
                    ],
                }
            ],
        }
    )
    replicas = [
        Activity(waiting={"m": 3}, waiting_on={"d1": 1}, waiting_keys={"a": 3}),
        Activity(waiting={"m": 2}, waiting_on={"d1": 1, "d2": 1}, waiting_keys={"a": 2}),
    ]
    view = state(settings, Catalog(settings), Reading(NOW, LimiterMode.SHARED, {}, {}, replicas))
    [model] = view["models"]
    d1, d2 = model["deployments"]
    assert (model["waiting"], d1["waiting"], d2["waiting"]) == (5, 2, 1)
    assert model["waiting_for_any_deployment"] == 2
    # A deployment paced one request at a time: full means one, refilled at its rate.
    [rpm] = d1["windows"]
    assert (rpm["configured"], rpm["capacity"]) == (6, 1)
    assert rpm["limit"] < 6


def test_the_pacing_margin_in_force_and_whose_need_set_it_are_shown() -> None:
    catalog = Catalog(SETTINGS)
    catalog.pacing.identify("here")
    catalog.pacing.heard({"there": 0.0804})
    pacing = state(SETTINGS, catalog, Reading(NOW, LimiterMode.SHARED, {}, {}, []))["limiter"][
        "pacing"
    ]
    assert pacing["margin_seconds"] == pytest.approx(0.083)  # its need and RESERVE
    assert (pacing["set_by"], pacing["set_here"]) == ("there", False)
    assert pacing["others"] == {"there": 0.0804}
    fixed = settings_from({**SETTINGS.model_dump(mode="json"), "routing": {"pacing_margin": 0}})
    view = state(fixed, Catalog(fixed), Reading(NOW, LimiterMode.SHARED, {}, {}, []))
    assert view["limiter"]["pacing"] == {
        "mode": "fixed",
        "margin_seconds": 0.0,
        "set_by": "fixed",
        "set_here": False,
        "paced_at": 0.99,
        "late_turns_not_sent": 0,
    }
