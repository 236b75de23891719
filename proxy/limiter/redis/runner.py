"""The storage bridge: runs the limiter's Lua scripts on Redis or Redis Cluster.

The operations (``backend.py``) say which script, which keys and which arguments; this
module decides how they get there, and hides the Redis client from them (the model:
``limits``' storage classes):

* Single Redis or Cluster: ``redis+cluster://`` / ``rediss+cluster://`` URLs mean a
  cluster; ``redis://`` / ``rediss://`` URLs are probed once on first use with
  ``INFO cluster`` and ``cluster_enabled:1`` switches to the cluster client; ``unix://``
  is always a single Redis. ``cluster=True/False`` skips the probe. Connects lazily.
  A ``sentinel`` target (sentinel.py) is a single Redis found through its sentinels.
* On a single Redis, the scripts called within one turn of the event loop go out in one
  pipelined round trip (batch.py), over one multiplexed connection of their own
  (resp.py; redis-py's pipeline for TLS or when ``pipelined`` is False). A call that is
  not urgent (a settlement nobody waits for) rides along with the next urgent one; the
  backend may merge a batch's calls first (``merge``: backend.py merges key settlements).
* On Redis 7+ the bucket scripts run as the functions of one library (FCALL, loaded when
  Redis says it is missing); otherwise, and on clusters, as scripts with EVALSHA,
  reloaded on NOSCRIPT. A call that did not run for want of its script runs again.
* Every failure (connection, timeout, script error, cluster trouble) is raised as
  ``StorageError``; deciding what to do then is policy.py's job.

Timeouts are short on purpose: a limiter that cannot answer in a few tens of
milliseconds should fall back (policy.py), not stall traffic. ``op_timeout`` bounds a
whole operation, including waiting for one of ``max_connections`` connections and a
NOSCRIPT reload.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any, TypedDict

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError
from redis.retry import Retry

from proxy.limiter.base import STORAGE_REACHED, StorageError
from proxy.limiter.redis import resp, scripts
from proxy.limiter.redis.batch import LINGER, Batcher, Deliver, Merge, ScriptCall
from proxy.limiter.redis.sentinel import SentinelTarget, open_primary

__all__ = ["Client", "RunnerOptions", "ScriptRunner", "is_cluster", "redis_target", "shown"]

Client = Redis | RedisCluster

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def redis_target(url: str) -> tuple[str, bool | None]:
    """``url`` as redis-py takes it, and whether it names a cluster: ``redis+cluster://``
    yes, ``unix://`` no, any other not known (``is_cluster`` asks the server)."""
    scheme, sep, rest = url.partition("://")
    if scheme in CLUSTER_SCHEMES:
        return f"{CLUSTER_SCHEMES[scheme]}{sep}{rest}", True
    return url, (False if scheme == "unix" else None)


async def is_cluster(url: str, **options: Any) -> bool:
    """Whether the Redis at ``url`` runs in cluster mode (``INFO cluster``, once)."""
    probe = Redis.from_url(url, **options)
    try:
        info = await probe.info("cluster")
    finally:
        await probe.aclose()
    return str(info.get("cluster_enabled", 0)) == "1"


