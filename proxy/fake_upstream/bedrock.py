"""AWS Bedrock's side of the fake upstream: InvokeModel's paths, SigV4 checked, the
Messages body as Bedrock takes it, answers as Bedrock's (the event stream encoded), and
its errors (``{"message"}`` with ``x-amzn-errortype``).

``/model/{modelId}/invoke`` and ``/model/{modelId}/invoke-with-response-stream`` are
always served (their paths are their own). Every request must be signed with SigV4 for
the service ``bedrock``; with ``aws_access_key_id`` and ``aws_secret_access_key``
configured, the signature is recomputed with botocore from them and must match (403
``InvalidSignatureException`` otherwise), and its date must be within 5 minutes of now.
The body is the Messages API's without ``model`` and ``stream`` (Bedrock refuses both as
extraneous keys) and with ``anthropic_version: bedrock-2023-05-31`` (beta flags, if any, in
an ``anthropic_beta`` list of strings).

``/model/{modelId}/converse`` and ``/converse-stream``: Converse's body (``messages`` of
``text``, ``image``, ``toolUse`` and ``toolResult`` blocks, roles alternating, a user's
first; ``system``; ``toolConfig``, required beside tool blocks; ``inferenceConfig``)
answered as the Messages API's would be (a scripted tool call when it has tools and its
last turn holds no tool result), in Converse's shape and events.
"""

from __future__ import annotations

import base64
import hmac
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from proxy.providers.bedrock import quiet_signer
from proxy.providers.eventstream import encode_message

__all__ = [
    "ANTHROPIC_VERSION",
    "EVENTSTREAM_HEADERS",
    "body_problem",
    "error",
    "exception_message",
    "frames",
    "signature_problem",
]

ANTHROPIC_VERSION = "bedrock-2023-05-31"
EVENTSTREAM_HEADERS = {"Content-Type": "application/vnd.amazon.eventstream"}
_ERROR_NAMESPACE = "http://internal.amazon.com/coral/com.amazon.bedrock/"
_SKEW = 300.0  # seconds a signature's date may be off (AWS: "Signature expired")
_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/,\s]+)/(?P<date>\d{8})/(?P<region>[a-z0-9-]+)"
    r"/(?P<service>[a-z0-9-]+)/aws4_request, ?SignedHeaders=(?P<signed>[a-z0-9;-]+),"
    r" ?Signature=(?P<signature>[0-9a-f]{64})"
)
_CHUNK = {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}

# Bedrock's errors: the status of each and its message.
_ERRORS = {
    "ThrottlingException": (429, "Too many requests, please wait before trying again."),
    "ServiceUnavailableException": (503, "Bedrock is unable to process your request."),
    "InternalServerException": (500, "Internal server error"),
    "ValidationException": (400, "Malformed input request"),
    "InvalidSignatureException": (
        403,
        "The request signature we calculated does not match the signature you provided.",
    ),
    "MissingAuthenticationTokenException": (403, "Missing Authentication Token"),
    "ResourceNotFoundException": (404, "The model identifier is not found."),
}
ERROR_BY_STATUS = {429: "ThrottlingException", 503: "ServiceUnavailableException"}


def error(name: str, detail: str = "") -> tuple[int, bytes, dict[str, str]]:
    """A Bedrock error: its status, its body and its headers."""
    status, message = _ERRORS[name]
    body = orjson.dumps({"message": f"{message} {detail}".strip()})
    return status, body, {"x-amzn-errortype": f"{name}:{_ERROR_NAMESPACE}"}


def server_error(status: int) -> tuple[int, bytes, dict[str, str]]:
    """A fault's error as Bedrock answers it (503: ServiceUnavailableException)."""
    _, body, headers = error(ERROR_BY_STATUS.get(status, "InternalServerException"))
    return status, body, headers


