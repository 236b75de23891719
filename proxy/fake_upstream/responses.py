"""OpenAI's Responses API, pure: request parsing, response objects, their SSE events and
the per-instance store that `GET /v1/responses/{id}` and `previous_response_id` read.

A response lives in the account that created it; one fake upstream is one account, so an
id it did not create is unknown to it (404, or 400 `previous_response_not_found`), as it
is to OpenAI. Token counts use the chat estimate (bodies.py): `instructions` and each input
item count as messages; a follow-up's input also counts the previous response's input and
output, as OpenAI bills the whole conversation.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson

from .bodies import (
    SERVER_ERROR,
    Job,
    capped_job,
    completion_text,
    estimate_chat_prompt_tokens,
    named_sse,
    split_text,
)

MIN_MAX_OUTPUT_TOKENS = 16  # OpenAI rejects a smaller max_output_tokens
# Responses kept per instance, the oldest dropped first: ~1.5 KB each, as JSON bytes.
STORE_CAPACITY = 50_000


@dataclass(frozen=True, slots=True)
class Invalid:
    """A 400 `invalid_request_error` with OpenAI's `param` and `code`."""

    message: str
    param: str | None = None
    code: str | None = None


@dataclass(slots=True)
class Stored:
    """A response as `GET` returns it (JSON), kept compact for long benchmarks."""

    response: bytes
    items: bytes  # the input items, a JSON list
    tokens: int  # input plus output: what a follow-up adds to its own input
    background: bool = False
    finished: bytes | None = None  # a queued background response, once done


@dataclass
class ResponseStore:
    """The responses this instance created (`store` not false), oldest first."""

    capacity: int = STORE_CAPACITY
    _by_id: OrderedDict[str, Stored] = field(default_factory=OrderedDict)

    def put(self, rid: str, stored: Stored) -> None:
        self._by_id[rid] = stored
        if len(self._by_id) > self.capacity:
            self._by_id.popitem(last=False)

    def peek(self, rid: str) -> Stored | None:
        """The response as stored, without finishing a queued one."""
        return self._by_id.get(rid)

    def get(self, rid: str) -> Stored | None:
        """The response; a queued background one has finished by the time it is read."""
        stored = self._by_id.get(rid)
        if stored is not None and stored.finished is not None:
            stored.response, stored.finished = stored.finished, None
        return stored

    def cancel(self, rid: str) -> bytes | Invalid | None:
        """Cancel a queued background response; None if unknown."""
        stored = self._by_id.get(rid)
        if stored is None:
            return None
        if not stored.background:
            return Invalid("Only responses created with background=true can be cancelled.")
        if stored.finished is not None:
            cancelled = {**orjson.loads(stored.response), "status": "cancelled"}
            stored.response, stored.finished = orjson.dumps(cancelled), None
        return stored.response

    def delete(self, rid: str) -> bool:
        return self._by_id.pop(rid, None) is not None

    def __len__(self) -> int:
        return len(self._by_id)


def parse(body: dict[str, Any], default_completion: int, previous: Stored | None) -> Job | Invalid:
    """A Job for `POST /v1/responses` (`previous`: the stored `previous_response_id`)."""
    messages = input_messages(body.get("input"))
    if messages is None:
        return Invalid(
            "Invalid type for 'input': expected a string or an array of input items.",
            "input",
            "invalid_type",
        )
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        return Invalid("Invalid type for 'instructions': expected a string.", "instructions")
    if isinstance(instructions, str):
        messages = [{"content": instructions}, *messages]
    requested = body.get("max_output_tokens")
    if requested is not None:
        if not isinstance(requested, int) or isinstance(requested, bool):
            return Invalid(
                "Invalid type for 'max_output_tokens': expected an integer.",
                "max_output_tokens",
                "invalid_type",
            )
        if requested < MIN_MAX_OUTPUT_TOKENS:
            return Invalid(
                "Invalid 'max_output_tokens': integer below minimum value. Expected a value"
                f" >= {MIN_MAX_OUTPUT_TOKENS}, but got {requested} instead.",
                "max_output_tokens",
                "integer_below_min_value",
            )
    prompt = estimate_chat_prompt_tokens(messages) if messages else 0
    if previous is not None:
        prompt += previous.tokens
    return capped_job(body, prompt, requested, default_completion, request=body)


