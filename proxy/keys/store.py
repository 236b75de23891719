"""``RecordStore``: named records of one kind managed through the admin API, for one
process; ``RuntimeKeys``: its client keys (``teams.py``'s ``RuntimeTeams``: its teams).

Lookups read this process's index only (``index.py``), never Redis: the hot path costs
one dict access more for a key the config does not have. Writes go to the backend first
(Redis: shared, kept across restarts; or this process) and are applied here at once; other
replicas see them at their next poll, every ``POLL_INTERVAL``, reading only what changed.

What this process knows of a shared store is its *view*: ``unread`` until a first full
read succeeds (nothing from the store can be authenticated: 503, and the replica is not
ready), ``current`` while reads succeed, ``unreachable`` once one failed (the records read
keep working, a key it never saw gets 503, not 401). A store that lost its data (its epoch
gone or another: ``backend.py``) is an error line, ``on_lost`` (a metric) and
``status()``'s ``losses_detected``; this process writes what it knew back (the newest of
each name wins, so several replicas' copies merge, and what was written since the loss
stays), then reads the store again: every replica ends with the same records, each still
deletable, and a record no replica could restore is gone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Container, Sequence
from typing import Any, Generic

from proxy.background import stop
from proxy.catalog.catalog import key_limits
from proxy.config.settings import ClientKey
from proxy.errors import InvalidRequest, ModelNotFound, ServiceUnavailable
from proxy.keys.backend import Changes, Kind, R, RecordBackend, WriteRefused, WriteUnknown
from proxy.keys.index import KeyIndex, RecordIndex
from proxy.keys.listing import Page, page_of
from proxy.keys.memory_backend import MemoryBackend
from proxy.keys.records import KEYS, KeyRecord, digest_of, new_key_id, new_secret, rfc3339
from proxy.keys.redis_backend import RedisRecordBackend
from proxy.limiter.base import KeyLimits
from proxy.limiter.redis.sentinel import SentinelTarget

__all__ = [
    "POLL_INTERVAL",
    "Conflict",
    "KeyBackend",
    "KeyRevoked",
    "KeyStoreUnavailable",
    "OutcomeUnknown",
    "RecordStore",
    "RuntimeKeys",
    "backend_for",
    "merged",
]

logger = logging.getLogger("proxy.keys")

KeyBackend = RecordBackend[KeyRecord]

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
    """The shared store (of keys, of teams) did not answer: nothing was changed (audited
    ``unavailable``)."""

    default_code = "key_store_unavailable"

    def __init__(self, message: str) -> None:
        super().__init__(message, retry_after=1.0)


class OutcomeUnknown(KeyStoreUnavailable):
    """A write was sent and its answer never came: it may have happened (audited
    ``unknown``); the message says what a retry answers."""

    audit_result = "unknown"


class KeyRevoked(ModelNotFound):
    """A delete of a record already deleted (a retry whose first attempt happened):
    ``key_revoked``, ``team_deleted``."""

    default_code = "key_revoked"


def _nobody(name: str) -> None:
    """Told of a record gone, by default: no one."""


async def _go_ahead(records: Sequence[Any]) -> None:
    """Records read may be applied at once (what ``before_apply`` does by default)."""


def _no_one() -> None:
    """Told of a store that lost its data, by default: no one (the log line is written)."""


class RecordStore(Generic[R]):
    """The records of one ``kind``. ``shared``: the backend is seen by other replicas
    (poll it); ``refusal``: why records cannot be managed here at all (several workers
    without Redis), answered 409. ``on_gone`` hears the name of every record this process
    stops knowing (deleted here or by another replica, absent from a full reload): the
    pipeline in force's catalog drops what it built for it. ``on_lost`` hears of every
    loss of the shared store's data this process detects."""

    def __init__(
        self,
        backend: RecordBackend[R],
        *,
        shared: bool,
        refusal: str | None = None,
        clock: Callable[[], float] = time.time,
        poll_interval: float = POLL_INTERVAL,
    ) -> None:
        self.backend = backend
        self.kind = self._kind()
        self.shared = shared
        self.refusal = refusal
        self.index = self._new_index()
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
        # Awaited with the records a read brought, before they are applied (a key store
        # waits for its teams: ``RuntimeTeams.cover``); raising fails the read.
        self.before_apply: Callable[[Sequence[R]], Awaitable[None]] = _go_ahead

    def _kind(self) -> Kind[R]:
        """What this store holds (each subclass's)."""
        raise NotImplementedError

    def _new_index(self) -> RecordIndex[R]:
        return RecordIndex()

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

    def state(self) -> str:
        """``current``, ``unread`` (never read since start) or ``unreachable`` (read, but
        the last look failed)."""
        if not self.loaded:
            return "unread"
        return "unreachable" if self._failing else "current"

    def unavailable(self) -> KeyStoreUnavailable:
        """The answer to a request this process cannot check now."""
        why = "has not been read yet" if not self.loaded else "does not answer"
        return KeyStoreUnavailable(
            f"The store of {self.kind.label} (Redis) {why} on this replica: the request"
            " cannot be checked now; retry shortly."
        )

    def status(self) -> dict[str, Any]:
        """What ``/admin/state`` shows of the store (``key_store``, ``team_store``)."""
        return {
            "backend": "redis" if self.shared else "process",
            "state": self.state(),
            f"{self.kind.noun}s": len(self.index),
            "losses_detected": self.losses,
            "last_loss": self.last_loss,
        }

    async def get(self, name: str) -> R | None:
        return self.index.get(name)

    # -- life -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Load every record (a Redis that does not answer: retried by the poll), then
        poll."""
        if not self.shared:
            return
        try:
            await self.refresh()
        except Exception as exc:
            logger.warning(
                "%s: cannot read the shared store at start: %s; until it is read, what"
                " needs it gets 503 key_store_unavailable (retried every %g s)",
                self.kind.label,
                exc,
                self._poll_interval,
            )
        self._task = asyncio.create_task(self._poll_forever(), name=f"{self.kind.tag}-poll")

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
        await self.before_apply([record for _, record, _ in changes.changed if record])
        for name, record, revoked_at in changes.changed:
            self._apply(name, record)
            self._remember(name, revoked_at)
        self._seen = changes.version

    async def _reload(self) -> list[str]:
        """Every record again: a new index built beside the one in use, a slice per loop
        turn (100,000 keys would stall requests), then swapped in at once. Returns the
        names gone."""
        snapshot = await self.backend.load_all()
        index = self._new_index()
        records = snapshot.records
        await self.before_apply(records)
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
        logger.info(f"{self.kind.label} loaded", extra={f"{self.kind.noun}s": len(records)})
        return gone

    async def _poll_forever(self) -> None:
        label = self.kind.label
        while True:
            await asyncio.sleep(self._poll_interval)
            failing = self._failing or not self.loaded
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: keep the records known, try again
                if not failing:
                    logger.warning("%s: cannot read the shared store: %s", label, exc)
            else:
                if failing:
                    logger.info("%s: the shared store answers again", label)

    # -- a store that lost its data -------------------------------------------------------

    async def _recover(self, changes: Changes[R]) -> None:
        """The store is not the one last read: its epoch is gone or another (wiped), or
        its version went back (a failover to a replica that lagged). Counted and logged
        once; what this process knew written back; then everything read again."""
        reason = "wiped" if changes.epoch != self._epoch else "rolled_back"
        held = bool(self.index) or bool(self._revoked)
        label, noun = self.kind.label, self.kind.noun
        if not self._epoch and changes.epoch:  # its first write since this process read it
            await self._reload()
            return
        if not held:  # nothing was lost that this process knew of: adopt it quietly
            logger.info("%s: the shared store was reset (it held no %ss)", label, noun)
            await self._reload()
            return
        if self._counted != (self._epoch, self._seen):
            self._counted = (self._epoch, self._seen)
            self.losses += 1
            self.on_lost()
            self.last_loss = {"at": rfc3339(self._clock()), "reason": reason, "outcome": "pending"}
            logger.error(
                "%s: the shared %s store lost its data (%s): epoch %s version %d was read,"
                " the store now has epoch %s version %d; writing back the %d %ss and %d"
                " deletions this replica knew",
                label,
                noun,
                reason,
                self._epoch or "-",
                self._seen,
                changes.epoch or "none",
                changes.version,
                len(self.index),
                noun,
                len(self._revoked),
            )
        fresh = time.monotonic() - self._last_read <= RESTORE_MAX_AGE
        written = await self._write_back() if fresh else 0
        gone = await self._reload()
        if self.last_loss is not None:
            self.last_loss.update(
                outcome="restored" if fresh else "not_restored",
                written_back=written,
                **{f"{noun}s_gone": len(gone)},
            )
        log = logger.error if gone or not fresh else logger.warning
        log(
            "%s: the shared %s store was filled again: %d names written back from this"
            " replica, %d %ss it knew are gone%s",
            label,
            noun,
            written,
            len(gone),
            noun,
            "" if fresh else " (its copy was too old to write back)",
            extra={"gone": gone[:100]},
        )

    async def _write_back(self) -> int:
        """This process's records and deletions into the store, newest wins."""
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

    async def _create(self, record: R) -> None:
        """``record`` written (409 if its name exists), then known here."""
        self._check_allowed()
        await self.ensure_read()
        name = record.name
        await self._write(lambda: self.backend.create(record, self._epoch), name, "create")
        self.index.apply(name, record)
        self._remember(name, None)

    async def _delete(self, name: str, operation: str) -> None:
        """``name`` deleted (404 if there is none), then gone here."""
        self._check_allowed()
        await self.ensure_read()
        at = self._clock()
        await self._write(lambda: self.backend.delete(name, self._epoch, at), name, operation)
        self._apply(name, None)
        self._remember(name, at)

    def _apply(self, name: str, record: R | None) -> None:
        """``name`` is now ``record`` (None: deleted, here or by another replica)."""
        known = self.index.get(name) is not None
        self.index.apply(name, record)
        if record is None and known:
            self.on_gone(name)

    def names(
        self,
        prefix: str = "",
        skip: Container[str] = (),
        where: Callable[[R], bool] | None = None,
    ) -> list[str]:
        """The records' names in order, those starting with ``prefix`` (and ``where``
        holds of), without ``skip`` (the config's: they win)."""
        names = self.index.names()
        if prefix:
            names = [n for n in names if n.startswith(prefix)]
        if skip:
            names = [n for n in names if n not in skip]
        if where is not None:
            names = [n for n in names if (r := self.index.get(n)) and where(r)]
        return names

    def listing(
        self,
        configured: Collection[str],
        page: int,
        per_page: int,
        prefix: str = "",
        *,
        where: Callable[[R], bool] | None = None,
        hidden: Collection[str] | None = None,
    ) -> tuple[Page, list[R]]:
        """One page of the listing of both sources (``listing.page_of``): the config's
        ``configured`` names first, then this store's (``prefix``, ``where``, those the
        config's ``hidden``, default ``configured``, do not hide); with the records of
        this store's on it."""
        skip = configured if hidden is None else hidden
        created = self.names(prefix, skip=skip, where=where)
        chosen = page_of(list(configured), created, page, per_page)
        return chosen, [r for n in chosen.created if (r := self.index.get(n)) is not None]

    async def _change(self, name: str, change: Callable[[R], R], operation: str) -> R:
        await self.ensure_read()
        looked_again = False
        for _ in range(_ATTEMPTS):
            found = await self._call(self.backend.get(name))
            if found is None and not looked_again:
                looked_again = True  # the store may have lost it: a look recovers it
                await self.read_now()
                continue
            if found is None:
                raise self._missing(name)
            current, raw = found
            record = change(current)
            try:
                epoch = await self._call(
                    self.backend.update(record, raw, self._epoch), name=name, kind=operation
                )
                self._adopt(epoch)
            except WriteRefused as refused:
                if refused.reason == "missing":
                    raise self._missing(name) from None
                if refused.reason == "epoch":
                    await self.read_now()
                continue  # another replica changed it meanwhile: again, from its version
            self.index.apply(name, record)
            return record
        noun = self.kind.noun
        raise Conflict(f"The {noun} '{name}' kept changing; try again.", code=f"{noun}_busy")

    async def _write(self, operation: Callable[[], Awaitable[str]], name: str, kind: str) -> None:
        """A create or a delete: once more after a look at the store if it is not the
        one this process read (it lost its data: the look writes back what it knew)."""
        for attempt in range(2):
            try:
                self._adopt(await self._call(operation(), name=name, kind=kind))
                return
            except WriteRefused as refused:
                if refused.reason == "epoch" and attempt == 0:
                    await self.read_now()
                    continue
                raise self._refused(refused, name) from None

    def _adopt(self, epoch: str) -> None:
        """The epoch this process's first write to a store never written created."""
        if not self._epoch:
            self._epoch = epoch

    async def ensure_read(self) -> None:
        """The store read once at least (else a 503 saying nothing was changed)."""
        if not self.loaded:
            await self.read_now()

    async def read_now(self) -> None:
        """What changed read now (else a 503 saying nothing was changed)."""
        try:
            await self.refresh()
        except Exception as exc:
            raise KeyStoreUnavailable(
                f"The shared {self.kind.noun} store cannot be read ({type(exc).__name__});"
                " nothing was changed; retry shortly."
            ) from None

    async def _call(self, call: Awaitable[Any], *, name: str = "", kind: str = "") -> Any:
        """``call``'s result; a store that does not answer is a 503: ``OutcomeUnknown``
        if the ``kind`` of write on ``name`` may have happened."""
        try:
            return await call
        except (WriteRefused, asyncio.CancelledError):
            raise
        except WriteUnknown as exc:
            raise self._unknown(kind, name, exc) from None
        except Exception as exc:
            raise KeyStoreUnavailable(
                f"The shared {self.kind.noun} store is unavailable ({type(exc).__name__});"
                " nothing was changed; retry shortly."
            ) from None

    def _check_allowed(self) -> None:
        if self.refusal is not None:
            raise Conflict(self.refusal, code="runtime_keys_unavailable")

    def _unknown(self, operation: str, name: str, exc: WriteUnknown) -> OutcomeUnknown:
        says = self.kind.retry_says.get(operation, "retry").format(name=name)
        return OutcomeUnknown(
            f"The shared {self.kind.noun} store did not answer in time ({exc}): the outcome"
            f" is unknown, the {operation or 'write'} of '{name}' may have happened."
            f" Retry: {says}."
        )

    def _refused(self, refused: WriteRefused, name: str) -> Exception:
        noun = self.kind.noun
        if refused.reason == "exists":
            return Conflict(
                f"A {noun} named '{name}' exists{self.kind.exists_note}.", code=f"{noun}_exists"
            )
        if refused.reason == "revoked":
            when = f" at {rfc3339(refused.revoked_at)}" if refused.revoked_at else ""
            return KeyRevoked(
                f"The {noun} '{name}' was {self.kind.gone}{when}: nothing left to do.",
                code=f"{noun}_{self.kind.gone}",
            )
        if refused.reason == "epoch":
            return KeyStoreUnavailable(
                f"The shared {noun} store changed while it was written to; nothing was"
                " changed; retry shortly."
            )
        return self._missing(name)

    def _missing(self, name: str) -> ModelNotFound:
        noun = self.kind.noun
        return ModelNotFound(
            f"No {noun} created through the API is named '{name}'.", code=f"{noun}_not_found"
        )


