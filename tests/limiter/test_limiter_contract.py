"""The Limiter contract, run against every backend: memory, Redis, Redis Cluster, and a
Redis over TLS logged in as an ACL user that may run only the proxy's commands.

Time is an injected clock (the Redis scripts get an explicit ``now``), so nothing sleeps
and concurrency tests are exact: what is checked is atomicity, not timing.
"""

from __future__ import annotations

import asyncio

import pytest
from support.limits import RULE, URL_FIXTURES, Subject, rpm, subjects, tpm, window

from proxy.costs import estimate_cost
from proxy.limiter.base import (
    Claimant,
    DeploymentLimits,
    DeploymentSettlement,
    GroupAsk,
    KeyAsk,
    KeyLimits,
    KeySettlement,
)
from proxy.limiter.core.verdicts import LEASE_TTL, PARALLEL_RETRY_AFTER

s = subjects("memory", *URL_FIXTURES)


# -- client keys -----------------------------------------------------------------------


@pytest.mark.slow
async def test_200_concurrent_requests_on_a_key_of_50_pass_exactly_50(s: Subject) -> None:
    key = KeyLimits("team-a", windows=(rpm(50),))
    verdicts = await asyncio.gather(
        *(s.limiter.acquire_key(KeyAsk(key, f"req-{i}", estimate_cost(10))) for i in range(200))
    )
    allowed = [v for v in verdicts if v.allowed]
    refused = [v for v in verdicts if not v.allowed]
    assert len(allowed) == 50
    assert {v.code for v in refused} == {"key_rpm"}
    assert all(v.retry_after == pytest.approx(1.2) for v in refused)
    # Each pass saw its own remaining count: the check-and-charge was atomic.
    assert sorted(
        v.tightest("requests").remaining for v in allowed if v.tightest("requests")
    ) == list(range(50))


async def test_key_rpm_and_tpm_are_all_or_nothing(s: Subject) -> None:
    key = KeyLimits(
        "k",
        windows=(
            rpm(10),
            tpm(100),
        ),
    )  # 0.6 s per token
    first = await s.limiter.acquire_key(KeyAsk(key, "a", estimate_cost(60)))
    assert (
        first.allowed
        and first.tightest("tokens") is not None
        and first.tightest("tokens").remaining == 40
    )
    second = await s.limiter.acquire_key(KeyAsk(key, "b", estimate_cost(60)))
    assert not second.allowed and second.code == "key_tpm"
    assert second.retry_after == pytest.approx(12.0)  # 20 tokens short at 0.6 s each
    # The refused request charged no request either.
    assert second.tightest("requests") is not None and second.tightest("requests").remaining == 9
    s.clock.now += 12.0
    assert (await s.limiter.acquire_key(KeyAsk(key, "b", estimate_cost(60)))).allowed


async def test_key_request_larger_than_the_bucket_is_not_retryable(s: Subject) -> None:
    key = KeyLimits(
        "k",
        windows=(
            rpm(10),
            tpm(100),
        ),
    )
    verdict = await s.limiter.acquire_key(KeyAsk(key, "a", estimate_cost(101)))
    assert not verdict.allowed and verdict.code == "request_too_large"
    assert verdict.retry_after == 0
    assert verdict.tightest("tokens") is not None and verdict.tightest("tokens").remaining == 100
    assert verdict.tightest("requests") is not None and verdict.tightest("requests").remaining == 10


async def test_key_usage_reports_limit_remaining_and_reset(s: Subject) -> None:
    key = KeyLimits(
        "k",
        windows=(
            rpm(60),
            tpm(6000),
        ),
    )
    verdict = await s.limiter.acquire_key(KeyAsk(key, "a", estimate_cost(600)))
    assert verdict.tightest("requests") is not None and verdict.tightest("tokens") is not None
    assert (verdict.tightest("requests").limit, verdict.tightest("requests").remaining) == (60, 59)
    assert verdict.tightest("requests").reset == pytest.approx(1.0)
    assert (verdict.tightest("tokens").limit, verdict.tightest("tokens").remaining) == (6000, 5400)
    assert verdict.tightest("tokens").reset == pytest.approx(6.0)


