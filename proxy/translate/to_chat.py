"""An Anthropic Messages request as a chat completions request (pure).

``system`` becomes a leading system message (a ``system`` message among the turns stays
where it is); user turns become user messages, their ``tool_result`` blocks tool messages
(in their order: the blocks around them user messages of their own); assistant turns
assistant messages, their ``tool_use`` blocks ``tool_calls``; image blocks ``image_url``
parts (base64 as a ``data:`` URL); ``max_tokens`` becomes ``max_completion_tokens``;
tools and ``tool_choice`` (``disable_parallel_tool_use``: ``parallel_tool_calls: false``)
their chat counterparts; a stream asks for its usage (``stream_options.include_usage``),
which the answer's ``message_delta`` carries.

``cache_control`` (a block's, a tool's, the request's) is a caching hint the chat
completions API needs no counterpart of (its upstreams cache prompts themselves): it is
accepted and not sent. Whatever else has no faithful counterpart is refused, naming the
field (refusals.py). docs/translation.md is the table.
"""

from __future__ import annotations

from typing import Any, NoReturn

import orjson

from proxy.translate.refusals import content_list, listing, mapping, only, refuse, text, wrong

__all__ = ["UPSTREAM", "conversation", "to_chat"]

UPSTREAM = "OpenAI chat completions"

_HANDLED = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "stop_sequences",
        "temperature",
        "top_p",
        "stream",
        "tools",
        "tool_choice",
        "metadata",
        "service_tier",
        "thinking",
        "output_config",
        "speed",
        "cache_control",
    }
)
_WHY = {
    "top_k": "chat completions sample by temperature and top_p only",
    "container": "chat completions run no code containers",
    "mcp_servers": "chat completions call no MCP servers",
    "inference_geo": "chat completions choose no inference region",
}
_NO_COUNTERPART = "it has no counterpart in chat completions"
_TEXT_BLOCK = frozenset({"type", "text", "cache_control", "citations"})
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
_SERVICE_TIERS = {"auto": "auto", "standard_only": "default"}
_OUTPUT_NAME = "output"  # a chat json_schema is named; the Messages API's is not


def _refuse(param: str, why: str = _NO_COUNTERPART) -> NoReturn:
    refuse(param, why, UPSTREAM)


def _only(value: dict[str, Any], allowed: frozenset[str], param: str) -> None:
    only(value, allowed, param, _NO_COUNTERPART, UPSTREAM)


def to_chat(body: dict[str, Any], default_cap: int) -> dict[str, Any]:
    """The chat request for the Messages request ``body`` (its fields the proxy reads
    already checked: shapes/anthropic.check_fields, ``max_tokens`` required).
    Raises InvalidRequest naming the field it cannot translate."""
    for name, value in body.items():
        if value is not None and name not in _HANDLED:
            _refuse(name, _WHY.get(name, _NO_COUNTERPART))
    out: dict[str, Any] = {
        "model": body.get("model"),
        "messages": conversation(body),
        "max_completion_tokens": body.get("max_tokens", default_cap),
    }
    _sampling(body, out)
    _tools(body, out)
    _options(body, out)
    return out


def _sampling(body: dict[str, Any], out: dict[str, Any]) -> None:
    for name in ("temperature", "top_p"):  # 0..1 both ways (chat's temperature: 0..2)
        value = body.get(name)
        if value is not None:
            if type(value) not in (int, float):
                wrong(name, "a number")
            out[name] = value
    stop = body.get("stop_sequences")
    if stop is not None:
        stops = listing(stop, "stop_sequences")
        sequences = [text(s, f"stop_sequences[{i}]") for i, s in enumerate(stops)]
        if sequences:
            out["stop"] = sequences


