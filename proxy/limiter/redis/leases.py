"""The Redis backend's leases (allowance.py): its requests admitted without a round trip
while their windows are far from full.

Per client key and per deployment (an *owner*) this replica holds at most one open
lease. A request it covers is admitted at once: a key's windows (a key with
``max_parallel`` never leases: its slots are counted one by one), or a turn on the first
candidate of a reservation when that deployment holds the lease (never under
``least_busy``, which counts requests in flight across replicas, nor for a deployment
without limits, which only 429s can teach). A request it does not cover renews it: what
is left goes back and a new one is taken, both in the round trip the request would have
made anyway (a key's refused lease answers the request like ``acquire_key``). Requests
arriving while a renewal is on its way wait for it. Near a limit leases are refused and
requests ask per request again (for ``REFUSED_FOR``).

What the requests admitted from a lease settle (a token estimate corrected, a turn given
back) stays in the lease while it is open; a failure, a 429 or an upstream running low
closes a deployment's lease, so its next request asks the shared health. An idle lease
is given back when its use ends (its unused units; the refill its hold reserved stays
until the hold ends, allowance.py).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, NamedTuple, TypeVar

from proxy.limiter.base import (
    SHARED,
    DeploymentLimits,
    DeploymentSettlement,
    DeploymentVerdict,
    GroupAsk,
    KeyAsk,
    KeyLimits,
    KeySettlement,
    KeyVerdict,
    Private,
    Sent,
    Window,
)
from proxy.limiter.core import turns
from proxy.limiter.core.allowance import (
    FIRST_REQUESTS,
    HOLD,
    MIN_REQUESTS,
    REFUSED_FOR,
    USE_SHARE,
    Allowance,
    lease_size,
)
from proxy.limiter.core.bucket import Admission, BucketState, Decision
from proxy.limiter.core.verdicts import (
    Spend,
    admitted_verdict,
    amounts,
    excess_cost,
    key_spends,
    key_verdict,
    spends,
)
from proxy.limiter.redis.runner import ScriptRunner

Num = Callable[[float], str]

RENEWALS = 3  # a request asks for a new lease at most this many times, then per request
# A key is leased only while its requests here come often enough that a lease serves
# this many of them in its use (allowance.HOLD * USE_SHARE): a lease that serves one
# request costs two round trips (lease, give back) where asking costs one. With many
# keys each of which sends a few requests a second, no lease pays (docs/performance.md).
WARM_USES = 4
BUDGET_USE = HOLD * USE_SHARE  # how long a budget lease is used (allowance.py)
TURN_USE = turns.SPAN * turns.USE_SHARE  # how long a turn lease hands out turns (turns.py)
T = TypeVar("T")


class _TurnWaiter(NamedTuple):
    d: DeploymentLimits
    costs: list[float]
    max_wait: float
    served: asyncio.Future[DeploymentVerdict | None]


class Owner:
    """One key's or deployment's lease state in this replica."""

    __slots__ = (
        "admitted",
        "allowance",
        "arrival",
        "asked_turns_at",
        "gap",
        "keys",
        "names",
        "paced",
        "private",
        "refused_until",
        "renewing",
        "size",
        "timer",
        "turn_size",
        "turn_waiters",
        "turns",
        "windows",
    )

    def __init__(self, windows: tuple[Window, ...], keys: list[str]) -> None:
        self.windows = windows
        self.keys = keys  # the lease script's Redis keys, ending with the windows'
        self.names = keys[len(keys) - len(windows) :]  # the windows' Redis keys
        self.allowance: Allowance | None = None
        self.arrival = -math.inf  # the owner's last request (local time)
        self.gap = math.inf  # the time between its requests no lease covered, smoothed
        self.turns: turns.TurnLease | None = None  # a paced deployment's (turns.py)
        self.admitted: set[str] = set()  # the open lease's requests, by lease id (keys)
        self.renewing: asyncio.Future[None] | None = None
        # Requests waiting for the turn lease being renewed: served when it is read.
        self.turn_waiters: list[_TurnWaiter] = []
        self.refused_until = 0.0
        self.size = FIRST_REQUESTS  # the next budget lease's, in requests
        self.turn_size = turns.FIRST_TURNS  # the next turn lease's, in turns
        self.asked_turns_at = 0.0  # when the open turn lease was asked for (its cycle's start)
        self.timer: asyncio.TimerHandle | None = None  # gives the open lease back when idle
        self.private = SHARED  # what the open lease's turns carry back (its serial)
        # The costs last found to go by turns (no budget lease, worth a turn lease): a
        # paced deployment's requests cost the same (its windows count requests), so the
        # question is answered once, not per request.
        self.paced: list[float] | None = None

    def warm(self, now: float, use: float, uses: int) -> bool:
        """Whether a lease used for ``use`` seconds from now would serve ``uses``
        requests or more, judged by the smoothed gap between this owner's requests so far
        (this one counted; those a lease admitted are ``arrived``)."""
        gap, self.arrival = now - self.arrival, now
        self.gap = gap if math.isinf(self.gap) else (self.gap + gap) / 2.0
        return uses == 0 or self.gap * uses <= use

    def arrived(self, now: float) -> None:
        """A request its open lease admitted: the gap to the next counts from it."""
        self.arrival = now

    def counts(self, windows: tuple[Window, ...]) -> bool:
        """Whether it leases these windows (limits reloaded unchanged are equal, not the
        same objects)."""
        return self.windows is windows or self.windows == windows


class Leases:
    """``key_keys`` and ``deployment_keys`` name an owner's Redis keys (the lease
    scripts'), asked only when its lease state is made."""

    def __init__(
        self,
        runner: ScriptRunner,
        num: Num,
        now_arg: Callable[[], str],
        key_keys: Callable[[KeyLimits], list[str]],
        deployment_keys: Callable[[str, DeploymentLimits], list[str]],
        *,
        warm_uses: int = WARM_USES,
    ) -> None:
        """``warm_uses`` 0: lease from an owner's first request (tests of the leases)."""
        self.runner = runner
        self._warm_uses = warm_uses
        self._num = num
        self._now_arg = now_arg
        self._key_keys = key_keys
        self._deployment_keys = deployment_keys
        self._owners: dict[Any, Owner] = {}
        self._serial = 0
        self._returning: set[asyncio.Task[Any]] = set()
        self._origins = turns.Origins()  # where turn leases' times fall on this clock

    def _warm(self, owner: Owner, use: float) -> bool:
        """Whether a lease of ``owner`` would pay now (``Owner.warm``)."""
        return owner.warm(time.monotonic(), use, self._warm_uses)

    # -- client keys ---------------------------------------------------------------------

    async def acquire_key(self, ask: KeyAsk) -> KeyVerdict | None:
        """The key's verdict from its lease, or from the renewal's round trip; None: ask
        ``acquire_key`` per request."""
        limits = ask.limits
        owner = self._key_owner(limits)
        if owner.allowance is None and not self._warm(owner, BUDGET_USE):
            return None
        spent = key_spends(limits, ask.cost)
        own = len(limits.windows)
        got = await self._admit(owner, spent, partial(self._renew_key, owner, spent, own))
        if isinstance(got, tuple):
            a, now = got
            return _admitted(owner, a, ask.slot, now, own)
        return got

    def acquire_key_now(self, ask: KeyAsk) -> KeyVerdict | None:
        """The key's verdict from its open lease (None: none covers the request now)."""
        limits = ask.limits
        owner = self._key_owner(limits)
        a = owner.allowance
        if a is None:
            return None
        costs = amounts(owner.windows, ask.cost)
        now = time.monotonic()
        if not a.covers(costs, now):
            return None
        a.take(costs, now)
        owner.arrived(now)
        return _admitted(owner, a, ask.slot, now, len(limits.windows))

    async def _renew_key(
        self, owner: Owner, spent: list[Spend], own: int, now: float
    ) -> Allowance | KeyVerdict | None:
        """A new lease of the key's windows; refused, the key checked for this request
        alone in the same call (its verdict)."""
        size = self._size(owner, spent, now)
        if size is None:
            return None
        requests, amounts = size
        args = [self._now_arg()]
        for s, amount in zip(spent, amounts, strict=True):
            rate = s.rate
            capacity = self._num(rate.capacity)
            args += [self._num(rate.interval), self._num(s.capacity), capacity]
            args += [self._num(s.amount), self._num(amount)]
        reply = await self._renew(owner, "lease_key", owner.keys, args)
        received = time.monotonic()
        if reply[0] == "leased":
            at, hold, *debts = (float(x) for x in reply[1:])
            rates = [s.rate for s in spent]
            self._serial += 1
            a = Allowance(self._serial, rates, amounts, debts, at, hold, now, received, requests)
            return self._open(owner, a)
        owner.refused_until = received + REFUSED_FOR
        outcome, binding, wait, retry_after, at, *flat = reply[1:]
        decision = Decision(Admission(outcome), float(wait), float(retry_after), int(binding))
        states = [
            BucketState(float(d), float(t)) for d, t in zip(flat[::2], flat[1::2], strict=True)
        ]
        return key_verdict(spent, decision, "", states, float(at), own)

    async def _admit(
        self,
        owner: Owner,
        spent: list[Spend],
        renew: Callable[[float], Awaitable[Allowance | T | None]],
    ) -> tuple[Allowance, float] | T | None:
        """The request admitted from the owner's lease (and the local time), renewed if
        need be (once more if others took what a renewal brought); else what ``renew``
        answered instead of a lease (None: ask per request)."""
        costs = [s.amount for s in spent]
        # One look more than renewals: a request takes from the lease it renewed last.
        for renewals in range(RENEWALS + 1):
            now = time.monotonic()
            a = owner.allowance
            if a is not None and a.covers(costs, now):
                a.take(costs, now)
                owner.arrived(now)
                return a, now
            if renewals == RENEWALS:
                break
            if owner.renewing is not None:  # another request is renewing it: wait for it
                await asyncio.shield(owner.renewing)
                continue
            if now < owner.refused_until:
                return None
            got = await renew(now)
            if not isinstance(got, Allowance):
                return got
        return None

    def settle_key(self, s: KeySettlement) -> KeySettlement | None:
        """What of ``s`` is left for the shared buckets (None: nothing) once the lease
        that admitted its request, if still open, took its part."""
        owner = self._owners.get(_key_ident(s.limits))
        if owner is None or s.slot not in owner.admitted:
            return s
        owner.admitted.discard(s.slot)
        a = owner.allowance
        if a is None or a.closed:
            return s
        if not s.cost:
            return None
        excess = a.correct([w.cost(s.cost) for w in owner.windows], time.monotonic())
        if excess is None:
            return s
        extra = excess_cost(owner.windows, excess)
        return replace(s, cost=extra) if extra else None

    # -- deployments ---------------------------------------------------------------------

    async def reserve(self, ask: GroupAsk) -> DeploymentVerdict | None:
        """A turn on the ask's first candidate from its lease (renewed if need be): now
        from a budget lease, within ``max_wait`` from a turn lease when its windows pace
        (turns.py); None: reserve per request (the lease was refused, or the deployment
        is not healthy, or states no limit: then 429s are all there is to learn its rate
        from, and every replica must hear of the first at once)."""
        d = ask.candidates[0]
        if not d.windows:
            return None
        owner = self._deployment_owner(ask.group, d)
        spent = spends(d.windows, ask.cost)
        costs = [s.amount for s in spent]
        leased = _from_open(owner, d, costs, ask.max_wait)  # the usual request
        if leased is not None:
            return leased
        if costs == owner.paced:
            if not self._warm(owner, TURN_USE):
                return None
            return await self._reserve_turn(owner, d, spent, ask.max_wait)
        # Whether the deployment can be leased at all is asked only without a lease.
        rates = [s.window.rate for s in spent]
        if lease_size(MIN_REQUESTS, costs, rates, costs) is None:
            if not turns.worth(rates, [s.capacity for s in spent], costs):
                return None
            owner.paced = costs
            if not self._warm(owner, TURN_USE):
                return None
            return await self._reserve_turn(owner, d, spent, ask.max_wait)
        if not self._warm(owner, BUDGET_USE):
            return None
        got = await self._admit(owner, spent, partial(self._renew_deployment, owner, spent))
        if got is None:
            return None
        return _leased(owner, d, *got)

    def reserve_now(self, ask: GroupAsk) -> DeploymentVerdict | None:
        """``reserve``'s turn when the open lease gives it at once: the next request of
        a budget lease, or a turn lease's next turn within ``max_wait`` (None: await
        ``reserve``, which renews or asks per request)."""
        d = ask.candidates[0]
        if not d.windows:
            return None
        owner = self._deployment_owner(ask.group, d)
        costs = amounts(d.windows, ask.cost)
        return _from_open(owner, d, costs, ask.max_wait)

    def reserve_on_renewal(self, ask: GroupAsk) -> asyncio.Future[DeploymentVerdict | None] | None:
        """A turn on the ask's first candidate from the turn lease being renewed, served
        with the renewal's other waiters when it is read (``_serve_waiters``), as
        ``reserve`` would wait for it, without a coroutine of its own; None: no turn lease
        of its costs is being renewed (await ``reserve``)."""
        d = ask.candidates[0]
        owner = self._owners.get(("d", ask.group, d.id))
        if owner is None or owner.renewing is None or not owner.counts(d.windows):
            return None
        costs = amounts(d.windows, ask.cost)
        if costs != owner.paced:
            return None
        return _wait_for_renewal(owner, d, costs, ask.max_wait)

    async def _renew_deployment(
        self, owner: Owner, spent: list[Spend], now: float
    ) -> Allowance | None:
        """A new lease of the deployment's windows (None: refused)."""
        size = self._size(owner, spent, now)
        if size is None:
            return None
        requests, amounts = size
        args = [self._now_arg(), str(requests)]
        for s, amount in zip(spent, amounts, strict=True):
            args += [self._num(s.rate.interval), self._num(s.rate.capacity), self._num(amount)]
        keys = [*owner.keys[:2], *owner.names]  # health, learned window, windows
        reply = await self._renew(owner, "lease_deployment", keys, args)
        received = time.monotonic()
        if reply[0] != "1":
            owner.refused_until = received + REFUSED_FOR
            return None
        at, epoch, sequence, hold, *debts = reply[1:]
        self._serial += 1
        a = Allowance(
            self._serial, [s.rate for s in spent], amounts, [float(x) for x in debts],
            float(at), float(hold), now, received, requests, int(epoch), int(sequence),
            track=False,
        )  # fmt: skip
        return self._open(owner, a)

    def settle_deployment(self, s: DeploymentSettlement) -> DeploymentSettlement | None:
        """What of ``s`` is left for the shared state (None: nothing) once the lease that
        granted its turn, if still open, took its part. An answer that tells something
        of the deployment (a failure, a 429, a budget running low) closes the lease."""
        sent = s.sent
        if sent is None or not sent.private.lease:
            return s
        owner = self._owners.get(("d", s.group, s.deployment.id))
        if owner is None:
            return s
        a = _granting_lease(owner, sent.private.lease)
        if a is None:
            return s
        excess = _lease_excess(a, [w.cost(s.cost) for w in owner.windows])
        # What the lease could not hold goes to the shared buckets.
        extra = excess_cost(owner.windows, excess)
        if _tells(s):
            self._close_lease(owner, a)
        elif not extra:
            return None
        return replace(s, cost=extra)

    def _close_lease(self, owner: Owner, a: Allowance | turns.TurnLease) -> None:
        """Give back a lease of either kind, so that the deployment's next request asks
        the shared health."""
        if isinstance(a, turns.TurnLease):
            self._return_turns(owner, a)
        else:
            self._give_back(owner, a)

    # -- turn leases (turns.py) ----------------------------------------------------------

    async def _reserve_turn(
        self, owner: Owner, d: DeploymentLimits, spent: list[Spend], max_wait: float
    ) -> DeploymentVerdict | None:
        """A turn on a paced deployment from its turn lease, renewed if need be (None:
        reserve per request)."""
        costs = [s.amount for s in spent]
        for _ in range(RENEWALS):
            now = time.monotonic()
            t = owner.turns
            if t is not None:
                wait = t.turn(costs, now - t.origin, max_wait)
                if wait is not None:
                    return _leased_turn(owner, d, t, now, wait)
            renewing = owner.renewing is not None  # else this request renews it
            if not renewing and now < owner.refused_until:
                return None
            served = _wait_for_renewal(owner, d, costs, max_wait)
            if not renewing:
                try:
                    await self._renew_turns(owner, spent, now)
                finally:
                    self._serve_waiters(owner)  # this request first: it came first
            verdict = await served
            if verdict is not None:
                return verdict
            if not renewing and owner.turns is None:
                return None  # refused, or near the limit: per request
        return None

    async def _renew_turns(
        self, owner: Owner, spent: list[Spend], now: float
    ) -> turns.TurnLease | None:
        """Give back the old turn lease and take the next turns, in one round trip
        (None: refused, or the last lease says the deployment is near its limit)."""
        old = owner.turns
        if old is not None:
            size = old.next_turns(owner.turn_size, now - owner.asked_turns_at)
            if size is None:
                self._return_turns(owner, old)
                owner.turns = None
                owner.turn_size = turns.FIRST_TURNS
                owner.refused_until = now + turns.REFUSED_FOR
                return None
            owner.turn_size = size
            self._return_turns(owner, old)
        owner.turns = None
        owner.asked_turns_at = now
        args = [self._now_arg(), str(owner.turn_size)]
        for s in spent:
            rate = s.rate
            long = 0.0 if rate.period <= turns.LONG else rate.capacity
            args += [self._num(rate.interval), self._num(s.capacity), self._num(s.amount)]
            args.append(self._num(long))
        keys = [owner.keys[0], owner.keys[2], *owner.names]  # health, waiting, windows
        renewing = owner.renewing = asyncio.get_running_loop().create_future()
        try:
            reply = await self.runner.run("lease_turns", keys, args)
            return self._turns_granted(owner, spent, reply, now)
        finally:
            owner.renewing = None
            renewing.set_result(None)

    def _turns_granted(
        self, owner: Owner, spent: list[Spend], reply: Any, now: float
    ) -> turns.TurnLease | None:
        """The turn lease of ``lease_turns``' ``reply`` to a request sent at ``now``, now
        the owner's (None: refused, or not trusted and given back)."""
        received = time.monotonic()
        if reply[0] != "1":
            behind = float(reply[1]) if len(reply) > 1 else None
            owner.refused_until = received + turns.refused_for(behind)
            owner.turn_size = turns.FIRST_TURNS
            return None
        at, epoch, sequence, taken, first, last, *debts = reply[1:]
        clock = owner.keys[2]  # the group's: one storage clock (a cluster's slot) per group
        trusted = self._origins.trusts(clock, received - now)
        origin = self._origins.origin(clock, float(at), received)
        rates = [s.rate for s in spent]
        spacing = turns.spacing(rates, [s.amount for s in spent])
        self._serial += 1
        t = turns.TurnLease(
            self._serial, rates, [float(x) for x in debts[::2]],
            [float(x) for x in debts[1::2]], float(at), int(taken), float(last), int(epoch),
            int(sequence), origin, spacing, received - origin,
        )  # fmt: skip
        if not trusted:  # maybe read late, with nothing to tell: give it back, ask per request
            self._return_turns(owner, t)
            return None
        owner.turns = t
        owner.private = Private(lease=t.serial)
        # Idle at the end of its use (counted from its first turn): give back what it did
        # not hand out.
        if owner.timer is not None:
            owner.timer.cancel()
        delay = max(float(first) + turns.USE_SHARE * turns.SPAN - t.read, 0.0)
        owner.timer = asyncio.get_running_loop().call_later(delay, self._expire_turns, owner, t)
        return t

    def _serve_waiters(self, owner: Owner) -> None:
        """Hand the requests that waited for a renewal their turns from it, in the order
        they came, the moment it is read: a grant read late has little of its span left,
        and each request resumes later still. (A request sent after its turn is later,
        never sooner, than the pacing allows.) None for each it cannot serve."""
        waiters, owner.turn_waiters = owner.turn_waiters, []
        t, now = owner.turns, time.monotonic()
        for w in waiters:
            if w.served.done():  # its request is gone
                continue
            wait = None if t is None else t.turn(w.costs, now - t.origin, w.max_wait)
            verdict = None if t is None or wait is None else _leased_turn(owner, w.d, t, now, wait)
            w.served.set_result(verdict)

    def _expire_turns(self, owner: Owner, t: turns.TurnLease) -> None:
        if owner.turns is t and not t.closed:
            now = time.monotonic()
            size = t.next_turns(owner.turn_size, now - owner.asked_turns_at)
            if size is None:
                size = turns.FIRST_TURNS
                owner.refused_until = now + turns.REFUSED_FOR
            owner.turn_size = size
            self._return_turns(owner, t)
            owner.turns = None

    def _return_turns(
        self, owner: Owner, t: turns.TurnLease, *, urgent: bool = False
    ) -> asyncio.Future[Any] | None:
        """Give back the turns ``t`` did not hand out (turns.returned); None when its
        buckets have drained (its span is past: nothing to give back, nothing sent)."""
        t.closed = True
        # On this clock the lease's time 0 is never before the grant: its time read here
        # is never ahead of the storage's, so a lease seen drained is.
        if t.drained(time.monotonic() - t.origin):
            return None
        args = [self._num(t.at)]
        for rate, end, local in zip(t.rates, t.ends, t.stored(), strict=True):
            args += [self._num(rate.interval), self._num(end.debt)]
            args += [self._num(local.debt), self._num(local.at)]
        return self._send("return_turns", owner.names, args, urgent)

    # -- both ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Give back every open lease (a clean shutdown), and wait for it."""
        returns = []
        for owner in self._owners.values():
            if owner.timer is not None:
                owner.timer.cancel()
            a = owner.allowance
            if a is not None and not a.closed:
                returns.append(self._give_back(owner, a, urgent=True))
            t = owner.turns
            if t is not None and not t.closed:
                returned = self._return_turns(owner, t, urgent=True)
                if returned is not None:
                    returns.append(returned)
        await asyncio.gather(*self._returning, *returns, return_exceptions=True)

    # The lookups of a key's and a deployment's lease state: the Redis keys are named
    # only when a state is made (no closure per request to name them).
    def _key_owner(self, limits: KeyLimits) -> Owner:
        ident = _key_ident(limits)
        owner = self._owners.get(ident)
        if owner is not None and owner.counts(limits.all_windows):
            return owner
        return self._new_owner(ident, limits.all_windows, self._key_keys(limits), owner)

    def _deployment_owner(self, group: str, d: DeploymentLimits) -> Owner:
        ident = ("d", group, d.id)
        owner = self._owners.get(ident)
        if owner is not None and owner.counts(d.windows):
            return owner
        return self._new_owner(ident, d.windows, self._deployment_keys(group, d), owner)

    def _new_owner(
        self, ident: Any, windows: tuple[Window, ...], keys: list[str], old: Owner | None
    ) -> Owner:
        """A fresh lease state for ``ident``: new, or replacing ``old``, whose limits
        changed (a reload), once its open leases are given back."""
        if old is not None and old.allowance is not None:
            self._give_back(old, old.allowance)
        if old is not None and old.turns is not None:
            self._return_turns(old, old.turns)
        owner = self._owners[ident] = Owner(windows, keys)
        return owner

    def _size(
        self, owner: Owner, spent: Sequence[Spend], now: float
    ) -> tuple[int, list[float]] | None:
        old = owner.allowance
        if old is not None:
            owner.size = old.next_size(owner.size, now)
        costs = [s.amount for s in spent]
        size = lease_size(owner.size, costs, [s.rate for s in spent], costs)
        if size is None:
            owner.refused_until = now + REFUSED_FOR
        return size

    async def _renew(self, owner: Owner, script: str, keys: list[str], args: list[str]) -> Any:
        """Give back the old lease and ask for a new one, in one round trip."""
        old = owner.allowance
        if old is not None and not old.closed:
            self._give_back(owner, old)
        owner.allowance = None
        renewing = owner.renewing = asyncio.get_running_loop().create_future()
        try:
            return await self.runner.run(script, keys, args)
        finally:
            owner.renewing = None
            renewing.set_result(None)
            self._serve_waiters(owner)  # turn waiters, had any come: an open turn lease or None

    def _open(self, owner: Owner, a: Allowance) -> Allowance:
        """``a`` is the owner's lease from now on."""
        owner.allowance = a
        owner.admitted = set()
        owner.private = Private(lease=a.serial)
        # Idle at the end of its use: give it back while it still can be.
        delay = max(a.until - time.monotonic(), 0.0)
        if owner.timer is not None:
            owner.timer.cancel()
        owner.timer = asyncio.get_running_loop().call_later(delay, self._expire, owner, a)
        return a

    def _expire(self, owner: Owner, a: Allowance) -> None:
        if owner.allowance is a and not a.closed:
            owner.size = a.next_size(owner.size, time.monotonic())
            self._give_back(owner, a)
            owner.allowance = None

    def _give_back(
        self, owner: Owner, a: Allowance, *, urgent: bool = False
    ) -> asyncio.Future[Any]:
        """Return what ``a`` did not use (before any later call; nobody need await it)."""
        a.closed = True
        args = [self._now_arg(), self._num(a.at), self._num(a.hold)]
        for rate, amount, used, mark in zip(a.rates, a.amounts, a.used, a.marks, strict=True):
            args += [self._num(rate.interval), self._num(amount), self._num(used), self._num(mark)]
        return self._send("return_lease", owner.names, args, urgent)

    def _send(
        self, script: str, keys: list[str], args: list[str], urgent: bool
    ) -> asyncio.Future[Any]:
        """Run a give-back (before any later call; nobody need await it)."""
        future = self.runner.submit(script, keys, args, urgent=urgent)
        if future is None:
            task = asyncio.ensure_future(self.runner.run(script, keys, args))
            self._returning.add(task)
            task.add_done_callback(self._returned)
            return task
        future.add_done_callback(_ignore)
        return future

    def _returned(self, task: asyncio.Task[Any]) -> None:
        self._returning.discard(task)
        if not task.cancelled():
            task.exception()  # a lost return only wastes the lease's units: nothing to do