async def test_release_corrects_the_token_estimate(s: Subject) -> None:
    key = KeyLimits("k", windows=(tpm(100),))
    assert (await s.limiter.acquire_key(KeyAsk(key, "a", estimate_cost(60)))).allowed
    await s.limiter.settle(KeySettlement(key, "a", {"tokens": -50}))  # used 10 of the 60 estimated
    verdict = await s.limiter.acquire_key(KeyAsk(key, "b", estimate_cost(0)))
    assert verdict.tightest("tokens") is not None and verdict.tightest("tokens").remaining == 90
    await s.limiter.settle(KeySettlement(key, "b", {"tokens": 30}))  # used 30 more than estimated
    verdict = await s.limiter.acquire_key(KeyAsk(key, "c", estimate_cost(0)))
    assert verdict.tightest("tokens") is not None and verdict.tightest("tokens").remaining == 60


async def test_unlimited_key_always_passes(s: Subject) -> None:
    verdict = await s.limiter.acquire_key(KeyAsk(KeyLimits("free"), "a", estimate_cost(1e9)))
    assert (
        verdict.allowed
        and verdict.tightest("requests") is None
        and verdict.tightest("tokens") is None
    )


# -- max_parallel ----------------------------------------------------------------------


async def test_parallel_slots_never_exceed_max_parallel(s: Subject) -> None:
    key = KeyLimits("k", windows=(rpm(1000),), max_parallel=5)
    verdicts = await asyncio.gather(
        *(s.limiter.acquire_key(KeyAsk(key, f"l{i}", estimate_cost(1))) for i in range(20))
    )
    held = [f"l{i}" for i, v in enumerate(verdicts) if v.allowed]
    assert len(held) == 5
    refused = [v for v in verdicts if not v.allowed]
    assert {v.code for v in refused} == {"key_parallel"}
    assert {v.retry_after for v in refused} == {PARALLEL_RETRY_AFTER}
    # Refused requests charged nothing: only the 5 passes count against rpm.
    probe = await s.limiter.acquire_key(
        KeyAsk(key, held[0], estimate_cost(1))
    )  # re-acquiring a held slot
    assert (
        probe.allowed
        and probe.tightest("requests") is not None
        and probe.tightest("requests").remaining == 994
    )

    for lease in held[:2]:
        await s.limiter.settle(KeySettlement(key, lease, {}))
    again = await asyncio.gather(
        *(s.limiter.acquire_key(KeyAsk(key, f"m{i}", estimate_cost(1))) for i in range(5))
    )
    assert sum(v.allowed for v in again) == 2


async def test_parallel_slots_of_crashed_requests_expire(s: Subject) -> None:
    key = KeyLimits("k", max_parallel=2)
    assert (await s.limiter.acquire_key(KeyAsk(key, "a", estimate_cost(0)))).allowed
    assert (await s.limiter.acquire_key(KeyAsk(key, "b", estimate_cost(0)))).allowed
    assert not (await s.limiter.acquire_key(KeyAsk(key, "c", estimate_cost(0)))).allowed
    s.clock.now += LEASE_TTL + 1  # "a" and "b" were never released
    assert (await s.limiter.acquire_key(KeyAsk(key, "c", estimate_cost(0)))).allowed


# -- teams: another owner of windows, checked with the key's in one step -----------------


def team(
    rpm_limit: float = 6, name: str = "research", max_parallel: int | None = None
) -> KeyLimits:
    return KeyLimits(name, windows=(rpm(rpm_limit),), max_parallel=max_parallel, scope="team")


