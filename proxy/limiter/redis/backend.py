"""The Redis backend: the limiter's operations as Lua scripts, shared by every replica.

One script per operation, one round trip each (``lua/*.lua``, the math mirrored from
bucket.py, selection.py and health.py line by line); how scripts reach Redis (batching,
functions, clusters, errors) is runner.py's job. Time comes from ``redis.call('TIME')``,
so replicas' clocks need not agree; tests pass an explicit clock instead. Keys are
hash-tagged so each script touches one cluster slot (``P`` is ``KEY_PREFIX``,
``llmproxy:v<SCHEMA_VERSION>``)::

    {P:k:<key name>}:<window> | :leases              a client key's windows, slots
    {P:t:<team>}:<window> | :leases                   a team's windows, slots...
    {P:t:<team>}:k:<key name>:<window> | :leases       ...and those of its keys
    ...:budget_<kind>_<period>[:<models>]            a key's or team's budget (period, spent)
    {P:g:<group>}:d:<deployment id>:<window>          a group's deployments...
    {P:g:<group>}:d:<deployment id>:health            ...their health (a hash)...
    {P:g:<group>}:d:<deployment id>:inflight          ...and requests in flight
    P:replicas                                        replica heartbeats (policy.py)
    {P:replicas}:activity                             what each replica reports doing
    {P:replicas}:margins                              the pacing margin each replica needs

``<window>`` is the window's name (``rpm``, ``tpd``, ``tokens_30d``, ``rpm@gpt-4o``...),
so a window's state outlives a change of its rate. A key in a team lives in its team's
slot: its check and settlement are one script on one slot. Idle bucket keys expire a
little (10 s) after they have refilled (a deployment's at the slowest rate 429s may
lower it to): a missing key reads as a full bucket. Health keys expire a little after
``health.expires_at`` (a missing key reads as healthy), in-flight sets after their
latest deadline.

The key settlements of one key that go out in the same batch are merged into one
``settle_key`` call (``merge_key_settlements``): under load a batch carries several.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Unpack

import orjson

from proxy.limiter.base import (
    NO_CHANGE,
    TEAM,
    Activity,
    Claimant,
    DeploymentLimits,
    DeploymentSettlement,
    DeploymentState,
    DeploymentVerdict,
    GroupAsk,
    HealthChange,
    KeyAsk,
    KeyLimits,
    KeySettlement,
    KeyState,
    KeyVerdict,
    Sent,
    Settlement,
)
from proxy.limiter.core.bucket import Admission, BucketState, Decision
from proxy.limiter.core.fairness import Deferral
from proxy.limiter.core.health import Evidence, Health
from proxy.limiter.core.quota import QuotaCheck, QuotaState, cost_of
from proxy.limiter.core.selection import Selection
from proxy.limiter.core.verdicts import (
    LEARNED,
    LEASE_TTL,
    Floor,
    corrections,
    deployment_state,
    deployment_verdict,
    evidence,
    floors,
    key_spends,
    key_state,
    key_verdict,
    pacing_windows,
    quota_costs,
    spends,
)
from proxy.limiter.redis.batch import ScriptCall
from proxy.limiter.redis.eviction import evicting
from proxy.limiter.redis.leases import WARM_USES, Leases
from proxy.limiter.redis.runner import RunnerOptions, ScriptRunner

Clock = Callable[[], float]
log = logging.getLogger(__name__)

CLOSING_RETURNS = 1.0  # seconds a shutdown waits to give back its open leases

# The layout of the keys and of what they hold. Raised whenever either changes, so that
# during a rolling upgrade two versions of the proxy sharing one Redis use disjoint keys
# and never misread each other's state (docs/production.md). Version 1 had no number in
# its keys (``{llmproxy:k:...}``).
SCHEMA_VERSION = 2
KEY_PREFIX = f"llmproxy:v{SCHEMA_VERSION}"


class RedisLimiter:
    """A Limiter over Redis or Redis Cluster; ``options`` say how to reach it (runner.py)."""

    def __init__(
        self,
        url: str,
        *,
        lease_ttl: float = LEASE_TTL,
        prefix: str = KEY_PREFIX,
        clock: Clock | None = None,
        leases: bool | None = None,
        lease_warm_uses: int = WARM_USES,
        **options: Unpack[RunnerOptions],
    ) -> None:
        self.runner = ScriptRunner(url, merge=merge_key_settlements, **options)
        # Leases (leases.py) unless told otherwise; never under an explicit clock (tests
        # that compare verdicts with the memory backend's, step by step).
        leasing = clock is None if leases is None else leases
        self._leases = (
            Leases(
                self.runner,
                _num,
                self._now,
                self._windows,
                self._lease_keys,
                warm_uses=lease_warm_uses,
            )
            if leasing
            else None
        )
        self._lease_ttl = lease_ttl
        self._prefix = prefix
        self._key_prefixes: dict[tuple[str, str, str], str] = {}
        self._deployment_prefixes: dict[tuple[str, str], str] = {}
        self._clock = clock

    @property
    def prefix(self) -> str:
        """What every key of this limiter's starts with (the schema's prefix)."""
        return self._prefix

    @property
    def is_cluster(self) -> bool | None:
        """True/False once known (after the first operation), None before."""
        return self.runner.is_cluster

    # -- Limiter ---------------------------------------------------------------------

    async def acquire_key(self, ask: KeyAsk) -> KeyVerdict:
        limits = ask.limits
        if limits.unlimited:
            return KeyVerdict(True)
        quotas = limits.all_quotas
        # A budget is never leased: each request's reservation is checked against every
        # replica's (quota.py: why concurrency cannot overshoot).
        if self._leases is not None and not limits.slotted and not quotas:
            leased = await self._leases.acquire_key(ask)
            if leased is not None:
                return leased
        spent = key_spends(limits, ask.cost)
        team = limits.team
        args = [
            self._now(),
            _slots_arg(limits),
            ask.slot,
            _num(self._lease_ttl),
            "" if team is None else _slots_arg(team),
            str(len(quotas)),
        ]
        for s in spent:
            args += [_num(s.rate.interval), _num(s.capacity), _num(s.amount)]
        if quotas:
            args += _budget_args(limits, ask)
        keys = self._key_keys(limits) + self._quota_keys(limits)
        reply = iter(await self.runner.run("acquire_key", keys, args))
        outcome, binding, wait, retry_after, slots_full, now = (next(reply) for _ in range(6))
        decision = Decision(Admission(outcome), float(wait), float(retry_after), int(binding))
        states = [_state(reply) for _ in spent]
        refused, budget_retry = int(next(reply)), float(next(reply))
        cap = int(next(reply))
        charged = [_quota_state(reply) for _ in quotas]
        return key_verdict(
            spent,
            decision,
            slots_full,
            states,
            float(now),
            len(limits.windows),
            quotas,
            charged,
            QuotaCheck(refused, budget_retry),
            cap=cap,
        )

    def acquire_key_now(self, ask: KeyAsk) -> KeyVerdict | None:
        limits = ask.limits
        if limits.unlimited:
            return KeyVerdict(True)
        if self._leases is None or limits.slotted or limits.all_quotas:
            return None
        return self._leases.acquire_key_now(ask)

    def reserve_now(self, ask: GroupAsk) -> DeploymentVerdict | None:
        if self._leases is None or ask.least_busy or not ask.candidates:
            return None
        return self._leases.reserve_now(ask)

    def reserve_on_renewal(self, ask: GroupAsk) -> asyncio.Future[DeploymentVerdict | None] | None:
        if self._leases is None or ask.least_busy or not ask.candidates:
            return None
        return self._leases.reserve_on_renewal(ask)

    async def reserve(self, ask: GroupAsk) -> DeploymentVerdict:
        if not ask.candidates:
            raise ValueError("reserve needs at least one candidate")
        group = ask.group
        if self._leases is not None and not ask.least_busy:
            leased = await self._leases.reserve(ask)
            if leased is not None:
                return leased
        claimant = ask.claimant or Claimant()
        lookahead = ask.lookahead if ask.claimant is not None else 0.0
        keys = [
            self._fairness(group, f"held:{claimant.key}"),
            self._fairness(group, "waiting"),
        ]
        args = [
            self._now(),
            _num(ask.max_wait),
            ask.slot,
            "1" if ask.least_busy else "0",
            claimant.key,
            str(claimant.tier),
            _num(claimant.weight),
            _num(lookahead),
        ]
        for c in ask.candidates:
            spent = spends(c.windows, ask.cost)
            keys += [
                self._deployment(group, c.id, "health"),
                self._deployment(group, c.id, "inflight"),
                self._deployment(group, c.id, LEARNED),
            ]
            keys += [self._deployment(group, c.id, s.window.name) for s in spent]
            args += [str(len(spent)), _num(c.probe_timeout)]
            for s in spent:
                args += [_num(s.rate.interval), _num(s.capacity), _num(s.amount)]
        reply = await self.runner.run("reserve_deployment", keys, args)
        outcome, index, wait, retry_after, binding, probe, cooling, epoch, seq, at, *rest = reply
        deferred, *waits = rest
        decision = Decision(Admission(outcome), float(wait), float(retry_after), int(binding))
        selection = Selection(
            int(index),
            [],
            decision,
            [float(w) for w in waits],
            probe == "1",
            cooling == "1",
            Deferral(float(retry_after), "") if deferred == "1" else None,
        )
        sent = Sent(int(epoch), int(seq), float(at)) if int(index) >= 0 else None
        return deployment_verdict(ask.candidates, selection, sent)

    async def settle(self, settlement: Settlement) -> HealthChange:
        if isinstance(settlement, KeySettlement):
            await self._settle_key(settlement)
            return NO_CHANGE
        s = settlement
        if self._leases is not None:
            left = self._leases.settle_deployment(s)
            if left is None:
                return NO_CHANGE
            s = left
        keys, args, lowered = self._deployment_settlement(s)
        # A cooldown must start at once; other settlements ride along with the next call.
        urgent = s.outcome.kind == "failure" or bool(lowered) or s.private.hold > 0.0
        cooled, recovered, left, epoch = await self.runner.run(
            "settle_deployment", keys, args, urgent=urgent
        )
        return HealthChange(cooled == "1", recovered == "1", float(left), int(epoch))

    def _deployment_settlement(
        self, s: DeploymentSettlement
    ) -> tuple[list[str], list[str], list[Floor]]:
        """settle_deployment's keys and arguments for ``s``, and the floors it lowers
        (an upstream running low: its settlement goes at once)."""
        d = s.deployment
        corrected = corrections(d.windows, s.cost)
        lowered = floors(d, s.remaining, s.rule.max_hold)
        pacing = pacing_windows(d)
        keys = [
            self._deployment(s.group, d.id, "health"),
            self._deployment(s.group, d.id, "inflight"),
            self._deployment(s.group, d.id, LEARNED),
            *(self._deployment(s.group, d.id, c.window.name) for c in corrected),
            *(self._deployment(s.group, d.id, f.window.name) for f in lowered),
            *(self._deployment(s.group, d.id, w.name) for w in pacing),
        ]
        args = [
            self._now(),
            s.slot,
            s.outcome.kind,
            "" if s.outcome.cool_for is None else _num(s.outcome.cool_for),
            "1" if s.outcome.rate_limited else "0",
            str(s.rule.allowed_fails),
            _num(s.rule.window),
            _num(s.rule.time),
            *_evidence_args(evidence(d, s.sent)),
            str(len(corrected)),
            str(len(lowered)),
            _num(s.private.hold),
            _num(s.rule.max_hold),
        ]
        for c in corrected:
            args += [_num(c.rate.interval), _num(c.amount)]
        for f in lowered:
            wait = "" if f.wait is None else _num(f.wait)
            rate = f.window.rate
            args += [_num(rate.interval), _num(rate.capacity), _num(f.available), wait]
        for w in pacing:
            args += [_num(w.rate.interval), _num(w.rate.capacity)]
        return keys, args, lowered

    @property
    def batching(self) -> bool:
        """Whether calls go out in batches now, so ``settle_soon`` needs no task."""
        return self.runner.submit_ready

    def settle_leased(self, settlement: KeySettlement) -> KeySettlement | None:
        """The part of a key's settlement the lease that admitted its request took, at
        once (no storage call): what is left for the storage (None: nothing), to settle
        as any other (its lease no longer holds it)."""
        return settlement if self._leases is None else self._leases.settle_key(settlement)

    def settle_soon(self, settlement: KeySettlement, on_done: Done | None = None) -> bool:
        """``settle`` of a key's settlement with the next batch, without a task (False,
        and nothing sent, when calls are not batched now). ``on_done`` gets None once it
        ran, or its StorageError; without it, a failure is logged."""
        if not self.runner.submit_ready:
            return False
        budgets = self._quota_settlement(settlement)
        if budgets is not None:
            corrected = self.runner.submit("settle_quota", *budgets, urgent=False)
            assert corrected is not None  # submit_ready
            corrected.add_done_callback(partial(_report, _log_failure))
        call = self._key_settlement(settlement)
        if call is None:
            if on_done is not None:
                on_done(None)
            return True
        future = self.runner.submit("settle_key", *call, urgent=False)
        assert future is not None  # submit_ready
        future.add_done_callback(partial(_report, on_done or _log_failure))
        return True

    async def snapshot(
        self, group: str, deployments: Sequence[DeploymentLimits]
    ) -> dict[str, DeploymentState]:
        if not deployments:
            return {}
        keys: list[str] = []
        args = [self._now()]
        for d in deployments:
            keys += [
                self._deployment(group, d.id, "health"),
                self._deployment(group, d.id, LEARNED),
                *(self._deployment(group, d.id, w.name) for w in d.windows),
            ]
            args.append(str(len(d.windows)))
        reply = iter(await self.runner.run("snapshot", keys, args))
        now = float(next(reply))
        states = {}
        for d in deployments:
            cooling = next(reply) == "1"
            cool_until, probe_until, hold_until, learned, learned_at = (
                float(next(reply)) for _ in range(5)
            )
            h = Health(
                cool_until=cool_until,
                cooling=cooling,
                probe_until=probe_until,
                hold_until=hold_until,
                learned=learned,
                learned_at=learned_at,
            )
            learned_state, *buckets = (_state(reply) for _ in range(len(d.windows) + 1))
            states[d.id] = deployment_state(d, h, buckets, learned_state, now)
        return states

    async def key_snapshot(self, limits: KeyLimits) -> KeyState:
        """One owner's windows, slots and budgets (a key's own, or a team's)."""
        if not limits.windows and limits.max_parallel is None and not limits.quotas:
            return KeyState()
        prefix = self._owner_prefix(limits)
        keys = [prefix + "leases", *(prefix + w.name for w in limits.windows)]
        reply = iter(await self.runner.run("key_snapshot", keys, [self._now()]))
        now, held = float(next(reply)), int(next(reply))
        states = [_state(reply) for _ in limits.windows]
        if not limits.quotas:
            return key_state(limits, states, held, now)
        budget_keys = [prefix + q.name for q in limits.quotas]
        budgets = iter(await self.runner.run("quota_snapshot", budget_keys, [self._now()]))
        wall = float(next(budgets))
        spent = [_quota_state(budgets) for _ in limits.quotas]
        return key_state(limits, states, held, now, spent, wall)

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._closing_returns(), CLOSING_RETURNS)
        await self.runner.aclose()

    async def _closing_returns(self) -> None:
        """Give back the open leases, then wait for every give-back still lingering in
        the batch (else it would open a new connection once this one is closed)."""
        if self._leases is not None:
            await self._leases.aclose()
        await self.runner.drain()

    # -- replica heartbeats (used by policy.py) -----------------------------------------

    async def heartbeat(
        self, replica_id: str, alive_for: float, activity: Activity | None = None
    ) -> int:
        """Mark ``replica_id`` alive, with what it is doing (``activity``); return how
        many replicas were seen within ``alive_for`` seconds (this one included)."""
        report = "" if activity is None else orjson.dumps(activity).decode()
        count = await self.runner.run(
            "heartbeat",
            [self._replicas(), self._activity()],
            [replica_id, str(round(alive_for * 1000)), report],
        )
        return int(count)

    async def heartbeat_paced(
        self,
        replica_id: str,
        alive_for: float,
        activity: Activity | None,
        margin: float | None,
    ) -> tuple[int, dict[str, float]]:
        """A ``heartbeat`` that also shares the pacing margin this replica's turns need
        (``margin``, seconds; None: none, a fixed one) and reads every live replica's
        (by id, this one's included): ``catalog/pacing.py``."""
        report = "" if activity is None else orjson.dumps(activity).decode()
        own = "" if margin is None else f"{margin:.6f}"
        reply = await self.runner.run(
            "heartbeat",
            [self._replicas(), self._activity(), self._margins()],
            [replica_id, str(round(alive_for * 1000)), report, own],
        )
        count, rest = int(reply[0]), reply[1:]
        margins = {
            r.decode() if isinstance(r, bytes) else str(r): float(m)
            for r, m in zip(rest[::2], rest[1::2], strict=True)
        }
        return count, margins

    async def activity(self, alive_for: float) -> dict[str, Activity]:
        """What each replica seen within ``alive_for`` seconds last reported, by id."""
        reply = await self.runner.run(
            "activity", [self._replicas(), self._activity()], [str(round(alive_for * 1000))]
        )
        return {
            replica: _activity_from(orjson.loads(report))
            for replica, report in zip(reply[::2], reply[1::2], strict=True)
        }

    async def maxmemory_policy(self) -> tuple[str | None, str]:
        """The Redis's ``maxmemory-policy`` (a cluster's: an evicting one if any primary
        has one; None if ``CONFIG GET`` is refused), and which Redis it is, for logs."""
        policies = await self.runner.config_values("maxmemory-policy")
        if policies is None:
            return None, self.runner.where
        evicting_first = sorted(policies, key=lambda p: not evicting(p))
        return (evicting_first[0] if evicting_first else ""), self.runner.where

    async def leave(self, replica_id: str) -> None:
        """Stop counting ``replica_id`` as alive (a clean shutdown)."""
        await self.runner.call(lambda client: client.zrem(self._replicas(), replica_id))

    # -- plumbing --------------------------------------------------------------------

    async def _settle_key(self, s: KeySettlement) -> None:
        budgets = self._quota_settlement(s)
        if budgets is not None:
            await self.runner.run("settle_quota", *budgets, urgent=False)
        call = self._key_settlement(s)
        if call is not None:
            await self.runner.run("settle_key", *call, urgent=False)

    def _quota_settlement(self, s: KeySettlement) -> tuple[list[str], list[str]] | None:
        """The keys and arguments of ``settle_quota`` for ``s`` (None: nothing to do)."""
        limits = s.limits
        quotas = limits.all_quotas
        if not quotas:
            return None
        keys: list[str] = []
        args = [self._now()]
        units = quota_costs(limits, s.budget_cost)
        for q, key, amount in zip(quotas, self._quota_keys(limits), units, strict=True):
            if amount != 0:
                keys.append(key)
                args += [q.period, _num(s.started), _num(amount)]
        return (keys, args) if keys else None

    def _key_settlement(self, s: KeySettlement) -> tuple[list[str], list[str]] | None:
        """The keys and arguments of ``settle_key`` for ``s`` (None: nothing to do)."""
        if self._leases is not None:
            left = self._leases.settle_key(s)
            if left is None:
                return None
            s = left
        limits = s.limits
        lease = s.slot if limits.slotted else ""
        windows = limits.all_windows
        names = self._windows(limits)
        args = [self._now(), lease]
        keys = self._key_keys(limits)[:2]
        for c, name in zip(spends(windows, s.cost), names, strict=True):
            if c.amount != 0:
                args += [_num(c.rate.interval), _num(c.amount)]
                keys.append(name)
        if not lease and len(keys) == 2:
            return None
        return keys, args

    # Key names are built per request; their prefixes (one per key and team of the
    # config) are made once. A key in a team keeps its windows under the team's hash
    # tag: one script touches one cluster slot (a key changing team starts afresh).
    def _owner_prefix(self, owner: KeyLimits, team: KeyLimits | None = None) -> str:
        """Where an owner's windows and slots live: a team's, or a key's (in its team's
        slot when it has one: ``team``, else ``owner.team``)."""
        team = team or owner.team
        ident = (owner.scope, owner.name, "" if team is None else team.name)
        prefix = self._key_prefixes.get(ident)
        if prefix is None:
            if owner.scope == TEAM:
                prefix = f"{{{self._prefix}:t:{owner.name}}}:"
            elif team is None:
                prefix = f"{{{self._prefix}:k:{owner.name}}}:"
            else:
                prefix = f"{{{self._prefix}:t:{team.name}}}:k:{owner.name}:"
            self._key_prefixes[ident] = prefix
        return prefix

    def _key_keys(self, limits: KeyLimits) -> list[str]:
        """acquire_key's keys: the key's slots, its team's (the key's without a team),
        then every window (``KeyLimits.all_windows``)."""
        own = self._owner_prefix(limits) + "leases"
        team = own if limits.team is None else self._owner_prefix(limits.team) + "leases"
        return [own, team, *self._windows(limits)]

    def _quota_keys(self, limits: KeyLimits) -> list[str]:
        """The key's budgets, then its team's (``KeyLimits.all_quotas``' order)."""
        return [self._owner_prefix(o) + q.name for o in limits.owners for q in o.quotas]

    def _windows(self, limits: KeyLimits) -> list[str]:
        """The buckets of the key's windows, then of its team's."""
        prefix = self._owner_prefix(limits)
        names = [prefix + w.name for w in limits.windows]
        if limits.team is not None:
            prefix = self._owner_prefix(limits.team)
            names += [prefix + w.name for w in limits.team.windows]
        return names

    def _lease_keys(self, group: str, d: DeploymentLimits) -> list[str]:
        """The leases' keys: the deployment's health, learned window, its group's waiting
        keys (fair share), its windows."""
        keys = [self._deployment(group, d.id, kind) for kind in ("health", LEARNED)]
        keys.append(self._fairness(group, "waiting"))
        return keys + [self._deployment(group, d.id, w.name) for w in d.windows]

    def _deployment(self, group: str, deployment_id: str, kind: str) -> str:
        prefix = self._deployment_prefixes.get((group, deployment_id))
        if prefix is None:
            prefix = f"{{{self._prefix}:g:{group}}}:d:{deployment_id}:"
            self._deployment_prefixes[(group, deployment_id)] = prefix
        return prefix + kind

    def _fairness(self, group: str, kind: str) -> str:
        return f"{{{self._prefix}:g:{group}}}:fair:{kind}"

    def _replicas(self) -> str:
        return f"{self._prefix}:replicas"

    def _activity(self) -> str:
        # Hash-tagged with the replicas set's whole name: the same cluster slot.
        return f"{{{self._replicas()}}}:activity"

    def _margins(self) -> str:
        return f"{{{self._replicas()}}}:margins"  # the pacing margins: same slot

    def _now(self) -> str:
        return "" if self._clock is None else _num(self._clock())