def shown(url: str) -> str:
    """Which Redis ``url`` names, as logs and messages show it: no user or password, and
    no query (one may carry ``password=`` too)."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.rpartition('@')[2].partition('?')[0]}"


class RunnerOptions(TypedDict, total=False):
    """How the runner reaches Redis (``ScriptRunner``'s keyword arguments)."""

    cluster: bool | None
    socket_timeout: float
    connect_timeout: float
    op_timeout: float
    max_connections: int
    pipelined: bool
    linger: float
    sentinel: SentinelTarget | None


class ScriptRunner:
    def __init__(
        self,
        url: str,
        *,
        cluster: bool | None = None,
        socket_timeout: float = 0.1,
        connect_timeout: float = 0.1,
        op_timeout: float = 0.25,
        max_connections: int = 64,
        pipelined: bool = True,
        linger: float = LINGER,
        merge: Merge | None = None,
        sentinel: SentinelTarget | None = None,
    ) -> None:
        """``merge``: how the backend merges a batch's calls (batch.py), if it does.
        ``sentinel``: reach the primary its sentinels name (``url`` is then ignored)."""
        self._sentinel = sentinel
        self._sentinels: Sentinel | None = None
        if sentinel is not None:
            cluster, pipelined = False, False
        else:
            url, known = redis_target(url)
            cluster = cluster if known is None else known
        self._url = url
        self._cluster = cluster
        self._options: dict[str, Any] = {
            "decode_responses": True,
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": connect_timeout,
        }
        self._max_connections = max_connections
        self._op_timeout = op_timeout
        self._client: Client | None = None
        self._scripts: dict[str, AsyncScript] = {}
        self._connecting = asyncio.Lock()
        # Never more operations in flight than connections: the pool never overflows
        # (the cluster client would raise), callers queue here within op_timeout.
        self._slots = asyncio.Semaphore(max_connections)
        self._batch = Batcher(self._run_batch, linger=linger, send_now=self._send_now, merge=merge)
        self._loading: set[asyncio.Task[list[Any]]] = set()
        self._functions = True  # until the server shows it has none (scripts.library)
        # The batches' own connection (single Redis over TCP or a unix socket).
        self._pipelined = (
            resp.PipelinedConnection(url, connect_timeout=connect_timeout, timeout=socket_timeout)
            if pipelined and resp.supports(url) and cluster is not True
            else None
        )

    @property
    def is_cluster(self) -> bool | None:
        """True/False once known (after the first operation), None before."""
        return self._cluster

    @property
    def submit_ready(self) -> bool:
        """Whether calls are batched now (single Redis, connected): ``submit`` works."""
        return self._cluster is False and self._client is not None

    def submit(
        self, script: str, keys: list[str], args: list[str], *, urgent: bool = True
    ) -> asyncio.Future[Any] | None:
        """``run`` without a coroutine: the batch's future for ``script``'s result (a
        failure as StorageError), or None when calls are not batched now (a cluster, or
        not connected yet): then ``run`` must be awaited instead."""
        if self.submit_ready:
            STORAGE_REACHED.set(True)
            return self._batch.submit(script, keys, args, urgent=urgent)
        return None

    async def run(
        self, script: str, keys: list[str], args: list[str], *, urgent: bool = True
    ) -> Any:
        """Run ``script``; a call that is not ``urgent`` (bookkeeping nobody waits for)
        may ride along with the next urgent one (batch.py)."""
        batched = self.submit(script, keys, args, urgent=urgent)
        if batched is not None:
            return await batched
        return await self.call(lambda _: self._scripts[script](keys=keys, args=args))

    async def call(self, op: Callable[[Client], Awaitable[Any]]) -> Any:
        """``op`` on the client, within the operation deadline; failures as StorageError."""
        STORAGE_REACHED.set(True)
        try:
            async with asyncio.timeout(self._op_timeout), self._slots:
                return await op(await self._connected())
        except Exception as exc:
            # RedisError (connection, timeout, script error), RedisClusterException (not
            # a RedisError), OSError, our deadline's TimeoutError, and anything else the
            # client lets escape: the policy falls back rather than failing the request.
            raise _storage_error(exc) from exc

    async def config_values(self, name: str) -> list[str] | None:
        """The server's ``CONFIG GET name`` (a cluster's: each primary's); None when the
        server refuses it (an ACL without CONFIG, a managed Redis that renamed it).
        Other failures as StorageError."""

        async def read(client: Client) -> list[str] | None:
            try:
                if isinstance(client, RedisCluster):
                    nodes = RedisCluster.PRIMARIES
                    replies: Any = await client.config_get(name, target_nodes=nodes)
                    return [str(reply.get(name, "")) for reply in replies.values()]
                return [str((await client.config_get(name)).get(name, ""))]
            except ResponseError:
                return None

        result: list[str] | None = await self.call(read)
        return result

    @property
    def where(self) -> str:
        """Which Redis, for logs (no credentials)."""
        if self._sentinel is not None:
            return self._sentinel.describe()
        return shown(self._url)

    async def drain(self) -> None:
        """Wait for the batched calls, lingering ones sent now (a shutdown's first step)."""
        await self._batch.drain()

    async def aclose(self) -> None:
        if self._pipelined is not None:
            self._pipelined.close()
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
        sentinels, self._sentinels = self._sentinels, None
        if sentinels is not None:
            await sentinels.aclose()

    # -- batches ---------------------------------------------------------------------

    async def _run_batch(self, calls: list[ScriptCall]) -> list[Any]:
        """Several scripts in one pipelined round trip (single Redis only: a cluster
        would split the pipeline per node anyway). Entries are results or exceptions."""
        try:
            results = await self._execute(self._commands(calls, range(len(calls))))
            return await self._complete(calls, results)
        except StorageError:
            raise
        except Exception as exc:
            raise _storage_error(exc) from exc

    def _send_now(self, calls: list[ScriptCall], deliver: Deliver) -> bool:
        """The batcher's fast path: write the batch at once on the pipelined connection
        (if connected) and hand the replies over from the connection's own callback."""
        connection = self._pipelined
        if connection is None:
            return False

        def replied(outcome: list[Any] | BaseException) -> None:
            if isinstance(outcome, BaseException):
                deliver(_storage_error(outcome))
            elif not any(_missing(r) for r in outcome):
                deliver(outcome)
            else:  # scripts to load first: finish in a task
                task = asyncio.ensure_future(self._complete(calls, outcome))
                self._loading.add(task)
                task.add_done_callback(partial(self._loaded, deliver))

        return connection.send(self._commands(calls, range(len(calls))), replied)

    def _loaded(self, deliver: Deliver, task: asyncio.Task[list[Any]]) -> None:
        self._loading.discard(task)
        if task.cancelled():
            deliver(StorageError("redis limiter: cancelled while loading scripts"))
        elif (exc := task.exception()) is not None:
            deliver(_storage_error(exc))
        else:
            deliver(task.result())

    def _commands(self, calls: list[ScriptCall], indices: Iterable[int]) -> list[resp.Command]:
        """Bucket scripts as the library's functions (FCALL) while the server has
        functions (Redis 7+), else EVALSHA."""
        out: list[resp.Command] = []
        for i in indices:
            name, keys, args = calls[i]
            if self._functions and name in scripts.BUCKET_SCRIPTS:
                out.append(("FCALL", scripts.function_name(name), len(keys), *keys, *args))
            else:
                out.append(("EVALSHA", self._scripts[name].sha, len(keys), *keys, *args))
        return out

    async def _execute(self, commands: list[resp.Command]) -> list[Any]:
        if self._pipelined is not None:
            return await self._pipelined.execute(commands)
        return list(await self.call(lambda client: _pipeline(client, commands)))

    async def _complete(self, calls: list[ScriptCall], results: list[Any]) -> list[Any]:
        """``results`` with the calls that did not run for want of their script or
        function loaded and run again. A restarted or flushed Redis forgot them (or never
        had functions); the call did not run, so running it again is safe. At most twice:
        FCALL unknown -> EVALSHA -> NOSCRIPT -> loaded."""
        for _ in range(2):
            missing = [i for i, r in enumerate(results) if _missing(r)]
            if not missing:
                break
            await self._load({_missing(results[i]) for i in missing}, missing, calls)
            again = await self._execute(self._commands(calls, missing))
            for i, result in zip(missing, again, strict=True):
                results[i] = result
        return results

    async def _load(
        self, what: set[str | None], missing: list[int], calls: list[ScriptCall]
    ) -> None:
        if "fcall" in what:
            self._functions = False  # Redis before 7: scripts only
        elif "function" in what:
            [loaded] = await self._execute([("FUNCTION", "LOAD", "REPLACE", scripts.library()[1])])
            if isinstance(loaded, Exception):  # e.g. an ACL without FUNCTION: scripts
                self._functions = False
        if "script" in what:
            names = {calls[i][0] for i in missing}
            await self._execute([("SCRIPT", "LOAD", scripts.source(name)) for name in names])

    # -- connecting ------------------------------------------------------------------

    async def _connected(self) -> Client:
        if self._client is None:
            async with self._connecting:
                if self._client is None:
                    self._client = await self._open()
                    self._scripts = {
                        name: self._client.register_script(scripts.source(name))
                        for name in scripts.BUCKET_SCRIPTS + scripts.PLAIN_SCRIPTS
                    }
        return self._client

    async def _open(self) -> Client:
        if self._sentinel is not None:
            client, self._sentinels = open_primary(
                self._sentinel, self._options, self._max_connections
            )
            return client
        if self._cluster is None:
            self._cluster = await is_cluster(
                self._url, retry=Retry(NoBackoff(), 0), **self._options
            )
        if self._cluster:
            cluster = RedisCluster.from_url(
                self._url,
                max_connections=self._max_connections,
                retry=Retry(NoBackoff(), 0),  # scripts are not idempotent: never re-run
                **self._options,
            )
            # Discover the topology once, before any concurrent use.
            return await cluster.initialize()
        return Redis.from_url(
            self._url,
            max_connections=self._max_connections,
            retry=Retry(NoBackoff(), 0),  # fail fast: the circuit breaker decides
            **self._options,
        )


def _storage_error(exc: BaseException) -> StorageError:
    if isinstance(exc, StorageError):
        return exc
    return StorageError(f"redis limiter: {type(exc).__name__}: {exc}")


def _missing(reply: object) -> str | None:
    """Why a call did not run: its script or function is not loaded, or the server has
    no functions at all ("fcall"); None if it ran (well or not)."""
    if isinstance(reply, NoScriptError):
        return "script"
    if isinstance(reply, ResponseError):
        message = str(reply).lower()
        if "function not found" in message:
            return "function"
        if "unknown command" in message and "fcall" in message:
            return "fcall"
    return None


async def _pipeline(client: Client, commands: list[resp.Command]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return list(await pipe.execute(raise_on_error=False))
