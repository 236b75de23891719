"""A chat completions request as an Anthropic Messages request (pure).

Leading ``system`` / ``developer`` messages become ``system``; ``user``, ``assistant``
(its ``tool_calls`` as ``tool_use`` blocks) and ``tool`` messages (as ``tool_result``
blocks of a user turn) become turns, consecutive ones of a role merged (the Messages API
merges them too); images (``data:`` base64 or http(s) URLs) become image blocks; tools,
``tool_choice`` and ``parallel_tool_calls`` their Messages counterparts; the output cap
``max_tokens`` (required there: the proxy's default cap when the client set none).

Whatever has no faithful counterpart is refused, naming the field (refusals.py): a field
is accepted only where it is translated or at the value its absence means (``n: 1``).
docs/translation.md is the table.
"""

from __future__ import annotations

from typing import Any, NoReturn

from proxy.translate.refusals import (
    content_list,
    function_call,
    listing,
    mapping,
    only,
    refuse,
    text,
    wrong,
)

__all__ = ["UPSTREAM", "conversation", "to_messages"]

UPSTREAM = "Anthropic Messages"

# Fields read below (translated, or the model and stream the proxy reads itself).
_HANDLED = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "stop",
        "stream",
        "stream_options",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "user",
        "safety_identifier",
        "response_format",
        "service_tier",
    }
)
# Fields with no counterpart, accepted at the values that mean what their absence means.
_AT_DEFAULT: dict[str, tuple[object, ...]] = {
    "n": (1,),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "logit_bias": ({},),
    "store": (False,),
    "metadata": ({},),
    "modalities": (["text"],),
}
# Why a field is refused, where a word helps (else: no counterpart).
_WHY = {
    "n": "the Messages API answers with one choice",
    "logprobs": "the Messages API reports no log probabilities",
    "top_logprobs": "the Messages API reports no log probabilities",
    "seed": "the Messages API takes no seed",
    "reasoning_effort": "extended thinking is a token budget, not an effort",
    "store": "the Messages API stores no completions",
    "metadata": "the Messages API's metadata holds a user id only",
    "modalities": "the Messages API answers in text",
    "audio": "the Messages API answers in text",
}
_TEXT_PART = frozenset({"type", "text"})
_NO_COUNTERPART = "it has no counterpart in the Messages API"
_TOOL_CHOICES = {"none": "none", "auto": "auto", "required": "any"}
_SERVICE_TIERS = {"auto": "auto", "default": "standard_only"}
_EMPTY_SCHEMA = {"type": "object", "properties": {}}


def _refuse(param: str, why: str = _NO_COUNTERPART) -> NoReturn:
    refuse(param, why, UPSTREAM)


def _only(value: dict[str, Any], allowed: frozenset[str], param: str) -> None:
    only(value, allowed, param, _NO_COUNTERPART, UPSTREAM)


def _at_default(value: object, defaults: tuple[object, ...]) -> bool:
    return any(type(value) is type(d) and value == d for d in defaults)


def to_messages(body: dict[str, Any], default_cap: int) -> dict[str, Any]:
    """The Messages request for the chat request ``body`` (its fields the proxy reads
    already checked: shapes/openai_fields.py); ``default_cap``: its ``max_tokens`` when
    the client set no cap. Raises InvalidRequest naming the field it cannot translate."""
    for name, value in body.items():
        if value is None or name in _HANDLED:
            continue
        if not _at_default(value, _AT_DEFAULT.get(name, ())):
            _refuse(name, _WHY.get(name, _NO_COUNTERPART))
    system, messages = conversation(body.get("messages"))
    out: dict[str, Any] = {"model": body.get("model"), "max_tokens": _cap(body, default_cap)}
    if system is not None:
        out["system"] = system
    out["messages"] = messages
    _sampling(body, out)
    _tools(body, out)
    _options(body, out)
    return out


def _cap(body: dict[str, Any], default_cap: int) -> int:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is not None:  # a non-negative int (checked)
            if value == 0:
                _refuse(name, "the Messages API reads a cap of 0 as a cache warm-up")
            return int(value)
    return default_cap


