"""AWS Bedrock: ``bedrock``, Anthropic's models through ``InvokeModel`` and
``InvokeModelWithResponseStream`` (``{base_url}/model/{modelId}/invoke`` and
``/invoke-with-response-stream``), the Messages API's body without ``model`` and
``stream`` and with Bedrock's ``anthropic_version`` (and the client's ``anthropic-beta``
header flags as its ``anthropic_beta`` list: Bedrock reads them there, not in a header);
``bedrock-converse``, any model through ``Converse`` and ``ConverseStream``
(``/model/{modelId}/converse``, ``/converse-stream``), which chat requests are
translated to (proxy/translate/converse.py). Every request signed with SigV4 by botocore (service
``bedrock``, the deployment's region; credentials from its ``aws_*`` fields or botocore's
default chain); a streamed answer in AWS's event stream reframed into server-sent events
(InvokeModel's ``chunk`` messages each carry one of the Messages API's events, in
base64; ConverseStream's messages are each their own event); Bedrock's throttling
(``x-amzn-errortype``: ``ThrottlingException``, ``ModelNotReadyException``,
``ServiceUnavailableException``) learned as a 429 is.

botocore is imported only when a Bedrock deployment is configured (the ``bedrock``
extra).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import orjson

from proxy.costs import Counting
from proxy.errors import InvalidRequest, UpstreamUnavailable
from proxy.limiter.base import Outcome
from proxy.providers.eventstream import Message, MessageReader
from proxy.providers.framing import Undecodable
from proxy.providers.ratelimits import UpstreamBudget

if TYPE_CHECKING:
    from botocore.credentials import Credentials, ReadOnlyCredentials

    from proxy.config.settings import AwsConfig, Deployment

__all__ = [
    "BEDROCK",
    "BEDROCK_CONVERSE",
    "BEDROCK_COUNTING",
    "BedrockWire",
    "Reframer",
    "beta_flags",
    "invoke_url",
    "merged_betas",
    "quiet_signer",
    "throttling",
]

# The Messages API's version field as Bedrock takes it (in the body, not a header),
# https://docs.aws.amazon.com/bedrock/latest/userguide/model-parameters-anthropic-claude-messages.html
ANTHROPIC_VERSION = "bedrock-2023-05-31"
STREAM_TYPE = "application/vnd.amazon.eventstream"
_SERVICE = "bedrock"  # the signing name of bedrock-runtime (botocore's service model)

# How Bedrock's quotas count a request, https://docs.aws.amazon.com/bedrock/latest/
# userguide/quotas-token-burndown.html: one tokens-per-minute quota per model and region,
# input and output together; at the start of a request its input and its `max_tokens`
# are taken from the quota, and at its end the quota is "adjusted" to the output tokens
# it used (adjusted); tokens read from the prompt cache do not count (not cache reads).
# Its 5x "burndown rate" of some models' output tokens is not modelled: a deployment's
# `tpm` of such a model is best set to what that leaves (docs/architecture.md).
BEDROCK_COUNTING = Counting(cache_reads=False, adjusted=True)

# ``x-amzn-errortype`` values (before any ``:``) that say Bedrock has no capacity for the
# request now: retried elsewhere and learned as a 429 is, whatever the status (503).
_THROTTLING = frozenset(
    ("ThrottlingException", "ModelNotReadyException", "ServiceUnavailableException")
)
_ERROR_TYPE = "x-amzn-errortype"
_THROTTLED = UpstreamBudget(throttled=True)
_NONE = UpstreamBudget()

# Bedrock answers a model id it cannot resolve with a 400 (ValidationException) or 404.
_BAD_MODEL = (b"model identifier is invalid", b"ResourceNotFoundException")

# An event's type as a Messages API stream names it (``event:`` line): a bare word.
_EVENT_TYPE = re.compile(rb"[a-z_]{1,64}")
# ConverseStream's event types (messageStart, contentBlockDelta, metadata...): a word.
_CONVERSE_EVENT = re.compile(r"[a-z][A-Za-z]{0,63}")
# Exceptions an event stream may end with, as the Messages API's error types.
_STREAM_ERRORS = {
    "throttlingException": "overloaded_error",
    "serviceUnavailableException": "overloaded_error",
    "validationException": "invalid_request_error",
}


def throttling(headers: Mapping[str, str]) -> bool:
    """Whether an answer's ``x-amzn-errortype`` names Bedrock's throttling."""
    value = headers.get(_ERROR_TYPE)
    return value is not None and value.split(":", 1)[0].strip() in _THROTTLING


class Bedrock:
    name = "bedrock"
    shapes = frozenset(("messages",))
    counting: Counting = BEDROCK_COUNTING
    default_headers: tuple[tuple[str, str], ...] = ()

    def url(self, deployment: Deployment, shape: str) -> str:
        return invoke_url(deployment.base_url, deployment.model or "", stream=False, shape=shape)

    def body_model(self, deployment: Deployment, shape: str) -> str | None:
        return None  # the deployment's model: its id in the URL

    def credential(self, deployment: Deployment) -> tuple[str, str] | None:
        return None  # the wire signs each request

    def wire(self, deployment: Deployment) -> BedrockWire:
        assert deployment.aws is not None  # config: required with provider: bedrock
        quiet_signer()
        return BedrockWire(deployment.base_url, deployment.aws)

    def budget(self, headers: Mapping[str, str], now: float) -> UpstreamBudget:
        # Bedrock announces no budget; its answer that it has none left is its error type.
        return _THROTTLED if _ERROR_TYPE in headers and throttling(headers) else _NONE

    def misconfigured(
        self, status: int, body: bytes, cooldown_time: float, asked: bool = False
    ) -> Outcome | None:
        """The model id in the URL is the config's: Bedrock's answer that it names no
        model is never the client's fault, unless it was the client's own name."""
        if asked or status not in (400, 404):
            return None
        head = body[:1024]
        if status == 400 and _BAD_MODEL[0] not in head:
            return None
        return Outcome(kind="failure", reason="misconfigured", cool_for=cooldown_time)


def quiet_signer() -> None:
    """botocore's signer logs each canonical request at DEBUG, a session token in it:
    never, whatever the proxy's log level."""
    logging.getLogger("botocore.auth").setLevel(logging.INFO)


