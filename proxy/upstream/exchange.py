"""One call to a deployment, as a value: build, send, classify the answer, read what its
headers say of the upstream's budget (through the provider) and its usage (through the
API shape), redact the upstream's key. The routing layer decides what to do with the
``Answer``: settle, retry, learn.

    build (forward.build_request: model, the shape's needs, credentials; translated
           to the deployment's API when it does not speak the client's: proxy/translate)
    -> send (one transport)  -> a failure status: discarded, classified (outcomes)
                             -> a stream: StreamBody, its usage read on the way (sse),
                                translated back event by event
                             -> a body: read whole (bounded), redacted; an answer that
                                says the deployment is misconfigured (the provider) or
                                no API answers there (unshaped): a failure; else
                                translated back (a 200 and its usage, an error body)

This is the one seam of translation: the request is built for each attempt's deployment,
and its answer comes back in the client's API, its usage read in the deployment's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from proxy.catalog.catalog import DeploymentRoute
from proxy.costs import TokenUsage
from proxy.errors import InvalidRequest, ProxyError, UpstreamError, UpstreamUnavailable
from proxy.limiter.base import SUCCESS, Outcome, Remaining
from proxy.providers.base import ThrottleInBody, Wire
from proxy.providers.ratelimits import UpstreamBudget, remaining_report
from proxy.request.call import Call, Reply
from proxy.shapes.base import Shape
from proxy.shapes.sse import UsageTap
from proxy.translate import Link, Translations, Untranslatable, link_for
from proxy.upstream.encoding import Reframed, StreamDecoder, Undecodable, decoder_for
from proxy.upstream.forward import (
    TransportFailure,
    UnusableAnswer,
    build_request,
    discard,
    read_body,
    send,
    undecodable,
)
from proxy.upstream.headers import response_headers
from proxy.upstream.interface import HEADER_MAP, UpstreamRequest
from proxy.upstream.outcomes import (
    admitted,
    classify_status,
    is_failure,
    misconfigured_error,
    status_error,
    unshaped,
    unshaped_error,
)
from proxy.upstream.redact import StreamRedactor, redact, redact_headers, redactable
from proxy.upstream.stream import StreamBody, StreamEnd

__all__ = [
    "Answer",
    "Exchange",
    "StreamEnd",
    "StreamEnded",
    "Translated",
    "Untranslated",
    "build_request",
]

logger = logging.getLogger("proxy.upstream")

# A stream ended (how), with the usage its shape read (None: none) and the events passed.
StreamEnded = Callable[[StreamEnd, TokenUsage | None, int], Awaitable[None]]

_NO_BUDGET = UpstreamBudget()


@dataclass(slots=True)
class Answer:
    """What one call to a deployment came to.

    ``reply`` is what the client gets; None: a failure (``error``, tried elsewhere when
    ``retry``) or an answer that cannot be passed on (``error`` as it is). ``label``:
    the status, or the failure's reason (metrics). ``outcome``: its meaning for the
    deployment's health. ``refund``: the upstream did not admit the request (its token
    charge goes back). ``budget`` and ``remaining``: what its headers said of the
    upstream's budget, and what the limiter should hear of it (None: nothing)."""

    label: str
    outcome: Outcome
    upstream_time: float  # seconds waited on the upstream (to the headers, a body's read)
    reply: Reply | None = None
    error: ProxyError | None = None
    retry: bool = False
    refund: bool = False
    budget: UpstreamBudget = _NO_BUDGET
    remaining: Remaining | None = None
    ended: float | None = None  # perf_counter when a buffered answer was read
    shape: Shape | None = None  # a buffered 200's, whose usage it reads (``usage``)
    _usage: TokenUsage | None = field(default=None, repr=False)
    _read: bool = field(default=False, repr=False)

    @property
    def usage(self) -> TokenUsage | None:
        """A buffered 200's usage, read by its shape once, when first asked (after the
        answer is on its way); None: none, or not readable."""
        if not self._read:
            self._read = True
            if self.shape is not None and self.reply is not None:
                self._usage = self.shape.usage(self.reply.body)
        return self._usage


class Untranslated(Exception):
    """The request cannot be translated to the API of the deployment named: that one
    cannot serve it (why: ``call.translations.refusal()``), another may."""


@dataclass(slots=True)
class Translated:
    """How an attempt's request was translated (``Exchange.build``): the link to the
    deployment's API, and the client's request (a translated stream reads it)."""

    link: Link
    client_body: dict[str, Any]