class _Settlements:
    """Key settlements of one key merged into one ``settle_key`` call: per window (and
    interval), the sum of its refunds and the sum of its charges."""

    __slots__ = ("call", "count", "index", "keys", "sums")

    def __init__(self, index: int, call: ScriptCall) -> None:
        self.index = index  # the merged call's place in the batch
        self.call = call  # the first settlement, sent as it is when it stays alone
        self.count = 0
        self.keys: set[str] = set()
        self.sums: dict[tuple[str, str], list[float]] = {}  # [refunds, charges]

    def add(self, keys: list[str], args: list[str]) -> None:
        self.count += 1
        self.keys.update(keys)
        for i in range(2, len(keys)):
            sums = self.sums.setdefault((keys[i], args[2 * i - 2]), [0.0, 0.0])
            units = float(args[2 * i - 1])
            sums[1 if units > 0.0 else 0] += units

    def merged(self) -> ScriptCall:
        name, keys, args = self.call
        if self.count == 1:
            return self.call
        out_keys, out_args = [keys[0], keys[1]], [args[0], ""]
        for (window, interval), (refunds, charges) in self.sums.items():
            # Refunds first: the debt each bucket is left with is the highest any order
            # of the settlements would leave (a refund may be clipped at zero, a charge
            # is not), the same as applying them one by one in that order.
            for units in (refunds, charges):
                if units != 0.0:
                    out_keys.append(window)
                    out_args += [interval, _num(units)]
        return name, out_keys, out_args


