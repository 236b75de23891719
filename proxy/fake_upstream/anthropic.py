"""Anthropic's Messages API, pure: request checks, messages, their SSE events, errors and
the `anthropic-ratelimit-*` headers.

The key comes as `x-api-key` or as `Authorization: Bearer` (current SDKs send the bearer
form); `anthropic-version` is required. Usage splits input three ways as Anthropic does:
`input_tokens` (uncached, the chat estimate of `system` plus `messages`), and the cache
counts set by the `cache_read_tokens` / `cache_write_tokens` options; with `prompt_cache`
on, the part of the estimate its cache serves (`prompt_cache.Split`) is read or written
instead of uncached.
"""

from __future__ import annotations

import hmac
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from .bodies import (
    Job,
    capped_job,
    completion_text,
    estimate_chat_prompt_tokens,
    named_sse,
    split_arguments,
    split_text,
    tool_arguments,
    tool_call,
)
from .prompt_cache import Split

# Anthropic accepts only the versions it published (2023-06-01 for years; newer SDKs send
# newer dates): the fake takes any well-formed date, so that a version is never its test.
_VERSION = re.compile(r"^\d{4}-\d{2}-\d{2}$")

# Anthropic's error `type` per HTTP status.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}

# The limit kinds of the fake's windows, as Anthropic's headers and messages name them.
HEADER_KINDS = {
    "requests": "requests",
    "input_tokens": "input-tokens",
    "output_tokens": "output-tokens",
}
_UNITS = {
    "requests": "requests",
    "tokens": "tokens",
    "input_tokens": "input tokens",
    "output_tokens": "output tokens",
}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str, request_id: str) -> bytes:
    return orjson.dumps(
        {
            "type": "error",
            "error": {"type": error_type(status), "message": message},
            "request_id": request_id,
        }
    )


def authorized(headers: Mapping[str, str], key: str | None) -> bool:
    """A key is always required; with `key` configured, that one (either header form)."""
    sent = headers.get("x-api-key")
    if sent is None:
        bearer = headers.get("Authorization", "")
        sent = bearer[7:] if bearer.startswith("Bearer ") else None
    if not sent:
        return False
    return key is None or hmac.compare_digest(sent.encode(), key.encode())


def version_problem(version: str | None) -> str | None:
    if version is None:
        return "anthropic-version: header is required"
    if not _VERSION.match(version):
        return f'anthropic-version: "{version}" is not a valid version'
    return None


def input_tokens(body: dict[str, Any]) -> int | str:
    """The uncached input estimate: `system` and `messages` as chat messages; or a 400
    (for `count_tokens` too: it needs `model` and `messages`)."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "model: Field required"
    messages = body.get("messages")
    if messages is None:
        return "messages: Field required"
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return "messages: Input should be a valid list"
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        return "system: Input should be a valid string or a list of text blocks"
    extra = [{"content": system}] if system is not None else []
    return estimate_chat_prompt_tokens([*extra, *messages])


def parse(
    body: dict[str, Any],
    default_completion: int,
    cache: tuple[int, int],
    split: Split | None = None,
) -> Job | str:
    """A Job for `POST /v1/messages` (`cache`: the read and written cache tokens to
    report on top; `split`: what the prompt cache serves of its input), or a 400
    message."""
    requested = body.get("max_tokens")
    if requested is None:
        return "max_tokens: Field required"
    if not isinstance(requested, int) or isinstance(requested, bool) or requested < 1:
        return "max_tokens: Input should be a valid integer greater than or equal to 1"
    prompt = input_tokens(body)
    if isinstance(prompt, str):
        return prompt
    read, write = cache
    entries: tuple[tuple[bytes, float], ...] = ()
    if split is not None:  # served from the cache: read or written, not uncached
        prompt -= split.read + split.written
        read, write, entries = read + split.read, write + split.written, split.entries
    job = capped_job(
        body,
        prompt,
        requested,
        default_completion,
        ("max_tokens", "end_turn"),
        cache_read=read,
        cache_write=write,
        cache_entries=entries,
    )
    job.cost += read + write  # a combined tpm counts all input
    job.tool = tool_call(body, last_is_result=_answers_a_tool(body["messages"]))
    if job.tool is not None:
        job.finish_reason = "tool_use"
    return job


def _answers_a_tool(messages: list[Any]) -> bool:
    """Whether the last message holds a tool's result."""
    content = messages[-1].get("content") if messages else None
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


