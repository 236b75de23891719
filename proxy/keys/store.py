"""``RuntimeKeys``: the client keys of the admin API, for one process.

Lookups read this process's index only (``index.py``), never Redis: the hot path costs
one dict access more for a key the config does not have. Writes go to the backend first
(Redis: shared, kept across restarts; or this process) and are applied here at once; other
replicas see them at their next poll, every ``POLL_INTERVAL``, reading only what changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Container
from typing import Any, Protocol

from proxy.background import stop
from proxy.catalog import key_limits
from proxy.config import ClientKey
from proxy.errors import InvalidRequest, ModelNotFound, ServiceUnavailable
from proxy.keys.index import KeyIndex
from proxy.keys.listing import Page, page_of
from proxy.keys.memory_backend import MemoryKeyBackend
from proxy.keys.records import KeyRecord, digest_of, new_key_id, new_secret
from proxy.keys.redis_backend import RedisKeyBackend, WriteRefused
from proxy.limiter.base import KeyLimits
from proxy.limiter.redis.sentinel import SentinelTarget

__all__ = ["POLL_INTERVAL", "Conflict", "KeyBackend", "RuntimeKeys"]

logger = logging.getLogger("proxy.keys")

POLL_INTERVAL = 0.25  # a change reaches every replica within this and a round trip
_ATTEMPTS = 5  # a PATCH or rotation racing another replica's write is retried
_INDEX_SLICE = 2000  # records indexed per loop turn when everything is read again


class Conflict(InvalidRequest):
    status = 409
    default_code = "conflict"


class KeyBackend(Protocol):
    async def load_all(self) -> tuple[int, list[KeyRecord]]: ...
    async def changes(self, seen: int) -> tuple[int, list[tuple[str, KeyRecord | None]] | None]: ...
    async def get(self, name: str) -> tuple[KeyRecord, bytes] | None: ...
    async def create(self, record: KeyRecord) -> None: ...
    async def update(self, record: KeyRecord, expected: bytes) -> None: ...
    async def delete(self, name: str) -> None: ...
    async def aclose(self) -> None: ...


def _nobody(name: str) -> None:
    """Told of a key gone, by default: no one."""


class RuntimeKeys:
    """``shared``: the backend is seen by other replicas (poll it); ``refusal``: why
    keys cannot be managed here at all (several workers without Redis), answered 409.
    ``on_gone`` hears the name of every key this process stops knowing (revoked here,
    deleted by another replica, absent from a full reload): the pipeline in force's
    catalog drops what it built for it (``Catalog.forget``)."""

    def __init__(
        self,
        backend: KeyBackend,
        *,
        shared: bool,
        refusal: str | None = None,
        clock: Callable[[], float] = time.time,
        poll_interval: float = POLL_INTERVAL,
    ) -> None:
        self.backend = backend
        self.shared = shared
        self.refusal = refusal
        self.index = KeyIndex()
        self._clock = clock
        self._poll_interval = poll_interval
        self._seen = 0
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self.on_gone: Callable[[str], None] = _nobody

    # -- lookups (the request path) -------------------------------------------------------

    def find(self, sha256: str) -> tuple[ClientKey, KeyLimits] | None:
        if not self.index:
            return None
        return self.index.find(sha256, self._clock())

    def limits_of(self, key: ClientKey) -> KeyLimits:
        """The limits of ``key``, which ``find`` returned: its record's (built once), or,
        if that record has changed or gone since, built from the key itself."""
        record = self.index.get(key.name)
        if record is not None:
            built, limits = record.client_key()
            if built is key:
                return limits
        return key_limits(key)

    def __len__(self) -> int:
        return len(self.index)

    # -- life -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Load every key (a Redis that does not answer: retried by the poll), then poll."""
        if not self.shared:
            return
        with contextlib.suppress(Exception):
            await self._reload()
        self._task = asyncio.create_task(self._poll_forever(), name="runtime-keys-poll")

    async def aclose(self) -> None:
        await stop(self._task)
        await self.backend.aclose()

    async def _reload(self) -> None:
        """Every key again: a new index built beside the one in use, a slice per loop
        turn (100,000 keys would stall requests), then swapped in at once."""
        version, records = await self.backend.load_all()
        index = KeyIndex()
        for start in range(0, len(records), _INDEX_SLICE):
            for record in records[start : start + _INDEX_SLICE]:
                index.apply(record.name, record)
            await asyncio.sleep(0)
        gone = self.index.missing_from(index)
        self.index = index
        self._seen = version
        for name in gone:
            self.on_gone(name)
        logger.info("run-time client keys loaded", extra={"keys": len(records)})

    async def refresh(self) -> None:
        """Apply what changed since the last look (one round trip when nothing did)."""
        version, changed = await self.backend.changes(self._seen)
        if changed is None:
            await self._reload()
            return
        for name, record in changed:
            self._apply(name, record)
        self._seen = version

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._poll_interval)
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: keep the keys known, try again
                if not self._failing:
                    logger.warning("run-time client keys: cannot read the shared store: %s", exc)
                self._failing = True
            else:
                if self._failing:
                    logger.info("run-time client keys: the shared store answers again")
                self._failing = False

    # -- operations (the admin API) -------------------------------------------------------

    async def create(
        self, name: str, spec: dict[str, Any], expires_at: float | None
    ) -> tuple[KeyRecord, str]:
        self._check_allowed()
        now = self._clock()
        secret = new_secret()
        record = KeyRecord(name, spec, digest_of(secret), now, now, expires_at, key_id=new_key_id())
        await self._write(self.backend.create(record), name)
        self.index.apply(name, record)
        return record, secret

    async def update(
        self,
        name: str,
        changes: dict[str, Any],
        expires: tuple[float | None] | None,
        validate: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> KeyRecord:
        """``changes`` merged over the entry (a null removes a field), checked by
        ``validate``; ``expires``: the new expiry, or None to keep it."""
        self._check_allowed()

        def change(record: KeyRecord) -> KeyRecord:
            merged = {**record.spec, **changes}
            spec = validate({k: v for k, v in merged.items() if v is not None})
            expiry = record.expires_at if expires is None else expires[0]
            return record.changed(spec, expiry, self._clock())

        return await self._change(name, change)

    async def rotate(self, name: str, grace: float) -> tuple[KeyRecord, str]:
        self._check_allowed()
        secret = new_secret()
        record = await self._change(name, lambda r: r.rotated(secret, grace, self._clock()))
        return record, secret

    async def revoke(self, name: str) -> None:
        self._check_allowed()
        await self._write(self.backend.delete(name), name)
        self._apply(name, None)

    async def get(self, name: str) -> KeyRecord | None:
        return self.index.get(name)

    def _apply(self, name: str, record: KeyRecord | None) -> None:
        """``name`` is now ``record`` (None: deleted, here or by another replica)."""
        known = self.index.get(name) is not None
        self.index.apply(name, record)
        if record is None and known:
            self.on_gone(name)

    def names(
        self, prefix: str = "", skip: Container[str] = (), team: str | None = None
    ) -> list[str]:
        """The keys' names in order, those starting with ``prefix`` (and in ``team``),
        without ``skip`` (the config's: they win)."""
        names = self.index.names()
        if prefix:
            names = [n for n in names if n.startswith(prefix)]
        if skip:
            names = [n for n in names if n not in skip]
        if team is not None:
            names = [n for n in names if (r := self.index.get(n)) and r.spec.get("team") == team]
        return names

    def page(
        self,
        configured: Collection[str],
        page: int,
        per_page: int,
        prefix: str = "",
        *,
        team: str | None = None,
        hidden: Collection[str] | None = None,
    ) -> tuple[Page, list[KeyRecord]]:
        """One page of the listing of both sources (``listing.page_of``): the config's
        ``configured`` names first, then this store's (``prefix``, ``team``, those the
        config's ``hidden``, default ``configured``, do not hide); with the records of
        this store's on it."""
        skip = configured if hidden is None else hidden
        created = self.names(prefix, skip=skip, team=team)
        chosen = page_of(list(configured), created, page, per_page)
        return chosen, [r for n in chosen.created if (r := self.index.get(n)) is not None]

    async def _change(self, name: str, change: Callable[[KeyRecord], KeyRecord]) -> KeyRecord:
        for _ in range(_ATTEMPTS):
            found = await self._call(self.backend.get(name))
            if found is None:
                raise _missing(name)
            current, raw = found
            record = change(current)
            try:
                await self._call(self.backend.update(record, raw))
            except WriteRefused as refused:
                if refused.reason == "missing":
                    raise _missing(name) from None
                continue  # another replica changed it meanwhile: again, from its version
            self.index.apply(name, record)
            return record
        raise Conflict(f"The key '{name}' kept changing; try again.", code="key_busy")

    async def _write(self, operation: Any, name: str) -> None:
        try:
            await self._call(operation)
        except WriteRefused as refused:
            if refused.reason == "exists":
                raise Conflict(f"A key named '{name}' exists.", code="key_exists") from None
            raise _missing(name) from None

    @staticmethod
    async def _call(operation: Any) -> Any:
        try:
            return await operation
        except (WriteRefused, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise ServiceUnavailable(
                f"The shared key store is unavailable ({type(exc).__name__}); retry shortly.",
                code="key_store_unavailable",
                retry_after=1.0,
            ) from None

    def _check_allowed(self) -> None:
        if self.refusal is not None:
            raise Conflict(self.refusal, code="runtime_keys_unavailable")


def _missing(name: str) -> ModelNotFound:
    return ModelNotFound(f"No key created through the API is named '{name}'.", code="key_not_found")


def runtime_keys_for(
    redis_url: str, workers: int, timeout: float, sentinel: SentinelTarget | None = None
) -> RuntimeKeys:
    """The run-time key store of one process: in Redis when there is one (a URL, or the
    primary its ``sentinel``s name); else in this process, and refused (409) with several
    workers, each of which would hold its own."""
    if redis_url or sentinel is not None:
        backend = RedisKeyBackend(redis_url, timeout=max(timeout, 0.5), sentinel=sentinel)
        return RuntimeKeys(backend, shared=True)
    if workers > 1:
        refusal = (
            f"Client keys cannot be managed through the API with {workers} workers and no"
            " redis.url: each worker is a process of its own and would know only the keys"
            " created through it. Configure redis.url, or run one worker."
        )
        logger.info(
            "Run-time client keys (/admin/keys) are off: %d workers, no redis.url.", workers
        )
        return RuntimeKeys(MemoryKeyBackend(), shared=False, refusal=refusal)
    logger.info(
        "Client keys created through /admin/keys live in this process (no redis.url):"
        " they are lost on restart."
    )
    return RuntimeKeys(MemoryKeyBackend(), shared=False)