class Exchange:
    """Calls deployments over one transport. ``max_answer``: a buffered body's bound;
    ``max_hold``: the longest a 429 or an upstream's budget holds a deployment;
    ``cooldown_time``: how long a misconfigured one cools; ``default_cap``: the output
    cap of a request translated to an API that requires one when it set none."""

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport,
        max_answer: int | None,
        max_hold: float,
        cooldown_time: float,
        default_cap: int,
    ) -> None:
        self.transport = transport
        self.max_answer = max_answer
        self.max_hold = max_hold
        self.cooldown_time = cooldown_time
        self.default_cap = default_cap

    # --- the request, for its deployment ---------------------------------------------

    def reachable(self, call: Call, candidates: list[DeploymentRoute]) -> list[DeploymentRoute]:
        """Those of ``candidates`` that can serve ``call``: speaking its API, or one its
        request translates to (proxy/translate). When none speaks its API the request is
        translated now (each needs it): a deployment its translation refuses is no
        candidate, and the refusal is kept on the call (``Translations.refusal``). Beside
        one that speaks it, a translation is made only for the deployment chosen
        (``build``), and one known refused is no candidate."""
        name = call.arrival.shape.name
        now = not any(d.speaks(name) for d in candidates)
        return [d for d in candidates if d.speaks(name) or self._translates(call, d, now)]

    def _translates(self, call: Call, deployment: DeploymentRoute, now: bool) -> bool:
        link = link_for(call.arrival.shape.name, deployment.speaks)
        if link is None:
            return False
        translations = self._translations(call)
        if not now:
            return not translations.refused(link)
        try:
            translations.body_for(link, call.ask.body)
        except InvalidRequest:
            return False
        return True

    def build(
        self, call: Call, deployment: DeploymentRoute
    ) -> tuple[UpstreamRequest, bool, Translated | None]:
        """``call``'s request for ``deployment``: as the client sent it (forward.py), or
        translated when the deployment does not speak its API. Raises InvalidRequest
        (the body cannot be sent), or ``Untranslated`` (the translation refused it)."""
        if deployment.speaks(call.arrival.shape.name):
            request, strip_usage = build_request(
                call.arrival.shape,
                call.ask.body,
                call.ask.raw,
                call.arrival.headers,
                deployment,
                call.ask.stream,
                call.pin.method,
                call.pin.path,
                call.ask.asked_model,
            )
            return request, strip_usage, None
        link = link_for(call.arrival.shape.name, deployment.speaks)
        assert link is not None  # the dispatcher's candidates are those that translate
        try:
            body = self._translations(call).body_for(link, call.ask.body)
        except InvalidRequest:  # kept on the call: another deployment may serve it
            raise Untranslated(deployment.id) from None
        request, strip_usage = build_request(
            link.upstream, body, None, call.arrival.headers, deployment, call.ask.stream
        )
        return request, strip_usage, Translated(link, call.ask.body)

    def _translations(self, call: Call) -> Translations:
        if call.translations is None:
            call.translations = Translations(self.default_cap)
        return call.translations

    # --- the call --------------------------------------------------------------------

    async def call(
        self,
        shape: Shape,
        deployment: DeploymentRoute,
        request: UpstreamRequest,
        strip_usage: bool,
        stream: bool,
        started: float,
        on_first_chunk: Callable[[], None],
        on_stream_end: StreamEnded,
        translated: Translated | None = None,
    ) -> Answer:
        """Send ``request`` (built by ``build``, sent at ``started``: perf_counter) and
        what its answer came to, in the API of the client's ``shape`` (``translated``
        back when it was). A streamed answer's end is reported to ``on_stream_end``."""
        try:
            if deployment.wire is not None:  # its credentials, over the final request
                await _authorize(deployment.wire, request, deployment.id)
            response = await send(self.transport, request, deployment.id)
        except TransportFailure as failure:
            return _failed(failure, time.perf_counter() - started)
        upstream_time = time.perf_counter() - started  # to its headers
        status = response.status_code
        # One plain dict: httpx's Headers scan and decode their list at every lookup.
        upstream_headers = response.extensions.get(HEADER_MAP) or dict(
            response.headers.multi_items()
        )
        now = time.time()
        budget = deployment.provider.budget(upstream_headers, now)
        remaining = self._remaining(deployment, budget)
        if is_failure(status):
            said = await _throttle_said(deployment, response, status)
            outcome = classify_status(
                status, upstream_headers, budget, now, self.cooldown_time, self.max_hold, said
            )
            error = _failure_error(status, outcome, deployment.id)
            return Answer(
                str(status), outcome, upstream_time, None, error, True, False, budget, remaining
            )
        secret = redactable(_key(deployment, request))
        headers = redact_headers(response_headers(upstream_headers.items()), secret.decode())
        content_type = upstream_headers.get("content-type", "")
        if stream and status == 200 and _streamed(deployment.wire, content_type):
            try:
                decoder = _stream_decoder(deployment.wire, upstream_headers)
            except Undecodable as exc:
                await discard(response)
                unusable = undecodable(deployment.id, exc)
                return _unusable(unusable, upstream_time, budget, remaining)

            async def on_close(end: StreamEnd) -> None:
                await on_stream_end(end, body.tap.usage, body.events)

            body = _stream_body(
                shape, translated, strip_usage, response, secret, decoder, on_first_chunk, on_close
            )
            headers.update({"cache-control": "no-cache", "x-accel-buffering": "no"})
            reply = Reply(status=200, headers=headers, stream=body)
            return Answer("200", SUCCESS, upstream_time, reply, budget=budget, remaining=remaining)
        headers_at = time.perf_counter()
        try:
            content = await read_body(response, deployment.id, self.max_answer)
        except (TransportFailure, UnusableAnswer) as unread:
            return _unread(unread, upstream_time, budget, remaining)
        ended = time.perf_counter()
        upstream_time += ended - headers_at  # and its body
        answer = Answer(
            str(status),
            SUCCESS,
            upstream_time,
            Reply(status=status, headers=headers, body=redact(content, secret)),
            refund=not admitted(status),
            budget=budget,
            remaining=remaining,
            ended=ended,
        )
        return self._buffered(shape, deployment, request, translated, answer, content_type)

    def _buffered(
        self,
        shape: Shape,
        deployment: DeploymentRoute,
        request: UpstreamRequest,
        translated: Translated | None,
        answer: Answer,
        content_type: str,
    ) -> Answer:
        """A buffered answer read whole (``answer``, as if passed on): passed on
        (translated back when its request was), or a failure: one that says the
        deployment is misconfigured (its provider), or no API's answer (unshaped)."""
        reply = answer.reply
        assert reply is not None
        status, content = reply.status, reply.body
        link = None if translated is None else translated.link
        spoken = shape if link is None else link.upstream  # the API the upstream answered in
        asked = deployment.model_for(spoken.name) is None  # the client's name went
        wrong = deployment.provider.misconfigured(status, content, self.cooldown_time, asked)
        if wrong is not None:  # not the client's fault: cool it as a bad key is cooled
            error = misconfigured_error(status, deployment.id)
            answer.outcome, answer.reply, answer.error = wrong, None, error
            answer.retry, answer.refund = True, not admitted(status)
            return answer
        odd = unshaped(status, content, self.cooldown_time)
        if odd is not None:  # no API answer: the contract's shape instead
            shaped = unshaped_error(status, deployment.id, _shown(request.url))
            retry = isinstance(shaped, UpstreamError)  # no LLM API there: try another
            if retry:
                logger.warning("%s (%s)", shaped.message, content_type or "no content-type")
            answer.outcome, answer.reply, answer.error = odd, None, shaped
            answer.retry, answer.refund = retry, False
            return answer
        reply.headers.setdefault("content-type", "application/json")
        answer.shape = spoken if status == 200 else None
        return answer if link is None else _translated_back(link, deployment, answer)

    def _remaining(self, deployment: DeploymentRoute, budget: UpstreamBudget) -> Remaining | None:
        """What the limiter should hear of the upstream's budget (None: nothing)."""
        if budget.empty:
            return None
        # Azure announces no limits: what is left is judged against the configured ones.
        config = deployment.config
        return remaining_report(budget.assuming(config.rpm, config.tpm), self.max_hold)


