"""The Redis backend: the bucket core run atomically in Lua, shared by every replica.

One script per operation, one round trip each (``lua/*.lua``, the math mirrored from
bucket.py line by line). Time comes from ``redis.call('TIME')``, so replicas' clocks need
not agree; tests pass an explicit clock instead. Keys are hash-tagged so each script
touches one cluster slot::

    {llmproxy:k:<key name>}:rpm | :tpm | :leases          a client key's buckets and slots
    {llmproxy:g:<model group>}:d:<deployment id>:rpm | :tpm  a group's deployments...
    {llmproxy:g:<model group>}:d:<deployment id>:health      ...their health (a hash)...
    {llmproxy:g:<model group>}:d:<deployment id>:inflight    ...and requests in flight
    llmproxy:replicas                                       replica heartbeats (policy.py)

Idle bucket keys expire a little (10 s) after they have refilled (a deployment's at the
slowest rate 429s may lower it to): a missing key reads as a full bucket. Health keys
expire a little after ``health.expires_at`` (a missing key reads as healthy), in-flight
sets after their latest deadline. On a single Redis 7+ the bucket scripts run as the
functions of one library (FCALL, loaded when Redis says it is missing); otherwise, and on
clusters, as scripts with EVALSHA, reloaded on NOSCRIPT. Every failure (connection,
timeout, script error, cluster trouble) is raised as ``StorageError``; deciding what to do
then is policy.py's job.

Single Redis or Cluster: ``redis+cluster://`` / ``rediss+cluster://`` URLs mean a
cluster; ``redis://`` / ``rediss://`` URLs are probed once on first use with
``INFO cluster`` and ``cluster_enabled:1`` switches to the cluster client; ``unix://``
is always a single Redis. ``cluster=True/False`` skips the probe.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from functools import partial
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError
from redis.retry import Retry

from proxy.limiter import resp, scripts
from proxy.limiter.base import (
    CooldownRule,
    DeploymentLimits,
    DeploymentVerdict,
    HealthChange,
    KeyLimits,
    KeyVerdict,
    Outcome,
    StorageError,
)
from proxy.limiter.batch import LINGER, Batcher, Call, Deliver
from proxy.limiter.bucket import BucketState, Decision
from proxy.limiter.bucket import Outcome as Result
from proxy.limiter.selection import Selection
from proxy.limiter.verdicts import (
    LEASE_TTL,
    Spend,
    correction_spends,
    deployment_spends,
    deployment_verdict,
    key_spends,
    key_verdict,
    sync_floors,
)

Client = Redis | RedisCluster
Clock = Callable[[], float]

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


class RedisLimiter:
    """A Limiter over Redis or Redis Cluster; connects lazily on first use.

    Timeouts are short on purpose: a limiter that cannot answer in a few tens of
    milliseconds should fall back (policy.py), not stall traffic. ``op_timeout`` bounds a
    whole operation, including waiting for one of ``max_connections`` connections and a
    NOSCRIPT reload. Batches go over one pipelined connection of their own (resp.py),
    or through redis-py's pipeline for TLS or when ``pipelined`` is False. Settlements
    wait up to ``linger`` seconds to ride along with the next reservation.
    """

    def __init__(
        self,
        url: str,
        *,
        cluster: bool | None = None,
        socket_timeout: float = 0.1,
        connect_timeout: float = 0.1,
        op_timeout: float = 0.25,
        max_connections: int = 64,
        lease_ttl: float = LEASE_TTL,
        prefix: str = "llmproxy",
        clock: Clock | None = None,
        pipelined: bool = True,
        linger: float = LINGER,
    ) -> None:
        scheme, sep, rest = url.partition("://")
        if scheme in CLUSTER_SCHEMES:
            url, cluster = f"{CLUSTER_SCHEMES[scheme]}{sep}{rest}", True
        elif scheme == "unix":
            cluster = False
        self._url = url
        self._cluster = cluster
        self._options: dict[str, Any] = {
            "decode_responses": True,
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": connect_timeout,
        }
        self._max_connections = max_connections
        self._op_timeout = op_timeout
        self._lease_ttl = lease_ttl
        self._prefix = prefix
        self._clock = clock
        self._client: Client | None = None
        self._scripts: dict[str, AsyncScript] = {}
        self._connecting = asyncio.Lock()
        # Never more operations in flight than connections: the pool never overflows
        # (the cluster client would raise), callers queue here within op_timeout.
        self._slots = asyncio.Semaphore(max_connections)
        self._batch = Batcher(self._run_batch, linger=linger, send_now=self._send_now)
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

    # -- Limiter ---------------------------------------------------------------------

    async def acquire_key(self, limits: KeyLimits, lease_id: str, tokens: float) -> KeyVerdict:
        spends = key_spends(limits, tokens)
        if not spends and limits.max_parallel is None:
            return KeyVerdict(True)
        rate = {s.kind: s.rate for s in spends}
        rpm, tpm = rate.get("rpm"), rate.get("tpm")
        reply = await self._run(
            "acquire_key",
            [self._key(limits.name, k) for k in ("rpm", "tpm", "leases")],
            [
                self._now(),
                _num(tokens),
                _num(rpm.interval) if rpm else "",
                _num(rpm.capacity) if rpm else "",
                _num(tpm.interval) if tpm else "",
                _num(tpm.capacity) if tpm else "",
                "" if limits.max_parallel is None else str(limits.max_parallel),
                lease_id,
                _num(self._lease_ttl),
            ],
        )
        outcome, binding, wait, retry_after, parallel_full, now, *flat = reply
        decision = Decision(Result(outcome), float(wait), float(retry_after), int(binding))
        states = [
            BucketState(float(d), float(t)) for d, t in zip(flat[::2], flat[1::2], strict=True)
        ]
        return key_verdict(spends, decision, parallel_full == "1", states, float(now))

    async def release_key(self, limits: KeyLimits, lease_id: str, token_correction: float) -> None:
        lease = lease_id if limits.max_parallel is not None else ""
        correct = limits.tpm is not None and token_correction != 0
        if not lease and not correct:
            return
        await self._run(
            "release_key",
            [self._key(limits.name, "tpm"), self._key(limits.name, "leases")],
            [
                self._now(),
                lease,
                _num(limits.tpm.interval) if limits.tpm and correct else "",
                _num(token_correction),
            ],
            urgent=False,
        )

    async def reserve_deployment(
        self,
        group: str,
        candidates: Sequence[DeploymentLimits],
        tokens: float,
        max_wait: float,
        *,
        lease_id: str = "",
        least_busy: bool = False,
    ) -> DeploymentVerdict:
        if not candidates:
            raise ValueError("reserve_deployment needs at least one candidate")
        keys: list[str] = []
        args = [self._now(), _num(max_wait), lease_id, "1" if least_busy else "0"]
        for c in candidates:
            spends = deployment_spends(c, tokens)
            keys += [
                self._deployment(group, c.id, "health"),
                self._deployment(group, c.id, "inflight"),
            ]
            keys += [self._deployment(group, c.id, s.kind) for s in spends]
            args += [str(len(spends)), _num(c.probe_timeout)]
            for s in spends:
                args += [_num(s.rate.interval), _num(s.rate.capacity), _num(s.amount)]
        reply = await self._run("reserve_deployment", keys, args)
        outcome, index, wait, retry_after, binding, probe, cooling, *waits = reply
        decision = Decision(Result(outcome), float(wait), float(retry_after), int(binding))
        selection = Selection(
            int(index), [], decision, [float(w) for w in waits], probe == "1", cooling == "1"
        )
        return deployment_verdict(candidates, selection)

    async def correct_deployment(
        self, group: str, deployment: DeploymentLimits, requests: float, tokens: float
    ) -> None:
        spends = correction_spends(deployment, requests, tokens)
        if spends:
            await self._run(
                "correct_deployment",
                [
                    self._deployment(group, deployment.id, "health"),
                    *(self._deployment(group, deployment.id, s.kind) for s in spends),
                ],
                [self._now(), *_adjust_args(spends)],
                urgent=False,
            )

    async def settle_deployment(
        self,
        group: str,
        deployment: DeploymentLimits,
        *,
        lease_id: str,
        outcome: Outcome,
        rule: CooldownRule,
        requests: float = 0.0,
        tokens: float = 0.0,
    ) -> HealthChange:
        spends = correction_spends(deployment, requests, tokens)
        reply = await self._run(
            "settle_deployment",
            [
                self._deployment(group, deployment.id, "health"),
                self._deployment(group, deployment.id, "inflight"),
                *(self._deployment(group, deployment.id, s.kind) for s in spends),
            ],
            [
                self._now(),
                lease_id,
                outcome.kind,
                "" if outcome.cool_for is None else _num(outcome.cool_for),
                "1" if outcome.rate_limited else "0",
                str(rule.allowed_fails),
                _num(rule.window),
                _num(rule.time),
                *_adjust_args(spends),
            ],
            urgent=outcome.kind == "failure",  # a cooldown must start at once
        )
        cooled, recovered, cool_for = reply
        return HealthChange(cooled == "1", recovered == "1", float(cool_for))

    async def sync_budget(
        self,
        group: str,
        deployment: DeploymentLimits,
        *,
        remaining_requests: float | None,
        reset_requests: float | None,
        remaining_tokens: float | None,
        reset_tokens: float | None,
    ) -> None:
        floors = sync_floors(deployment, remaining_requests, reset_requests, remaining_tokens)
        if not floors:
            return
        args = [self._now()]
        for f in floors:
            wait = "" if f.wait is None else _num(f.wait)
            args += [_num(f.rate.interval), _num(f.rate.capacity), _num(f.available), wait]
        keys = [
            self._deployment(group, deployment.id, k) for k in ("health", *(f.kind for f in floors))
        ]
        await self._run("sync_budget", keys, args)

    async def deployment_health(self, group: str, ids: Sequence[str]) -> dict[str, float]:
        if not ids:
            return {}
        reply = await self._run(
            "deployment_health", [self._deployment(group, i, "health") for i in ids], [self._now()]
        )
        return {i: float(w) for i, w in zip(ids, reply, strict=True)}

    async def deployment_budget(
        self, group: str, deployments: Sequence[DeploymentLimits]
    ) -> dict[str, dict[str, float]]:
        keys: list[str] = []
        args = [self._now()]
        slots: list[tuple[str, str]] = []
        for d in deployments:
            for kind, bucket, rate in (("requests", "rpm", d.rpm), ("tokens", "tpm", d.tpm)):
                if rate is not None:
                    keys.append(self._deployment(group, d.id, bucket))
                    args += [_num(rate.interval), _num(rate.capacity)]
                    slots.append((d.id, kind))
        budget: dict[str, dict[str, float]] = {d.id: {} for d in deployments}
        if keys:
            reply = await self._run("deployment_budget", keys, args)
            for (deployment_id, kind), left in zip(slots, reply, strict=True):
                budget[deployment_id][kind] = float(left)
        return budget

    async def aclose(self) -> None:
        if self._pipelined is not None:
            self._pipelined.close()
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    # -- replica heartbeats (used by policy.py) -----------------------------------------

    async def heartbeat(self, replica_id: str, alive_for: float) -> int:
        """Mark ``replica_id`` alive; return how many replicas were seen within
        ``alive_for`` seconds (this one included)."""
        count = await self._run(
            "heartbeat", [self._replicas()], [replica_id, str(round(alive_for * 1000))]
        )
        return int(count)

    async def leave(self, replica_id: str) -> None:
        """Stop counting ``replica_id`` as alive (a clean shutdown)."""
        await self._call(lambda client: client.zrem(self._replicas(), replica_id))

    # -- plumbing --------------------------------------------------------------------

    def _key(self, name: str, kind: str) -> str:
        return f"{{{self._prefix}:k:{name}}}:{kind}"

    def _deployment(self, group: str, deployment_id: str, kind: str) -> str:
        return f"{{{self._prefix}:g:{group}}}:d:{deployment_id}:{kind}"

    def _replicas(self) -> str:
        return f"{self._prefix}:replicas"

    def _now(self) -> str:
        return "" if self._clock is None else _num(self._clock())

    async def _run(
        self, script: str, keys: list[str], args: list[str], *, urgent: bool = True
    ) -> Any:
        """Run ``script``; a call that is not ``urgent`` (bookkeeping nobody waits for)
        may ride along with the next urgent one (batch.py)."""
        if self._cluster is False and self._client is not None:
            return await self._batch.submit(script, keys, args, urgent=urgent)
        return await self._call(lambda _: self._scripts[script](keys=keys, args=args))

    async def _run_batch(self, calls: list[Call]) -> list[Any]:
        """Several scripts in one pipelined round trip (single Redis only: a cluster
        would split the pipeline per node anyway). Entries are results or exceptions.

        Bucket scripts are called as the function library's functions (FCALL) while the
        server has functions (Redis 7+), else with EVALSHA."""
        try:
            results = await self._execute(self._commands(calls, range(len(calls))))
            return await self._complete(calls, results)
        except StorageError:
            raise
        except Exception as exc:
            raise _storage_error(exc) from exc

    def _send_now(self, calls: list[Call], deliver: Deliver) -> bool:
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

    def _commands(self, calls: list[Call], indices: Iterable[int]) -> list[resp.Command]:
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
        return list(await self._call(lambda client: _pipeline(client, commands)))

    async def _complete(self, calls: list[Call], results: list[Any]) -> list[Any]:
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

    async def _load(self, what: set[str | None], missing: list[int], calls: list[Call]) -> None:
        if "fcall" in what:
            self._functions = False  # Redis before 7: scripts only
        elif "function" in what:
            [loaded] = await self._execute([("FUNCTION", "LOAD", "REPLACE", scripts.library()[1])])
            if isinstance(loaded, Exception):  # e.g. an ACL without FUNCTION: scripts
                self._functions = False
        if "script" in what:
            names = {calls[i][0] for i in missing}
            await self._execute([("SCRIPT", "LOAD", scripts.source(name)) for name in names])

    async def _call(self, op: Callable[[Client], Awaitable[Any]]) -> Any:
        try:
            async with asyncio.timeout(self._op_timeout), self._slots:
                return await op(await self._connected())
        except Exception as exc:
            # RedisError (connection, timeout, script error), RedisClusterException (not
            # a RedisError), OSError, our deadline's TimeoutError, and anything else the
            # client lets escape: the policy falls back rather than failing the request.
            raise _storage_error(exc) from exc

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
        if self._cluster is None:
            self._cluster = await self._probe_cluster()
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

    async def _probe_cluster(self) -> bool:
        probe = Redis.from_url(self._url, retry=Retry(NoBackoff(), 0), **self._options)
        try:
            info = await probe.info("cluster")
        finally:
            await probe.aclose()
        return str(info.get("cluster_enabled", 0)) == "1"


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


def _num(x: float) -> str:
    """A float as text that Lua's tonumber reads back as the very same double."""
    return repr(float(x))


def _adjust_args(spends: Sequence[Spend]) -> list[str]:
    args: list[str] = []
    for s in spends:
        args += [_num(s.rate.interval), _num(s.amount)]
    return args
