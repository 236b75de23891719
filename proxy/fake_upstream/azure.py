"""Azure OpenAI's side of the fake upstream: its paths, its checks and its error bodies.

In Azure mode the fake serves ``/openai/deployments/{deployment}/{endpoint}`` and answers
as Azure does: the key in the ``api-key`` header (401 without the right one), the
``api-version`` query parameter (404 without one, 400 for one it does not serve), the
deployment named in the path (404 for an unknown one; the deployments are the configured
models). Azure's gateway errors are ``{"error": {"code", "message"}}``, not OpenAI's shape.
"""

from __future__ import annotations

import hmac

import orjson

__all__ = [
    "ACCESS_DENIED",
    "DEFAULT_API_VERSIONS",
    "OPERATIONS",
    "authorized",
    "error_body",
    "not_found",
    "path_problem",
    "rate_limit_message",
    "responses_problem",
]

# api-version values Azure OpenAI serves for chat, completions and embeddings (GA first).
DEFAULT_API_VERSIONS: tuple[str, ...] = (
    "2024-10-21",
    "2024-06-01",
    "2024-02-01",
    "2023-05-15",
    "2025-01-01-preview",
    "2024-12-01-preview",
)

# Azure serves the Responses API at /openai/v1/responses (the v1 API: no api-version, or
# "preview" / "latest") and at /openai/responses?api-version=... (these preview versions).
RESPONSES_API_VERSIONS: tuple[str, ...] = ("2025-04-01-preview", "2025-03-01-preview")
V1_API_VERSIONS: tuple[str, ...] = ("preview", "latest")

# Azure names each endpoint's operation in its 429 messages.
OPERATIONS = {
    "chat/completions": "ChatCompletions_Create",
    "completions": "Completions_Create",
    "embeddings": "Embeddings_Create",
    "responses": "Responses_Create",
}

ACCESS_DENIED = (
    "Access denied due to invalid subscription key or wrong API endpoint. Make sure to"
    " provide a valid key for an active subscription and use a correct regional API"
    " endpoint for your resource."
)
_NOT_FOUND = "Resource not found"
_NO_DEPLOYMENT = (
    "The API deployment for this resource does not exist. If you created the deployment"
    " within the last 5 minutes, please wait a moment and try again."
)
_BAD_VERSION = "API version not supported"


def error_body(code: str, message: str) -> bytes:
    return orjson.dumps({"error": {"code": code, "message": message}})


def authorized(sent: str | None, key: str | None) -> bool:
    """Azure always wants an ``api-key``; with ``key`` configured, that one."""
    if sent is None:
        return False
    return key is None or hmac.compare_digest(sent.encode(), key.encode())


def path_problem(
    api_version: str | None,
    deployment: str,
    versions: tuple[str, ...],
    deployments: tuple[str, ...],
) -> tuple[int, bytes] | None:
    """Status and body of Azure's answer to a wrong api-version or deployment; None: fine."""
    if not api_version:
        return 404, error_body("404", _NOT_FOUND)
    if api_version not in versions:
        return 400, error_body("BadRequest", _BAD_VERSION)
    if deployment not in deployments:
        return 404, error_body("DeploymentNotFound", _NO_DEPLOYMENT)
    return None


def responses_problem(
    v1: bool, api_version: str | None, model: object, deployments: tuple[str, ...]
) -> tuple[int, bytes] | None:
    """Azure's answer to a wrong api-version, or (`model` not None: a create) to a model
    that names no deployment; None: fine. The v1 path needs no api-version."""
    if v1:
        if api_version is not None and api_version not in V1_API_VERSIONS:
            return 400, error_body("BadRequest", _BAD_VERSION)
    elif not api_version:
        return 404, error_body("404", _NOT_FOUND)
    elif api_version not in RESPONSES_API_VERSIONS:
        return 400, error_body("BadRequest", _BAD_VERSION)
    if model is not None and model not in deployments:
        return 404, error_body("DeploymentNotFound", _NO_DEPLOYMENT)
    return None


def not_found() -> bytes:
    return error_body("404", _NOT_FOUND)


def rate_limit_message(endpoint: str, api_version: str, kind: str, retry_after: int) -> str:
    operation = OPERATIONS.get(endpoint, "ChatCompletions_Create")
    limit = "call rate limit" if kind == "requests" else "token rate limit"
    return (
        f"Requests to the {operation} Operation under Azure OpenAI API version {api_version}"
        f" have exceeded {limit} of your current OpenAI S0 pricing tier. Please retry after"
        f" {retry_after} seconds. Please go here: https://aka.ms/oai/quotaincrease if you"
        " would like to further increase the default rate limit."
    )
