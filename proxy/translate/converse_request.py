"""A chat completions request as AWS Bedrock's Converse API takes it (pure); the table is
docs/translation.md, the module that answers back proxy/translate/converse.py.

The conversation: leading ``system`` / ``developer`` messages are ``system`` text
blocks; ``user`` and ``assistant`` messages turns of ``text`` blocks, a user's
``image_url`` parts (base64 ``data:`` URLs only) ``image`` blocks, an assistant's
``tool_calls`` ``toolUse`` blocks; ``tool`` messages ``toolResult`` blocks of a user
turn. Consecutive turns of a role are merged into one: Converse takes alternating roles.
``tools`` are ``toolConfig.tools[].toolSpec``, ``tool_choice`` ``toolConfig.toolChoice``.
Whatever has no faithful counterpart is refused, naming the field (refusals.py).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any, NoReturn

from proxy.errors import InvalidRequest
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

__all__ = ["IMAGE_BYTES", "UPSTREAM", "to_converse"]

UPSTREAM = "Bedrock Converse"
# Bedrock's bound on one image's bytes (3.75 MB), checked here to name the field.
IMAGE_BYTES = 3_750_000
_NO_COUNTERPART = "it has no counterpart in Bedrock's Converse API"
_HANDLED = frozenset(
    (
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "stop",
        "n",
        "stream",
        "stream_options",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    )
)
# A data: URL's image type -> Converse's format (image/jpg: a common misspelling).
_FORMATS = {"png": "png", "jpeg": "jpeg", "jpg": "jpeg", "gif": "gif", "webp": "webp"}
_EMPTY_SCHEMA = {"type": "object", "properties": {}}
_TOOL_CHOICES: dict[str, dict[str, Any]] = {"auto": {"auto": {}}, "required": {"any": {}}}


def _refuse(param: str, why: str = _NO_COUNTERPART) -> NoReturn:
    refuse(param, why, UPSTREAM)


def _only(value: dict[str, Any], allowed: frozenset[str], param: str) -> None:
    only(value, allowed, param, _NO_COUNTERPART, UPSTREAM)


def to_converse(body: dict[str, Any], default_cap: int) -> dict[str, Any]:
    """A chat request as Converse's (its ``model`` kept: the wire puts it in the URL);
    ``default_cap``: its ``maxTokens`` when the client set none."""
    _only(body, _HANDLED, "")
    if body.get("n") not in (None, 1):
        _refuse("n", "Converse answers with one choice")
    if body.get("parallel_tool_calls") not in (None, True):
        _refuse("parallel_tool_calls", "Converse cannot forbid parallel tool calls")
    options = body.get("stream_options")
    if options is not None:
        _only(mapping(options, "stream_options"), frozenset({"include_usage"}), "stream_options")
    system, turns = _turns(listing(body.get("messages"), "messages"))
    out: dict[str, Any] = {
        "model": body.get("model"),
        "messages": turns,
        "inferenceConfig": _inference(body, default_cap),
    }
    if system:
        out["system"] = system
    tools = _tool_config(body.get("tools"), body.get("tool_choice"))
    if tools is not None:
        out["toolConfig"] = tools
    return out


def _inference(body: dict[str, Any], default_cap: int) -> dict[str, Any]:
    cap = body.get("max_completion_tokens", body.get("max_tokens"))
    config: dict[str, Any] = {"maxTokens": default_cap if cap is None else cap}
    for name, field in (("temperature", "temperature"), ("top_p", "topP")):
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                wrong(name, "a number")
            config[field] = value
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else listing(stop, "stop")
        config["stopSequences"] = [text(s, "stop") for s in stops]
    return config


# --- tools ------------------------------------------------------------------------------


def _tool_config(tools: Any, choice: Any) -> dict[str, Any] | None:
    if tools is None:
        if choice is not None:
            _refuse("tool_choice", "Converse takes a tool choice only beside tools")
        return None
    specs = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(listing(tools, "tools"))]
    if not specs:  # Converse's toolConfig needs one tool at least; none means none
        if choice not in (None, "none", "auto"):
            _refuse("tool_choice", "Converse takes a tool choice only beside tools")
        return None
    config: dict[str, Any] = {"tools": specs}
    if choice is not None:
        config["toolChoice"] = _choice(choice)
    return config


def _tool(tool: Any, where: str) -> dict[str, Any]:
    tool = mapping(tool, where)
    if tool.get("type") != "function":
        _refuse(f"{where}.type", "only function tools have a counterpart")
    _only(tool, frozenset({"type", "function"}), where)
    function = mapping(tool.get("function"), f"{where}.function")
    _only(function, frozenset({"name", "description", "parameters", "strict"}), f"{where}.function")
    if function.get("strict") not in (None, False):
        _refuse(f"{where}.function.strict", "Converse does not enforce a tool's schema")
    schema = function.get("parameters")
    spec: dict[str, Any] = {"name": text(function.get("name"), f"{where}.function.name")}
    if function.get("description") is not None:
        spec["description"] = text(function["description"], f"{where}.function.description")
    given = _EMPTY_SCHEMA if schema is None else mapping(schema, f"{where}.function.parameters")
    spec["inputSchema"] = {"json": given}
    return {"toolSpec": spec}


def _choice(choice: Any) -> dict[str, Any]:
    if choice == "none":
        _refuse("tool_choice", "Converse cannot forbid calling the tools it is given")
    if isinstance(choice, str):
        mapped = _TOOL_CHOICES.get(choice)
        if mapped is None:
            wrong("tool_choice", "none, auto, required or a named function")
        return mapped
    choice = mapping(choice, "tool_choice")
    if choice.get("type") != "function":
        _refuse("tool_choice.type", "only a named function has a counterpart")
    function = mapping(choice.get("function"), "tool_choice.function")
    return {"tool": {"name": text(function.get("name"), "tool_choice.function.name")}}


# --- the conversation -------------------------------------------------------------------


def _turns(messages: list[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for i, given in enumerate(messages):
        where = f"messages[{i}]"
        message = mapping(given, where)
        if message.get("role") in ("system", "developer"):
            if turns:
                _refuse(where, "Converse takes system text before the conversation only")
            _only(message, frozenset({"role", "content", "name"}), where)
            system += _texts(message.get("content"), f"{where}.content")
            continue
        role, blocks = _turn(message, where)
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return system, turns


def _turn(message: dict[str, Any], where: str) -> tuple[str, list[dict[str, Any]]]:
    role = message.get("role")
    if role == "user":
        _only(message, frozenset({"role", "content", "name"}), where)
        return "user", _texts(message.get("content"), f"{where}.content", _user_part)
    if role == "assistant":
        _only(message, frozenset({"role", "content", "name", "tool_calls"}), where)
        return "assistant", _assistant(message, where)
    if role == "tool":
        _only(message, frozenset({"role", "content", "tool_call_id"}), where)
        return "user", [_tool_result(message, where)]
    _refuse(f"{where}.role", f"the role {str(role)[:40]!r} {_NO_COUNTERPART}")


def _texts(
    content: Any, where: str, part_of: Callable[[Any, str], dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """``content`` (a string or a list of parts) as Converse blocks, each part read by
    ``part_of`` (text parts only, by default)."""
    if isinstance(content, str):
        return [{"text": content}]
    read = part_of or _text_part
    parts = content_list(content, where)
    return [read(part, f"{where}[{j}]") for j, part in enumerate(parts)]


def _text_part(part: Any, where: str) -> dict[str, Any]:
    part = mapping(part, where)
    if part.get("type") != "text":
        _refuse(f"{where}.type", f"a {str(part.get('type'))[:40]!r} part {_NO_COUNTERPART}")
    _only(part, frozenset({"type", "text"}), where)
    return {"text": text(part.get("text"), f"{where}.text")}


def _user_part(part: Any, where: str) -> dict[str, Any]:
    part = mapping(part, where)
    if part.get("type") == "image_url":
        _only(part, frozenset({"type", "image_url"}), where)
        return _image(part.get("image_url"), f"{where}.image_url")
    return _text_part(part, where)


def _image(spec: Any, where: str) -> dict[str, Any]:
    spec = mapping(spec, where)
    _only(spec, frozenset({"url", "detail"}), where)
    if spec.get("detail") not in (None, "auto"):
        _refuse(f"{where}.detail", "Converse chooses an image's resolution itself")
    url = text(spec.get("url"), f"{where}.url")
    if url.startswith(("https://", "http://")):
        _refuse(f"{where}.url", "Converse takes an image's bytes; the proxy fetches no URL")
    head, comma, data = url.partition(",")
    kind = head.removeprefix("data:image/").removesuffix(";base64")
    if not comma or head != f"data:image/{kind};base64":
        _refuse(f"{where}.url", "only a base64 data: URL of an image has a counterpart")
    image = _FORMATS.get(kind.lower())
    if image is None:
        _refuse(f"{where}.url", "Converse takes png, jpeg, gif and webp images only")
    return {"image": {"format": image, "source": {"bytes": _base64(data, f"{where}.url")}}}


def _base64(data: str, where: str) -> str:
    """``data``, checked: base64 of at most ``IMAGE_BYTES`` bytes (Converse's JSON wire
    takes an image's bytes base64-encoded, as the client sent them)."""
    if len(data) // 4 * 3 > IMAGE_BYTES + 2:  # bounded before it is decoded
        _too_large(where)
    try:
        decoded = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        wrong(where, "a data: URL of base64")
    if not decoded:
        wrong(where, "a data: URL of an image")
    if len(decoded) > IMAGE_BYTES:
        _too_large(where)
    return data


def _too_large(where: str) -> NoReturn:
    raise InvalidRequest(
        f"'{where}' is an image over Bedrock's bound of {IMAGE_BYTES:,} bytes.",
        code="image_too_large",
        param=where,
    )


def _assistant(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    content = message.get("content")
    blocks = [] if content is None else _texts(content, f"{where}.content")
    calls = message.get("tool_calls")
    if calls is None:
        return blocks
    calls = listing(calls, f"{where}.tool_calls")
    uses = [_tool_use(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(calls)]
    # An empty text beside tool calls says nothing (Converse refuses a blank text block).
    return [b for b in blocks if b["text"]] + uses if uses else blocks


def _tool_use(call: Any, where: str) -> dict[str, Any]:
    call, function, given = function_call(call, where, _NO_COUNTERPART, UPSTREAM)
    if not isinstance(given, dict):
        wrong(f"{where}.function.arguments", "a JSON object (Converse's toolUse input is one)")
    return {
        "toolUse": {
            "toolUseId": text(call.get("id"), f"{where}.id"),
            "name": text(function.get("name"), f"{where}.function.name"),
            "input": given,
        }
    }


def _tool_result(message: dict[str, Any], where: str) -> dict[str, Any]:
    content = message.get("content")
    texts = _texts("" if content is None else content, f"{where}.content")
    return {
        "toolResult": {
            "toolUseId": text(message.get("tool_call_id"), f"{where}.tool_call_id"),
            "content": texts or [{"text": ""}],
        }
    }