async def test_keys_of_a_team_share_its_windows(s: Subject) -> None:
    shared = team(6)
    alice = KeyLimits("alice", windows=(rpm(5),), team=shared)
    bob = KeyLimits("bob", windows=(rpm(5),), team=shared)
    asks = [KeyAsk(k, f"{k.name}-{i}", estimate_cost(1)) for i in range(5) for k in (alice, bob)]
    verdicts = await asyncio.gather(*(s.limiter.acquire_key(a) for a in asks))
    assert sum(v.allowed for v in verdicts) == 6
    assert {v.code for v in verdicts if not v.allowed} == {"team_rpm"}
    # The headers are the key's own windows, not the team's.
    passed = [v for v in verdicts if v.allowed]
    assert all(v.usage and v.usage[0][1].limit == 5 for v in passed)


async def test_a_team_refusal_charges_nothing_on_the_key_and_vice_versa(s: Subject) -> None:
    shared = team(1)
    alice = KeyLimits("alice", windows=(rpm(2),), team=shared)
    bob = KeyLimits("bob", windows=(rpm(1),), team=team(100, "infra"))
    assert (await s.limiter.acquire_key(KeyAsk(alice, "a1", estimate_cost(1)))).allowed
    refused = await s.limiter.acquire_key(KeyAsk(alice, "a2", estimate_cost(1)))
    assert (refused.allowed, refused.code) == (False, "team_rpm")
    assert refused.retry_after == pytest.approx(60.0)
    mine = await s.limiter.key_snapshot(alice)
    assert mine.remaining["rpm"] == pytest.approx(1.0)  # the refused request took nothing
    # The key's own refusal leaves its team's windows alone.
    assert (await s.limiter.acquire_key(KeyAsk(bob, "b1", estimate_cost(1)))).allowed
    refused = await s.limiter.acquire_key(KeyAsk(bob, "b2", estimate_cost(1)))
    assert (refused.allowed, refused.code) == (False, "key_rpm")
    theirs = await s.limiter.key_snapshot(team(100, "infra"))
    assert theirs.remaining["rpm"] == pytest.approx(99.0)


async def test_a_team_settlement_corrects_the_key_and_the_team(s: Subject) -> None:
    shared = KeyLimits("research", windows=(tpm(1000),), scope="team")
    alice = KeyLimits("alice", windows=(tpm(500),), team=shared)
    assert (await s.limiter.acquire_key(KeyAsk(alice, "a", estimate_cost(300)))).allowed
    await s.limiter.settle(KeySettlement(alice, "a", {"tokens": -200}))  # used 100 of the 300
    assert (await s.limiter.key_snapshot(alice)).remaining["tpm"] == pytest.approx(400)
    assert (await s.limiter.key_snapshot(shared)).remaining["tpm"] == pytest.approx(900)


async def test_a_teams_parallel_slots_are_shared_by_its_keys(s: Subject) -> None:
    shared = team(1000, max_parallel=2)
    alice = KeyLimits("alice", max_parallel=5, team=shared)
    bob = KeyLimits("bob", team=shared)
    assert (await s.limiter.acquire_key(KeyAsk(alice, "a1", estimate_cost(0)))).allowed
    assert (await s.limiter.acquire_key(KeyAsk(bob, "b1", estimate_cost(0)))).allowed
    refused = await s.limiter.acquire_key(KeyAsk(alice, "a2", estimate_cost(0)))
    assert (refused.allowed, refused.code) == (False, "team_parallel")
    # The key's slot taken before the team's refused is given back, and nothing charged.
    assert (await s.limiter.key_snapshot(alice)).slots_held == 1
    assert (await s.limiter.key_snapshot(shared)).remaining["rpm"] == pytest.approx(998)
    await s.limiter.settle(KeySettlement(bob, "b1"))
    assert (await s.limiter.acquire_key(KeyAsk(alice, "a2", estimate_cost(0)))).allowed
    assert (await s.limiter.key_snapshot(shared)).slots_held == 2


# -- deployments -----------------------------------------------------------------------