def _tools(body: dict[str, Any], out: dict[str, Any]) -> None:
    tools = body.get("tools")
    if tools is not None:
        out["tools"] = [_tool(tool, i) for i, tool in enumerate(listing(tools, "tools"))]
    choice = body.get("tool_choice")
    if choice is None:
        return
    choice = mapping(choice, "tool_choice")
    _only(choice, frozenset({"type", "name", "disable_parallel_tool_use"}), "tool_choice")
    kind = choice.get("type")
    if kind == "tool":
        name = text(choice.get("name"), "tool_choice.name")
        out["tool_choice"] = {"type": "function", "function": {"name": name}}
    elif isinstance(kind, str) and kind in _TOOL_CHOICES:
        out["tool_choice"] = _TOOL_CHOICES[kind]
    else:
        wrong("tool_choice.type", "auto, any, tool or none")
    if choice.get("disable_parallel_tool_use") is True and tools:
        out["parallel_tool_calls"] = False


def _tool(tool: Any, i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    tool = mapping(tool, where)
    if tool.get("type") not in (None, "custom"):
        _refuse(f"{where}.type", "server tools have no counterpart")
    allowed = {"type", "name", "description", "input_schema", "strict", "cache_control"}
    _only(tool, frozenset(allowed | {"eager_input_streaming"}), where)
    function: dict[str, Any] = {
        "name": text(tool.get("name"), f"{where}.name"),
        "parameters": mapping(tool.get("input_schema"), f"{where}.input_schema"),
    }
    if tool.get("description") is not None:
        function["description"] = text(tool["description"], f"{where}.description")
    if tool.get("strict") is True:
        function["strict"] = True
    return {"type": "function", "function": function}


def _options(body: dict[str, Any], out: dict[str, Any]) -> None:
    if body.get("stream") is True:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}  # the message_delta's usage
    metadata = body.get("metadata")
    if metadata is not None:
        _only(mapping(metadata, "metadata"), frozenset({"user_id"}), "metadata")
        if metadata.get("user_id") is not None:
            out["user"] = text(metadata["user_id"], "metadata.user_id")
    tier = body.get("service_tier")
    if tier is not None:
        out["service_tier"] = _service_tier(tier)
    thinking = body.get("thinking")
    if thinking is not None and mapping(thinking, "thinking").get("type") != "disabled":
        _refuse("thinking", "chat completions take no thinking configuration")
    if body.get("speed") not in (None, "standard"):
        _refuse("speed", "chat completions have no fast mode")
    output = body.get("output_config")
    if output is not None:
        _format(mapping(output, "output_config"), out)


def _service_tier(tier: object) -> str:
    if not isinstance(tier, str) or tier not in _SERVICE_TIERS:
        wrong("service_tier", "auto or standard_only")
    return _SERVICE_TIERS[tier]


def _format(output: dict[str, Any], out: dict[str, Any]) -> None:
    _only(output, frozenset({"format"}), "output_config")
    fmt = output.get("format")
    if fmt is None:
        return
    fmt = mapping(fmt, "output_config.format")
    if fmt.get("type") != "json_schema":
        wrong("output_config.format.type", "json_schema")
    _only(fmt, frozenset({"type", "schema"}), "output_config.format")
    schema = mapping(fmt.get("schema"), "output_config.format.schema")
    spec = {"name": _OUTPUT_NAME, "schema": schema, "strict": True}
    out["response_format"] = {"type": "json_schema", "json_schema": spec}


# --- the conversation ---------------------------------------------------------------


