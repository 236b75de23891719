"""What each deployment's prompt cache holds, as this process has seen it answer (pure).

A provider whose limits do not count cache reads (Anthropic: ``providers/anthropic.py``)
leaves a prompt the client caches out of its input limit; the proxy's estimate of a
request must too, or it holds back what the provider admits (a cached prompt of 10,000
tokens and a question of 50 is charged 50 there). Nothing in a request says whether its
prefix is cached; the answers to earlier ones do: an answer that reports cache reads or
writes shows each breakpoint's prefix cached on that deployment (``shapes/cache_prefixes``)
until its lifetime runs out unused. ``expected_read`` is then the estimated tokens of the
longest prefix of a request known cached there, which its admission leaves out.

Only answers teach: a prefix is known once an answer showing it cached came back, so the
requests sent meanwhile are charged whole (Anthropic too makes an entry readable only once
the answer that writes it has begun), and each replica learns from its own answers (one
that has not yet seen a prefix charges it whole: never less than the upstream counts). An
answer that reports no cache read forgets the prefixes the request was looked up by (an
entry evicted early, a prompt too short to cache): the next is charged whole again. A
lifetime is counted from when the request was sent, less ``MARGIN``, so an entry is
forgotten here before the upstream drops it. A wrong guess is corrected by the answer's
settlement (Anthropic's input is adjusted to what it reports): at worst one request's
cache reads too few charged, once.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from proxy.costs import TokenUsage
from proxy.shapes.cache_prefixes import CachePrefixes

__all__ = ["MARGIN", "PromptCaches"]

MARGIN = 10.0  # seconds an entry is forgotten here before its lifetime ends upstream
SIZE = 20_000  # entries kept in all (the oldest go first): ~2 MB at most


class PromptCaches:
    """The prefixes each deployment is known to hold, until when (``clock``: monotonic
    seconds)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, size: int = SIZE) -> None:
        self.clock = clock
        self.size = size
        self._until: dict[tuple[str, bytes], float] = {}  # oldest written first

    def __len__(self) -> int:
        return len(self._until)

    def expected_read(self, deployment: str, prefixes: CachePrefixes) -> int:
        """The estimated tokens of the longest of ``prefixes`` known cached on
        ``deployment`` now (0: none)."""
        if not self._until:
            return 0
        now = self.clock()
        for prefix in prefixes.lookups:  # the longest first
            until = self._until.get((deployment, prefix.digest))
            if until is not None and until > now:
                return prefix.tokens
        return 0

    def answered(
        self, deployment: str, prefixes: CachePrefixes, usage: TokenUsage, sent: float
    ) -> None:
        """``deployment`` answered a request with ``prefixes``, sent at ``sent`` (this
        clock), reporting ``usage``."""
        if usage.cache_read == 0:  # nothing read where it was looked up: none of it holds
            for prefix in prefixes.lookups:
                self._until.pop((deployment, prefix.digest), None)
        if usage.cache_read == 0 and usage.cache_write == 0:
            return  # nothing cached (too short, or no cache there)
        for prefix, ttl in prefixes.breakpoints:
            key = (deployment, prefix.digest)
            self._until.pop(key, None)  # written again: the newest
            self._until[key] = sent + ttl - MARGIN
        while len(self._until) > self.size:
            del self._until[next(iter(self._until))]