def signature_problem(
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    key: str | None,
    secret: str | None,
) -> str | None:
    """Why a request's SigV4 signature is refused (an ``error`` name); None: accepted.
    ``url`` as the request's line sent it (its path escaped as it was)."""
    found = _AUTHORIZATION.fullmatch(headers.get("authorization", "").strip())
    if found is None or found["service"] != "bedrock" or "x-amz-date" not in headers:
        return "MissingAuthenticationTokenException"
    if key is None or secret is None:
        return None  # no keys configured: any well-formed signature will do
    if not hmac.compare_digest(found["key"].encode(), key.encode()):
        return "InvalidSignatureException"
    try:
        when = datetime.strptime(headers["x-amz-date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "InvalidSignatureException"
    if abs(when.timestamp() - datetime.now(UTC).timestamp()) > _SKEW:
        return "InvalidSignatureException"
    expected = _signature(method, url, headers, body, found, secret)
    if not hmac.compare_digest(expected.encode(), found["signature"].encode()):
        return "InvalidSignatureException"
    return None


def _signature(
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    found: re.Match[str],
    secret: str,
) -> str:
    """The signature botocore computes over the headers the request says it signed."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    quiet_signer()  # its DEBUG lines quote the session token
    signed = {name: headers.get(name, "") for name in found["signed"].split(";")}
    request = AWSRequest(method=method, url=url, data=body, headers=signed)
    request.context["timestamp"] = headers["x-amz-date"]
    token = headers.get("x-amz-security-token")
    auth = SigV4Auth(Credentials(found["key"], secret, token), "bedrock", found["region"])
    canonical = auth.canonical_request(request)
    return str(auth.signature(auth.string_to_sign(request, canonical), request))


def body_problem(body: dict[str, Any]) -> str | None:
    """What Bedrock's validation says of a Messages body sent to InvokeModel."""
    extraneous = [name for name in ("model", "stream") if name in body]
    if extraneous:
        return f"#: extraneous key [{extraneous[0]}] is not permitted"
    if body.get("anthropic_version") != ANTHROPIC_VERSION:
        return "#: required key [anthropic_version] not found or not bedrock-2023-05-31"
    betas = body.get("anthropic_beta", [])
    if not isinstance(betas, list) or not all(isinstance(flag, str) for flag in betas):
        return "#/anthropic_beta: expected type: JSONArray of strings"
    return None


def frames(events: list[bytes]) -> list[bytes]:
    """A Messages stream's SSE events as InvokeModelWithResponseStream's messages: each
    event's JSON, base64 in a ``chunk``; the last (``message_stop``) with Bedrock's
    ``amazon-bedrock-invocationMetrics``."""
    out = []
    for event in events:
        data = orjson.loads(event.split(b"data: ", 1)[1])
        if data.get("type") == "message_stop":
            data["amazon-bedrock-invocationMetrics"] = {"invocationLatency": 1}
        part = {"bytes": base64.b64encode(orjson.dumps(data)).decode()}
        out.append(encode_message(_CHUNK, orjson.dumps(part)))
    return out


def exception_message(name: str, message: str) -> bytes:
    """An event stream's exception (``throttlingException``...): how Bedrock ends a
    stream that fails midway."""
    headers = {
        ":exception-type": name,
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    return encode_message(headers, orjson.dumps({"message": message}))


# --- the Converse API ---------------------------------------------------------------------


class _Invalid(ValueError):
    """What Bedrock's validation says of a Converse body."""


_FORMATS = frozenset(("png", "jpeg", "gif", "webp"))
_CHOICES = {"auto": "auto", "any": "any", "tool": "tool"}


def messages_body(body: dict[str, Any], default_cap: int) -> dict[str, Any] | str:
    """A Converse request as the Messages API's body (what the fake answers from), or
    what Bedrock's validation says of it."""
    extraneous = [name for name in ("model", "stream", "anthropic_version") if name in body]
    if extraneous:
        return f"Unexpected field: {extraneous[0]}"
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        return "messages: must be a non-empty list"
    try:
        messages = _conversation(turns)
        system = [_text(block) for block in body.get("system", [])]
        tools = _tool_config(body.get("toolConfig"), messages)
    except _Invalid as invalid:
        return str(invalid)
    except (KeyError, TypeError, AttributeError, ValueError):
        return "messages: each needs a role and content blocks of a known shape"
    config = body.get("inferenceConfig") or {}
    cap = config.get("maxTokens", default_cap) if isinstance(config, dict) else None
    out: dict[str, Any] = {"messages": messages, "max_tokens": cap, **tools}
    if system:
        out["system"] = system
    return out


def _conversation(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The turns as the Messages API's: they alternate, a user's first, as Converse
    requires; a toolResult answers a toolUse of the turn before it."""
    messages: list[dict[str, Any]] = []
    for i, turn in enumerate(turns):
        role = turn["role"]
        if role != ("user", "assistant")[i % 2]:
            raise _Invalid("A conversation must alternate between user and assistant roles.")
        blocks = [_block(block, role) for block in turn["content"]]
        asked = {b["id"] for b in messages[-1]["content"] if b["type"] == "tool_use"} if i else ()
        for block in blocks:
            if block["type"] == "tool_result" and block["tool_use_id"] not in asked:
                raise _Invalid("A toolResult's toolUseId matches no toolUse of the turn before.")
        messages.append({"role": role, "content": blocks})
    return messages


def _text(block: dict[str, Any]) -> dict[str, Any]:
    said = block["text"]
    if not isinstance(said, str) or not said.strip():
        raise _Invalid("The text field in the ContentBlock object is blank.")
    return {"type": "text", "text": said}


def _block(block: dict[str, Any], role: str) -> dict[str, Any]:
    """One content block as the Messages API's (each kind in the role Converse takes it)."""
    if "text" in block:
        return _text(block)
    if "image" in block and role == "user":
        return _image(block["image"])
    if "toolUse" in block and role == "assistant":
        use = block["toolUse"]
        if not isinstance(use["input"], dict):
            raise _Invalid("A toolUse's input must be an object.")
        return {
            "type": "tool_use",
            "id": use["toolUseId"],
            "name": use["name"],
            "input": use["input"],
        }
    if "toolResult" in block and role == "user":
        result = block["toolResult"]
        content = [{"type": "text", "text": str(part["text"])} for part in result["content"]]
        return {"type": "tool_result", "tool_use_id": result["toolUseId"], "content": content}
    raise _Invalid(f"A {role} turn cannot hold the content block {sorted(block)[:1]}.")


def _image(image: dict[str, Any]) -> dict[str, Any]:
    if image["format"] not in _FORMATS:
        raise _Invalid("An image's format must be png, jpeg, gif or webp.")
    try:
        data = base64.b64decode(image["source"]["bytes"], validate=True)
    except (ValueError, TypeError):
        data = b""
    if not data:
        raise _Invalid("An image's source.bytes must be its bytes, base64-encoded.")
    media = f"image/{image['format']}"
    source = {"type": "base64", "media_type": media, "data": image["source"]["bytes"]}
    return {"type": "image", "source": source}


def _tool_config(config: Any, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """``toolConfig`` as the Messages API's ``tools`` and ``tool_choice``; required when
    the conversation holds tool blocks (as Bedrock requires it)."""
    if config is None:
        used = any(b["type"] in ("tool_use", "tool_result") for m in messages for b in m["content"])
        if used:
            raise _Invalid(
                "The toolConfig field must be defined when using toolUse and toolResult."
            )
        return {}
    tools = []
    for tool in config["tools"]:
        spec = tool["toolSpec"]
        if not isinstance(spec["inputSchema"]["json"], dict):
            raise _Invalid("A toolSpec's inputSchema.json must be an object.")
        tools.append({"name": str(spec["name"]), "input_schema": spec["inputSchema"]["json"]})
    if not tools:
        raise _Invalid("toolConfig.tools must hold one tool at least.")
    out: dict[str, Any] = {"tools": tools}
    choice = config.get("toolChoice")
    if choice is not None:
        ((kind, value),) = choice.items()
        out["tool_choice"] = {
            "type": _CHOICES[kind],
            **({"name": value["name"]} if kind == "tool" else {}),
        }
    return out


_CONVERSE_STOP = {
    "end_turn": "end_turn",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "tool_use": "tool_use",
}


def _converse_block(block: dict[str, Any]) -> dict[str, Any]:
    if block.get("type") == "tool_use":
        use = {"toolUseId": block["id"], "name": block["name"], "input": block["input"]}
        return {"toolUse": use}
    return {"text": block["text"]}


def converse_answer(message: bytes) -> bytes:
    """A Messages answer (the fake's) as Converse's."""
    given = orjson.loads(message)
    content = [_converse_block(block) for block in given["content"]]
    return orjson.dumps(
        {
            "output": {"message": {"role": "assistant", "content": content}},
            "stopReason": _CONVERSE_STOP.get(given["stop_reason"], "end_turn"),
            "usage": _counts(given["usage"]),
            "metrics": {"latencyMs": 1},
        }
    )


def _counts(usage: dict[str, Any]) -> dict[str, int]:
    counts = {"inputTokens": usage["input_tokens"], "outputTokens": usage["output_tokens"]}
    counts["totalTokens"] = counts["inputTokens"] + counts["outputTokens"]
    return counts


def converse_frames(events: list[bytes]) -> list[bytes]:
    """A Messages stream's SSE events as ConverseStream's messages: ``messageStart``,
    ``contentBlockStart`` (a toolUse's), ``contentBlockDelta``s (text, or a toolUse's
    input piece), ``contentBlockStop``, ``messageStop``, ``metadata`` (usage)."""
    out = []
    for event in events:
        data = orjson.loads(event.split(b"data: ", 1)[1])
        for name, payload in _converse_events(data):
            headers = {":event-type": name, ":content-type": "application/json"}
            out.append(encode_message({**headers, ":message-type": "event"}, orjson.dumps(payload)))
    return out


def _converse_events(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    kind = data.get("type")
    if kind == "message_start":
        return [("messageStart", {"role": "assistant"})]
    if kind == "content_block_start" and data["content_block"].get("type") == "tool_use":
        block = data["content_block"]
        start = {"toolUse": {"toolUseId": block["id"], "name": block["name"]}}
        return [("contentBlockStart", {"contentBlockIndex": 0, "start": start})]
    if kind == "content_block_delta":
        return [("contentBlockDelta", {"contentBlockIndex": 0, "delta": _delta(data["delta"])})]
    if kind == "content_block_stop":
        return [("contentBlockStop", {"contentBlockIndex": 0})]
    if kind == "message_delta":
        stop = _CONVERSE_STOP.get(data["delta"]["stop_reason"], "end_turn")
        return [
            ("messageStop", {"stopReason": stop}),
            ("metadata", {"usage": _counts(data["usage"]), "metrics": {"latencyMs": 1}}),
        ]
    return []


def _delta(delta: dict[str, Any]) -> dict[str, Any]:
    if delta.get("type") == "input_json_delta":
        return {"toolUse": {"input": delta["partial_json"]}}
    return {"text": delta["text"]}