def _tool_use(job: Job, mid: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{mid[-12:]}", "name": job.tool, "input": {}}


def usage(job: Job, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": job.prompt_tokens,
        "cache_creation_input_tokens": job.cache_write,
        "cache_read_input_tokens": job.cache_read,
        "output_tokens": output_tokens,
        "service_tier": "standard",
    }


def _message(job: Job, mid: str, content: list[Any], stop: str | None, out: int) -> Any:
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": job.model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage(job, out),
    }


def message(job: Job, mid: str, created: int) -> bytes:
    block = {"type": "text", "text": completion_text(job.completion_tokens)}
    if job.tool is not None:
        block = {**_tool_use(job, mid), "input": orjson.loads(tool_arguments(job))}
    return orjson.dumps(_message(job, mid, [block], job.finish_reason, job.completion_tokens))


def _deltas(job: Job, mid: str, parts: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A streamed message's one content block, as it starts, and its deltas."""
    if job.tool is not None:
        pieces = split_arguments(tool_arguments(job), parts)
        deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in pieces]
        return _tool_use(job, mid), deltas
    texts = split_text(job.completion_tokens, parts)
    return {"type": "text", "text": ""}, [{"type": "text_delta", "text": t} for t in texts]


def events(job: Job, mid: str, created: int, parts: int) -> list[bytes]:
    """The SSE events of a streamed message, as Anthropic sends them."""
    start = _message(job, mid, [], None, 1)  # Anthropic's message_start counts 1 output
    block, pieces = _deltas(job, mid, parts)
    deltas = [
        named_sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": d})
        for d in pieces
    ]
    final_usage = {
        "input_tokens": job.prompt_tokens,
        "cache_creation_input_tokens": job.cache_write,
        "cache_read_input_tokens": job.cache_read,
        "output_tokens": job.completion_tokens,
    }
    return [
        named_sse("message_start", {"type": "message_start", "message": start}),
        named_sse(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": block},
        ),
        named_sse("ping", {"type": "ping"}),
        *deltas,
        named_sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        named_sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": job.finish_reason, "stop_sequence": None},
                "usage": final_usage,
            },
        ),
        named_sse("message_stop", {"type": "message_stop"}),
    ]


def stream_error() -> bytes:
    """`event: error`: how a Messages stream ends when Anthropic is overloaded midway."""
    error = {"type": "overloaded_error", "message": "Overloaded"}
    return named_sse("error", {"type": "error", "error": error})


def rate_limit_message(kind: str, limit: int, per_minute: float) -> str:
    return (
        "This request would exceed the rate limit for your organization (org-fake) of"
        f" {round(limit * per_minute):,} {_UNITS.get(kind, kind)} per minute. For details,"
        " refer to: https://docs.claude.com/en/api/rate-limits. You can see the response"
        " headers for current usage. Please reduce the prompt length or the maximum tokens"
        " requested, or try again later."
    )


def rfc3339(seconds_from_now: float, now: float | None = None) -> str:
    """The wall-clock time `seconds_from_now` ahead, RFC 3339 in UTC, rounded up to the
    second (so a client never resumes too early)."""
    wall = (time.time() if now is None else now) + max(0.0, seconds_from_now)
    whole = int(wall) + (wall % 1 > 0)
    return datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def limit_headers(
    windows: Mapping[str, tuple[int, int, float]], per_minute: float, now: float | None = None
) -> dict[str, str]:
    """`anthropic-ratelimit-*` from each configured window's (limit, used, reset seconds);
    `tokens-*` repeats the input or output window with the least left (Anthropic: "the most
    restrictive limit currently in effect")."""
    headers: dict[str, str] = {}
    for kind, (limit, used, reset) in windows.items():
        name = HEADER_KINDS[kind]
        headers[f"anthropic-ratelimit-{name}-limit"] = str(round(limit * per_minute))
        headers[f"anthropic-ratelimit-{name}-remaining"] = str(max(0, limit - used))
        headers[f"anthropic-ratelimit-{name}-reset"] = rfc3339(reset, now)
    tokens = [windows[k] for k in ("input_tokens", "output_tokens") if k in windows]
    if tokens:
        limit, used, reset = min(tokens, key=lambda w: w[0] - w[1])
        headers["anthropic-ratelimit-tokens-limit"] = str(round(limit * per_minute))
        headers["anthropic-ratelimit-tokens-remaining"] = str(max(0, limit - used))
        headers["anthropic-ratelimit-tokens-reset"] = rfc3339(reset, now)
    return headers