def _admitted(owner: Owner, a: Allowance, lease: str, now: float, own: int) -> KeyVerdict:
    """The verdict of a key's request ``a`` took (``lease`` names it for its settlement):
    its headers read the lease's own buckets (the key's ``own`` first windows)."""
    owner.admitted.add(lease)
    assert a.states is not None  # a key's lease tracks its buckets
    return admitted_verdict(owner.windows, a.states, now, own)


def _from_open(
    owner: Owner, d: DeploymentLimits, costs: list[float], max_wait: float
) -> DeploymentVerdict | None:
    """A request costing ``costs`` on ``d`` taken from its open lease now: the next of a
    budget lease, or a turn lease's next turn within ``max_wait`` (None: neither can)."""
    now = time.monotonic()
    a = owner.allowance
    if a is not None and a.covers(costs, now):
        a.take(costs, now)
        owner.arrived(now)
        return _leased(owner, d, a, now)
    t = owner.turns
    if t is not None and costs == owner.paced:
        wait = t.turn(costs, now - t.origin, max_wait)
        if wait is not None:
            owner.arrived(now)
            return _leased_turn(owner, d, t, now, wait)
    return None


def _granting_lease(owner: Owner, lease: int) -> Allowance | turns.TurnLease | None:
    """The owner's lease of serial ``lease`` if still open: only the lease that granted a
    turn holds its settlement (None: renewed or closed since, the shared state settles)."""
    a: Allowance | turns.TurnLease | None = owner.allowance
    if a is None or a.serial != lease:
        a = owner.turns
    if a is None or a.serial != lease or a.closed:
        return None
    return a


