"""``RuntimeKeys``: the client keys of the admin API, for one process.

Lookups read this process's index only (``index.py``), never Redis: the hot path costs
one dict access more for a key the config does not have. Writes go to the backend first
(Redis: shared, kept across restarts; or this process) and are applied here at once; other
replicas see them at their next poll, every ``POLL_INTERVAL``, reading only what changed.

What this process knows of a shared store is its *view*: ``unread`` until a first full
read succeeds (nothing from the store can be authenticated: 503, and the replica is not
ready), ``current`` while reads succeed, ``unreachable`` once one failed (the keys read
keep working, a key it never saw gets 503, not 401). A store that lost its data (its epoch
gone or another: ``backend.py``) is an error line, ``on_lost`` (a metric) and
``status()``'s ``losses_detected``; this process writes what it knew back (the newest of
each name wins, so several replicas' copies merge, and what was written since the loss
stays), then reads the store again: every replica ends with the same keys, each still
revocable, and a key no replica could restore stops working.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Container
from datetime import UTC, datetime
from typing import Any

from proxy.background import stop
from proxy.catalog import key_limits
from proxy.config import ClientKey
from proxy.errors import InvalidRequest, ModelNotFound, ServiceUnavailable
from proxy.keys.backend import Changes, KeyBackend, WriteRefused, WriteUnknown
from proxy.keys.index import KeyIndex
from proxy.keys.listing import Page, page_of
from proxy.keys.memory_backend import MemoryKeyBackend
from proxy.keys.records import KeyRecord, digest_of, new_key_id, new_secret
from proxy.keys.redis_backend import RedisKeyBackend
from proxy.limiter.base import KeyLimits
from proxy.limiter.redis.sentinel import SentinelTarget

__all__ = [
    "POLL_INTERVAL",
    "Conflict",
    "KeyBackend",
    "KeyRevoked",
    "KeyStoreUnavailable",
    "OutcomeUnknown",
    "RuntimeKeys",
]

logger = logging.getLogger("proxy.keys")

POLL_INTERVAL = 0.25  # a change reaches every replica within this and a round trip
_ATTEMPTS = 5  # a PATCH or rotation racing another replica's write is retried
_INDEX_SLICE = 2000  # records indexed per loop turn when everything is read again
_KEEP_REVOKED = 10_000  # revocations remembered (written back after a loss)
_MERGE_CHUNK = 500  # records (and revocations) written back per script call
# A view older than this (its last read) is not written back into a store that lost
# its data: this process was cut off while others may have changed keys.
RESTORE_MAX_AGE = 300.0


class Conflict(InvalidRequest):
    status = 409
    default_code = "conflict"


class KeyStoreUnavailable(ServiceUnavailable):
    """The shared key store did not answer: nothing was changed (audited
    ``unavailable``)."""

    default_code = "key_store_unavailable"

    def __init__(self, message: str) -> None:
        super().__init__(message, retry_after=1.0)


class OutcomeUnknown(KeyStoreUnavailable):
    """A write was sent and its answer never came: it may have happened (audited
    ``unknown``); the message says what a retry answers."""

    audit_result = "unknown"


class KeyRevoked(ModelNotFound):
    """A revoke of a key already revoked (a retry whose first attempt happened)."""

    default_code = "key_revoked"


def _nobody(name: str) -> None:
    """Told of a key gone, by default: no one."""


def _no_one() -> None:
    """Told of a store that lost its data, by default: no one (the log line is written)."""


class RuntimeKeys:
    """``shared``: the backend is seen by other replicas (poll it); ``refusal``: why
    keys cannot be managed here at all (several workers without Redis), answered 409.
    ``on_gone`` hears the name of every key this process stops knowing (revoked here,
    deleted by another replica, absent from a full reload): the pipeline in force's
    catalog drops what it built for it (``Catalog.forget``). ``on_lost`` hears of every
    loss of the shared store's data this process detects."""

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
        self.loaded = not shared  # this process's own store needs no reading
        self._failing = False
        self._epoch = ""
        self._revoked: dict[str, float] = {}  # name -> when: written back after a loss
        self._reading = asyncio.Lock()
        self._last_read = 0.0  # time.monotonic() of the last read that succeeded
        self._counted: tuple[str, int] | None = None  # the loss last counted
        self.losses = 0
        self.last_loss: dict[str, Any] | None = None
        self.on_gone: Callable[[str], None] = _nobody
        self.on_lost: Callable[[], None] = _no_one

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

    @property
    def known(self) -> bool:
        """Whether this process has read the store (its own: always)."""
        return self.loaded

    @property
    def current(self) -> bool:
        """Whether its view is the store's as of its last look (read, and no read has
        failed since)."""
        return self.loaded and not self._failing

    @property
    def can_hold_keys(self) -> bool:
        return self.refusal is None

    def needed(self, key_api: bool, configured: bool) -> bool:
        """Whether requests depend on reading the shared store (``key_api``: the admin
        key API is on; ``configured``: the config file has client keys): not read yet
        (with the key API on, or no keys in the file: it may hold every key), or it holds
        keys (their revocations must reach this process), or every key lives in it."""
        if not self.shared:
            return False
        if not self.loaded:
            return key_api or not configured
        return len(self.index) > 0 or (key_api and not configured)

    def state(self) -> str:
        """``current``, ``unread`` (never read since start) or ``unreachable`` (read, but
        the last look failed)."""
        if not self.loaded:
            return "unread"
        return "unreachable" if self._failing else "current"

    def unavailable(self) -> KeyStoreUnavailable:
        """The answer to a request whose key this process cannot check now."""
        why = "has not been read yet" if not self.loaded else "does not answer"
        return KeyStoreUnavailable(
            f"The client key store (Redis) {why} on this replica: the key cannot be"
            " checked now; retry shortly."
        )

    def status(self) -> dict[str, Any]:
        """What ``/admin/state`` shows of the store (``key_store``)."""
        return {
            "backend": "redis" if self.shared else "process",
            "state": self.state(),
            "keys": len(self.index),
            "losses_detected": self.losses,
            "last_loss": self.last_loss,
        }

    # -- life -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Load every key (a Redis that does not answer: retried by the poll), then poll."""
        if not self.shared:
            return
        try:
            await self.refresh()
        except Exception as exc:
            logger.warning(
                "run-time client keys: cannot read the shared store at start: %s; until"
                " it is read, a key the config file does not have gets 503"
                " key_store_unavailable (retried every %g s)",
                exc,
                self._poll_interval,
            )
        self._task = asyncio.create_task(self._poll_forever(), name="runtime-keys-poll")

    async def aclose(self) -> None:
        await stop(self._task)
        await self.backend.aclose()

    async def refresh(self) -> None:
        """Read what changed since the last look (one round trip when nothing did);
        everything if the store was never read; a store that lost its data: recovered."""
        async with self._reading:
            try:
                await self._refresh()
            except Exception:
                self._failing = True
                raise
            self._failing = False
            self._last_read = time.monotonic()

    async def _refresh(self) -> None:
        if not self.loaded:
            await self._reload()
            return
        changes = await self.backend.changes(self._seen)
        if changes.epoch != self._epoch or changes.version < self._seen:
            await self._recover(changes)
            return
        if changes.changed is None:
            await self._reload()
            return
        for name, record, revoked_at in changes.changed:
            self._apply(name, record)
            self._remember(name, revoked_at)
        self._seen = changes.version

    async def _reload(self) -> list[str]:
        """Every key again: a new index built beside the one in use, a slice per loop
        turn (100,000 keys would stall requests), then swapped in at once. Returns the
        names gone."""
        snapshot = await self.backend.load_all()
        index = KeyIndex()
        records = snapshot.records
        for start in range(0, len(records), _INDEX_SLICE):
            for record in records[start : start + _INDEX_SLICE]:
                index.apply(record.name, record)
            await asyncio.sleep(0)
        gone = self.index.missing_from(index)
        self.index = index
        self._seen = snapshot.version
        self._epoch = snapshot.epoch
        self._revoked = snapshot.revoked
        self.loaded = True
        for name in gone:
            self.on_gone(name)
        logger.info("run-time client keys loaded", extra={"keys": len(records)})
        return gone

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._poll_interval)
            failing = self._failing or not self.loaded
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: keep the keys known, try again
                if not failing:
                    logger.warning("run-time client keys: cannot read the shared store: %s", exc)
            else:
                if failing:
                    logger.info("run-time client keys: the shared store answers again")

    # -- a store that lost its data -------------------------------------------------------

    async def _recover(self, changes: Changes) -> None:
        """The store is not the one last read: its epoch is gone or another (wiped), or
        its version went back (a failover to a replica that lagged). Counted and logged
        once; what this process knew written back; then everything read again."""
        reason = "wiped" if changes.epoch != self._epoch else "rolled_back"
        held = bool(self.index) or bool(self._revoked)
        if not self._epoch and changes.epoch:  # its first write since this process read it
            await self._reload()
            return
        if not held:  # nothing was lost that this process knew of: adopt it quietly
            logger.info("run-time client keys: the shared store was reset (it held no keys)")
            await self._reload()
            return
        if self._counted != (self._epoch, self._seen):
            self._counted = (self._epoch, self._seen)
            self.losses += 1
            self.on_lost()
            self.last_loss = {"at": _rfc3339(self._clock()), "reason": reason, "outcome": "pending"}
            logger.error(
                "run-time client keys: the shared key store lost its data (%s): epoch %s"
                " version %d was read, the store now has epoch %s version %d; writing back"
                " the %d keys and %d revocations this replica knew",
                reason,
                self._epoch or "-",
                self._seen,
                changes.epoch or "none",
                changes.version,
                len(self.index),
                len(self._revoked),
            )
        fresh = time.monotonic() - self._last_read <= RESTORE_MAX_AGE
        written = await self._write_back() if fresh else 0
        gone = await self._reload()
        if self.last_loss is not None:
            self.last_loss.update(
                outcome="restored" if fresh else "not_restored",
                written_back=written,
                keys_gone=len(gone),
            )
        log = logger.error if gone or not fresh else logger.warning
        log(
            "run-time client keys: the shared key store was filled again: %d names written"
            " back from this replica, %d keys it knew are gone%s",
            written,
            len(gone),
            "" if fresh else " (its copy was too old to write back)",
            extra={"gone": gone[:100]},
        )

    async def _write_back(self) -> int:
        """This process's records and revocations into the store, newest wins."""
        records = self.index.records()
        revoked = list(self._revoked.items())
        epoch, written = "", 0
        for start in range(0, max(len(records), len(revoked)), _MERGE_CHUNK):
            epoch, changed = await self.backend.merge(
                records[start : start + _MERGE_CHUNK],
                revoked[start : start + _MERGE_CHUNK],
                epoch,
            )
            written += changed
        return written

    def _remember(self, name: str, revoked_at: float | None) -> None:
        self._revoked.pop(name, None)
        if revoked_at is not None:
            self._revoked[name] = revoked_at
            if len(self._revoked) > _KEEP_REVOKED:
                del self._revoked[next(iter(self._revoked))]

    # -- operations (the admin API) -------------------------------------------------------

    async def create(
        self, name: str, spec: dict[str, Any], expires_at: float | None
    ) -> tuple[KeyRecord, str]:
        self._check_allowed()
        await self._ensure_read()
        now = self._clock()
        secret = new_secret()
        record = KeyRecord(name, spec, digest_of(secret), now, now, expires_at, key_id=new_key_id())
        await self._write(lambda: self.backend.create(record, self._epoch), name, "create")
        self.index.apply(name, record)
        self._remember(name, None)
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

        return await self._change(name, change, "update")

    async def rotate(self, name: str, grace: float) -> tuple[KeyRecord, str]:
        self._check_allowed()
        secret = new_secret()
        record = await self._change(
            name, lambda r: r.rotated(secret, grace, self._clock()), "rotate"
        )
        return record, secret

    async def revoke(self, name: str) -> None:
        self._check_allowed()
        await self._ensure_read()
        at = self._clock()
        await self._write(lambda: self.backend.delete(name, self._epoch, at), name, "revoke")
        self._apply(name, None)
        self._remember(name, at)

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

    async def _change(
        self, name: str, change: Callable[[KeyRecord], KeyRecord], operation: str
    ) -> KeyRecord:
        await self._ensure_read()
        looked_again = False
        for _ in range(_ATTEMPTS):
            found = await self._call(self.backend.get(name))
            if found is None and not looked_again:
                looked_again = True  # the store may have lost it: a look recovers it
                await self._read_now()
                continue
            if found is None:
                raise _missing(name)
            current, raw = found
            record = change(current)
            try:
                epoch = await self._call(
                    self.backend.update(record, raw, self._epoch), name=name, kind=operation
                )
                self._adopt(epoch)
            except WriteRefused as refused:
                if refused.reason == "missing":
                    raise _missing(name) from None
                if refused.reason == "epoch":
                    await self._read_now()
                continue  # another replica changed it meanwhile: again, from its version
            self.index.apply(name, record)
            return record
        raise Conflict(f"The key '{name}' kept changing; try again.", code="key_busy")

    async def _write(self, operation: Callable[[], Awaitable[str]], name: str, kind: str) -> None:
        """A create or a revoke: once more after a look at the store if it is not the
        one this process read (it lost its data: the look writes back what it knew)."""
        for attempt in range(2):
            try:
                self._adopt(await self._call(operation(), name=name, kind=kind))
                return
            except WriteRefused as refused:
                if refused.reason == "epoch" and attempt == 0:
                    await self._read_now()
                    continue
                raise _refused(refused, name) from None

    def _adopt(self, epoch: str) -> None:
        """The epoch this process's first write to a store never written created."""
        if not self._epoch:
            self._epoch = epoch

    async def _ensure_read(self) -> None:
        if not self.loaded:
            await self._read_now()

    async def _read_now(self) -> None:
        try:
            await self.refresh()
        except Exception as exc:
            raise KeyStoreUnavailable(
                f"The shared key store cannot be read ({type(exc).__name__}); nothing was"
                " changed; retry shortly."
            ) from None

    @staticmethod
    async def _call(call: Awaitable[Any], *, name: str = "", kind: str = "") -> Any:
        """``call``'s result; a store that does not answer is a 503: ``OutcomeUnknown``
        if the ``kind`` of write on ``name`` may have happened."""
        try:
            return await call
        except (WriteRefused, asyncio.CancelledError):
            raise
        except WriteUnknown as exc:
            raise _unknown(kind, name, exc) from None
        except Exception as exc:
            raise KeyStoreUnavailable(
                f"The shared key store is unavailable ({type(exc).__name__}); nothing was"
                " changed; retry shortly."
            ) from None

    def _check_allowed(self) -> None:
        if self.refusal is not None:
            raise Conflict(self.refusal, code="runtime_keys_unavailable")


