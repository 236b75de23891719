"""What an upstream answer means for the deployment and for the client (pure).

    2xx, other 4xx        success: the request's own fault never cools anything (400,
                          404, 413, 422: the upstream did not admit it, ``admitted``)
    429                   failure "rate_limited": hold until the upstream's retry-after /
                          reset (at most server.max_upstream_hold), lower the effective
                          rate; retry elsewhere
    401, 403              failure "auth": a bad upstream key; cool for cooldown.time
    Azure 404, Azure 400  failure "misconfigured": the deployment name, base_url or
      of an api-version   api_version is wrong (the proxy builds the path, not the client);
                          cool for cooldown.time
    5xx                   failure "server_error": counts toward allowed_fails
    timeout, connection,  failure of that name: counts toward allowed_fails
    protocol

Every failure is retryable on another deployment (before a stream's first byte).
"""

from __future__ import annotations

from collections.abc import Mapping

from proxy.errors import ServiceUnavailable, UpstreamError, UpstreamUnavailable
from proxy.limiter.base import Outcome
from proxy.limiter.health import bounded_hold
from proxy.upstream.ratelimits import parse_budget, retry_after

__all__ = [
    "SUCCESS",
    "admitted",
    "classify_status",
    "is_failure",
    "misconfigured",
    "misconfigured_error",
    "status_error",
]

SUCCESS = Outcome(kind="success")


def is_failure(status: int) -> bool:
    return status == 429 or status >= 500 or status in (401, 403)


# Answers that say the upstream refused the request before counting it against its
# budget: a bad request, no such model or route, too large, unprocessable.
_NOT_ADMITTED = frozenset((400, 404, 413, 422))


def admitted(status: int) -> bool:
    """Whether the upstream took the request into its budget (its token charge stays)."""
    return status not in _NOT_ADMITTED


def classify_status(
    status: int, headers: Mapping[str, str], now: float, cooldown_time: float, max_hold: float
) -> Outcome:
    """The outcome of an upstream HTTP answer; ``now`` is the wall clock (epoch); a 429
    holds the deployment at most ``max_hold`` seconds."""
    if not is_failure(status):
        return SUCCESS
    if status == 429:
        wait = retry_after(headers, now)
        if wait is None:
            budget = parse_budget(headers, now)
            resets = [r for r in (budget.reset_requests, budget.reset_tokens) if r]
            wait = max(resets) if resets else None
        wait = bounded_hold(wait, max_hold)
        return Outcome(kind="failure", reason="rate_limited", cool_for=wait, rate_limited=True)
    if status in (401, 403):
        return Outcome(kind="failure", reason="auth", cool_for=cooldown_time)
    return Outcome(kind="failure", reason="server_error")


# What Azure says of an api-version it does not serve (a 400 otherwise like the client's).
_AZURE_VERSION_REFUSED = b"API version not supported"


def misconfigured(provider: str, status: int, body: bytes, cooldown_time: float) -> Outcome | None:
    """An answer that says the deployment's own config is wrong, read from its body;
    None: an ordinary answer. Only for Azure, whose path (deployment name, api-version)
    comes from the config: its 404 (no such deployment, no api-version) and its 400 of an
    unsupported api-version are never the client's fault."""
    if provider != "azure" or status not in (400, 404):
        return None
    if status == 400 and _AZURE_VERSION_REFUSED not in body[:1024]:
        return None
    return Outcome(kind="failure", reason="misconfigured", cool_for=cooldown_time)


def misconfigured_error(status: int, deployment: str) -> UpstreamError:
    return UpstreamUnavailable(
        f"The upstream deployment '{deployment}' answered with status {status}: its"
        " deployment name, base_url or api_version in the proxy's config is wrong.",
        code="upstream_error",
    )


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