def _stream_body(
    shape: Shape,
    translated: Translated | None,
    strip_usage: bool,
    response: httpx.Response,
    secret: bytes,
    decoder: StreamDecoder | None,
    on_first_chunk: Callable[[], None],
    on_close: Callable[[StreamEnd], Awaitable[None]],
) -> StreamBody:
    """A streamed answer passed on: its usage read in the upstream's API, translated to
    the client's (``shape``'s) when its request was."""
    link = None if translated is None else translated.link
    spoken = shape if link is None else link.upstream  # the API the upstream streams in
    tap = UsageTap(spoken.stream_usage(), strip_usage_event=strip_usage)
    return StreamBody(
        response,
        tap,
        StreamRedactor(secret),
        on_first_chunk,
        on_close,
        shape.stream_error,
        decoder,
        translation=(
            None
            if translated is None
            else translated.link.stream(translated.client_body, int(time.time()))
        ),
        ends=None if link is None else shape.stream_usage().ends,
    )


# The most of a 429's body read for the wait it says (``ThrottleInBody``).
THROTTLE_BODY_LIMIT = 64 * 1024


async def _throttle_said(
    deployment: DeploymentRoute, response: httpx.Response, status: int
) -> float | None:
    """The wait a failure's body says, when it is a 429 of a provider that says it there
    (read at most ``THROTTLE_BODY_LIMIT`` bytes); the body is done with either way."""
    provider = deployment.provider
    if status != 429 or not isinstance(provider, ThrottleInBody):
        await discard(response)
        return None
    try:
        content = await read_body(response, deployment.id, THROTTLE_BODY_LIMIT)
    except (TransportFailure, UnusableAnswer):
        return None  # cut short, too long, undecodable: no wait it says
    return provider.throttled(content)