# What a retry of a write whose outcome is unknown answers, by operation.
_RETRY_SAYS = {
    "create": "a retry answers 409 key_exists if it was (rotate the key for a secret:"
    " POST /admin/keys/{name}/rotate)",
    "update": "retrying the same change is safe",
    "rotate": "a retry rotates it again and answers the secret in force (that of an"
    " attempt which happened is never shown, and the grace then runs from the retry)",
    "revoke": "a retry answers 204, or 404 key_revoked if it was",
}


def _unknown(operation: str, name: str, exc: WriteUnknown) -> OutcomeUnknown:
    says = _RETRY_SAYS.get(operation, "retry").format(name=name)
    return OutcomeUnknown(
        f"The shared key store did not answer in time ({exc}): the outcome is unknown,"
        f" the {operation or 'write'} of '{name}' may have happened. Retry: {says}."
    )


def _refused(refused: WriteRefused, name: str) -> Exception:
    if refused.reason == "exists":
        return Conflict(
            f"A key named '{name}' exists (if an earlier create of it answered that its"
            " outcome is unknown, it happened: rotate the key for a secret).",
            code="key_exists",
        )
    if refused.reason == "revoked":
        when = f" at {_rfc3339(refused.revoked_at)}" if refused.revoked_at else ""
        return KeyRevoked(f"The key '{name}' was revoked{when}: nothing left to do.")
    if refused.reason == "epoch":
        return KeyStoreUnavailable(
            "The shared key store changed while it was written to; nothing was changed;"
            " retry shortly."
        )
    return _missing(name)


def _missing(name: str) -> ModelNotFound:
    return ModelNotFound(f"No key created through the API is named '{name}'.", code="key_not_found")


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


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
