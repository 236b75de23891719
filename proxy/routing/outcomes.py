"""What an upstream answer means for the deployment and for the client (pure).

    2xx, other 4xx        success: the request's own fault never cools anything
    429                   failure "rate_limited": cool until the upstream's retry-after /
                          reset, lower the effective rate; retry elsewhere
    401, 403              failure "auth": a bad upstream key; cool for cooldown.time
    5xx                   failure "server_error": counts toward allowed_fails
    timeout, connection,  failure of that name: counts toward allowed_fails
    protocol

Every failure is retryable on another deployment (before a stream's first byte).
"""

from __future__ import annotations

from collections.abc import Mapping

from proxy.errors import ServiceUnavailable, UpstreamError, UpstreamUnavailable
from proxy.limiter.base import Outcome
from proxy.upstream.ratelimits import parse_budget, retry_after

__all__ = ["SUCCESS", "classify_status", "is_failure", "status_error"]

SUCCESS = Outcome(kind="success")


def is_failure(status: int) -> bool:
    return status == 429 or status >= 500 or status in (401, 403)


def classify_status(
    status: int, headers: Mapping[str, str], now: float, cooldown_time: float
) -> Outcome:
    """The outcome of an upstream HTTP answer; ``now`` is the wall clock (epoch)."""
    if not is_failure(status):
        return SUCCESS
    if status == 429:
        wait = retry_after(headers, now)
        if wait is None:
            budget = parse_budget(headers, now)
            resets = [r for r in (budget.reset_requests, budget.reset_tokens) if r]
            wait = max(resets) if resets else None
        return Outcome(kind="failure", reason="rate_limited", cool_for=wait, rate_limited=True)
    if status in (401, 403):
        return Outcome(kind="failure", reason="auth", cool_for=cooldown_time)
    return Outcome(kind="failure", reason="server_error")


def status_error(status: int, deployment: str) -> UpstreamError:
    """What the client hears when a deployment's failure was the last one tried."""
    if status == 429:
        return ServiceUnavailable(
            f"The upstream deployment '{deployment}' is rate limited.",
            code="upstream_rate_limited",
        )
    if status in (401, 403):
        return UpstreamUnavailable(
            f"The upstream deployment '{deployment}' rejected the proxy's credentials.",
            code="upstream_auth_error",
        )
    return UpstreamUnavailable(
        f"The upstream deployment '{deployment}' answered with status {status}.",
        code="upstream_error",
    )