def merge_key_settlements(calls: list[ScriptCall]) -> tuple[list[ScriptCall], list[int]] | None:
    """A batch (batch.py ``Merge``) with the key settlements of one key that follow each
    other (no other call of the batch touches the key between them: its check, its
    snapshot, a settlement releasing one of its slots) as one ``settle_key`` call, in the
    place of the first. ``bucket.adjust`` clips a debt at zero, so corrections do not
    commute: each window is corrected by the sum of its refunds, then by the sum of its
    charges, the most conservative order, which leaves the debt that applying them one by
    one in that order, at one time, would (tests/limiter/test_limiter_merge.py).
    Settlements that release a parallel slot (a lease) go alone; settlements with
    different explicit clocks (tests) too. None when nothing merges."""
    if sum(1 for call in calls if _merges(call)) < 2:
        return None
    batch = _Merging()
    for call in calls:
        if _merges(call):
            batch.settle(call)
        else:
            batch.other(call)
    if len(batch.out) == len(calls):
        return None
    return batch.done()


def _merges(call: ScriptCall) -> bool:
    """Whether ``call`` is a key settlement that may merge: one releasing no slot."""
    name, _, args = call
    return name == "settle_key" and not args[1]


class _Merging:
    """``merge_key_settlements``'s pass over a batch: the calls out, the place of each
    call's answer among them, the merges made, and the merge each key may still join."""

    __slots__ = ("merging", "open", "out", "owners")

    def __init__(self) -> None:
        self.out: list[ScriptCall] = []
        self.owners: list[int] = []
        self.merging: list[_Settlements] = []
        self.open: dict[str, _Settlements] = {}  # every key of a merge that may still grow

    def settle(self, call: ScriptCall) -> None:
        """A settlement joins its key's open merge if it may, else starts one in its
        place."""
        _, keys, args = call
        m = self._joinable(keys, args[0])
        if m is None:
            m = _Settlements(len(self.out), call)
            self.merging.append(m)
            self.out.append(call)
        m.add(keys, args)
        for key in keys:
            self.open[key] = m
        self.owners.append(m.index)

    def other(self, call: ScriptCall) -> None:
        """Any other call goes as it is, closing the merges of the keys it touches."""
        for key in call[1]:
            if (m := self.open.get(key)) is not None:
                self._close(m)
        self.owners.append(len(self.out))
        self.out.append(call)

    def done(self) -> tuple[list[ScriptCall], list[int]]:
        """The calls with each merge in its place, and where each call's answer is."""
        for m in self.merging:
            self.out[m.index] = m.merged()
        return self.out, self.owners

    def _joinable(self, keys: list[str], now: str) -> _Settlements | None:
        """The open merge of the settlement's key if it may join it (the same clock, no
        other merge touching its windows); else None, that merge and those closed."""
        m = self.open.get(keys[0])
        # A team's windows are also its other keys': a merge that another one
        # touched meanwhile is not joined (corrections do not commute).
        others = self._touching(keys, m)
        if m is not None and m.call[2][0] == now and not others:
            return m
        for o in [*others, *([m] if m is not None else [])]:
            self._close(o)
        return None

    def _touching(self, keys: list[str], m: _Settlements | None) -> set[_Settlements]:
        """The open merges other than ``m`` that one of ``keys`` belongs to."""
        return {o for key in keys if (o := self.open.get(key)) is not None and o is not m}

    def _close(self, m: _Settlements) -> None:
        """A merge no settlement may join any more: its keys are no longer open."""
        for key in m.keys:
            if self.open.get(key) is m:
                del self.open[key]


