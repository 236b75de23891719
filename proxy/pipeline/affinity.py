"""Where each stored response lives: response id -> the deployment (upstream account)
that created it, its model group and the client key that asked for it.

OpenAI keeps a response (``GET /v1/responses/{id}``, ``previous_response_id``...) in the
account that created it, 30 days; another account answers 404. So the proxy remembers,
when a response is created, which deployment made it and for whom, and sends its
follow-ups there only, for that key only.

``LocalAffinity``: a bounded in-process map (the oldest entries go first, each kept the
upstream's retention). ``SharedAffinity``: the same in Redis, one key per response under
the limiter's schema (``{llmproxy:v<N>:r:<id>}``: its own hash slot, a plain
``SET ... EX`` / ``GET`` / ``DEL``), with this process's map in front: what it created or
looked up is answered without a round trip, and while Redis is down. An id unknown here
while Redis is down is neither known nor unknown: ``AffinityUnavailable`` (503), never a
404 that would tell the client its conversation is gone.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

import orjson

from proxy.limiter.base import StorageError
from proxy.limiter.policy import ResilientLimiter
from proxy.limiter.redis.backend import KEY_PREFIX
from proxy.limiter.redis.runner import ScriptRunner
from proxy.values import value

__all__ = [
    "RETENTION",
    "Affinity",
    "AffinityUnavailable",
    "LocalAffinity",
    "Owner",
    "SharedAffinity",
    "affinity_for",
]

logger = logging.getLogger("proxy.affinity")

RETENTION = 30 * 86400.0  # seconds OpenAI keeps a stored response
CAPACITY = 100_000  # responses one process remembers (about 20 MB)
MAX_ID = 256  # characters of an id worth looking up (OpenAI's are ~50)
MAX_TOKENS = 100_000_000  # a conversation's tokens, bounded: more is no count we believe


@value
class Owner:
    """Who holds a stored response: the deployment that created it, its model group,
    and the identity of the client key it was created for (``ClientKey.identity``: a
    config key's name, an API key's id; None: the proxy runs open).
    ``tokens``: the conversation so far (the response's input and output, as its usage
    said; 0: not known yet), which the upstream counts again as the input of a request
    that continues it."""

    deployment: str
    group: str
    key: str | None
    tokens: int = 0


class AffinityUnavailable(Exception):
    """The shared store cannot be asked, and this process does not know the id
    (``response_id``, asked for as ``param``: what the client's 503 names)."""

    def __init__(self, response_id: str = "", param: str | None = None) -> None:
        super().__init__(response_id)
        self.response_id = response_id
        self.param = param


class Affinity(Protocol):
    async def remember(self, response_id: str, owner: Owner) -> None:
        """Record that ``owner`` holds ``response_id`` (a failure is logged, not raised:
        the response was made; only its follow-ups may miss it)."""
        ...

    async def owner(self, response_id: str) -> Owner | None:
        """Who holds ``response_id``; None: nobody here created it (or it expired).
        Raises AffinityUnavailable when that cannot be told."""
        ...

    async def forget(self, response_id: str) -> None:
        """``response_id`` was deleted upstream."""
        ...


class LocalAffinity:
    """This process's map: at most ``capacity`` ids, each for ``retention`` seconds."""

    def __init__(
        self,
        capacity: int = CAPACITY,
        retention: float = RETENTION,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.capacity = capacity
        self.retention = retention
        self._clock = clock
        self._owners: OrderedDict[str, tuple[Owner, float]] = OrderedDict()

    def put(self, response_id: str, owner: Owner) -> None:
        self._owners[response_id] = (owner, self._clock() + self.retention)
        self._owners.move_to_end(response_id)
        while len(self._owners) > self.capacity:
            self._owners.popitem(last=False)

    def get(self, response_id: str) -> Owner | None:
        found = self._owners.get(response_id)
        if found is None:
            return None
        owner, expires = found
        if expires <= self._clock():
            del self._owners[response_id]
            return None
        return owner

    def drop(self, response_id: str) -> None:
        self._owners.pop(response_id, None)

    def __len__(self) -> int:
        return len(self._owners)

    # -- Affinity ----------------------------------------------------------------------

    async def remember(self, response_id: str, owner: Owner) -> None:
        self.put(response_id, owner)

    async def owner(self, response_id: str) -> Owner | None:
        return self.get(response_id)

    async def forget(self, response_id: str) -> None:
        self.drop(response_id)


class SharedAffinity:
    """Redis, shared by every replica, with ``local`` in front. ``available``: whether
    the limiter's circuit to Redis is closed (while open, Redis is not waited for)."""

    def __init__(
        self,
        runner: ScriptRunner,
        available: Callable[[], bool],
        local: LocalAffinity | None = None,
        prefix: str = KEY_PREFIX,
    ) -> None:
        self.runner = runner
        self.available = available
        self.local = local or LocalAffinity()
        self._prefix = prefix

    def key(self, response_id: str) -> str:
        return f"{{{self._prefix}:r:{response_id}}}"

    async def remember(self, response_id: str, owner: Owner) -> None:
        self.local.put(response_id, owner)
        if not self.available():
            logger.warning("affinity store unavailable: response %s known here only", response_id)
            return
        data = orjson.dumps([owner.deployment, owner.group, owner.key, owner.tokens])
        ttl = int(self.local.retention)
        try:
            await self.runner.call(lambda r: r.set(self.key(response_id), data, ex=ttl))
        except StorageError as exc:
            logger.warning(
                "affinity store failed: response %s known here only: %s", response_id, exc
            )

    async def owner(self, response_id: str) -> Owner | None:
        known = self.local.get(response_id)
        if known is not None:
            return known
        if not self.available():
            raise AffinityUnavailable
        key = self.key(response_id)
        try:
            data = await self.runner.call(lambda r: r.get(key))
        except StorageError as exc:
            raise AffinityUnavailable from exc
        owner = None if data is None else _decode(data)
        if owner is not None:  # kept here at most the retention (the upstream's 404 after)
            self.local.put(response_id, owner)
        return owner

    async def forget(self, response_id: str) -> None:
        self.local.drop(response_id)
        try:
            await self.runner.call(lambda r: r.delete(self.key(response_id)))
        except StorageError as exc:  # it expires anyway; the upstream has it no more
            logger.warning("affinity store failed to forget %s: %s", response_id, exc)


def affinity_for(limiter: object) -> Affinity:
    """The store beside ``limiter``: in Redis when the limiter is, else in memory."""
    if isinstance(limiter, ResilientLimiter):
        return SharedAffinity(limiter.shared.runner, lambda: limiter.storage_available)
    return LocalAffinity()


def _decode(data: str | bytes) -> Owner | None:
    """A record as ``remember`` wrote it; None for anything else (never trusted)."""
    try:
        fields = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if (
        isinstance(fields, list)
        and len(fields) == 4
        and isinstance(fields[0], str)
        and isinstance(fields[1], str)
        and (fields[2] is None or isinstance(fields[2], str))
        and type(fields[3]) is int
        and 0 <= fields[3] <= MAX_TOKENS
    ):
        return Owner(fields[0], fields[1], fields[2], fields[3])
    return None
