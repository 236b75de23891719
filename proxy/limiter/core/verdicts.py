"""Pure glue between the limits in base.py and the bucket core, shared by every backend.

Which windows a request touches and what it costs in each, and how a core decision
becomes a KeyVerdict or a DeploymentVerdict. Both backends call these functions, so
their verdicts agree by construction; only where the bucket states live differs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from proxy.costs import NOTHING, REQUESTS, Cost
from proxy.limiter.base import (
    KEY,
    MINUTE,
    TEAM,
    DeploymentLimits,
    DeploymentState,
    DeploymentVerdict,
    KeyLimits,
    KeyState,
    KeyVerdict,
    Quota,
    Rate,
    Remaining,
    Sent,
    Usage,
    Window,
    base_name,
)
from proxy.limiter.core import health, quota
from proxy.limiter.core.bucket import Admission, Bucket, BucketState, Decision, plan, usage
from proxy.limiter.core.health import Health
from proxy.limiter.core.quota import QuotaCheck, QuotaState
from proxy.limiter.core.selection import Selection
from proxy.values import value

QUOTA_ALLOWED = QuotaCheck()

PARALLEL_RETRY_AFTER = 1.0
"""Seconds a client refused for max_parallel is told to wait. Slots free up when other
requests finish, which nothing can predict; one second is a short, polite guess."""

IN_FLIGHT_MARGIN = 60.0
"""Seconds an in-flight slot outlives its request's deadline (its turn plus the
deployment's ``probe_timeout``) unless settled. A replica that dies mid-request never
settles; its requests stop counting for ``least_busy`` after this. A stream that outlasts
it (the timeout bounds each read, not a whole stream) silently stops counting."""

LEASE_TTL = 900.0
"""Seconds a max_parallel lease lives unless released. A replica that crashes mid-request
never releases, so leases expire; 15 minutes outlasts any sane LLM call (a request still
running after that silently stops counting against max_parallel)."""


@value
class Spend:
    """One window a request (or a correction) touches, and what it adds there."""

    window: Window
    amount: float

    @property
    def rate(self) -> Rate:
        return self.window.rate

    @property
    def capacity(self) -> float:
        """What this spend is measured against (``Rate.capacity_for``)."""
        return self.window.rate.capacity_for(self.amount)


def largest(windows: Sequence[Window], kind: str) -> float:
    """The most of ``kind`` one request can take in ``windows`` (inf: no window of it):
    what their smallest admits at once. An upstream's usage beyond it is no usage it
    could have admitted (a lie or a bug), and is charged only that far."""
    return min((w.rate.largest for w in windows if w.kind == kind), default=math.inf)


def too_large(windows: Sequence[Window], cost: Cost) -> bool:
    """Whether some window of ``windows`` can never take a request of ``cost``."""
    return any(w.cost(cost) > w.rate.largest for w in windows)


def spends(windows: Sequence[Window], cost: Cost) -> list[Spend]:
    """Every window with what ``cost`` costs in it (its kind's amount)."""
    return [Spend(w, cost.get(w.kind, 0.0)) for w in windows]


def amounts(windows: Sequence[Window], cost: Cost) -> list[float]:
    """``spends``' amounts alone (no ``Spend`` per window: a lease's hot path)."""
    return [cost.get(w.kind, 0.0) for w in windows]


def settled_cost(
    estimate: Cost, used: Cost | None, windows: Sequence[Window], *, refund: bool = True
) -> Cost:
    """The correction of a request charged ``estimate`` that used ``used`` (None:
    unknown, as nothing), per kind that some window of ``windows`` counts but requests (a
    request is one whatever it used; a kind no window counts has nothing to correct): a
    use beyond the estimate is believed only as far as ``windows`` could admit it
    (``largest``); without ``refund`` an estimate is never given back (a deployment's
    tokens were spent upstream once it admitted the request). Kinds with nothing to
    correct are left out."""
    out: dict[str, float] | None = None  # made only when something is corrected
    for w in windows:  # (two windows of a kind: the same correction, written twice)
        kind = w.kind
        if kind == REQUESTS:
            continue
        charged = estimate.get(kind, 0.0)
        real = 0.0 if used is None else used.get(kind, 0.0)
        if real > charged:
            real = max(charged, min(real, largest(windows, kind)))
        if real != charged and (refund or real > charged):
            out = {} if out is None else out
            out[kind] = real - charged
    return NOTHING if out is None else out


def excess_cost(windows: Sequence[Window], excess: Sequence[float]) -> dict[str, float]:
    """Per-window amounts (a lease's excess) back as a cost: the largest of each kind
    (a window that held its part is charged again, which errs on the safe side)."""
    out: dict[str, float] = {}
    for w, amount in zip(windows, excess, strict=True):
        if amount != 0.0 and (w.kind not in out or amount > out[w.kind]):
            out[w.kind] = amount
    return out


LEARNED = "learned"
"""The name of a deployment's learned window (its bucket's storage)."""


def with_learned(spent: list[Spend], h: Health, now: float) -> list[Spend]:
    """A deployment's spends, and one request in its learned window if it has one."""
    rate = health.learned_window_rate(h, now)
    if rate is None:
        return spent
    return [*spent, Spend(Window(LEARNED, "requests", rate), 1.0)]


def pacing_windows(deployment: DeploymentLimits) -> list[Window]:
    """The windows of a minute or less: they pace, so a hold means something to them."""
    return [w for w in deployment.windows if w.rate.period <= MINUTE]


def learning_windows(deployment: DeploymentLimits, h: Health, now: float) -> list[Window]:
    """The windows a learning event holds (dropping the turns reserved past the hold):
    those of a minute or less, which pace, and the learned one."""
    windows = pacing_windows(deployment)
    rate = health.learned_window_rate(h, now)
    return windows if rate is None else [*windows, Window(LEARNED, "requests", rate)]


def pace(deployment: DeploymentLimits) -> float:
    """The requests a second its configured windows of a minute or less allow (0: none)."""
    paces = [
        w.rate.limit / w.rate.period
        for w in deployment.windows
        if w.kind == "requests" and w.rate.period <= MINUTE
    ]
    return min(paces) if paces else 0.0


def evidence(deployment: DeploymentLimits, sent: Sent | None) -> health.Evidence | None:
    """What a 429 on the turn ``sent`` can teach (None: nothing known of its turn)."""
    if sent is None:
        return None
    return health.Evidence(sent.epoch, sent.sequence, sent.at, pace(deployment))


def corrections(windows: Sequence[Window], cost: Cost) -> list[Spend]:
    """Only the windows with something to correct: no round trip for zero corrections."""
    return [s for s in spends(windows, cost) if s.amount != 0]


@value
class Floor:
    """A window a settlement lowers: at most ``available`` units at once, and with
    ``wait``, one unit no sooner than ``wait`` seconds from now (``bucket.lower``)."""

    window: Window
    available: float
    wait: float | None = None


def floors(
    deployment: DeploymentLimits, remaining: Remaining | None, max_hold: float
) -> list[Floor]:
    """What the upstream's remaining budget says, for the deployment's per-minute windows
    (upstreams announce per-minute limits; a longer window of ours is not theirs); its
    wait for the next request holds at most ``max_hold`` (``health.bounded_hold``)."""
    if remaining is None:
        return []
    out = []
    for w in deployment.windows:
        if w.rate.period != MINUTE:
            continue
        if w.kind == "requests" and remaining.requests is not None:
            wait = None
            if remaining.requests <= 0:
                wait = health.bounded_hold(remaining.requests_wait, max_hold)
            out.append(Floor(w, remaining.requests, wait))
        elif (left := remaining.of(w.kind)) is not None:  # a token kind
            out.append(Floor(w, left))
    return out


def key_code(window: Window, scope: str = KEY) -> str:
    """The code of a 429 from an owner's ``window``: ``key_rpm``, ``key_tokens_30d``,
    ``team_rpm``... (a window counting only some models' requests: its window's code)."""
    return f"{scope}_{base_name(window.name)}"


def key_codes(limits: KeyLimits) -> list[str]:
    """Every code a key's limits and its team's can refuse with (``key_parallel``,
    ``team_parallel`` included)."""
    codes: list[str] = []
    for owner in limits.owners:
        codes += [key_code(w, owner.scope) for w in owner.windows]
        codes += [f"{owner.scope}_parallel"] if owner.max_parallel is not None else []
    return list(dict.fromkeys(codes))


def key_spends(limits: KeyLimits, cost: Cost) -> list[Spend]:
    """What an ask of the key costs in every window: its own, then its team's."""
    return spends(limits.all_windows, cost)


def admitted_verdict(
    windows: Sequence[Window], states: Sequence[BucketState], now: float, own: int
) -> KeyVerdict:
    """The verdict of a key's request admitted with no budget to check (a lease's): the
    usage of its own ``own`` first windows after it (``states``: theirs, the team's after
    them), what its x-ratelimit-* headers show. ``key_verdict``'s, without the rest."""
    return KeyVerdict(
        True,
        usage=tuple([(w, usage(states[i], w.rate, now)) for i, w in enumerate(windows[:own])]),
    )


def key_verdict(
    spent: Sequence[Spend],
    decision: Decision,
    slots_full: str,
    states: Sequence[BucketState],
    now: float,
    own: int | None = None,
    quotas: Sequence[Quota] = (),
    quota_states: Sequence[QuotaState] = (),
    budget: QuotaCheck = QUOTA_ALLOWED,
    wall: float | None = None,
    cap: int = 0,
) -> KeyVerdict:
    """``states`` and ``quota_states`` are the windows and budgets (the key's, then its
    team's) after the decision (unchanged when refused). ``own``: how many of ``spent``
    are the key's own windows (the rest its team's; None: all): the verdict's usage (the
    x-ratelimit-* headers) is the key's own. ``slots_full``: the scope whose parallel
    slots were full (``key``, ``team``; empty: none). A window refuses first, then a
    budget, then the slots. ``wall``: the budgets' time (UTC seconds), when the windows'
    ``now`` is not. ``cap``: the output cap the budgets lowered the ask's to (0: not
    lowered: ``core/edge.py``), the verdict's when allowed."""
    at = now if wall is None else wall
    mine, mine_states = spent, states
    if own is None or own == len(spent):
        own = len(spent)
    else:  # the key's own windows come first, its team's after them (no copy without)
        mine, mine_states = spent[:own], states[:own]
    used = tuple(
        [(s.window, usage(st, s.window.rate, now)) for s, st in zip(mine, mine_states, strict=True)]
    )
    left = (
        tuple([(q, quota.usage(st, q, at)) for q, st in zip(quotas, quota_states, strict=True)])
        if quotas
        else ()
    )
    if decision.admission is Admission.TOO_LARGE:
        window = spent[decision.binding].window
        return KeyVerdict(False, "request_too_large", usage=used, window=window, budgets=left)
    if decision.admission is Admission.REFUSED:
        window = spent[decision.binding].window
        code = key_code(window, KEY if decision.binding < own else TEAM)
        return KeyVerdict(False, code, decision.retry_after, used, window, budgets=left)
    if not budget.allowed:
        refused = quotas[budget.refused]
        return KeyVerdict(
            False,
            refused.code,
            budget.retry_after,
            used,
            budgets=left,
            budget=refused,
        )
    if slots_full:
        return KeyVerdict(False, f"{slots_full}_parallel", PARALLEL_RETRY_AFTER, used, budgets=left)
    return KeyVerdict(True, usage=used, budgets=left, at=at if quotas else 0.0, cap=cap)


def deployment_verdict(
    candidates: Sequence[DeploymentLimits], selection: Selection, sent: Sent | None
) -> DeploymentVerdict:
    """``sent``: the chosen one's turn (None when refused)."""
    waits = {c.id: w for c, w in zip(candidates, selection.waits, strict=True)}
    decision = selection.decision
    if selection.index >= 0:
        chosen = candidates[selection.index].id
        return DeploymentVerdict(
            chosen, decision.wait, waits=waits, probe=selection.probe, sent=sent
        )
    if decision.admission is Admission.TOO_LARGE:
        return DeploymentVerdict(None, code="request_too_large", waits=waits)
    return DeploymentVerdict(
        None,
        code="model_capacity",
        retry_after=decision.retry_after,
        waits=waits,
        cooling=selection.cooling,
        deferred=selection.deferral is not None,
    )


def in_flight_deadline(deployment: DeploymentLimits, wait: float, now: float) -> float:
    """When a request reserved at ``now`` for a turn ``wait`` seconds away stops counting
    as in flight unless settled (the Lua scripts add in the same order)."""
    return now + wait + deployment.probe_timeout + IN_FLIGHT_MARGIN


def probe_timeout(deployment: DeploymentLimits, wait: float) -> float:
    """How long a probe reserved for a turn ``wait`` seconds away may stay out."""
    return wait + deployment.probe_timeout


def deployment_state(
    deployment: DeploymentLimits,
    h: Health,
    states: Sequence[BucketState],
    learned: BucketState,
    now: float,
) -> DeploymentState:
    """A deployment as ``snapshot`` reports it, from its health, its windows' states (in
    ``deployment.windows`` order) and its learned window's: both backends read the raw
    state and call this, so they agree by construction."""
    windows = deployment.windows
    used = _usages(windows, states, now)
    # The smallest request: one unit of every window's kind.
    buckets = [Bucket(state, w.rate, 1.0) for state, w in zip(states, windows, strict=True)]
    rate = health.learned_window_rate(h, now)
    if rate is not None:
        buckets.append(Bucket(learned, rate, 1.0))
    unusable = health.unusable_for(h, now)
    wait = health.wait_for(h, now)
    return DeploymentState(
        unusable_for=unusable,
        remaining={name: u.remaining for name, u in used.items()},
        learned=health.learned_rate(h, now),
        next_turn=max(unusable, plan(buckets, now).wait),
        reset={name: u.reset for name, u in used.items()},
        cooling=h.cooling,
        cool_for=0.0 if wait is None else wait,
        probe_for=max(0.0, h.probe_until - now) if wait is None else 0.0,
        hold_for=health.hold_for(h, now),
    )


def key_state(
    limits: KeyLimits,
    states: Sequence[BucketState],
    slots_held: int,
    now: float,
    quota_states: Sequence[QuotaState] = (),
    wall: float | None = None,
) -> KeyState:
    """A key as ``key_snapshot`` reports it (states in ``limits.windows`` order, and its
    budgets' in ``limits.quotas`` order, at ``wall``, UTC seconds, if not ``now``)."""
    used = _usages(limits.windows, states, now)
    return KeyState(
        remaining={name: u.remaining for name, u in used.items()},
        reset={name: u.reset for name, u in used.items()},
        slots_held=slots_held,
        budgets=tuple(
            (q, quota.usage(st, q, now if wall is None else wall))
            for q, st in zip(limits.quotas, quota_states, strict=True)
        ),
    )


def quota_costs(limits: KeyLimits, cost: Cost) -> list[float]:
    """What a request (or a correction) costs in each budget of the key and its team
    (``KeyLimits.all_quotas``' order; the catalog left out those over other models)."""
    return [quota.cost_of(q, cost) for q in limits.all_quotas]


def _usages(
    windows: Sequence[Window], states: Sequence[BucketState], now: float
) -> dict[str, Usage]:
    return {w.name: usage(st, w.rate, now) for w, st in zip(windows, states, strict=True)}