A = DeploymentLimits(
    "a",
    windows=(
        rpm(60, 1),
        tpm(6000, 1000),
    ),
)
B = DeploymentLimits(
    "b",
    windows=(
        rpm(60, 1),
        tpm(6000, 1000),
    ),
)


async def test_deployment_first_in_order_among_those_that_can_go_now(s: Subject) -> None:
    verdict = await s.limiter.reserve(GroupAsk("g", [B, A], estimate_cost(10), max_wait=30))
    assert (verdict.deployment_id, verdict.wait) == ("b", 0.0)
    assert verdict.waits == {"b": 0.0, "a": 0.0}
    # b now waits 1 s for its next turn; a can go now and wins whatever the order.
    verdict = await s.limiter.reserve(GroupAsk("g", [B, A], estimate_cost(10), max_wait=30))
    assert (verdict.deployment_id, verdict.wait) == ("a", 0.0)
    assert verdict.waits == {"b": pytest.approx(1.0), "a": 0.0}


async def test_deployment_soonest_turn_is_reserved(s: Subject) -> None:
    for _ in range(3):
        await s.limiter.reserve(
            GroupAsk("g", [A], estimate_cost(10), max_wait=30)
        )  # a: turns 0, 1, 2
    await s.limiter.reserve(GroupAsk("g", [B], estimate_cost(10), max_wait=30))  # b: turn 0
    verdict = await s.limiter.reserve(GroupAsk("g", [A, B], estimate_cost(10), max_wait=30))
    assert verdict.deployment_id == "b" and verdict.wait == pytest.approx(1.0)
    assert verdict.waits == {"a": pytest.approx(3.0), "b": pytest.approx(1.0)}


@pytest.mark.slow
async def test_100_concurrent_reservations_get_distinct_turns(s: Subject) -> None:
    verdicts = await asyncio.gather(
        *(
            s.limiter.reserve(GroupAsk("g", [A], estimate_cost(1), max_wait=1000))
            for _ in range(100)
        )
    )
    waits = sorted(v.wait for v in verdicts)
    assert waits == pytest.approx([float(i) for i in range(100)])


async def test_deployment_rpm_and_tpm_are_reserved_together(s: Subject) -> None:
    # tpm allows 1000 at once, then 100 a second: 1500 tokens wait 5 s for tpm.
    first = await s.limiter.reserve(GroupAsk("g", [A], estimate_cost(1000), max_wait=30))
    assert first.wait == 0.0
    second = await s.limiter.reserve(GroupAsk("g", [A], estimate_cost(500), max_wait=30))
    assert second.deployment_id == "a" and second.wait == pytest.approx(5.0)
    # rpm was charged as of that turn (t=5), so the next request waits past it.
    third = await s.limiter.reserve(GroupAsk("g", [A], estimate_cost(0), max_wait=30))
    assert third.wait == pytest.approx(6.0)


async def test_deployment_none_fits_charges_nothing(s: Subject) -> None:
    await s.limiter.reserve(GroupAsk("g", [A], estimate_cost(1000), max_wait=0))
    refused = await s.limiter.reserve(GroupAsk("g", [A], estimate_cost(800), max_wait=2))
    assert refused.deployment_id is None and refused.code == "model_capacity"
    assert refused.retry_after == pytest.approx(6.0)  # 8 s until a turn, minus max_wait
    s.clock.now += 6.0
    retried = await s.limiter.reserve(GroupAsk("g", [A], estimate_cost(800), max_wait=2))
    assert retried.deployment_id == "a" and retried.wait == pytest.approx(2.0)


async def test_deployment_retry_after_is_the_soonest_candidate(s: Subject) -> None:
    await s.limiter.reserve(GroupAsk("g", [A], estimate_cost(1000), max_wait=0))  # a: 10 s for 1000
    await s.limiter.reserve(GroupAsk("g", [B], estimate_cost(600), max_wait=0))  # b: 6 s for 1000
    refused = await s.limiter.reserve(GroupAsk("g", [A, B], estimate_cost(1000), max_wait=1))
    assert refused.code == "model_capacity" and refused.retry_after == pytest.approx(5.0)
    assert refused.waits == {"a": pytest.approx(10.0), "b": pytest.approx(6.0)}


