"""Parsing of OpenAI request bodies and rendering of OpenAI-shaped answers (pure).

Token counts are estimates, not a tokenizer: prompt text counts ~4 characters a token,
plus 3 tokens per chat message and 3 for the reply (as OpenAI's cookbook counts), and each
completion "token" is one word of a fixed lorem-ipsum text.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

SYSTEM_FINGERPRINT = "fp_fake_upstream"
MAX_EMBEDDING_DIMS = 4096

_TEXT = (
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor "
    "incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud "
    "exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat."
)
_WORDS = tuple(_TEXT.split())


@dataclass(slots=True)
class Job:
    """What one inference request asks for, reduced to what the answer needs."""

    model: str
    prompt_tokens: int
    completion_tokens: int  # what the answer will contain (0 for embeddings)
    cost: int  # tokens charged against the tpm limit: prompt + max_tokens (as OpenAI)
    stream: bool = False
    include_usage: bool = False
    finish_reason: str = "stop"
    inputs: tuple[Any, ...] = ()  # embeddings only
    dims: int = 0
    base64: bool = False
    max_output: int = 0  # the output cap at admission (max_tokens or the default)
    cache_read: int = 0  # input tokens reported as read from a prompt cache
    cache_write: int = 0  # input tokens reported as written to it (Anthropic only)
    # What its admission caches (prompt_cache.py): (digest, lifetime) per prefix.
    cache_entries: tuple[tuple[bytes, float], ...] = ()
    request: dict[str, Any] | None = None  # the body, for answers that quote it
    tool: str | None = None  # the tool it calls instead of answering in text (tool_call)


# ---------------------------------------------------------------- request parsing


def parse_chat(body: dict[str, Any], default_completion: int) -> Job | str:
    """A Job for a chat completion request, or an error message for a 400."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    prompt = estimate_chat_prompt_tokens(messages)
    job = _generation_job(body, prompt, default_completion, "max_completion_tokens")
    if isinstance(job, Job):
        last = messages[-1]
        job.tool = tool_call(body, isinstance(last, dict) and last.get("role") == "tool")
        if job.tool is not None:
            job.finish_reason = "tool_calls"
    return job


# ---------------------------------------------------------------- tools


def tool_call(body: dict[str, Any], last_is_result: bool) -> str | None:
    """The tool a request with ``tools`` is answered with a call of, in either API's
    shape: the one ``tool_choice`` names, else the first; none when ``tool_choice`` says
    none, or (``auto``) when the last message is a tool's result (answered in text)."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools or not isinstance(tools[0], dict):
        return None
    choice = body.get("tool_choice", "auto")
    if not isinstance(choice, dict):
        choice = {"type": choice}
    kind = choice.get("type")
    if kind == "none" or (kind == "auto" and last_is_result):
        return None
    return _name(choice) or _name(tools[0])


def _name(entry: dict[str, Any]) -> str | None:
    """A tool's or a tool choice's name: the Messages API's (``name``) or chat's
    (``function.name``)."""
    function = entry.get("function")
    name = entry.get("name") or (function.get("name") if isinstance(function, dict) else None)
    return str(name) if name else None


def tool_arguments(job: Job) -> str:
    """The arguments of a job's tool call: its completion text as ``input``."""
    return orjson.dumps({"input": completion_text(job.completion_tokens)}).decode()