def _lease_excess(a: Allowance | turns.TurnLease, units: list[float]) -> list[float]:
    """What open lease ``a`` cannot hold of a correction by ``units`` per window, now on
    its clock: a turn lease counts from its origin, a budget lease in local time."""
    if isinstance(a, turns.TurnLease):
        excess = a.correct(units, time.monotonic() - a.origin)
    else:
        excess = a.correct(units, time.monotonic())
    assert excess is not None  # open
    return excess


def _tells(s: DeploymentSettlement) -> bool:
    """Whether the answer tells something of the deployment (a failure, a 429, a budget
    running low): then the lease is closed, and the next request asks the shared health."""
    return s.outcome.kind == "failure" or s.remaining is not None or s.private.hold > 0.0


def _wait_for_renewal(
    owner: Owner, d: DeploymentLimits, costs: list[float], max_wait: float
) -> asyncio.Future[DeploymentVerdict | None]:
    """A turn from the owner's renewal on its way, served with its other waiters when it
    is read (``Leases._serve_waiters``; None: it brought none within ``max_wait``)."""
    served: asyncio.Future[DeploymentVerdict | None]
    served = asyncio.get_running_loop().create_future()
    owner.turn_waiters.append(_TurnWaiter(d, costs, max_wait, served))
    return served