def input_messages(value: object) -> list[dict[str, Any]] | None:
    """The input as chat-like messages for the token estimate; None if malformed."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"content": value}]
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        return None
    # Tool results carry their text in `output`, messages in `content`.
    return [{"content": item.get("content", item.get("output"))} for item in value]


def input_items(body: dict[str, Any], item_prefix: str) -> list[dict[str, Any]]:
    """The input as the items `GET /v1/responses/{id}/input_items` lists (with ids)."""
    value = body.get("input")
    raw: list[Any] = [{"role": "user", "content": value}] if isinstance(value, str) else []
    if isinstance(value, list):
        raw = value
    items = []
    for index, item in enumerate(raw):
        content = item.get("content")
        if isinstance(content, str):
            content = [{"type": "input_text", "text": content}]
        items.append(
            {
                "id": f"{item_prefix}{index:x}",
                "type": item.get("type", "message"),
                "role": item.get("role", "user"),
                "status": "completed",
                "content": content,
            }
            if "content" in item
            else {"id": f"{item_prefix}{index:x}", **item}
        )
    return items


def usage(job: Job) -> dict[str, Any]:
    return {
        "input_tokens": job.prompt_tokens,
        "input_tokens_details": {"cached_tokens": min(job.cache_read, job.prompt_tokens)},
        "output_tokens": job.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": job.prompt_tokens + job.completion_tokens,
    }


def response_object(
    job: Job, rid: str, created: int, status: str, output: list[dict[str, Any]]
) -> dict[str, Any]:
    """The `response` object in any state (`usage` only once it ended)."""
    body = job.request or {}
    ended = status in ("completed", "incomplete")
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "background": body.get("background") is True,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": None,
        "model": job.model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": body.get("store") is not False,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage(job) if ended else None,
        "user": None,
        "metadata": body.get("metadata") or {},
    }


def final_status(job: Job) -> str:
    return "incomplete" if job.finish_reason == "length" else "completed"


def message_item(item_id: str, status: str, text: str | None) -> dict[str, Any]:
    content = [] if text is None else [output_text(text)]
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def finished(job: Job, rid: str, created: int) -> dict[str, Any]:
    """The response as it is once generated."""
    status = final_status(job)
    item = message_item(message_id(rid), status, completion_text(job.completion_tokens))
    return response_object(job, rid, created, status, [item])


def message_id(rid: str) -> str:
    return "msg_" + rid.removeprefix("resp_")


def events(job: Job, rid: str, created: int, parts: int) -> list[bytes]:
    """The semantic SSE events of a streamed response, as OpenAI sends them (no [DONE])."""
    return replay(finished(job, rid, created), parts)


def replay(response: dict[str, Any], parts: int, after: int = -1) -> list[bytes]:
    """The events that make ``response`` (a stored one, in its final state), as a stream
    of it sends them: ``response.created`` and ``response.in_progress`` (in progress, no
    output, no usage), its message's item, part and ``parts`` text deltas, then
    ``response.completed`` / ``incomplete`` / ``failed`` with the response whole. A
    response without a message (failed, cancelled) goes from ``in_progress`` to its end
    (none for a cancelled one: OpenAI names no such event). ``after``: only the events
    whose ``sequence_number`` is greater (``starting_after``)."""
    status = response["status"]
    started = {
        **response,
        "status": "in_progress",
        "output": [],
        "usage": None,
        "error": None,
        "incomplete_details": None,
    }
    payloads: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
    ]
    message = next((item for item in response["output"] if item.get("type") == "message"), None)
    if message is not None:
        payloads.extend(_message_events(message, response.get("usage"), parts))
    if status in ("completed", "incomplete", "failed"):
        payloads.append({"type": f"response.{status}", "response": response})
    return [
        named_sse(payload["type"], {**payload, "sequence_number": number})
        for number, payload in enumerate(payloads)
        if number > after
    ]


def _message_events(
    message: dict[str, Any], used: dict[str, Any] | None, parts: int
) -> list[dict[str, Any]]:
    """A message item's events, its text in ``parts`` deltas (cut as a generated one's
    are, by its output tokens, when the text is the one they make)."""
    item_id = message["id"]
    text = "".join(p.get("text", "") for p in message["content"] if p.get("type") == "output_text")
    tokens = used.get("output_tokens") if isinstance(used, dict) else None
    if isinstance(tokens, int) and completion_text(tokens) == text:
        deltas: tuple[str, ...] = split_text(tokens, parts)
    else:
        size = -(-len(text) // parts) if parts else len(text)
        deltas = tuple(text[i : i + size] for i in range(0, len(text), size or 1))
    where = {"item_id": item_id, "output_index": 0, "content_index": 0}
    return [
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**message, "status": "in_progress", "content": []},
        },
        {"type": "response.content_part.added", **where, "part": output_text("")},
        *(
            {"type": "response.output_text.delta", **where, "delta": delta, "logprobs": []}
            for delta in deltas
        ),
        {"type": "response.output_text.done", **where, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **where, "part": output_text(text)},
        {"type": "response.output_item.done", "output_index": 0, "item": message},
    ]


def failed(job: Job, rid: str, created: int) -> dict[str, Any]:
    """The response as it is when the server failed while generating it."""
    response = response_object(job, rid, created, "failed", [])
    response["error"] = {"code": "server_error", "message": SERVER_ERROR}
    return response


def failed_event(response: dict[str, Any], sequence_number: int) -> bytes:
    """`response.failed`: how a Responses stream ends when the server fails midway."""
    payload = {"type": "response.failed", "response": response}
    return named_sse("response.failed", {**payload, "sequence_number": sequence_number})


def deleted(rid: str) -> dict[str, Any]:
    return {"id": rid, "object": "response.deleted", "deleted": True}


def item_list(items: bytes, order: str) -> dict[str, Any]:
    """`input_items` as OpenAI lists them: newest first unless `order=asc`."""
    stored: list[dict[str, Any]] = orjson.loads(items)
    data = stored if order == "asc" else stored[::-1]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": False,
    }
