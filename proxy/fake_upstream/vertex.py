"""Google Vertex AI's side of the fake upstream: Anthropic's models at
``/v1/projects/{project}/locations/{region}/publishers/anthropic/models/{model}:rawPredict``
(``:streamRawPredict``, ``count-tokens:rawPredict``), Google's at
``.../publishers/google/models/{model}:generateContent`` (``:streamGenerateContent?alt=sse``,
the Gemini API's bodies and CRLF events: gemini.py), and the OAuth2 token endpoint a
service account's key file names (``token_uri``).

The token endpoint takes the JWT bearer grant (RFC 7523) as google-auth sends it: an
RS256 assertion signed with the service account's private key, verified here with the
public key configured for its ``iss`` (``google_service_accounts``), addressed to
Google's token endpoint (as google-auth addresses every one) or to this one, not
expired, asking for the ``cloud-platform`` scope. It issues opaque access tokens that
live ``token_lifetime`` seconds; the model paths take only a token it issued and that
has not expired (401 ``UNAUTHENTICATED`` otherwise, in Google's error shape).
Their throttling answer is Google's: 429 ``RESOURCE_EXHAUSTED`` with a ``RetryInfo``.
"""

from __future__ import annotations

import base64
import binascii
import secrets
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from . import anthropic

__all__ = [
    "JWT_BEARER",
    "SCOPE",
    "TokenIssuer",
    "google_error",
    "model_action",
    "rate_limit_message",
    "version_problem",
]

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
VERTEX_VERSION = "vertex-2023-10-16"
_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}
UNAUTHENTICATED = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login"
    " cookie or other valid authentication credential."
)
_SKEW = 60.0  # how far an assertion's times may be off this clock
# The audience google-auth names in every assertion, whatever the key file's token_uri.
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"  # noqa: S105 (a URL)


def google_error(status: int, message: str, retry_delay: float | None = None) -> bytes:
    """Google's error body; a 429's with its ``RetryInfo`` (``retry_delay`` seconds)."""
    error: dict[str, Any] = {
        "code": status,
        "message": message,
        "status": _STATUS_NAMES.get(status, "UNKNOWN"),
    }
    if retry_delay is not None:
        error["details"] = [
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{retry_delay}s"}
        ]
    return orjson.dumps({"error": error})


def rate_limit_message(kind: str, model: str, publisher: str = "anthropic") -> str:
    """Vertex AI's words for an exhausted quota of ``publisher``'s base model."""
    if publisher == "google":
        metric = {
            "requests": "generate_content_requests_per_minute_per_project_per_base_model",
        }.get(kind, "generate_content_input_tokens_per_minute_per_base_model")
        base = model
    else:
        metric = {
            "requests": "online_prediction_requests_per_base_model",
            "input_tokens": "online_prediction_input_tokens_per_minute_per_base_model",
            "output_tokens": "online_prediction_output_tokens_per_minute_per_base_model",
        }.get(kind, "online_prediction_tokens_per_minute_per_base_model")
        base = f"anthropic-{model.partition('@')[0]}"
    return (
        f"Quota exceeded for aiplatform.googleapis.com/{metric} with base model:"
        f" {base}. Please submit a quota increase request."
    )


def version_problem(version: object) -> str | None:
    """What is wrong with a body's ``anthropic_version``: Vertex's own is documented
    (``vertex-2023-10-16``); Anthropic's recent SDKs send the API's dated version there,
    taken too. None: fine."""
    if version == VERTEX_VERSION:
        return None
    if not isinstance(version, str):
        return f"anthropic_version: Field required ({VERTEX_VERSION})"
    return anthropic.version_problem(version) and f"anthropic_version: {version!r} is not valid"


def model_action(segment: str) -> tuple[str, str]:
    """``claude-x@2025:rawPredict`` as its model and method (``""``: none named)."""
    model, _, method = segment.rpartition(":")
    return (model, method) if model else (segment, "")