def _number(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is not None and (type(value) not in (int, float)):
        wrong(name, "a number")
    return value


def _sampling(body: dict[str, Any], out: dict[str, Any]) -> None:
    temperature = _number(body, "temperature")
    if temperature is not None:
        if temperature > 1:
            _refuse("temperature", "the Messages API's range is 0 to 1")
        out["temperature"] = temperature
    top_p = _number(body, "top_p")
    if top_p is not None:
        out["top_p"] = top_p
    stop = body.get("stop")
    if isinstance(stop, str):
        out["stop_sequences"] = [stop]
    elif stop is not None:
        sequences = [text(s, f"stop[{i}]") for i, s in enumerate(listing(stop, "stop"))]
        if sequences:
            out["stop_sequences"] = sequences


def _tools(body: dict[str, Any], out: dict[str, Any]) -> None:
    tools = body.get("tools")
    if tools is not None:
        out["tools"] = [_tool(tool, i) for i, tool in enumerate(listing(tools, "tools"))]
    choice = _choice(body.get("tool_choice"))
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        wrong("parallel_tool_calls", "a boolean")
    if parallel is False and tools:
        choice = choice or {"type": "auto"}
        if choice["type"] != "none":
            choice["disable_parallel_tool_use"] = True
    if choice is not None:
        out["tool_choice"] = choice


def _tool(tool: Any, i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    tool = mapping(tool, where)
    if tool.get("type") != "function":
        _refuse(f"{where}.type", "only function tools have a counterpart")
    _only(tool, frozenset({"type", "function"}), where)
    function = mapping(tool.get("function"), f"{where}.function")
    _only(function, frozenset({"name", "description", "parameters", "strict"}), f"{where}.function")
    schema = function.get("parameters")
    translated: dict[str, Any] = {
        "name": text(function.get("name"), f"{where}.function.name"),
        "input_schema": _EMPTY_SCHEMA
        if schema is None
        else mapping(schema, f"{where}.function.parameters"),
    }
    if function.get("description") is not None:
        translated["description"] = text(function["description"], f"{where}.function.description")
    if function.get("strict") is True:
        translated["strict"] = True
    return translated


def _choice(choice: Any) -> dict[str, Any] | None:
    if choice is None:
        return None
    if isinstance(choice, str):
        mapped = _TOOL_CHOICES.get(choice)
        if mapped is None:
            wrong("tool_choice", "none, auto, required or a named function")
        return {"type": mapped}
    choice = mapping(choice, "tool_choice")
    if choice.get("type") != "function":
        _refuse("tool_choice.type", "only a named function has a counterpart")
    function = mapping(choice.get("function"), "tool_choice.function")
    return {"type": "tool", "name": text(function.get("name"), "tool_choice.function.name")}


def _options(body: dict[str, Any], out: dict[str, Any]) -> None:
    if body.get("stream") is True:
        out["stream"] = True
    options = body.get("stream_options")
    if options is not None:  # include_usage: what the client's stream shows (stream.py)
        _only(options, frozenset({"include_usage", "include_obfuscation"}), "stream_options")
    user = _user_id(body)
    if user is not None:
        out["metadata"] = {"user_id": user}
    output = _output(body.get("response_format"))
    if output is not None:
        out["output_config"] = output
    tier = body.get("service_tier")
    if tier is not None:
        mapped = _SERVICE_TIERS.get(tier) if isinstance(tier, str) else None
        if mapped is None:
            _refuse("service_tier", "only auto and default have a counterpart")
        out["service_tier"] = mapped


def _user_id(body: dict[str, Any]) -> str | None:
    user, identifier = body.get("user"), body.get("safety_identifier")
    if user is not None:
        text(user, "user")
    if identifier is not None:
        text(identifier, "safety_identifier")
        if user is not None and user != identifier:
            _refuse("safety_identifier", "the Messages API takes one user id (user differs)")
    result: str | None = identifier if identifier is not None else user
    return result


def _output(fmt: Any) -> dict[str, Any] | None:
    if fmt is None:
        return None
    fmt = mapping(fmt, "response_format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind != "json_schema":
        _refuse("response_format.type", "only a JSON schema has a counterpart")
    spec = mapping(fmt.get("json_schema"), "response_format.json_schema")
    _only(spec, frozenset({"name", "schema", "strict"}), "response_format.json_schema")
    schema = mapping(spec.get("schema"), "response_format.json_schema.schema")
    return {"format": {"type": "json_schema", "schema": schema}}


# --- the conversation ---------------------------------------------------------------


def conversation(messages: Any) -> tuple[str | list[dict[str, Any]] | None, list[dict[str, Any]]]:
    """The ``system`` prompt and the turns of chat ``messages``."""
    messages = listing(messages, "messages")
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        message = mapping(message, f"messages[{i}]")
        if message.get("role") in ("system", "developer"):
            if turns:
                _refuse(f"messages[{i}].role", "the Messages API takes system text only first")
            system.extend(_system(message, f"messages[{i}]"))
            continue
        role, blocks = _turn(message, f"messages[{i}]")
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    if messages and messages[-1].get("role") == "assistant":
        last = f"messages[{len(messages) - 1}]"
        _refuse(last, "the Messages API continues a last assistant message instead of answering")
    return _system_value(system), [_tidy(turn) for turn in turns]


def _system(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    _only(message, frozenset({"role", "content"}), where)
    content = message.get("content")
    if isinstance(content, str):
        return [_text(content)]
    parts = content_list(content, f"{where}.content")
    return [_text_part(part, f"{where}.content[{j}]") for j, part in enumerate(parts)]


def _system_value(blocks: list[dict[str, Any]]) -> str | list[dict[str, Any]] | None:
    if not blocks:
        return None
    if len(blocks) == 1:
        only_text: str = blocks[0]["text"]
        return only_text
    return blocks


def _tidy(turn: dict[str, Any]) -> dict[str, Any]:
    """A turn of one text block as a string, as clients write it."""
    content = turn["content"]
    if len(content) == 1 and content[0]["type"] == "text":
        return {"role": turn["role"], "content": content[0]["text"]}
    return turn


def _turn(message: dict[str, Any], where: str) -> tuple[str, list[dict[str, Any]]]:
    role = message.get("role")
    if role == "user":
        _only(message, frozenset({"role", "content"}), where)
        return "user", _user_content(message.get("content"), f"{where}.content")
    if role == "assistant":
        _only(message, frozenset({"role", "content", "tool_calls"}), where)
        return "assistant", _assistant(message, where)
    if role == "tool":
        _only(message, frozenset({"role", "content", "tool_call_id"}), where)
        return "user", [_tool_result(message, where)]
    if role == "function":
        _refuse(f"{where}.role", "function messages are deprecated: send tool messages")
    wrong(f"{where}.role", "system, developer, user, assistant or tool")


def _text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def _text_part(part: Any, where: str) -> dict[str, Any]:
    part = mapping(part, where)
    if part.get("type") != "text":
        _refuse(f"{where}.type", "only text parts have a counterpart here")
    _only(part, _TEXT_PART, where)
    return _text(text(part.get("text"), f"{where}.text"))


def _user_content(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [_text(content)]
    return [
        _user_part(part, f"{where}[{j}]") for j, part in enumerate(content_list(content, where))
    ]


def _user_part(part: Any, where: str) -> dict[str, Any]:
    part = mapping(part, where)
    kind = part.get("type")
    if kind == "image_url":
        _only(part, frozenset({"type", "image_url"}), where)
        return _image(part.get("image_url"), f"{where}.image_url")
    if kind != "text":
        _refuse(f"{where}.type", f"a {str(kind)[:40]!r} part has no counterpart")
    return _text_part(part, where)


def _image(spec: Any, where: str) -> dict[str, Any]:
    spec = mapping(spec, where)
    _only(spec, frozenset({"url", "detail"}), where)
    if spec.get("detail") not in (None, "auto"):
        _refuse(f"{where}.detail", "the Messages API chooses an image's resolution itself")
    url = text(spec.get("url"), f"{where}.url")
    if url.startswith("data:"):
        head, comma, data = url.partition(",")
        if not comma or not head.endswith(";base64"):
            _refuse(f"{where}.url", "only a base64 data: URL has a counterpart")
        source = {"type": "base64", "media_type": head[5:-7], "data": data}
        return {"type": "image", "source": source}
    if url.startswith(("https://", "http://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    _refuse(f"{where}.url", "only data: and http(s) URLs have a counterpart")


def _assistant(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    content = message.get("content")
    blocks: list[dict[str, Any]] = []
    if isinstance(content, str):
        blocks.append(_text(content))
    elif content is not None:
        parts = content_list(content, f"{where}.content")
        blocks.extend(_text_part(part, f"{where}.content[{j}]") for j, part in enumerate(parts))
    calls = message.get("tool_calls")
    if calls is not None:
        calls = listing(calls, f"{where}.tool_calls")
        blocks.extend(_tool_use(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(calls))
    if calls:  # an empty text beside tool calls says nothing (the Messages API refuses it)
        blocks = [b for b in blocks if b["type"] != "text" or b["text"]]
    return blocks


def _tool_use(call: Any, where: str) -> dict[str, Any]:
    call, function, given = function_call(call, where, _NO_COUNTERPART, UPSTREAM)
    if not isinstance(given, dict):
        _refuse(f"{where}.function.arguments", "a tool_use input is a JSON object")
    return {
        "type": "tool_use",
        "id": text(call.get("id"), f"{where}.id"),
        "name": text(function.get("name"), f"{where}.function.name"),
        "input": given,
    }


def _tool_result(message: dict[str, Any], where: str) -> dict[str, Any]:
    content = message.get("content")
    result: str | list[dict[str, Any]]
    if isinstance(content, str):
        result = content
    else:
        parts = content_list(content, f"{where}.content")
        result = [_text_part(part, f"{where}.content[{j}]") for j, part in enumerate(parts)]
    return {
        "type": "tool_result",
        "tool_use_id": text(message.get("tool_call_id"), f"{where}.tool_call_id"),
        "content": result,
    }
