"""Run-time keys in Redis, shared by every replica and kept across restarts.

Layout (one hash tag: one cluster slot; no secret anywhere, only sha256 digests)::

    llmproxy:{apikeys}:records   hash   name -> the record's JSON
    llmproxy:{apikeys}:version   int    bumped by every change
    llmproxy:{apikeys}:changes   zset   name -> the version of its last change
    llmproxy:{apikeys}:trimmed   int    the newest version dropped from ``changes``

Every write is one Lua script (the record, the version and the change log together). A
replica reads ``version`` every poll (``store.py``: 250 ms) and, when it moved, only the
names changed since the version it saw; one that fell behind the trimmed log reloads
everything. So a change reaches every replica within a poll and a round trip, and costs
the same whatever the number of keys.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import Sentinel

from proxy.keys.records import KeyRecord
from proxy.limiter.redis.runner import is_cluster, redis_target
from proxy.limiter.redis.sentinel import SentinelTarget, open_primary

__all__ = ["RedisKeyBackend", "WriteRefused"]

_PREFIX = "llmproxy:{apikeys}:"
# Connections to a Sentinel-managed primary (its pool must be bounded); writes are rare.
_MAX_CONNECTIONS = 16
RECORDS, VERSION, CHANGES, TRIMMED = (
    _PREFIX + part for part in ("records", "version", "changes", "trimmed")
)
_KEEP_CHANGES = 10_000  # entries of the change log kept; a replica further behind reloads
_SCAN_CHUNK = 2_000

# ARGV: op (create | update | delete), name, new JSON, expected current JSON (update,
# delete: "" for any), changes to keep. Returns the new version, or -1: the name exists
# (create), -2: no such name, -3: the record changed since it was read.
_WRITE = """
local op, name = ARGV[1], ARGV[2]
local current = redis.call('HGET', KEYS[1], name)
if op == 'create' then
  if current then return -1 end
  redis.call('HSET', KEYS[1], name, ARGV[3])
else
  if not current then return -2 end
  if ARGV[4] ~= '' and current ~= ARGV[4] then return -3 end
  if op == 'update' then redis.call('HSET', KEYS[1], name, ARGV[3])
  else redis.call('HDEL', KEYS[1], name) end
end
local version = redis.call('INCR', KEYS[2])
redis.call('ZADD', KEYS[3], version, name)
local extra = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[5])
if extra > 0 then
  local dropped = redis.call('ZRANGE', KEYS[3], 0, extra - 1, 'WITHSCORES')
  redis.call('SET', KEYS[4], dropped[#dropped])
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, extra - 1)
end
return version
"""

# ARGV: the version last seen. Returns {version, trimmed, name1, name2, ...}: the names
# changed since (all of it in one step, so no change falls between the reads).
_CHANGES = """
local version = tonumber(redis.call('GET', KEYS[1]) or '0')
local trimmed = tonumber(redis.call('GET', KEYS[3]) or '0')
local seen = tonumber(ARGV[1])
local out = {version, trimmed}
if version ~= seen and trimmed <= seen then
  local names = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. seen, '+inf')
  for i = 1, #names do out[#out + 1] = names[i] end
end
return out
"""


class WriteRefused(Exception):
    """The write did not happen: ``reason`` is ``exists``, ``missing`` or ``changed``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_REFUSALS = {-1: "exists", -2: "missing", -3: "changed"}


class RedisKeyBackend:
    """``redis+cluster://`` means a cluster; other ``redis://`` URLs are probed once with
    ``INFO cluster``, as the limiter's (``limiter/redis/runner.py``)."""

    def __init__(
        self, url: str, *, timeout: float = 1.0, sentinel: SentinelTarget | None = None
    ) -> None:
        """``sentinel``: the primary its sentinels name (``url`` is then ignored), as the
        limiter's."""
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
                if self._sentinel is None and self._cluster is None:
                    self._cluster = await is_cluster(self._url, **self._options)
                if self._sentinel is not None:
                    client: Any
                    client, self._sentinels = open_primary(
                        self._sentinel, self._options, _MAX_CONNECTIONS
                    )
                elif self._cluster:
                    client = RedisCluster.from_url(self._url, **self._options)
                else:
                    client = Redis.from_url(self._url, **self._options)
                self._write = client.register_script(_WRITE)
                self._changes = client.register_script(_CHANGES)
                self._client = client
        return self._client

    async def load_all(self) -> tuple[int, list[KeyRecord]]:
        """Every record, and the version they are at least as new as."""
        redis = await self._redis()
        version = int(await redis.get(VERSION) or 0)
        records: list[KeyRecord] = []
        cursor: int | bytes = 0
        while True:
            cursor, chunk = await redis.hscan(RECORDS, cursor, count=_SCAN_CHUNK)
            records.extend(KeyRecord.from_json(raw) for raw in chunk.values())
            if not cursor or cursor == b"0":
                break
        return version, records

    async def changes(self, seen: int) -> tuple[int, list[tuple[str, KeyRecord | None]] | None]:
        """The version now and the records changed since ``seen`` (None for a record:
        revoked); None instead of the list: too far behind, reload everything."""
        redis = await self._redis()
        reply = await self._changes(keys=[VERSION, CHANGES, TRIMMED], args=[seen])
        version, trimmed, names = int(reply[0]), int(reply[1]), [n.decode() for n in reply[2:]]
        if version == seen:
            return version, []
        if trimmed > seen:
            return version, None
        if not names:
            return version, []
        raws = await redis.hmget(RECORDS, names)
        return version, [
            (name, KeyRecord.from_json(raw) if raw is not None else None)
            for name, raw in zip(names, raws, strict=True)
        ]

    async def get(self, name: str) -> tuple[KeyRecord, bytes] | None:
        raw = await (await self._redis()).hget(RECORDS, name)
        return None if raw is None else (KeyRecord.from_json(raw), raw)

    async def create(self, record: KeyRecord) -> None:
        await self._run("create", record.name, record.to_json(), b"")

    async def update(self, record: KeyRecord, expected: bytes) -> None:
        await self._run("update", record.name, record.to_json(), expected)

    async def delete(self, name: str) -> None:
        await self._run("delete", name, b"", b"")

    async def _run(self, op: str, name: str, new: bytes, expected: bytes) -> None:
        await self._redis()
        result = int(
            await self._write(
                keys=[RECORDS, VERSION, CHANGES, TRIMMED],
                args=[op, name, new, expected, _KEEP_CHANGES],
            )
        )
        if result < 0:
            raise WriteRefused(_REFUSALS[result])

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
        if self._sentinels is not None:
            await self._sentinels.aclose()