def _slots_arg(owner: KeyLimits) -> str:
    return "" if owner.max_parallel is None else str(owner.max_parallel)


def _state(reply: Any) -> BucketState:
    """The next debt and time of a script's reply as a bucket state."""
    return BucketState(float(next(reply)), float(next(reply)))


def _quota_state(reply: Any) -> QuotaState:
    """The next period index and spent of a script's reply as a budget's state."""
    return QuotaState(int(float(next(reply))), float(next(reply)))


Done = Callable[[BaseException | None], None]


def _report(on_done: Done, future: asyncio.Future[Any]) -> None:
    if future.cancelled():
        on_done(asyncio.CancelledError())
    else:
        on_done(future.exception())


def _log_failure(error: BaseException | None) -> None:
    if error is not None:
        log.warning("a key settlement failed: %s", error)


def _activity_from(data: dict[str, Any]) -> Activity:
    """An Activity read back (fields unknown to this version are ignored)."""
    return Activity(**{k: v for k, v in data.items() if k in Activity.__dataclass_fields__})


def _budget_args(limits: KeyLimits, ask: KeyAsk) -> list[str]:
    """``acquire_key``'s arguments of its budgets: per budget its period, limit, cost
    (``clamp``: its base), what a token of output cap adds and whether it clamps; then
    the clamp's most and least caps (0 0: none)."""
    args: list[str] = []
    clamp = ask.clamp
    if clamp is None:
        for q, cost in zip(limits.all_quotas, quota_costs(limits, ask.budget_cost), strict=True):
            args += [q.period, _num(q.limit), _num(cost), "0", "0"]
        return [*args, "0", "0"]
    for q in limits.all_quotas:
        base, per = cost_of(q, clamp.base), cost_of(q, clamp.per)
        args += [q.period, _num(q.limit), _num(base), _num(per), "1" if q.clamp else "0"]
    return [*args, str(clamp.most), str(clamp.least)]


def _evidence_args(ev: Evidence | None) -> tuple[str, str, str, str]:
    """What a settled turn was sent with, as settle_deployment reads it ('': nothing)."""
    if ev is None:
        return ("", "", "", "")
    return (str(ev.epoch), str(ev.sequence), _num(ev.sent_at), _num(ev.pace))


def _num(x: float) -> str:
    """A float as text that Lua's tonumber reads back as the very same double."""
    text = _NUMBERS.get(x)
    if text is None or x == 0.0:  # 0.0 and -0.0 are one key, not one text
        if len(_NUMBERS) >= _NUMBERS_KEPT:
            _NUMBERS.clear()
        text = _NUMBERS[x] = repr(float(x))
    return text


# A request's numbers (intervals, capacities, costs, timeouts) are nearly all the
# config's or repeat from request to request: their text is kept, not rebuilt.
_NUMBERS: dict[float, str] = {}
_NUMBERS_KEPT = 4096


__all__ = ["RedisLimiter", "merge_key_settlements"]
