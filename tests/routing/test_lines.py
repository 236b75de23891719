"""A key's deferred requests wait in one local line: only its head asks the limiter."""

from __future__ import annotations

import asyncio

from proxy.costs import estimate_cost
from proxy.limiter.base import DeploymentLimits, Rate, Window
from proxy.routing.lines import Lines, turn_spacing


def _run(coroutine: object) -> None:
    asyncio.run(coroutine)  # type: ignore[arg-type]


def test_the_first_request_heads_the_line_and_the_others_wait_in_arrival_order() -> None:
    async def scenario() -> None:
        lines = Lines()
        line = lines.line("g", "heavy")
        first, second, third = (line.join(deadline=60.0, now=0.0) for _ in range(3))
        assert first.done() and first.result() is None  # asks the limiter now
        assert not second.done() and not third.done()
        assert lines.busy("g", "heavy") and not lines.busy("g", "light")
        line.leave()
        assert second.result() is None and not third.done()
        line.leave()
        assert third.result() is None
        line.leave()
        assert not lines.busy("g", "heavy") and len(lines) == 0  # an empty line is forgotten

    _run(scenario())


def test_a_waiter_whose_max_wait_ends_before_the_heads_next_ask_is_told_at_once() -> None:
    async def scenario() -> None:
        line = Lines().line("g", "k")
        line.join(deadline=60.0, now=0.0)
        patient = line.join(deadline=60.0, now=0.0)
        hurried = line.join(deadline=2.0, now=0.0)
        line.defer(until=5.0)  # the head asks again at 5 s: too late for a 2 s max_wait
        assert hurried.result() == 5.0 and not patient.done()
        late = line.join(deadline=4.0, now=1.0)  # arrives after: refused on joining
        assert late.result() == 5.0
        line.leave()
        assert patient.result() is None

    _run(scenario())


def test_a_waiter_that_leaves_gives_up_its_place_and_a_new_head_passes_it_on() -> None:
    async def scenario() -> None:
        lines = Lines()
        line = lines.line("g", "k")
        line.join(deadline=60.0, now=0.0)
        gone = line.join(deadline=60.0, now=0.0)
        kept = line.join(deadline=60.0, now=0.0)
        line.abandon(gone)  # its client left while waiting
        assert gone.cancelled()
        line.leave()
        assert kept.result() is None  # the next head is the one still there
        line.abandon(kept)  # made head just as it left: the headship passes on (to nobody)
        assert len(lines) == 0

    _run(scenario())


def test_turn_spacing_is_the_groups_turn_interval_across_its_deployments() -> None:
    ten_a_second = Window("rpm", "requests", Rate(600, 60.0, 1))
    tokens = Window("tpm", "tokens", Rate(60_000, 60.0, 1000))
    assert turn_spacing([DeploymentLimits("a", (ten_a_second,))], estimate_cost(10)) == 0.1
    both = [DeploymentLimits("a", (ten_a_second,)), DeploymentLimits("b", (ten_a_second,))]
    assert abs(turn_spacing(both, estimate_cost(10)) - 0.05) < 1e-9
    # 500 tokens at 1000 a second: half a second per request, slower than its rpm.
    assert turn_spacing([DeploymentLimits("a", (ten_a_second, tokens))], estimate_cost(500)) == 0.5
    assert turn_spacing([DeploymentLimits("a", ())], estimate_cost(10)) == 0.0  # unlimited
