"""This replica's tally of waiting and in-flight requests (pure)."""

from __future__ import annotations

from proxy.limiter.base import Activity
from proxy.routing.activity import Tally


def test_a_waiting_request_counts_for_its_model_its_deployment_and_its_key() -> None:
    tally = Tally()
    tally.wait_started("m", "d1", "team-a")
    tally.wait_started("m", None, None)  # all cooling: no turn yet, no key
    assert tally.report({}) == Activity(
        waiting={"m": 2}, waiting_on={"d1": 1}, waiting_keys={"team-a": 1, "": 1}
    )


def test_counts_back_at_zero_leave_nothing_behind() -> None:
    tally = Tally()
    tally.wait_started("m", "d1", "team-a")
    tally.call_started("team-a")
    tally.wait_ended("m", "d1", "team-a")
    tally.call_ended("team-a")
    assert tally.report({"d1": 0}) == Activity()


def test_the_report_is_a_copy_with_the_deployments_in_flight() -> None:
    tally = Tally()
    tally.call_started("team-a")
    report = tally.report({"d1": 2, "d2": 0})
    tally.call_ended("team-a")
    assert report.in_flight == {"d1": 2}
    assert report.in_flight_keys == {"team-a": 1}