# Each shape's action (plain, streamed) in the URL.
_ACTIONS = {
    "messages": ("invoke", "invoke-with-response-stream"),
    "converse": ("converse", "converse-stream"),
}


def invoke_url(base_url: str, model: str, stream: bool, shape: str = "messages") -> str:
    """InvokeModel's URL (InvokeModelWithResponseStream's when ``stream``; Converse's
    for ``shape`` ``converse``): the model id escaped as botocore escapes a path label
    (``:`` of a version, ``/`` of an ARN)."""
    action = _ACTIONS[shape][stream]
    return f"{base_url}/model/{quote(model, safe='')}/{action}"


class BedrockWire:
    """One Bedrock deployment's requests: InvokeModel's URL and body, signed with SigV4.
    Credentials are resolved once, when first needed (botocore's chain may read files or
    ask an instance's metadata service: off the event loop), and refreshed, off the loop
    too, when botocore says they expire soon."""

    stream_type = STREAM_TYPE

    def __init__(self, base_url: str, aws: AwsConfig) -> None:
        self._base_url = base_url
        self._aws = aws
        self._credentials: Credentials | None = None
        self._lock = asyncio.Lock()

    def outgoing(
        self, shape: str, model: str | None, stream: bool, payload: bytes
    ) -> tuple[str, bytes]:
        body = _json_object(payload)
        name = model if model is not None else body.get("model")
        if not isinstance(name, str) or not name:
            raise InvalidRequest("'model' is required.", code="invalid_request", param="model")
        body.pop("model", None)
        body.pop("stream", None)
        if shape == "messages":
            body["anthropic_version"] = ANTHROPIC_VERSION
        return invoke_url(self._base_url, name, stream, shape), orjson.dumps(body)

    def carried(
        self, shape: str, client_headers: Iterable[tuple[str, str]], payload: bytes
    ) -> bytes:
        """InvokeModel's body with the client's ``anthropic-beta`` flags as its
        ``anthropic_beta`` list (``HeadersInBody``): Bedrock reads them there only."""
        flags = beta_flags(client_headers)
        if shape != "messages" or not flags:
            return payload
        body = _json_object(payload)
        body["anthropic_beta"] = merged_betas(body.get("anthropic_beta"), flags)
        return orjson.dumps(body)

    async def authorize(self, method: str, url: str, headers: dict[str, str], body: bytes) -> None:
        frozen = await self._frozen()
        stream = url.endswith(("/invoke-with-response-stream", "/converse-stream"))
        _replace(headers, _answer_headers(stream))
        signed = {"content-type": "application/json", **_answer_headers(stream)}
        headers.update(_signature(method, url, signed, body, frozen, self._aws.region))

    async def ready(self) -> None:
        """The credentials found and fresh (``Readies``): a turn is never spent waiting
        for AWS's credential chain."""
        with contextlib.suppress(UpstreamUnavailable):  # authorize reports it
            await self._frozen()

    def reframer(self) -> Reframer:
        return Reframer()

    async def _frozen(self) -> ReadOnlyCredentials:
        credentials = self._credentials
        if credentials is None or _stale(credentials):
            async with self._lock:
                credentials = await asyncio.to_thread(self._resolved)
        try:
            return credentials.get_frozen_credentials()
        except Exception:  # a refresh that failed between the check and now
            raise UpstreamUnavailable(_NO_CREDENTIALS, code="upstream_auth_error") from None

    def _resolved(self) -> Credentials:
        """The credentials, found (the chain) and fresh; in a worker thread."""
        try:
            credentials = self._credentials or _credentials(self._aws)
            if credentials is not None:
                credentials.get_frozen_credentials()  # a refresh that may block, now
        except Exception:  # botocore's many ways of failing to find or refresh them
            credentials = None
        if credentials is None:
            raise UpstreamUnavailable(_NO_CREDENTIALS, code="upstream_auth_error")
        self._credentials = credentials
        return credentials