def _failure_error(status: int, outcome: Outcome, deployment: str) -> UpstreamError:
    """What the client hears of a failure status: a throttled answer (a 429, or its
    provider's way of saying so: Bedrock's 503) as a 429, with the hold's retry-after."""
    throttled = outcome.rate_limited
    error = status_error(429 if throttled else status, deployment)
    error.retry_after = outcome.cool_for if throttled else None
    return error


async def _authorize(wire: Wire, request: UpstreamRequest, deployment: str) -> None:
    """The wire's credentials added to ``request``; a deployment whose credentials cannot
    be had now (a token endpoint down) is not reachable: retried elsewhere."""
    try:
        await wire.authorize(request.method, request.target, request.fields, request.content)
    except UpstreamUnavailable as exc:
        raise TransportFailure(exc, "credentials") from None


def _key(deployment: DeploymentRoute, request: UpstreamRequest) -> str:
    """The credential an answer must never show: the deployment's key, or what its wire
    put in ``authorization`` for this request (a bearer token: Vertex AI's)."""
    if deployment.wire is None:
        return deployment.config.api_key.get_secret_value()
    sent = request.fields.get("authorization", "")
    return sent.removeprefix("Bearer ") if sent else deployment.config.api_key.get_secret_value()


def _streamed(wire: Wire | None, content_type: str) -> bool:
    """Whether a 200's ``content_type`` is a stream of its deployment's framing."""
    if wire is None:
        return "event-stream" in content_type
    return content_type.split(";", 1)[0].strip().lower() == wire.stream_type


def _stream_decoder(wire: Wire | None, headers: Mapping[str, str]) -> StreamDecoder | None:
    """What turns a stream's bytes into server-sent events: its content-encoding undone,
    then its wire's framing (Bedrock's event stream) read."""
    decoder = decoder_for(headers.get("content-encoding"))
    reframer = None if wire is None else wire.reframer()
    return decoder if reframer is None else Reframed(decoder, reframer)


def _translated_back(link: Link, deployment: DeploymentRoute, answer: Answer) -> Answer:
    """A buffered answer in the client's API: a 200 (its usage read while translating,
    in the upstream's own units), an error body; any other status as it is."""
    reply = answer.reply
    assert reply is not None
    status = reply.status
    try:
        if status == 200:
            reply.body, answer._usage = link.answer(reply.body, int(time.time()))
            answer._read = True
        elif status >= 300:
            reply.body = link.error(status, reply.body)
    except Untranslatable as exc:
        unusable = _untranslatable(deployment.id, exc)
        return _unusable(unusable, answer.upstream_time, answer.budget, answer.remaining)
    return answer


def _untranslatable(deployment: str, exc: Untranslatable) -> UnusableAnswer:
    message = (
        f"The upstream deployment '{deployment}' answered with what cannot be translated: {exc}."
    )
    return UnusableAnswer(UpstreamUnavailable(message, code="upstream_error"), "untranslatable")


def _failed(failure: TransportFailure, upstream_time: float) -> Answer:
    """No (complete) HTTP answer: retried elsewhere."""
    outcome = Outcome("failure", failure.reason)
    return Answer(failure.reason, outcome, upstream_time, None, failure.error, retry=True)


def _unusable(
    unusable: UnusableAnswer,
    upstream_time: float,
    budget: UpstreamBudget,
    remaining: Remaining | None,
) -> Answer:
    """An answer that cannot be passed on (over the size bound, undecodable,
    untranslatable): another deployment would send the same, so no retry and no harm to
    this one's health; its tokens were spent upstream (the estimate stays charged)."""
    outcome = Outcome("neutral", unusable.reason)
    return Answer(
        unusable.reason,
        outcome,
        upstream_time,
        None,
        unusable.error,
        budget=budget,
        remaining=remaining,
    )


def _unread(
    unread: TransportFailure | UnusableAnswer,
    upstream_time: float,
    budget: UpstreamBudget,
    remaining: Remaining | None,
) -> Answer:
    """A buffered answer whose body could not be read (the connection failed: retried
    elsewhere), or not passed on (``_unusable``)."""
    if isinstance(unread, UnusableAnswer):
        return _unusable(unread, upstream_time, budget, remaining)
    answer = _failed(unread, upstream_time)
    answer.budget, answer.remaining = budget, remaining
    return answer


def _shown(url: httpx.URL) -> str:
    """An upstream URL as messages and logs show it: without credentials or a query."""
    port = f":{url.port}" if url.port is not None else ""
    return f"{url.scheme}://{url.host}{port}{url.path}"
