"""One exception tree for every way a request can fail, and its mapping to the HTTP contract.

    ProxyError                       status  error.type
    ├── InvalidRequest                 400   invalid_request_error   (bad JSON, bad fields)
    │   ├── UnsupportedMediaType       415   invalid_request_error
    │   ├── RequestTimeout             408   invalid_request_error   (body too slow)
    │   ├── BodyTooLarge               413   invalid_request_error
    │   └── HeadersTooLarge            431   invalid_request_error
    ├── AuthenticationFailed           401   authentication_error
    ├── ModelNotAllowed                403   permission_error
    ├── ModelNotFound                  404   invalid_request_error
    ├── RateLimited                    429   rate_limit_error        (code names whose limit)
    ├── ClientClosedRequest            499   client_closed           (nobody hears it: logged)
    └── UpstreamError                        api_error
        ├── UpstreamUnavailable        502   (refused, reset, invalid response)
        ├── ServiceUnavailable         503   (nothing usable, limiter storage down)
        └── UpstreamTimeout            504

Every error renders as OpenAI's ``{"error": {"message", "type", "param", "code"}}``; a
``RateLimited`` adds ``retry-after`` (whole seconds, rounded up) and ``retry-after-ms``.
Messages never carry secrets: they are written here or by the code raising them, never
copied from an upstream.

What a stage raises that is not a ``ProxyError`` is answered through one table,
``proxy/pipeline/error_table.py`` (``contract_error``: the first row whose type it is decides;
"=": its ``.error``'s, mapped; a row without retry-after says what becomes of it where
it is raised, never answered as it is):

    raised              by         status  type      code                 retry-after, or
    ProxyError          any        its own its own   its own              its own
    LimiterUnavailable  limiter    503     api_error limiter_unavailable  1 s
    StorageError        limiter    503     api_error limiter_unavailable  1 s
    AffinityUnavailable affinity   503     api_error affinity_unavailable 1 s
    GateClosed          dispatcher =       =         =                    its .error's
    Retryable           dispatcher =       =         =                    its .error's
    TransportFailure    upstream   502|504 api_error see (a)              its .error's
    UnusableAnswer      upstream   502     api_error upstream_error       its .error's
    AnswerTooLarge      upstream   502     api_error upstream_error       as UnusableAnswer
    Undecodable         upstream   502     api_error upstream_error       as UnusableAnswer
    Untranslatable      translate  502     api_error upstream_error       as UnusableAnswer
    Untranslated        exchange   -                                      next deployment
    NoCount             shapes     -                                      estimate charged
    ClientGone          forwarding -                                      no answer
    Exception           any        500     api_error internal_error       logged (a bug)

(a) upstream/errors.py, by what broke: 504 ``upstream_timeout``, 502
``upstream_invalid_response`` (a broken answer), 502 ``upstream_connection_error``.
"""

from __future__ import annotations

import math

import orjson

__all__ = [
    "AuthenticationFailed",
    "BodyTooLarge",
    "ClientClosedRequest",
    "InvalidRequest",
    "ModelNotAllowed",
    "ModelNotFound",
    "ProxyError",
    "RateLimited",
    "RequestTimeout",
    "ServiceUnavailable",
    "UnsupportedMediaType",
    "UpstreamError",
    "UpstreamTimeout",
    "UpstreamUnavailable",
    "error_body",
    "render",
]


class ProxyError(Exception):
    status: int = 500
    type: str = "api_error"
    default_code: str = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.param = param
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        seconds = max(self.retry_after, 0.0)
        return {
            "retry-after": str(max(1, math.ceil(seconds))),
            "retry-after-ms": str(max(1, math.ceil(seconds * 1000))),
        }


class InvalidRequest(ProxyError):
    status = 400
    type = "invalid_request_error"
    default_code = "invalid_request"


class UnsupportedMediaType(InvalidRequest):
    status = 415
    default_code = "unsupported_media_type"


class RequestTimeout(InvalidRequest):
    status = 408
    default_code = "request_timeout"


class BodyTooLarge(InvalidRequest):
    status = 413
    default_code = "request_too_large"


class HeadersTooLarge(InvalidRequest):
    status = 431
    default_code = "request_headers_too_large"


class AuthenticationFailed(ProxyError):
    status = 401
    type = "authentication_error"
    default_code = "invalid_api_key"


class ModelNotAllowed(ProxyError):
    status = 403
    type = "permission_error"
    default_code = "model_not_allowed"


class ModelNotFound(ProxyError):
    status = 404
    type = "invalid_request_error"
    default_code = "model_not_found"


class RateLimited(ProxyError):
    status = 429
    type = "rate_limit_error"
    default_code = "rate_limited"


class ClientClosedRequest(ProxyError):
    """The client went away while its request waited for a turn (nginx's 499)."""

    status = 499
    type = "client_closed"
    default_code = "client_closed_request"


class UpstreamError(ProxyError):
    status = 502
    type = "api_error"
    default_code = "upstream_error"


class UpstreamUnavailable(UpstreamError):
    status = 502
    default_code = "upstream_unavailable"


class ServiceUnavailable(UpstreamError):
    status = 503
    default_code = "service_unavailable"


class UpstreamTimeout(UpstreamError):
    status = 504
    default_code = "upstream_timeout"


def render(error: ProxyError) -> tuple[int, bytes, dict[str, str]]:
    """Status, JSON body and extra headers for an error response."""
    return error.status, error_body(error), error.headers()


def error_body(error: ProxyError) -> bytes:
    """The contract's (OpenAI's) error body."""
    return orjson.dumps(
        {
            "error": {
                "message": error.message,
                "type": error.type,
                "param": error.param,
                "code": error.code,
            }
        }
    )