_NO_CREDENTIALS = "The proxy could not get AWS credentials for a Bedrock deployment."


def beta_flags(client_headers: Iterable[tuple[str, str]]) -> list[str]:
    """The flags of every ``anthropic-beta`` header (comma-separated values split and
    trimmed), each once, in their order."""
    flags: list[str] = []
    for name, value in client_headers:
        if name.lower() == "anthropic-beta":
            flags += [flag.strip() for flag in value.split(",")]
    return list(dict.fromkeys(flag for flag in flags if flag))


def merged_betas(given: object, flags: list[str]) -> list[str]:
    """The body's own ``anthropic_beta`` (a list of strings) and then ``flags``, each once."""
    if given is None:
        given = []
    if not isinstance(given, list) or not all(isinstance(flag, str) for flag in given):
        raise InvalidRequest(
            "'anthropic_beta' must be an array of strings.",
            code="invalid_type",
            param="anthropic_beta",
        )
    return list(dict.fromkeys([*given, *flags]))


def _json_object(payload: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(payload)
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    return body


def _answer_headers(stream: bool) -> dict[str, str]:
    """What InvokeModel is asked to answer in: JSON, or JSON events in an event stream."""
    if stream:
        return {"accept": STREAM_TYPE, "x-amzn-bedrock-accept": "application/json"}
    return {"accept": "application/json"}


def _replace(headers: dict[str, str], new: dict[str, str]) -> None:
    """``new`` set in ``headers``, dropping any spelling of the same names (the client's)."""
    names = set(new) | {"content-type"}
    for name in [n for n in headers if n.lower() in names or n.lower().startswith("x-amz-")]:
        del headers[name]
    headers["content-type"] = "application/json"
    headers.update(new)


def _signature(
    method: str,
    url: str,
    signed: dict[str, str],
    body: bytes,
    frozen: ReadOnlyCredentials,
    region: str,
) -> dict[str, str]:
    """The SigV4 headers (authorization, x-amz-date, x-amz-security-token) of a request
    over ``signed`` headers (the host's added by botocore): the others it carries (the
    client's) are sent unsigned, so nothing on the way can break the signature."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    request = AWSRequest(method=method, url=url, data=body, headers=signed)
    SigV4Auth(frozen, _SERVICE, region).add_auth(request)
    added = {name.lower(): value for name, value in request.headers.items()}
    return {
        name: added[name]
        for name in ("authorization", "x-amz-date", "x-amz-security-token")
        if name in added
    }


def _credentials(aws: AwsConfig) -> Credentials | None:
    """The config's keys, or what botocore's default chain finds (None: nothing)."""
    import botocore.session
    from botocore.credentials import Credentials

    key = aws.access_key_id.get_secret_value()
    if key:
        secret = aws.secret_access_key.get_secret_value()
        token = aws.session_token.get_secret_value() or None
        return Credentials(key, secret, token)
    session = botocore.session.Session(profile=aws.profile or None)
    found: Credentials | None = session.get_credentials()
    return found


def _stale(credentials: Credentials) -> bool:
    """Whether botocore would refresh them now (a refresh may block: not on the loop)."""
    needed = getattr(credentials, "refresh_needed", None)  # RefreshableCredentials only
    return bool(needed()) if needed is not None else False


class Reframer:
    """One InvokeModelWithResponseStream answer as the Messages API's server-sent
    events: each ``chunk`` event's payload, ``{"bytes": base64 of an event's JSON}``,
    becomes ``event: <its type>`` and ``data: <its JSON>``; an exception (throttling,
    the model's error) becomes the Messages API's ``error`` event, and ends it."""

    def __init__(self) -> None:
        self._reader = MessageReader()
        self._ended = False

    def feed(self, data: bytes) -> list[bytes]:
        events = []
        for message in self._reader.feed(data):
            if self._ended:
                continue  # nothing follows an exception: what does is not passed on
            event = _event(message)
            if event is not None:
                events.append(event)
            self._ended = message.text(":message-type") != "event"
        return events

    def end(self) -> None:
        self._reader.end()


def _event(message: Message) -> bytes | None:
    """A message as one server-sent event (None: an event of a kind not passed on)."""
    kind = message.text(":message-type")
    if kind == "exception":
        return _error_event(message.text(":exception-type") or "exception")
    if kind == "error":
        return _error_event(message.text(":error-code") or "error")
    if kind != "event":
        raise Undecodable(f"an event stream message of type {kind!r}")
    kind = message.text(":event-type") or ""
    if kind != "chunk":  # ConverseStream's: the event's type, its JSON the payload
        if not _CONVERSE_EVENT.fullmatch(kind):
            raise Undecodable("an event stream event of no known type")
        return (
            b"event: "
            + kind.encode()
            + b"\ndata: "
            + orjson.dumps(_object(message.payload))
            + b"\n\n"
        )
    data = _chunk(message.payload)
    name = _EVENT_TYPE.fullmatch(str(data.get("type", "")).encode())
    if name is None:
        raise Undecodable("a Bedrock chunk whose event names no type")
    return b"event: " + name.group() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _object(payload: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        raise Undecodable("a Bedrock event that is not a JSON object")
    return data


def _chunk(payload: bytes) -> dict[str, Any]:
    """A chunk's event: ``{"bytes": base64}``, its bytes a JSON object."""
    try:
        part = orjson.loads(payload)
        encoded = part["bytes"] if isinstance(part, dict) else None
        data = orjson.loads(base64.b64decode(encoded, validate=True)) if encoded else None
    except (orjson.JSONDecodeError, binascii.Error, KeyError, TypeError, ValueError):
        data = None
    if not isinstance(data, dict):
        raise Undecodable("a Bedrock chunk that is not a base64 JSON event")
    return data


def _error_event(name: str) -> bytes:
    """The Messages API's error event for an exception Bedrock ended a stream with (its
    type named; its message, the upstream's words, not passed on)."""
    kind = _STREAM_ERRORS.get(name, "api_error")
    shown = name if re.fullmatch(r"[A-Za-z]{1,64}", name) else "exception"
    message = f"The upstream stream ended with Bedrock's {shown}."
    payload = orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})
    return b"event: error\ndata: " + payload + b"\n\n"


class BedrockConverse(Bedrock):
    """Bedrock's Converse API: any model, its requests translated from chat's."""

    name = "bedrock-converse"
    shapes = frozenset(("converse",))


BEDROCK = Bedrock()
BEDROCK_CONVERSE = BedrockConverse()
