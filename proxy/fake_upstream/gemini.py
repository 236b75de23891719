"""The Gemini API (Google AI Studio), pure: ``POST /v1beta/models/{model}:generateContent``
and ``:streamGenerateContent?alt=sse``, the key as ``x-goog-api-key`` or ``?key=``,
answers with ``usageMetadata``, errors in Google's shape, and its 429
``RESOURCE_EXHAUSTED`` whose ``RetryInfo.retryDelay`` says when to retry (no
``retry-after`` header, as Google sends none). Stream events end in CRLF, as Google's do.

A key that is missing is a 403 ``PERMISSION_DENIED``; a wrong one a 400
``INVALID_ARGUMENT`` whose ``ErrorInfo`` says ``API_KEY_INVALID`` (Google's answers).
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Mapping
from typing import Any

import orjson

from .bodies import Job, capped_job, completion_text, split_text

# The methods served, and whether each streams.
METHODS = {"generateContent": False, "streamGenerateContent": True}
_STATUSES = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


def error_body(status: int, message: str, details: list[dict[str, Any]] | None = None) -> bytes:
    error: dict[str, Any] = {
        "code": status,
        "message": message,
        "status": _STATUSES.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT"),
    }
    if details:
        error["details"] = details
    return orjson.dumps({"error": error})


def key_problem(
    headers: Mapping[str, str], query: Mapping[str, str], key: str | None
) -> tuple[int, bytes] | None:
    """None for an accepted key (any, unless ``key`` is configured); else the answer."""
    sent = headers.get("x-goog-api-key") or query.get("key")
    if not sent:
        message = (
            "Method doesn't allow unregistered callers (callers without established"
            " identity). Please use API Key or other form of API consumer identity to call"
            " this API."
        )
        return 403, error_body(403, message)
    if key is not None and not hmac.compare_digest(sent.encode(), key.encode()):
        info = {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": "API_KEY_INVALID",
            "domain": "googleapis.com",
        }
        return 400, error_body(400, "API key not valid. Please pass a valid API key.", [info])
    return None


def rate_limited(kind: str, limit: float, retry_after: float) -> bytes:
    """A 429 as Google words it, its wait as a ``RetryInfo`` (whole seconds, up)."""
    message = (
        f"You exceeded your current quota ({kind}: {limit:g} in the window), please check"
        " your plan and billing details."
    )
    retry = {
        "@type": "type.googleapis.com/google.rpc.RetryInfo",
        "retryDelay": f"{max(math.ceil(retry_after), 1)}s",
    }
    return error_body(429, message, [retry])


def _chars(value: object) -> int:
    """The characters of the text parts of ``value`` (contents, a content, parts)."""
    stack, total = [value], 0
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            if isinstance(item.get("text"), str):
                total += len(item["text"])
            elif "parts" in item:
                stack.append(item["parts"])
    return total


def parse(body: dict[str, Any], model: str, stream: bool, default_completion: int) -> Job | str:
    """A Job for a ``generateContent`` request, or a 400's message."""
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        return "* GenerateContentRequest.contents: contents is not specified"
    config = body.get("generationConfig") or {}
    if not isinstance(config, dict):
        return 'Invalid JSON payload received. Unknown name "generationConfig"'
    cap = config.get("maxOutputTokens")
    if cap is not None and (type(cap) is not int or cap < 1):
        return "* GenerateContentRequest.generation_config.max_output_tokens: must be positive"
    system = body.get("systemInstruction")
    prompt = math.ceil((_chars(contents) + _chars(system)) / 4) + 3 * len(contents) + 3
    job = capped_job(
        {**body, "model": model}, prompt, cap, default_completion, ("MAX_TOKENS", "STOP")
    )
    job.stream = stream
    job.request = body
    return job


def _usage(job: Job, completion: int) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "promptTokenCount": job.prompt_tokens,
        "candidatesTokenCount": completion,
        "totalTokenCount": job.prompt_tokens + completion,
    }
    if job.cache_read:
        usage["cachedContentTokenCount"] = job.cache_read
    return usage


def _candidate(text: str, finish: str | None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": [{"text": text}], "role": "model"}}
    if finish is not None:
        candidate["finishReason"] = finish
    candidate["index"] = 0
    return candidate


def response(job: Job, rid: str, created: int) -> bytes:
    return orjson.dumps(
        {
            "candidates": [_candidate(completion_text(job.completion_tokens), job.finish_reason)],
            "usageMetadata": _usage(job, job.completion_tokens),
            "modelVersion": job.model,
            "responseId": rid,
        }
    )


def events(job: Job, rid: str, created: int, parts: int) -> list[bytes]:
    """The answer as ``parts`` events (at least one), each with the usage so far; the
    last ends the candidate. CRLF line ends, as Google's streams have."""
    texts = split_text(job.completion_tokens, max(parts, 1))
    made = 0
    out = []
    for index, text in enumerate(texts):
        made = job.completion_tokens * (index + 1) // len(texts)
        last = index == len(texts) - 1
        payload = {
            "candidates": [_candidate(text, job.finish_reason if last else None)],
            "usageMetadata": _usage(job, made),
            "modelVersion": job.model,
            "responseId": rid,
        }
        out.append(b"data: " + orjson.dumps(payload) + b"\r\n\r\n")
    return out


def stream_error() -> bytes:
    payload = {
        "error": {"code": 500, "message": "Internal error encountered.", "status": "INTERNAL"}
    }
    return b"data: " + orjson.dumps(payload) + b"\r\n\r\n"