class RuntimeKeys(RecordStore[KeyRecord]):
    """The client keys of the admin API (``records.KEYS``): ``on_gone`` tells the
    pipeline in force's catalog of a key gone (``Catalog.forget``)."""

    index: KeyIndex

    def _kind(self) -> Kind[KeyRecord]:
        return KEYS

    def _new_index(self) -> KeyIndex:
        return KeyIndex()

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

    def unavailable(self) -> KeyStoreUnavailable:
        """The answer to a request whose key this process cannot check now."""
        why = "has not been read yet" if not self.loaded else "does not answer"
        return KeyStoreUnavailable(
            f"The client key store (Redis) {why} on this replica: the key cannot be"
            " checked now; retry shortly."
        )

    # -- operations (the admin API) -------------------------------------------------------

    async def create(
        self, name: str, spec: dict[str, Any], expires_at: float | None
    ) -> tuple[KeyRecord, str]:
        now = self._clock()
        secret = new_secret()
        record = KeyRecord(name, spec, digest_of(secret), now, now, expires_at, key_id=new_key_id())
        await self._create(record)
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
            expiry = record.expires_at if expires is None else expires[0]
            return record.changed(merged(record.spec, changes, validate), expiry, self._clock())

        return await self._change(name, change, "update")

    async def rotate(self, name: str, grace: float) -> tuple[KeyRecord, str]:
        self._check_allowed()
        secret = new_secret()
        record = await self._change(
            name, lambda r: r.rotated(secret, grace, self._clock()), "rotate"
        )
        return record, secret

    async def revoke(self, name: str) -> None:
        await self._delete(name, "revoke")

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
        """One page of the keys' listing (``listing``): those of ``team`` if given."""
        where = None if team is None else _in_team(team)
        return self.listing(configured, page, per_page, prefix, where=where, hidden=hidden)

    def in_team(self, team: str) -> list[str]:
        """The names of the keys of ``team`` (a team's delete is refused while any is)."""
        return self.names(where=_in_team(team))