def split_arguments(arguments: str, parts: int) -> list[str]:
    """``arguments`` cut into ``parts`` pieces (streamed one by one)."""
    step = max(1, -(-len(arguments) // max(parts, 1)))
    return [arguments[i : i + step] for i in range(0, len(arguments), step)]


def parse_completion(body: dict[str, Any], default_completion: int) -> Job | str:
    prompt = estimate_input_tokens(body.get("prompt"))
    if prompt is None:
        return "'prompt' must be a string, an array of strings or of token arrays"
    return _generation_job(body, prompt, default_completion, "max_tokens")


def parse_embedding(body: dict[str, Any], default_dims: int) -> Job | str:
    raw = body.get("input")
    prompt = estimate_input_tokens(raw)
    if prompt is None:
        return "'input' must be a string, an array of strings or of token arrays"
    dims = body.get("dimensions", default_dims)
    if not _is_int(dims) or not 1 <= dims <= MAX_EMBEDDING_DIMS:
        return f"'dimensions' must be an integer in 1..{MAX_EMBEDDING_DIMS}"
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        return "'encoding_format' must be 'float' or 'base64'"
    inputs = tuple(raw) if isinstance(raw, list) and not _is_token_array(raw) else (raw,)
    model = body["model"]
    return Job(model, prompt, 0, prompt, inputs=inputs, dims=dims, base64=encoding == "base64")


def _generation_job(
    body: dict[str, Any], prompt: int, default_completion: int, max_field: str
) -> Job | str:
    requested = body.get(max_field, body.get("max_tokens"))
    if requested is not None and (not _is_int(requested) or requested < 1):
        return f"'{max_field}' must be a positive integer"
    options = body.get("stream_options")
    stream = body.get("stream") is True
    include_usage = stream and isinstance(options, dict) and options.get("include_usage") is True
    return capped_job(body, prompt, requested, default_completion, include_usage=include_usage)


def capped_job(
    body: dict[str, Any],
    prompt: int,
    requested: int | None,
    default_completion: int,
    finish: tuple[str, str] = ("length", "stop"),
    **extra: Any,
) -> Job:
    """A generation: `default_completion` tokens, cut to the cap the request sets (then
    the first `finish` reason, else the second); the tpm cost counts the cap."""
    max_output = default_completion if requested is None else requested
    completion = min(max_output, default_completion)
    cut, whole = finish
    return Job(
        body["model"],
        prompt,
        completion,
        prompt + max_output,
        body.get("stream") is True,
        finish_reason=cut if completion < default_completion else whole,
        max_output=max_output,
        **extra,
    )


def estimate_chat_prompt_tokens(messages: list[Any]) -> int:
    """ceil(characters of all text content / 4) + 3 per message + 3."""
    chars = 0
    for message in messages:
        if isinstance(message, dict):
            chars += _content_chars(message.get("content"))
    return math.ceil(chars / 4) + 3 * len(messages) + 3


def estimate_input_tokens(value: object) -> int | None:
    """Tokens of a completions `prompt` / embeddings `input`; None if malformed."""
    if isinstance(value, str):
        return max(1, math.ceil(len(value) / 4))
    if not isinstance(value, list) or not value:
        return None
    if _is_token_array(value):
        return len(value)
    total = 0
    for item in value:
        if isinstance(item, str):
            total += max(1, math.ceil(len(item) / 4))
        elif isinstance(item, list) and _is_token_array(item):
            total += len(item)
        else:
            return None
    return total


def _content_chars(content: object) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):  # multi-part content: count the text parts
        return sum(
            len(part["text"])
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return 0


def _is_token_array(value: list[Any]) -> bool:
    return bool(value) and all(_is_int(v) for v in value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ---------------------------------------------------------------- generated text


@lru_cache(maxsize=256)
def _pieces(tokens: int) -> tuple[str, ...]:
    """`tokens` words, each but the first with its leading space (so pieces concatenate)."""
    words = [_WORDS[i % len(_WORDS)] for i in range(tokens)]
    return tuple(word if i == 0 else " " + word for i, word in enumerate(words))


@lru_cache(maxsize=256)
def completion_text(tokens: int) -> str:
    return "".join(_pieces(tokens))


@lru_cache(maxsize=256)
def split_text(tokens: int, parts: int) -> tuple[str, ...]:
    """The completion text cut into exactly `parts` deltas (some empty if tokens < parts)."""
    pieces = _pieces(tokens)
    bounds = [tokens * i // parts for i in range(parts + 1)]
    return tuple("".join(pieces[bounds[i] : bounds[i + 1]]) for i in range(parts))


# ---------------------------------------------------------------- answers


def usage(job: Job) -> dict[str, Any]:
    return {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": job.completion_tokens,
        "total_tokens": job.prompt_tokens + job.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def chat_completion(job: Job, rid: str, created: int) -> bytes:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": completion_text(job.completion_tokens),
        "refusal": None,
        "annotations": [],
    }
    if job.tool is not None:
        function = {"name": job.tool, "arguments": tool_arguments(job)}
        call = {"id": f"call_{rid[-12:]}", "type": "function", "function": function}
        message.update(content=None, tool_calls=[call])
    return orjson.dumps(
        {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": job.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": job.finish_reason,
                }
            ],
            "usage": usage(job),
            "service_tier": "default",
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }
    )


def chat_chunks(job: Job, rid: str, created: int, parts: int) -> list[bytes]:
    """All SSE events of a streamed chat completion, `[DONE]` included.

    A role chunk, `parts` content chunks, a finish chunk, then (with include_usage only)
    a usage chunk with no choices, as OpenAI streams them.
    """
    head = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": job.model,
        "service_tier": "default",
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }
    tail: dict[str, Any] = {"usage": None} if job.include_usage else {}

    def event(delta: dict[str, Any], finish: str | None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return sse({**head, "choices": [choice], **tail})

    events = [event({"role": "assistant", "content": "", "refusal": None}, None)]
    if job.tool is not None:
        function = {"name": job.tool, "arguments": ""}
        call = {"index": 0, "id": f"call_{rid[-12:]}", "type": "function", "function": function}
        events.append(event({"tool_calls": [call]}, None))
        events.extend(
            event({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}, None)
            for piece in split_arguments(tool_arguments(job), parts)
        )
    else:
        events.extend(
            event({"content": text}, None) for text in split_text(job.completion_tokens, parts)
        )
    events.append(event({}, job.finish_reason))
    if job.include_usage:
        events.append(sse({**head, "choices": [], "usage": usage(job)}))
    events.append(SSE_DONE)
    return events


def text_completion(job: Job, rid: str, created: int) -> bytes:
    choice = {
        "text": completion_text(job.completion_tokens),
        "index": 0,
        "logprobs": None,
        "finish_reason": job.finish_reason,
    }
    return orjson.dumps(
        {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": job.model,
            "choices": [choice],
            "usage": _plain_usage(job),
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }
    )


def completion_chunks(job: Job, rid: str, created: int, parts: int) -> list[bytes]:
    """`parts` text chunks, a finish chunk, the usage chunk if asked for, `[DONE]`."""
    head = {"id": rid, "object": "text_completion", "created": created, "model": job.model}
    tail: dict[str, Any] = {"usage": None} if job.include_usage else {}

    def event(text: str, finish: str | None) -> bytes:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}
        return sse({**head, "choices": [choice], **tail})

    events = [event(text, None) for text in split_text(job.completion_tokens, parts)]
    events.append(event("", job.finish_reason))
    if job.include_usage:
        events.append(sse({**head, "choices": [], "usage": _plain_usage(job)}))
    events.append(SSE_DONE)
    return events


def embeddings(job: Job) -> bytes:
    data = [
        {"object": "embedding", "index": i, "embedding": _embedding(item, job.dims, job.base64)}
        for i, item in enumerate(job.inputs)
    ]
    return orjson.dumps(
        {
            "object": "list",
            "data": data,
            "model": job.model,
            "usage": {"prompt_tokens": job.prompt_tokens, "total_tokens": job.prompt_tokens},
        }
    )


def _embedding(item: object, dims: int, as_base64: bool) -> list[float] | str:
    """A unit vector derived from a hash of the input: same input, same vector."""
    seed = item.encode() if isinstance(item, str) else orjson.dumps(item)
    raw = hashlib.shake_128(seed).digest(2 * dims)
    values = [v / 32768.0 for v in struct.unpack(f"<{dims}h", raw)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    vector = [v / norm for v in values]
    if as_base64:  # the openai SDK asks for base64 float32 by default
        return base64.b64encode(struct.pack(f"<{dims}f", *vector)).decode()
    return vector


def _plain_usage(job: Job) -> dict[str, int]:
    return {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": job.completion_tokens,
        "total_tokens": job.prompt_tokens + job.completion_tokens,
    }


def models_list(models: tuple[str, ...], created: int) -> bytes:
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": "fake-upstream"}
        for name in models
    ]
    return orjson.dumps({"object": "list", "data": data})


def error_body(
    message: str, type_: str, code: str | None = None, param: str | None = None
) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    )


SSE_DONE = b"data: [DONE]\n\n"
SERVER_ERROR = "The server had an error while processing your request. Sorry about that!"


def stream_error() -> bytes:
    """The error chunk OpenAI sends when a chat or completions stream fails midway."""
    return sse(orjson.loads(error_body(SERVER_ERROR, "server_error")))


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def named_sse(event: str, payload: dict[str, Any]) -> bytes:
    """An SSE event with an `event:` line (the Responses and Messages APIs name theirs)."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