async def test_deployment_request_too_large_for_every_candidate(s: Subject) -> None:
    verdict = await s.limiter.reserve(GroupAsk("g", [A, B], estimate_cost(1001), max_wait=30))
    assert verdict.deployment_id is None and verdict.code == "request_too_large"
    big = DeploymentLimits("big", windows=(tpm(60000),))
    verdict = await s.limiter.reserve(GroupAsk("g", [A, big], estimate_cost(1001), max_wait=30))
    assert verdict.deployment_id == "big"


async def test_unused_turn_is_given_back(s: Subject) -> None:
    await s.limiter.reserve(GroupAsk("g", [A], estimate_cost(1), max_wait=30))  # turn 0
    mine = await s.limiter.reserve(GroupAsk("g", [A], estimate_cost(1), max_wait=30))  # turn 1
    assert mine.wait == pytest.approx(1.0)
    await s.limiter.settle(
        DeploymentSettlement("g", A, RULE, cost={"requests": -1, "tokens": -1})
    )  # client left
    again = await s.limiter.reserve(GroupAsk("g", [A], estimate_cost(1), max_wait=30))
    assert again.wait == pytest.approx(1.0)


async def test_unlimited_deployment_goes_now(s: Subject) -> None:
    free = DeploymentLimits("free")
    verdict = await s.limiter.reserve(GroupAsk("g", [free, A], estimate_cost(1e9), max_wait=0))
    assert (verdict.deployment_id, verdict.wait) == ("free", 0.0)
    assert verdict.waits == {"free": 0.0, "a": float("inf")}
    assert verdict.sent is not None and verdict.sent.sequence == 1  # counted all the same


async def test_groups_do_not_share_budgets(s: Subject) -> None:
    await s.limiter.reserve(GroupAsk("g1", [A], estimate_cost(1), max_wait=0))
    verdict = await s.limiter.reserve(GroupAsk("g2", [A], estimate_cost(1), max_wait=0))
    assert verdict.deployment_id == "a" and verdict.wait == 0.0


# -- windows beyond a minute ------------------------------------------------------------

DAY = 86400.0
MONTH = 30 * DAY


async def test_a_day_window_caps_a_key_across_minutes(s: Subject) -> None:
    key = KeyLimits("k", (rpm(10), window("requests", 25, DAY)))
    for minute in range(3):
        verdicts = [
            await s.limiter.acquire_key(KeyAsk(key, "x", estimate_cost(0))) for _ in range(11)
        ]
        passed = sum(v.allowed for v in verdicts)
        if minute < 2:  # the minute's window refuses the 11th
            assert passed == 10 and verdicts[-1].code == "key_rpm"
        else:  # 20 of the day's 25 are spent: 5 more, then the day's window refuses
            assert passed == 5 and verdicts[5].code == "key_rpd"
            assert verdicts[5].window is not None and verdicts[5].window.rate.period == DAY
            # One request frees every 86400 / 25 = 3456 s, minus what two minutes refilled.
            assert verdicts[5].retry_after == pytest.approx(3456.0 - 120.0, abs=1.0)
        s.clock.now += 60.0


