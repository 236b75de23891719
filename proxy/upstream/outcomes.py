"""What an upstream answer means for the deployment and for the client (pure).

    2xx, other 4xx        success: the request's own fault never cools anything (400,
                          404, 413, 422: the upstream did not admit it, ``admitted``)
    429, or throttled     failure "rate_limited": hold until the upstream's retry-after /
                          reset (at most server.max_upstream_hold), lower the effective
                          rate; retry elsewhere. Throttled: its provider read so in
                          its headers (Bedrock's 503 ServiceUnavailableException)
    401, 403              failure "auth": a bad upstream key; cool for cooldown.time
    "misconfigured"       failure "misconfigured", as its provider says
      (providers/)        (Azure's 404, or 400 of an api-version: the deployment name,
                          base_url or api_version is wrong); cool for cooldown.time
    3xx, 4xx not JSON     failure "misconfigured" (no LLM API answers there: a base_url
      (or a framework's   missing its /v1); but 400, 409, 413, 414, 415, 422 are about the
      404 {"detail"})     client's request: its own status, wrapped in the contract's shape
    5xx                   failure "server_error": counts toward allowed_fails (Anthropic's
                          529 overloaded_error too, cooled as a 503 is)
    timeout, connection,  failure of that name: counts toward allowed_fails
    protocol

Every failure is retryable on another deployment (before a stream's first byte).
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from proxy.errors import (
    InvalidRequest,
    ProxyError,
    ServiceUnavailable,
    UpstreamError,
    UpstreamUnavailable,
)
from proxy.limiter.base import SUCCESS, Outcome
from proxy.limiter.core.health import bounded_hold
from proxy.providers.ratelimits import UpstreamBudget, retry_after

__all__ = [
    "SUCCESS",
    "admitted",
    "classify_status",
    "is_failure",
    "misconfigured_error",
    "status_error",
    "unshaped",
    "unshaped_error",
]


def is_failure(status: int) -> bool:
    return status == 429 or status >= 500 or status in (401, 403)


# Answers that say the upstream refused the request before counting it against its
# budget: a bad request, no such model or route, too large, unprocessable.
_NOT_ADMITTED = frozenset((400, 404, 413, 422))


def admitted(status: int) -> bool:
    """Whether the upstream took the request into its budget (its token charge stays)."""
    return status not in _NOT_ADMITTED


def classify_status(
    status: int,
    headers: Mapping[str, str],
    budget: UpstreamBudget,
    now: float,
    cooldown_time: float,
    max_hold: float,
    said: float | None = None,
) -> Outcome:
    """The outcome of an upstream HTTP answer (``budget``: what its headers say of the
    upstream's budget, read by its provider); ``now`` is the wall clock (epoch); a 429
    holds the deployment at most ``max_hold`` seconds (``said``: the wait its body
    says, when its provider reads one there: ``ThrottleInBody``)."""
    if not is_failure(status):
        return SUCCESS
    if status == 429 or budget.throttled:
        wait = retry_after(headers, now)
        if wait is None:
            wait = said
        if wait is None:
            resets = [r for r in budget.resets if r]
            wait = max(resets) if resets else None
        wait = bounded_hold(wait, max_hold)
        return Outcome(kind="failure", reason="rate_limited", cool_for=wait, rate_limited=True)
    if status in (401, 403):
        return Outcome(kind="failure", reason="auth", cool_for=cooldown_time)
    return Outcome(kind="failure", reason="server_error")


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
    if status == 529:  # Anthropic's "overloaded": no capacity there now, retry later
        return ServiceUnavailable(
            f"The upstream deployment '{deployment}' is overloaded.", code="upstream_overloaded"
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


# Statuses that say something about the client's request itself (its form, size, type).
_ABOUT_THE_REQUEST = frozenset({400, 409, 413, 414, 415, 422})


def unshaped(status: int, body: bytes, cooldown_time: float) -> Outcome | None:
    """An answer that is neither a success nor an error an OpenAI-compatible API sends
    (a redirect or a 4xx whose body is not a JSON object: the web server of a base_url
    missing its /v1, a web page), and what it means for the deployment; None: a usual
    answer. Only a status about the client's request leaves the deployment as it is."""
    if status < 300:
        return None
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and not _no_such_route(status, parsed):
        return None
    if status in _ABOUT_THE_REQUEST:
        return SUCCESS
    return Outcome(kind="failure", reason="misconfigured", cool_for=cooldown_time)


def _no_such_route(status: int, body: dict[str, object]) -> bool:
    """A web framework's own answer for a path or method it does not serve (FastAPI's
    and Starlette's ``{"detail": "Not Found"}``: vLLM's without its /v1)."""
    return status in (404, 405) and body.keys() == {"detail"}


def unshaped_error(status: int, deployment: str, url: str) -> ProxyError:
    """The contract's error for an answer ``unshaped`` found (the upstream's own words
    are not passed on: they may quote anything)."""
    if status in _ABOUT_THE_REQUEST:
        refused = InvalidRequest(
            f"The upstream deployment '{deployment}' refused the request with status"
            f" {status} (its answer was not JSON).",
            code="upstream_refused_request",
        )
        refused.status = status
        return refused
    return UpstreamUnavailable(
        f"The upstream deployment '{deployment}' answered with status {status} and a body"
        f" that is not JSON at {url}: no OpenAI-compatible API answers there; check its"
        " base_url (OpenAI-compatible servers serve under /v1).",
        code="upstream_error",
    )