def merged(
    spec: dict[str, Any],
    changes: dict[str, Any],
    validate: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    """An entry's fields after a PATCH: ``changes`` over ``spec`` (a null removes a
    field), checked by ``validate``."""
    fields = {**spec, **changes}
    return validate({k: v for k, v in fields.items() if v is not None})


def _in_team(team: str) -> Callable[[KeyRecord], bool]:
    return lambda record: record.spec.get("team") == team


def backend_for(
    kind: Kind[R],
    redis_url: str,
    workers: int,
    timeout: float,
    sentinel: SentinelTarget | None = None,
) -> tuple[RecordBackend[R], bool, str | None]:
    """Where one process keeps the records of ``kind``, whether that is shared, and why
    they cannot be managed (None: they can): in Redis when there is one (a URL, or the
    primary its ``sentinel``s name); else in this process, and refused (409) with several
    workers, each of which would hold its own."""
    plural = kind.label.removeprefix("run-time ")
    if redis_url or sentinel is not None:
        backend = RedisRecordBackend(
            redis_url, kind=kind, timeout=max(timeout, 0.5), sentinel=sentinel
        )
        return backend, True, None
    if workers > 1:
        refusal = (
            f"{plural.capitalize()} cannot be managed through the API with {workers} workers"
            f" and no redis.url: each worker is a process of its own and would know only the"
            f" {plural} created through it. Configure redis.url, or run one worker."
        )
        logger.info(
            "%s (%s) are off: %d workers, no redis.url.",
            kind.label.capitalize(),
            kind.path,
            workers,
        )
        return MemoryBackend(kind), False, refusal
    logger.info(
        "%s created through %s live in this process (no redis.url): they are lost on restart.",
        plural.capitalize(),
        kind.path,
    )
    return MemoryBackend(kind), False, None


def runtime_keys_for(
    redis_url: str, workers: int, timeout: float, sentinel: SentinelTarget | None = None
) -> RuntimeKeys:
    """The run-time key store of one process (``backend_for``)."""
    backend, shared, refusal = backend_for(KEYS, redis_url, workers, timeout, sentinel)
    return RuntimeKeys(backend, shared=shared, refusal=refusal)
