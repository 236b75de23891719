"""Rolling upgrades: two versions of the proxy sharing one Redis never read each other's
state. The key layout carries a schema version (``backend.KEY_PREFIX``); the layout before
it (schema 1, ``{llmproxy:k:...}``, what ``RedisLimiter(prefix="llmproxy")`` writes,
exactly as the releases before the version wrote it) is disjoint from it."""

from __future__ import annotations

import redis
from support.limits import patient, rpm, tpm

from proxy.costs import estimate_cost
from proxy.limiter.base import DeploymentLimits, GroupAsk, KeyAsk, KeyLimits
from proxy.limiter.redis.backend import KEY_PREFIX, SCHEMA_VERSION

KEY = KeyLimits("team-a", windows=(rpm(2, 2), tpm(1000, 1000)))
DEP = DeploymentLimits("openai-a", windows=(rpm(2, 2),), probe_timeout=20.0)
SCHEMA_1 = "llmproxy"


def _keys(url: str) -> dict[str, dict[str, str]]:
    with redis.Redis.from_url(url, decode_responses=True) as c:
        return {k: c.hgetall(k) if c.type(k) == "hash" else {} for k in c.keys("*")}


def test_the_key_prefix_names_the_schema_version() -> None:
    assert f"llmproxy:v{SCHEMA_VERSION}" == KEY_PREFIX and SCHEMA_VERSION >= 2


async def test_a_schema_1_fleet_spending_a_budget_leaves_this_versions_budget_whole(
    redis_url: str,
) -> None:
    old, new = patient(redis_url, prefix=SCHEMA_1), patient(redis_url)
    try:
        for lease in ("a", "b"):
            assert (await old.acquire_key(KeyAsk(KEY, lease, estimate_cost(10)))).allowed
        assert not (
            await old.acquire_key(KeyAsk(KEY, "c", estimate_cost(10)))
        ).allowed  # the old one's spent
        await old.reserve(GroupAsk("g", [DEP], estimate_cost(0), max_wait=5, slot="r1"))
        await old.reserve(GroupAsk("g", [DEP], estimate_cost(0), max_wait=5, slot="r2"))
        old_state = _keys(redis_url)

        # The new version starts from its own, full buckets...
        assert (await new.acquire_key(KeyAsk(KEY, "d", estimate_cost(10)))).allowed
        assert (await new.acquire_key(KeyAsk(KEY, "e", estimate_cost(10)))).allowed
        turn = await new.reserve(GroupAsk("g", [DEP], estimate_cost(0), max_wait=5, slot="r3"))
        assert turn.deployment_id == "openai-a" and turn.wait == 0.0
    finally:
        await old.aclose()
        await new.aclose()

    # ...and never wrote to (or removed) a key of the old layout.
    after = _keys(redis_url)
    assert {k: v for k, v in after.items() if k in old_state} == old_state
    ours = set(after) - set(old_state)
    assert ours and all(k.startswith((f"{{{KEY_PREFIX}:", f"{KEY_PREFIX}:")) for k in ours), sorted(
        ours
    )
    assert not any(k.startswith(("{llmproxy:k:", "{llmproxy:g:")) for k in ours)
