"""Pure glue between the limits in base.py and the bucket core, shared by every backend.

Which buckets a request touches and what it costs in each, and how a core decision
becomes a KeyVerdict or a DeploymentVerdict. Both backends call these functions, so
their verdicts agree by construction; only where the bucket states live differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.limiter.base import DeploymentLimits, DeploymentVerdict, KeyLimits, KeyVerdict, Rate
from proxy.limiter.bucket import BucketState, Decision, Outcome, usage
from proxy.limiter.selection import Selection

PARALLEL_RETRY_AFTER = 1.0
"""Seconds a client refused for max_parallel is told to wait. Slots free up when other
requests finish, which nothing can predict; one second is a short, polite guess."""

IN_FLIGHT_MARGIN = 60.0
"""Seconds an in-flight lease outlives its request's deadline (its turn plus the
deployment's ``probe_timeout``) unless settled. A replica that dies mid-request never
settles; its requests stop counting for ``least_busy`` after this. A stream that outlasts
it (the timeout bounds each read, not a whole stream) silently stops counting."""

LEASE_TTL = 900.0
"""Seconds a max_parallel lease lives unless released. A replica that crashes mid-request
never releases, so leases expire; 15 minutes outlasts any sane LLM call (a request still
running after that silently stops counting against max_parallel)."""


@dataclass(frozen=True, slots=True)
class Spend:
    """One bucket a request touches: ``kind`` is ``"rpm"`` or ``"tpm"``."""

    kind: str
    rate: Rate
    amount: float


def key_spends(limits: KeyLimits, tokens: float) -> list[Spend]:
    return _spends(limits.rpm, limits.tpm, 1.0, tokens)


def deployment_spends(deployment: DeploymentLimits, tokens: float) -> list[Spend]:
    return _spends(deployment.rpm, deployment.tpm, 1.0, tokens)


def correction_spends(deployment: DeploymentLimits, requests: float, tokens: float) -> list[Spend]:
    """Only the buckets with something to correct: no round trip for zero corrections."""
    return [s for s in _spends(deployment.rpm, deployment.tpm, requests, tokens) if s.amount != 0]


@dataclass(frozen=True, slots=True)
class Floor:
    """A bucket ``sync_budget`` lowers: at most ``available`` units at once, and with
    ``wait``, one unit no sooner than ``wait`` seconds from now (``bucket.lower``)."""

    kind: str
    rate: Rate
    available: float
    wait: float | None = None


def sync_floors(
    deployment: DeploymentLimits,
    remaining_requests: float | None,
    reset_requests: float | None,
    remaining_tokens: float | None,
) -> list[Floor]:
    """What the upstream's remaining budget says, for the buckets the deployment has.
    None is unknown; no requests left with a known reset: none before the reset."""
    floors = []
    if deployment.rpm is not None and remaining_requests is not None:
        wait = reset_requests if remaining_requests <= 0 else None
        floors.append(Floor("rpm", deployment.rpm, remaining_requests, wait))
    if deployment.tpm is not None and remaining_tokens is not None:
        floors.append(Floor("tpm", deployment.tpm, remaining_tokens))
    return floors


def _spends(rpm: Rate | None, tpm: Rate | None, requests: float, tokens: float) -> list[Spend]:
    spends = []
    if rpm is not None:
        spends.append(Spend("rpm", rpm, requests))
    if tpm is not None:
        spends.append(Spend("tpm", tpm, tokens))
    return spends


def key_verdict(
    spends: Sequence[Spend],
    decision: Decision,
    parallel_full: bool,
    states: Sequence[BucketState],
    now: float,
) -> KeyVerdict:
    """``states`` are the buckets after the decision (unchanged when refused)."""
    by_kind = {s.kind: usage(state, s.rate, now) for s, state in zip(spends, states, strict=True)}
    requests, tokens = by_kind.get("rpm"), by_kind.get("tpm")
    if decision.outcome is Outcome.TOO_LARGE:
        return KeyVerdict(False, "request_too_large", requests=requests, tokens=tokens)
    if decision.outcome is Outcome.REFUSED:
        code = f"key_{spends[decision.binding].kind}"
        return KeyVerdict(False, code, decision.retry_after, requests, tokens)
    if parallel_full:
        return KeyVerdict(False, "key_parallel", PARALLEL_RETRY_AFTER, requests, tokens)
    return KeyVerdict(True, requests=requests, tokens=tokens)


def deployment_verdict(
    candidates: Sequence[DeploymentLimits], selection: Selection
) -> DeploymentVerdict:
    waits = {c.id: w for c, w in zip(candidates, selection.waits, strict=True)}
    decision = selection.decision
    if selection.index >= 0:
        chosen = candidates[selection.index].id
        return DeploymentVerdict(chosen, decision.wait, waits=waits, probe=selection.probe)
    if decision.outcome is Outcome.TOO_LARGE:
        return DeploymentVerdict(None, code="request_too_large", waits=waits)
    return DeploymentVerdict(
        None,
        code="model_capacity",
        retry_after=decision.retry_after,
        waits=waits,
        cooling=selection.cooling,
    )


def in_flight_deadline(deployment: DeploymentLimits, wait: float, now: float) -> float:
    """When a request reserved at ``now`` for a turn ``wait`` seconds away stops counting
    as in flight unless settled (the Lua scripts add in the same order)."""
    return now + wait + deployment.probe_timeout + IN_FLIGHT_MARGIN


def probe_timeout(deployment: DeploymentLimits, wait: float) -> float:
    """How long a probe reserved for a turn ``wait`` seconds away may stay out."""
    return wait + deployment.probe_timeout