def conversation(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of a Messages request's ``system`` and ``messages``."""
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        out.append({"role": "system", "content": _plain(system, "system")})
    messages = listing(body.get("messages"), "messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        message = mapping(message, where)
        _only(message, frozenset({"role", "content"}), where)
        role, content = message.get("role"), message.get("content")
        if role == "user":
            out.extend(_user(content, f"{where}.content"))
        elif role == "assistant":
            out.append(_assistant(content, f"{where}.content"))
        elif role == "system":
            out.append({"role": "system", "content": _plain(content, f"{where}.content")})
        else:
            wrong(f"{where}.role", "user, assistant or system")
    if messages and messages[-1].get("role") == "assistant":
        last = f"messages[{len(messages) - 1}]"
        _refuse(last, "a last assistant message is continued (prefill), chat answers it instead")
    return out


def _text_of(block: dict[str, Any], where: str) -> str:
    _only(block, _TEXT_BLOCK, where)
    if block.get("citations"):
        _refuse(f"{where}.citations", "chat completions take no citations")
    return text(block.get("text"), f"{where}.text")


def _plain(content: Any, where: str) -> str | list[dict[str, Any]]:
    """Text content: a string, or text blocks as text parts."""
    if isinstance(content, str):
        return content
    parts = []
    for j, block in enumerate(content_list(content, where)):
        block = mapping(block, f"{where}[{j}]")
        if block.get("type") != "text":
            _refuse(f"{where}[{j}].type", "only text has a counterpart here")
        parts.append({"type": "text", "text": _text_of(block, f"{where}[{j}]")})
    return parts


def _user(content: Any, where: str) -> list[dict[str, Any]]:
    """A user turn: its tool results as tool messages, the blocks around them as user
    messages, in their order."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    messages: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(content_list(content, where)):
        at = f"{where}[{j}]"
        block = mapping(block, at)
        kind = block.get("type")
        if kind == "tool_result":
            if parts:
                messages.append({"role": "user", "content": parts})
                parts = []
            messages.append(_tool_message(block, at))
        elif kind == "text":
            parts.append({"type": "text", "text": _text_of(block, at)})
        elif kind == "image":
            parts.append(_image(block, at))
        else:
            _refuse(f"{at}.type", f"a {str(kind)[:40]!r} block has no counterpart")
    if parts:
        messages.append({"role": "user", "content": parts})
    return messages


def _tool_message(block: dict[str, Any], where: str) -> dict[str, Any]:
    allowed = frozenset({"type", "tool_use_id", "content", "is_error", "cache_control"})
    _only(block, allowed, where)
    if block.get("is_error") is True:
        _refuse(f"{where}.is_error", "a chat tool message carries no error flag")
    content = block.get("content")
    return {
        "role": "tool",
        "tool_call_id": text(block.get("tool_use_id"), f"{where}.tool_use_id"),
        "content": "" if content is None else _plain(content, f"{where}.content"),
    }


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    _only(block, frozenset({"type", "source", "cache_control"}), where)
    source = mapping(block.get("source"), f"{where}.source")
    kind = source.get("type")
    if kind == "base64":
        media = text(source.get("media_type"), f"{where}.source.media_type")
        url = f"data:{media};base64,{text(source.get('data'), f'{where}.source.data')}"
    elif kind == "url":
        url = text(source.get("url"), f"{where}.source.url")
    else:
        _refuse(f"{where}.source.type", "only base64 and url images have a counterpart")
    return {"type": "image_url", "image_url": {"url": url}}


def _assistant(content: Any, where: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content_list(content, where)):
        at = f"{where}[{j}]"
        block = mapping(block, at)
        kind = block.get("type")
        if kind == "text":
            texts.append({"type": "text", "text": _text_of(block, at)})
        elif kind == "tool_use":
            calls.append(_tool_call(block, at))
        else:
            _refuse(f"{at}.type", f"a {str(kind)[:40]!r} block has no counterpart")
    message: dict[str, Any] = {"role": "assistant", "content": _joined(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def _joined(texts: list[dict[str, Any]]) -> str | list[dict[str, Any]] | None:
    if not texts:
        return None
    if len(texts) == 1:
        first: str = texts[0]["text"]
        return first
    return texts


def _tool_call(block: dict[str, Any], where: str) -> dict[str, Any]:
    _only(block, frozenset({"type", "id", "name", "input", "cache_control"}), where)
    given = mapping(block.get("input"), f"{where}.input")
    return {
        "id": text(block.get("id"), f"{where}.id"),
        "type": "function",
        "function": {
            "name": text(block.get("name"), f"{where}.name"),
            "arguments": orjson.dumps(given).decode(),
        },
    }
