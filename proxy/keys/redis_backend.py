"""Run-time records in Redis (the client keys of the admin API, its teams), shared by
every replica and kept across restarts.

Layout of the keys' store (one hash tag: one cluster slot; no secret anywhere, only
sha256 digests); the teams' is the same under ``llmproxy:{apiteams}:`` (``Kind.tag``)::

    llmproxy:{apikeys}:records   hash   name -> the record's JSON
    llmproxy:{apikeys}:version   int    bumped by every change
    llmproxy:{apikeys}:changes   zset   name -> the version of its last change
    llmproxy:{apikeys}:trimmed   int    the newest version dropped from ``changes``
    llmproxy:{apikeys}:epoch     str    an id written with the store's first write
    llmproxy:{apikeys}:revoked   zset   name -> when it was revoked (the latest 10,000)
    llmproxy:{apikeys}:ops       hash   a write's id -> its answer (the latest 1,000)
    llmproxy:{apikeys}:ops_order zset   a write's id -> when it ran

Every write is one Lua script (the record, the version and the change log together),
names the epoch it expects (another, or none: the store lost its data, ``store.py``
recovers) and carries an id: a write sent again (after a timeout) gets the answer of the
first, never runs twice. A replica reads ``version`` every poll (``store.py``: 250 ms)
and, when it moved, only the records changed since the version it saw; one that fell
behind the trimmed log reloads everything. So a change reaches every replica within a
poll and a round trip, and costs the same whatever the number of keys.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any, Generic

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ResponseError

from proxy.keys.backend import Changes, Kind, R, Snapshot, WriteRefused, WriteUnknown
from proxy.keys.records import KEYS, KeyRecord
from proxy.limiter.redis.runner import is_cluster, redis_target
from proxy.limiter.redis.sentinel import SentinelTarget, open_primary

__all__ = ["RedisKeyBackend", "RedisRecordBackend", "WriteRefused", "WriteUnknown", "key_names"]

# Connections to a Sentinel-managed primary (its pool must be bounded); writes are rare.
_MAX_CONNECTIONS = 16
_PARTS = ("records", "version", "changes", "trimmed", "epoch", "revoked", "ops", "ops_order")


def key_names(tag: str) -> list[str]:
    """The Redis keys of the store whose hash tag is ``tag``, in the order the write
    scripts take them (``KEYS[1]`` ... ``KEYS[8]``)."""
    return [f"llmproxy:{{{tag}}}:{part}" for part in _PARTS]


# The client keys' store (what tests and docs name).
_WRITE_KEYS = key_names(KEYS.tag)
RECORDS, VERSION, CHANGES, TRIMMED, EPOCH, REVOKED, OPS, OPS_ORDER = _WRITE_KEYS
_KEEP_CHANGES = 10_000  # entries of the change log (and revocations) kept
_KEEP_OPS = 1_000  # answers of writes kept for a write sent again
_SCAN_CHUNK = 2_000
_WRITE_ATTEMPTS = 2  # a write whose answer did not come is sent again (same id) once

# Keep the change log (KEYS[3]) to ARGV[5] entries; what is dropped is recorded in
# KEYS[4] (a replica further behind reloads everything), with the revocations (KEYS[6]).
_TRIM = """
local function trim(keep)
  local extra = redis.call('ZCARD', KEYS[3]) - keep
  if extra > 0 then
    local dropped = redis.call('ZRANGE', KEYS[3], 0, extra - 1, 'WITHSCORES')
    redis.call('SET', KEYS[4], dropped[#dropped])
    redis.call('ZREMRANGEBYRANK', KEYS[3], 0, extra - 1)
  end
  extra = redis.call('ZCARD', KEYS[6]) - keep
  if extra > 0 then redis.call('ZREMRANGEBYRANK', KEYS[6], 0, extra - 1) end
end
local function logged(names, keep)
  local version = redis.call('INCR', KEYS[2])
  for i = 1, #names do redis.call('ZADD', KEYS[3], version, names[i]) end
  trim(keep)
  return version
end
"""

# ARGV: op (create | update | delete), name, new JSON, expected current JSON (update:
# "" for any), changes to keep, the epoch expected ("": a store never written, whose
# epoch this write creates as ARGV[10]), now, the write's id, answers kept.
# Returns {version}, or {-1}: the name exists (create), {-2}: no such name, {-3}: the
# record changed since it was read, {-4}: not the epoch expected, {-5, when}: a delete
# of a name revoked then. The answer is kept under the write's id: sent again, the same.
_WRITE = (
    _TRIM
    + """
local done = redis.call('HGET', KEYS[7], ARGV[8])
if done then return cjson.decode(done) end
local epoch = redis.call('GET', KEYS[5])
if not epoch and ARGV[6] == '' then redis.call('SET', KEYS[5], ARGV[10]) epoch = ARGV[10] end
if epoch ~= ARGV[6] and not (ARGV[6] == '' and epoch == ARGV[10]) then return {-4} end
local op, name = ARGV[1], ARGV[2]
local current = redis.call('HGET', KEYS[1], name)
local result
if op == 'create' then
  if current then result = {-1} else
    redis.call('HSET', KEYS[1], name, ARGV[3])
    redis.call('ZREM', KEYS[6], name)
  end
elseif not current then
  local gone = redis.call('ZSCORE', KEYS[6], name)
  if gone and op == 'delete' then result = {-5, gone} else result = {-2} end
elseif ARGV[4] ~= '' and current ~= ARGV[4] then result = {-3}
elseif op == 'update' then redis.call('HSET', KEYS[1], name, ARGV[3])
else
  redis.call('HDEL', KEYS[1], name)
  redis.call('ZADD', KEYS[6], ARGV[7], name)
end
if not result then result = {logged({name}, tonumber(ARGV[5]))} end
redis.call('HSET', KEYS[7], ARGV[8], cjson.encode(result))
redis.call('ZADD', KEYS[8], ARGV[7], ARGV[8])
local extra = redis.call('ZCARD', KEYS[8]) - tonumber(ARGV[9])
if extra > 0 then
  local old = redis.call('ZRANGE', KEYS[8], 0, extra - 1)
  redis.call('HDEL', KEYS[7], unpack(old))
  redis.call('ZREMRANGEBYRANK', KEYS[8], 0, extra - 1)
end
return result
"""
)

# A replica's copy written back into a store that lost its data: ARGV: changes to keep,
# an epoch id to create if there is none, the epoch expected ("" for any), the number of
# records, then name, JSON, updated_at of each, then the number of revocations, then
# name, when of each. Per name the newest wins (a record's updated_at against what the
# store has, a revocation's time against a record's), so the copies of several replicas
# merge in any order, and what was written since the loss stays. Returns {epoch,
# changed} (changed -1: not the epoch expected).
_MERGE = (
    _TRIM
    + """
local epoch = redis.call('GET', KEYS[5])
if not epoch then redis.call('SET', KEYS[5], ARGV[2]) epoch = ARGV[2] end
if ARGV[3] ~= '' and ARGV[3] ~= epoch then return {epoch, -1} end
local function newer(name, at)
  local current = redis.call('HGET', KEYS[1], name)
  if current then return at > tonumber(cjson.decode(current).updated_at), true end
  local gone = redis.call('ZSCORE', KEYS[6], name)
  return (not gone) or at > tonumber(gone), false
end
local changed = {}
local i = 5
for _ = 1, tonumber(ARGV[4]) do
  local name, at = ARGV[i], tonumber(ARGV[i + 2])
  if newer(name, at) then
    redis.call('HSET', KEYS[1], name, ARGV[i + 1])
    redis.call('ZREM', KEYS[6], name)
    changed[#changed + 1] = name
  end
  i = i + 3
end
local revocations = tonumber(ARGV[i])
i = i + 1
for _ = 1, revocations do
  local name, at = ARGV[i], tonumber(ARGV[i + 1])
  local wins, held = newer(name, at)
  if wins then
    redis.call('ZADD', KEYS[6], at, name)
    if held then
      redis.call('HDEL', KEYS[1], name)
      changed[#changed + 1] = name
    end
  end
  i = i + 2
end
if #changed > 0 then logged(changed, tonumber(ARGV[1])) else trim(tonumber(ARGV[1])) end
return {epoch, #changed}
"""
)

# ARGV: the version last seen. Returns {version, trimmed, epoch ("" if none), then
# name, record JSON ("" if none), revoked at ("" if not) of each name changed since}:
# all of it in one step, so no change falls between the reads.
_CHANGES = """
local version = tonumber(redis.call('GET', KEYS[1]) or '0')
local trimmed = tonumber(redis.call('GET', KEYS[3]) or '0')
local out = {version, trimmed, redis.call('GET', KEYS[4]) or ''}
local seen = tonumber(ARGV[1])
if version > seen and trimmed <= seen then
  local names = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. seen, '+inf')
  for i = 1, #names do
    out[#out + 1] = names[i]
    out[#out + 1] = redis.call('HGET', KEYS[5], names[i]) or ''
    out[#out + 1] = redis.call('ZSCORE', KEYS[6], names[i]) or ''
  end
end
return out
"""

_REFUSALS = {-1: "exists", -2: "missing", -3: "changed", -4: "epoch", -5: "revoked"}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _before_sending(exc: BaseException) -> bool:
    """Whether a call failed while connecting (its command never left)."""
    return "connecting" in str(exc).lower()


class RedisRecordBackend(Generic[R]):
    """The store of one ``kind`` of records. ``redis+cluster://`` means a cluster; other
    ``redis://`` URLs are probed once with ``INFO cluster``, as the limiter's
    (``limiter/redis/runner.py``). redis-py never sends a call again by itself: a write is
    sent again here, under the same id, and a read fails to its caller (the poll reads
    again)."""

    def __init__(
        self,
        url: str,
        *,
        kind: Kind[R],
        timeout: float = 1.0,
        sentinel: SentinelTarget | None = None,
    ) -> None:
        """``sentinel``: the primary its sentinels name (``url`` is then ignored), as the
        limiter's."""
        self._decode = kind.decode
        self._keys = key_names(kind.tag)
        self._url, self._cluster = redis_target(url)
        self._sentinel = sentinel
        self._sentinels: Sentinel | None = None
        self._options: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
        }
        self._client: Any = None
        self._connecting = asyncio.Lock()

    async def _redis(self) -> Any:
        if self._client is not None:
            return self._client
        async with self._connecting:
            if self._client is None:
                once = Retry(NoBackoff(), 0)
                if self._sentinel is None and self._cluster is None:
                    self._cluster = await is_cluster(self._url, retry=once, **self._options)
                if self._sentinel is not None:
                    client: Any
                    client, self._sentinels = open_primary(
                        self._sentinel, self._options, _MAX_CONNECTIONS
                    )
                elif self._cluster:
                    client = RedisCluster.from_url(self._url, retry=once, **self._options)
                else:
                    client = Redis.from_url(self._url, retry=once, **self._options)
                self._write = client.register_script(_WRITE)
                self._merge = client.register_script(_MERGE)
                self._changes = client.register_script(_CHANGES)
                self._client = client
        return self._client

    async def load_all(self) -> Snapshot[R]:
        """Every record and revocation, the version they are at least as new as, and the
        store's epoch ("" before its first write: a proxy that only reads writes nothing,
        so a Redis whose keys all expire holds none of the key store's)."""
        redis = await self._redis()
        records_key, version_key, _, _, epoch_key, revoked_key, _, _ = self._keys
        epoch = _text(await redis.get(epoch_key) or b"")
        version = int(await redis.get(version_key) or 0)
        records: list[R] = []
        cursor: int | bytes = 0
        while True:
            cursor, chunk = await redis.hscan(records_key, cursor, count=_SCAN_CHUNK)
            records.extend(self._decode(raw) for raw in chunk.values())
            if not cursor or cursor == b"0":
                break
        revoked = await redis.zrange(revoked_key, 0, -1, withscores=True)
        if _text(await redis.get(epoch_key) or b"") != epoch:
            raise RuntimeError("the store lost its data while it was read")
        return Snapshot(epoch, version, records, {_text(n): float(at) for n, at in revoked})

    async def changes(self, seen: int) -> Changes[R]:
        """The epoch and version now, and the records changed since ``seen``."""
        await self._redis()
        records, version_key, changes, trimmed_key, epoch_key, revoked = self._keys[:6]
        keys = [version_key, changes, trimmed_key, epoch_key, records, revoked]
        reply = await self._changes(keys=keys, args=[seen])
        version, trimmed, epoch = int(reply[0]), int(reply[1]), _text(reply[2])
        if version <= seen:
            return Changes(epoch, version, [])
        if trimmed > seen:
            return Changes(epoch, version, None)
        changed: list[tuple[str, R | None, float | None]] = []
        for at in range(3, len(reply), 3):
            name, raw, revoked_at = _text(reply[at]), reply[at + 1], reply[at + 2]
            record = self._decode(raw) if raw else None
            changed.append((name, record, float(revoked_at) if revoked_at else None))
        return Changes(epoch, version, changed)

    async def get(self, name: str) -> tuple[R, bytes] | None:
        raw = await (await self._redis()).hget(self._keys[0], name)
        return None if raw is None else (self._decode(raw), raw)

    async def create(self, record: R, epoch: str) -> str:
        return await self._run(
            "create", record.name, record.to_json(), b"", epoch, record.updated_at
        )

    async def update(self, record: R, expected: bytes, epoch: str) -> str:
        return await self._run(
            "update", record.name, record.to_json(), expected, epoch, record.updated_at
        )

    async def delete(self, name: str, epoch: str, at: float) -> str:
        return await self._run("delete", name, b"", b"", epoch, at)

    async def _run(
        self, op: str, name: str, new: bytes, expected: bytes, epoch: str, now: float
    ) -> str:
        """One write, sent again once (the same id) if its answer does not come; raises
        ``WriteUnknown`` if it may have run and no answer says so. Returns the store's
        epoch after it: the one expected, or this write's id if it created it."""
        op_id = uuid.uuid4().hex
        args = [op, name, new, expected, _KEEP_CHANGES, epoch, now, op_id, _KEEP_OPS, op_id]
        sent = False
        failure: Exception = RuntimeError("no attempt")
        for _ in range(_WRITE_ATTEMPTS):
            try:
                await self._redis()
            except ResponseError:
                raise
            except Exception as exc:  # no connection: nothing sent
                failure = exc
                continue
            try:
                reply = await self._write(keys=self._keys, args=args)
            except ResponseError:
                raise  # refused by the server: it did not run
            except Exception as exc:
                sent = sent or not _before_sending(exc)
                failure = exc
                continue
            code = int(reply[0])
            if code < 0:
                at = float(reply[1]) if len(reply) > 1 else None
                raise WriteRefused(_REFUSALS[code], at)
            return epoch or op_id
        if sent:
            raise WriteUnknown(f"{type(failure).__name__}: {failure}") from failure
        raise failure

    async def merge(
        self, records: Sequence[R], revoked: Sequence[tuple[str, float]], epoch: str
    ) -> tuple[str, int]:
        """Write ``records`` and ``revoked`` back where they are newer than what the store
        holds (``epoch``: the one expected, "" for any: the store gets one if it has
        none). Returns the store's epoch and how many names changed."""
        await self._redis()
        args: list[Any] = [_KEEP_CHANGES, uuid.uuid4().hex, epoch, len(records)]
        for record in records:
            args += [record.name, record.to_json(), record.updated_at]
        args.append(len(revoked))
        for name, at in revoked:
            args += [name, at]
        reply = await self._merge(keys=self._keys[:6], args=args)
        changed = int(reply[1])
        if changed < 0:
            raise WriteRefused("epoch")
        return _text(reply[0]), changed

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
        if self._sentinels is not None:
            await self._sentinels.aclose()


class RedisKeyBackend(RedisRecordBackend[KeyRecord]):
    """The client keys' store (``records.KEYS``: ``llmproxy:{apikeys}:*``)."""

    def __init__(
        self, url: str, *, timeout: float = 1.0, sentinel: SentinelTarget | None = None
    ) -> None:
        super().__init__(url, kind=KEYS, timeout=timeout, sentinel=sentinel)