async def test_a_30_day_token_budget_refuses_and_refunds(s: Subject) -> None:
    budget = window("tokens", 5000, MONTH)
    key = KeyLimits("k", (tpm(1000), budget))
    for _ in range(5):
        assert (await s.limiter.acquire_key(KeyAsk(key, "x", estimate_cost(1000)))).allowed
        s.clock.now += 60.0
    refused = await s.limiter.acquire_key(KeyAsk(key, "x", estimate_cost(1000)))
    assert not refused.allowed and refused.code == "key_tokens_30d"
    assert refused.retry_after > 5 * DAY  # 1000 tokens take 6 days to come back
    assert refused.tightest("tokens") is not None
    assert refused.tightest("tokens").remaining < 2  # type: ignore[union-attr]
    # The last request used 400 of its 1000: the refund reaches every token window.
    await s.limiter.settle(KeySettlement(key, "x", {"tokens": -600}))
    assert (await s.limiter.acquire_key(KeyAsk(key, "y", estimate_cost(500)))).allowed


async def test_a_day_window_caps_a_deployment(s: Subject) -> None:
    daily = DeploymentLimits("d", (rpm(60, 1), window("requests", 3, DAY)))
    waits = [
        (await s.limiter.reserve(GroupAsk("g", [daily], estimate_cost(0), 30))).wait
        for _ in range(3)
    ]
    assert waits == pytest.approx([0.0, 1.0, 2.0])  # paced by the minute's window
    refused = await s.limiter.reserve(GroupAsk("g", [daily], estimate_cost(0), 30))
    assert refused.deployment_id is None and refused.code == "model_capacity"
    assert refused.retry_after > 3600  # the day's window binds
    state = (await s.limiter.snapshot("g", [daily]))["d"]
    assert state.remaining == {"rpm": 0.0, "rpd": pytest.approx(0.0, abs=1e-3)}
    assert state.unusable_for == 0.0


# -- fair share between client keys (fairness.py) -----------------------------------------

TEN_A_SECOND = DeploymentLimits("ten", windows=(rpm(600, 1),))  # one turn every 0.1 s
LOOKAHEAD = 0.5


def _fair(key: str, tier: int = 0, weight: float = 1.0, lease: str = "") -> GroupAsk:
    return GroupAsk(
        "g",
        [TEN_A_SECOND],
        estimate_cost(1),
        max_wait=30,
        slot=lease or key,
        claimant=Claimant(key, tier, weight),
        lookahead=LOOKAHEAD,
    )


async def test_turns_are_committed_only_within_the_lookahead(s: Subject) -> None:
    waits = [(await s.limiter.reserve(_fair("heavy"))).wait for _ in range(6)]
    assert waits == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5], abs=1e-6)
    deferred = await s.limiter.reserve(_fair("heavy"))
    assert deferred.deployment_id is None and deferred.deferred
    # Asked again when the schedule has drained to the lookahead: not before.
    assert deferred.retry_after == pytest.approx(0.1, abs=1e-6)
    s.clock.now += 0.1
    assert (await s.limiter.reserve(_fair("heavy"))).wait == pytest.approx(0.5, abs=1e-6)


async def test_a_light_key_gets_the_next_turn_while_a_heavy_key_is_held_to_its_share(
    s: Subject,
) -> None:
    for _ in range(6):
        await s.limiter.reserve(_fair("heavy"))  # turns 0 to 0.5: the lookahead is full
    light = await s.limiter.reserve(_fair("light"))
    assert light.deferred and light.retry_after == pytest.approx(0.1, abs=1e-6)
    s.clock.now += 0.1
    # light waits: heavy (holding 4 turns ahead, its share is 2.5) is deferred until its
    # earliest turn has passed, and light takes the turn at the end of the lookahead.
    heavy = await s.limiter.reserve(_fair("heavy"))
    assert heavy.deferred and heavy.retry_after == pytest.approx(0.1, abs=1e-6)
    light = await s.limiter.reserve(_fair("light"))
    assert light.deployment_id == "ten" and light.wait == pytest.approx(0.5, abs=1e-6)


