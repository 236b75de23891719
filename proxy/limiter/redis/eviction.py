"""Whether the limiter's Redis may evict its keys: read once at start-up and again after
every reconnect (a failover's new primary may be configured otherwise).

A missing bucket reads as a full one (docs/limiter.md), so a Redis whose
``maxmemory-policy`` is ``allkeys-*`` silently hands out fresh budgets under memory
pressure: that is a loud warning and the ``llmproxy_redis_evicting_policy`` gauge. Every
key the limiter writes has a TTL, so ``noeviction`` and ``volatile-*`` are safe. Managed
Redis often forbids ``CONFIG``: then this is said once. *pure*
"""

from __future__ import annotations

import logging
from collections.abc import Callable

__all__ = ["EvictionWatch", "evicting"]

log = logging.getLogger(__name__)


def evicting(policy: str) -> bool:
    """Whether ``policy`` may evict keys that have no TTL, or any key regardless of it:
    the ``allkeys-*`` policies."""
    return policy.strip().lower().startswith("allkeys-")


class EvictionWatch:
    """What a read of ``maxmemory-policy`` means: ``observe(policy)`` with the policy
    read, or None when the server refused ``CONFIG GET``. ``report`` gets True/False
    (evicting or not) for the gauge; nothing is reported when the policy is unknown."""

    def __init__(self, report: Callable[[bool], None]) -> None:
        self._report = report
        self._refusal_said = False

    def observe(self, policy: str | None, where: str) -> None:
        if policy is None:
            if not self._refusal_said:
                self._refusal_said = True
                log.warning(
                    "cannot read maxmemory-policy of %s (CONFIG GET is not allowed, as on"
                    " many managed Redis): make sure it is noeviction or volatile-*;"
                    " allkeys-* evicts budgets and silently resets them",
                    where,
                )
            return
        bad = evicting(policy)
        if bad:
            log.warning(
                "Redis %s has maxmemory-policy %s: under memory pressure it evicts rate-limit"
                " budgets, which then read as full (requests pass over their limits). Set"
                " maxmemory-policy noeviction (or volatile-lru: every limiter key has a TTL).",
                where,
                policy,
            )
        self._report(bad)