def _leased(owner: Owner, d: DeploymentLimits, a: Allowance, now: float) -> DeploymentVerdict:
    """The verdict of a request ``a`` (a deployment's budget lease) took at local ``now``."""
    sent = Sent(a.epoch, a.sequence + a.uses - 1, a.at + (now - a.asked), owner.private)
    return DeploymentVerdict(d.id, 0.0, waits={d.id: 0.0}, sent=sent)


def _leased_turn(
    owner: Owner, d: DeploymentLimits, t: turns.TurnLease, now: float, wait: float
) -> DeploymentVerdict:
    """The verdict of a turn ``t`` handed out at local time ``now``, ``wait`` ahead: its
    time in the storage's, and how far the lease's turns go (the fallback starts after
    them, policy.py)."""
    lease_now = now - t.origin
    number = t.sequence + min(t.uses, turns.counted(t.turns)) - 1
    sent = Sent(t.epoch, number, t.at + t.granted, owner.private)
    tail = max(wait, t.last - lease_now)
    return DeploymentVerdict(d.id, wait, waits={d.id: tail}, sent=sent)


def _key_ident(limits: KeyLimits) -> tuple[str, str, str]:
    """A key's lease, by key and team: a key moving team leases other Redis keys."""
    return ("k", limits.name, "" if limits.team is None else limits.team.name)


def _ignore(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


__all__ = ["Leases"]