@pytest.mark.slow
async def test_a_waiting_higher_tier_stops_lower_tiers_from_taking_turns_ahead(
    s: Subject,
) -> None:
    for _ in range(6):
        await s.limiter.reserve(_fair("batch"))
    urgent = await s.limiter.reserve(_fair("urgent", tier=1))
    assert urgent.deferred  # the lookahead is full
    s.clock.now += 0.1
    batch = await s.limiter.reserve(_fair("batch", lease="b2"))
    assert batch.deferred
    urgent = await s.limiter.reserve(_fair("urgent", tier=1, lease="u2"))
    assert urgent.deployment_id == "ten" and urgent.wait == pytest.approx(0.5, abs=1e-6)


async def test_a_turn_that_can_go_now_is_never_deferred(s: Subject) -> None:
    for _ in range(6):
        await s.limiter.reserve(_fair("heavy"))
    await s.limiter.reserve(_fair("light"))  # deferred: light now waits
    s.clock.now += 10.0  # the schedule has drained: no turn must wait
    assert (await s.limiter.reserve(_fair("heavy"))).wait == 0.0


# -- a config reload: the same windows, some with new limits ------------------------------
# Buckets are named by owner and window (kind and period), not by rate: a reload that
# leaves a window alone keeps its state, and a changed limit meets what was spent.


async def test_a_reload_keeps_the_state_of_a_window_it_did_not_change(s: Subject) -> None:
    before = KeyLimits("team", windows=(rpm(10), tpm(1000)))
    for i in range(10):
        assert (await s.limiter.acquire_key(KeyAsk(before, f"r{i}", estimate_cost(1)))).allowed
    after = KeyLimits("team", windows=(rpm(10), tpm(5000)))  # only tpm changed
    verdict = await s.limiter.acquire_key(KeyAsk(after, "r10", estimate_cost(1)))
    assert not verdict.allowed and verdict.code == "key_rpm"


async def test_a_reload_that_lowers_a_limit_counts_what_was_spent_against_it(
    s: Subject,
) -> None:
    before = KeyLimits("team", windows=(rpm(10),))
    for i in range(5):
        await s.limiter.acquire_key(KeyAsk(before, f"r{i}", estimate_cost(1)))
    after = KeyLimits("team", windows=(rpm(6),))
    assert (await s.limiter.acquire_key(KeyAsk(after, "r5", estimate_cost(1)))).allowed
    refused = await s.limiter.acquire_key(KeyAsk(after, "r6", estimate_cost(1)))
    assert not refused.allowed and refused.code == "key_rpm"
    assert refused.window is not None and refused.window.rate.limit == 6


async def test_a_reload_that_raises_a_limit_lets_the_difference_through(s: Subject) -> None:
    before = KeyLimits("team", windows=(rpm(5),))
    for i in range(5):
        await s.limiter.acquire_key(KeyAsk(before, f"r{i}", estimate_cost(1)))
    assert not (await s.limiter.acquire_key(KeyAsk(before, "r5", estimate_cost(1)))).allowed
    after = KeyLimits("team", windows=(rpm(8),))
    verdicts = [
        await s.limiter.acquire_key(KeyAsk(after, f"n{i}", estimate_cost(1))) for i in range(4)
    ]
    assert [v.allowed for v in verdicts] == [True, True, True, False]


async def test_a_reload_keeps_a_deployments_turns_and_paces_at_its_new_rate(
    s: Subject,
) -> None:
    paced = DeploymentLimits("a", windows=(rpm(60, 1),))  # one turn a second
    assert (
        await s.limiter.reserve(GroupAsk("g", [paced], estimate_cost(1), max_wait=30))
    ).wait == 0.0
    same = await s.limiter.reserve(GroupAsk("g", [paced], estimate_cost(1), max_wait=30))
    assert same.wait == pytest.approx(1.0)  # unchanged: the turn taken still counts
    faster = DeploymentLimits("a", windows=(rpm(120, 1),))  # a turn every 0.5 s
    verdict = await s.limiter.reserve(GroupAsk("g", [faster], estimate_cost(1), max_wait=30))
    assert verdict.wait == pytest.approx(1.0)  # two units of debt at 0.5 s each