def _b64(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


class TokenIssuer:
    """The token endpoint's state: the service accounts' public keys by email, the
    tokens it issued and when each expires."""

    def __init__(self, accounts: tuple[tuple[str, str], ...], lifetime: float) -> None:
        self._keys: dict[str, rsa.RSAPublicKey] = {}
        for email, pem in accounts:
            key = serialization.load_pem_public_key(pem.encode())
            if not isinstance(key, rsa.RSAPublicKey):
                raise ValueError(f"the key of {email} is not an RSA public key")
            self._keys[email] = key
        self.lifetime = lifetime
        self._tokens: dict[str, float] = {}  # token -> its expiry (monotonic)
        self.issued = 0
        self.recent: deque[str] = deque(maxlen=100)  # the last tokens issued (tests)

    def grant(self, form: Mapping[str, str], audience: str) -> tuple[int, bytes]:
        """The status and body answering a token request's ``form`` at ``audience``
        (this endpoint's URL)."""
        if form.get("grant_type") != JWT_BEARER:
            return 400, _oauth_error("unsupported_grant_type", "Invalid grant_type.")
        problem = self._assertion_problem(form.get("assertion", ""), audience)
        if problem is not None:
            return 400, _oauth_error("invalid_grant", problem)
        token = f"ya29.fake-{secrets.token_urlsafe(24)}"
        now = time.monotonic()
        self._tokens = {t: e for t, e in self._tokens.items() if e > now}  # forget expired
        self._tokens[token] = now + self.lifetime
        self.issued += 1
        self.recent.append(token)
        answer = {"access_token": token, "expires_in": self.lifetime, "token_type": "Bearer"}
        return 200, orjson.dumps(answer)

    def valid(self, authorization: str | None) -> bool:
        """Whether ``Authorization`` carries a token issued here, not expired."""
        if authorization is None or not authorization.startswith("Bearer "):
            return False
        expiry = self._tokens.get(authorization[7:])
        return expiry is not None and time.monotonic() < expiry

    def _assertion_problem(self, assertion: str, audience: str) -> str | None:
        """What is wrong with a JWT bearer assertion; None: it may have a token."""
        parts = assertion.split(".")
        if len(parts) != 3:
            return "Invalid JWT: not a JWT."
        try:
            header, claims = orjson.loads(_b64(parts[0])), orjson.loads(_b64(parts[1]))
            signature = _b64(parts[2])
        except (binascii.Error, ValueError):
            return "Invalid JWT: undecodable."
        if not isinstance(header, dict) or not isinstance(claims, dict):
            return "Invalid JWT: not JSON objects."
        if header.get("alg") != "RS256":
            return "Invalid JWT: alg must be RS256."
        key = self._keys.get(claims.get("iss"))  # type: ignore[arg-type]
        if key is None:
            return "Invalid JWT: unknown issuer."
        signed = f"{parts[0]}.{parts[1]}".encode()
        try:
            key.verify(signature, signed, padding.PKCS1v15(), hashes.SHA256())
        except InvalidSignature:
            return "Invalid JWT Signature."
        return _claims_problem(claims, audience)


def _claims_problem(claims: dict[str, Any], audience: str) -> str | None:
    now = time.time()
    iat, exp = claims.get("iat"), claims.get("exp")
    if not isinstance(iat, int | float) or not isinstance(exp, int | float):
        return "Invalid JWT: iat and exp are required."
    if iat > now + _SKEW or exp < now - _SKEW or exp - iat > 3600:
        return (
            "Invalid JWT: Token must be a short-lived token (60 minutes) and in a"
            " reasonable timeframe."
        )
    if claims.get("aud") not in (audience, GOOGLE_TOKEN_AUDIENCE):
        return "Invalid JWT: the audience is not this token endpoint."
    scope = claims.get("scope")
    if not isinstance(scope, str) or SCOPE not in scope.split():
        return "Invalid JWT: the cloud-platform scope is not asked for."
    return None


def _oauth_error(error: str, description: str) -> bytes:
    return orjson.dumps({"error": error, "error_description": description})
