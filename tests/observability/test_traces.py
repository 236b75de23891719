"""Traces (``telemetry.traces: true``) as a collector receives them: a real proxy with the
official SDKs as clients, exporting by OTLP/HTTP to a receiver this test starts
(support/otlp.py), read back span by span.

* every API shape (chat, completions, embeddings, responses, messages; streamed and
  not): one trace per request, its admission, attempt and settlement spans (a stream's
  time to its first chunk), the GenAI semantic conventions' attributes and the proxy's;
* a retry and a fallback, on every API shape (streamed and not): one trace, an attempt
  span each (first, retry, fallback); the client's ``traceparent`` continued, and each
  attempt's sent upstream;
* waits for a turn, by cause (pacing, fair share, cooldown);
* no prompt or completion in any span unless ``record_content: true``; never a key.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from support.otlp import CLIENT, INTERNAL, SERVER, STATUS_ERROR, OtlpHttpReceiver, ReceivedSpan
from support.proxy_server import ProxyInThread, settings_from
from support.raw_upstream import Conversation, answer, chunked
from support.scripted_upstream import ScriptedUpstream

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

CLIENT_KEY = "sk-client-SECRET-trace-5e1a"
UPSTREAM_KEY = "sk-upstream-SECRET-trace-90c2"
PROMPT = "PROMPT-MARKER-never-in-a-span"
PRICE = {"input": 1.0, "output": 2.0}


def otel_env(receiver_url: str, protocol: str = "http/protobuf") -> dict[str, str]:
    """The exporter's environment: the receiver, batches sent every 50 ms."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver_url,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpHttpReceiver]:
    with OtlpHttpReceiver() as server, pytest.MonkeyPatch.context() as env:
        for name, value in otel_env(server.url).items():
            env.setenv(name, value)
        for name in ("OTEL_SERVICE_NAME", "OTEL_TRACES_SAMPLER", "OTEL_RESOURCE_ATTRIBUTES"):
            env.delenv(name, raising=False)
        yield server


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    config = FakeUpstreamConfig(port=0, api_key=UPSTREAM_KEY, chunk_delay=0.001)
    with run_in_thread(config) as handle:
        yield handle


def _config(upstream: FakeUpstreamHandle, **telemetry: bool) -> dict[str, Any]:
    return {
        "teams": [{"name": "research"}],
        "keys": [
            {
                "name": "app",
                "key": CLIENT_KEY,
                "team": "research",
                "limits": [{"tokens": 10_000_000, "per": "1d"}],
            }
        ],
        "models": [
            {
                "name": "gpt",
                "price": PRICE,
                "deployments": [
                    {
                        "id": "openai-a",
                        "base_url": upstream.base_url,
                        "api_key": UPSTREAM_KEY,
                        "model": "gpt-upstream",
                    }
                ],
            },
            {
                "name": "claude",
                "price": PRICE,
                "deployments": [
                    {
                        "id": "anthropic-a",
                        "provider": "anthropic",
                        "base_url": upstream.url,
                        "api_key": UPSTREAM_KEY,
                        "model": "claude-upstream",
                    }
                ],
            },
        ],
        "telemetry": {"traces": True, **telemetry},
    }


@pytest.fixture(scope="module")
def proxy(receiver: OtlpHttpReceiver, upstream: FakeUpstreamHandle) -> Iterator[ProxyInThread]:
    with ProxyInThread(settings_from(_config(upstream))) as server:
        yield server


def _openai(proxy: ProxyInThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key=CLIENT_KEY, max_retries=0)


def _anthropic(proxy: ProxyInThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=CLIENT_KEY, max_retries=0)


def _send(
    proxy: ProxyInThread,
    api: str,
    stream: bool,
    headers: dict[str, str] | None = None,
    prefix: str = "",
) -> tuple[str, str]:
    """One request through ``api`` with the official SDK (to the model ``gpt``, or
    ``claude`` for Messages, after ``prefix``; ``headers`` sent too): its request id and
    the text of the answer the client read."""
    messages: Any = [{"role": "user", "content": PROMPT}]
    client = _openai(proxy)
    gpt, extra = f"{prefix}gpt", {"extra_headers": headers or {}}
    if api == "chat":
        raw: Any = client.chat.completions.with_raw_response.create(
            model=gpt, messages=messages, max_tokens=20, stream=stream, **extra
        )
    elif api == "completions":
        raw = client.completions.with_raw_response.create(
            model=gpt, prompt=PROMPT, max_tokens=20, stream=stream, **extra
        )
    elif api == "embeddings":
        raw = client.embeddings.with_raw_response.create(model=gpt, input=PROMPT, **extra)
    elif api == "responses":
        raw = client.responses.with_raw_response.create(
            model=gpt, input=PROMPT, max_output_tokens=20, stream=stream, **extra
        )
    else:
        raw = _anthropic(proxy).messages.with_raw_response.create(
            model=f"{prefix}claude", max_tokens=20, messages=messages, stream=stream, **extra
        )
    parsed = raw.parse()
    text = "".join(str(event) for event in parsed) if stream else str(parsed)
    return raw.headers["x-request-id"], text


def _one(spans: list[ReceivedSpan], **where: Any) -> ReceivedSpan:
    found = [s for s in spans if all(getattr(s, k) == v for k, v in where.items())]
    assert len(found) == 1, (where, [(s.name, s.kind) for s in spans])
    return found[0]


SHAPES = [
    ("chat", False, "chat", "gpt"),
    ("chat", True, "chat", "gpt"),
    ("completions", False, "text_completion", "gpt"),
    ("completions", True, "text_completion", "gpt"),
    ("embeddings", False, "embeddings", "gpt"),
    ("responses", False, "chat", "gpt"),
    ("responses", True, "chat", "gpt"),
    ("messages", False, "chat", "claude"),
    ("messages", True, "chat", "claude"),
]


@pytest.mark.parametrize(
    ("api", "stream", "operation", "model"),
    SHAPES,
    ids=[f"{api}{'-stream' if stream else ''}" for api, stream, _, _ in SHAPES],
)
def test_each_api_makes_one_trace_of_its_request(
    proxy: ProxyInThread,
    receiver: OtlpHttpReceiver,
    api: str,
    stream: bool,
    operation: str,
    model: str,
) -> None:
    request_id, answer_text = _send(proxy, api, stream)
    spans = receiver.spans.request(request_id, spans_at_least=5 if stream else 4)
    assert len({s.trace_id for s in spans}) == 1

    root = _one(spans, kind=SERVER)
    provider = "anthropic" if model == "claude" else "openai"
    assert root.parent_span_id == ""  # the SDK sent no traceparent: a new trace
    assert root.name == f"{operation} {model}"
    attributes = root.attributes
    assert attributes["gen_ai.operation.name"] == operation
    assert attributes["gen_ai.provider.name"] == provider
    assert attributes["gen_ai.request.model"] == model
    assert attributes["gen_ai.response.model"] == f"{model}-upstream"
    assert attributes["gen_ai.request.stream"] is stream
    assert attributes["gen_ai.usage.input_tokens"] > 0
    if api != "embeddings":
        assert attributes["gen_ai.usage.output_tokens"] > 0
        assert attributes["gen_ai.request.max_tokens"] == 20
    assert attributes["http.response.status_code"] == 200
    assert attributes["llm_proxy.request_id"] == request_id
    assert attributes["llm_proxy.key.name"] == "app"
    assert attributes["llm_proxy.team"] == "research"
    assert attributes["llm_proxy.deployment"] == f"{provider}-a"
    assert attributes["llm_proxy.queue_time_ms"] == 0.0
    assert attributes["llm_proxy.cost_usd"] > 0
    assert root.resource["service.name"] == "llm-proxy"

    admission = _one(spans, name="admission")
    assert admission.parent_span_id == root.span_id
    assert admission.attributes["llm_proxy.key.verdict"] == "allowed"
    assert admission.start == root.start <= admission.end

    attempt = _one(spans, kind=CLIENT)
    assert attempt.parent_span_id == root.span_id
    assert attempt.name == f"{operation} {model}-upstream"
    assert attempt.attributes["gen_ai.request.model"] == f"{model}-upstream"
    assert attempt.attributes["gen_ai.response.model"] == f"{model}-upstream"
    assert attempt.attributes["gen_ai.provider.name"] == provider
    assert attempt.attributes["http.response.status_code"] == 200
    assert attempt.attributes["llm_proxy.attempt"] == 1
    assert attempt.attributes["llm_proxy.attempt.kind"] == "first"
    assert attempt.attributes["server.address"] == "127.0.0.1"
    assert admission.end <= attempt.start <= attempt.end

    settlement = _one(spans, name="settlement")
    assert settlement.parent_span_id == root.span_id
    assert settlement.start == attempt.end
    assert settlement.attributes["llm_proxy.usage.reported"] is True

    if stream:
        streamed = _one(spans, name="stream")
        assert streamed.parent_span_id == attempt.span_id
        assert attempt.attributes["gen_ai.response.time_to_first_chunk"] > 0
        assert [name for name, _ in attempt.events] == ["gen_ai.first_chunk"]
        assert streamed.attributes["llm_proxy.stream.end"] == "200"
    else:
        assert "gen_ai.response.time_to_first_chunk" not in attempt.attributes

    # record_content is off: neither the prompt nor the answer, and never a key.
    texts = [text for span in spans for text in span.texts()]
    for secret in (PROMPT, CLIENT_KEY, UPSTREAM_KEY):
        assert not any(secret in text for text in texts), secret
    assert not any(
        "gen_ai.input.messages" in s.attributes or "gen_ai.output.messages" in s.attributes
        for s in spans
    )
    assert answer_text  # the client read its answer


# --- a retry and a fallback, traceparent in and out ----------------------------------

FAILURE = answer(b'{"error":{"message":"boom","type":"server_error"}}', status="500 Oops")
FALLBACK_TEXT = f"the upstream's key {UPSTREAM_KEY} redacted; hello"


async def _failing(conversation: Conversation) -> None:
    await conversation.send(FAILURE)


async def _answering(conversation: Conversation) -> None:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "small-upstream",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": FALLBACK_TEXT},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
    }
    await conversation.send(answer(orjson.dumps(body), "content-type: application/json"))


@pytest.fixture(scope="module")
def failing() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream(_failing) as server:
        yield server


@pytest.fixture(scope="module")
def answering() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream(_answering) as server:
        yield server


@pytest.fixture(scope="module")
def falling_back(
    receiver: OtlpHttpReceiver,
    failing: ScriptedUpstream,
    answering: ScriptedUpstream,
    serving_path: str,
) -> Iterator[ProxyInThread]:
    """``big``: two deployments that answer 500, then its fallback ``small``; prompts
    and completions recorded."""

    def deployment(name: str, upstream: ScriptedUpstream, model: str) -> dict[str, Any]:
        return {"id": name, "base_url": upstream.url, "api_key": UPSTREAM_KEY, "model": model}

    config = {
        "keys": [{"name": "app", "key": CLIENT_KEY}],
        "models": [
            {
                "name": "big",
                "deployments": [
                    deployment("big-1", failing, "big-upstream"),
                    deployment("big-2", failing, "big-upstream"),
                ],
            },
            {"name": "small", "deployments": [deployment("small-1", answering, "small-upstream")]},
        ],
        "routing": {
            "retries": 2,
            "fallbacks": {"big": ["small"]},
            "strategy": "weighted-random",
            "cooldown": {"allowed_fails": 1000},
        },
        "telemetry": {"traces": True, "record_content": True},
    }
    with ProxyInThread(settings_from(config)) as server:
        yield server


def test_a_retry_and_a_fallback_are_one_trace_continuing_the_clients(
    falling_back: ProxyInThread,
    receiver: OtlpHttpReceiver,
    failing: ScriptedUpstream,
    answering: ScriptedUpstream,
) -> None:
    seen_before = len(failing.requests)
    client_trace, client_span = os.urandom(16).hex(), os.urandom(8).hex()
    raw = _openai(falling_back).chat.completions.with_raw_response.create(
        model="big",
        messages=[{"role": "user", "content": PROMPT}],
        extra_headers={"traceparent": f"00-{client_trace}-{client_span}-01"},
    )
    assert raw.parse().choices[0].message.content == FALLBACK_TEXT.replace(
        UPSTREAM_KEY, "sk-...redacted"
    )
    spans = receiver.spans.request(raw.headers["x-request-id"], spans_at_least=6)

    root = _one(spans, kind=SERVER)
    assert root.trace_id == client_trace  # the client's trace, continued
    assert root.parent_span_id == client_span
    assert root.attributes["llm_proxy.retries"] == 2
    assert root.attributes["llm_proxy.deployment"] == "small-1"
    assert root.attributes["gen_ai.response.model"] == "small-upstream"

    attempts = sorted((s for s in spans if s.kind == CLIENT), key=lambda s: s.start)
    assert [a.attributes["llm_proxy.attempt"] for a in attempts] == [1, 2, 3]
    assert [a.attributes["llm_proxy.attempt.kind"] for a in attempts] == [
        "first",
        "retry",
        "fallback",
    ]
    assert {a.attributes["llm_proxy.deployment"] for a in attempts[:2]} == {"big-1", "big-2"}
    assert attempts[2].attributes["llm_proxy.deployment"] == "small-1"
    assert attempts[2].attributes["llm_proxy.model"] == "small"
    for failed in attempts[:2]:
        assert failed.attributes["http.response.status_code"] == 500
        assert failed.attributes["error.type"] == "server_error"
        assert failed.status_code == STATUS_ERROR
    assert attempts[2].attributes["http.response.status_code"] == 200
    assert all(a.parent_span_id == root.span_id for a in attempts)

    # Each attempt's own span is the parent the upstream was told of.
    sent = [r.headers["traceparent"] for r in failing.requests[seen_before:]]
    sent.append(answering.requests[-1].headers["traceparent"])
    assert sent == [f"00-{client_trace}-{a.span_id}-01" for a in attempts]

    # record_content: the prompt and the answer; the upstream's key redacted from it.
    assert PROMPT in root.attributes["gen_ai.input.messages"]
    output = orjson.loads(root.attributes["gen_ai.output.messages"])
    assert output[0]["role"] == "assistant"
    assert output[0]["parts"][0]["content"].endswith("redacted; hello")
    texts = [text for span in spans for text in span.texts()]
    for secret in (CLIENT_KEY, UPSTREAM_KEY):
        assert not any(secret in text for text in texts), secret


_HOP_BY_HOP = ("host", "content-length", "connection", "accept-encoding", "transfer-encoding")


def _relay(target: str) -> Any:
    """An answer that passes each request on to ``target`` (the fake upstream) and its
    answer back, chunked as it comes: an upstream that serves every API shape and keeps
    the headers it was sent (``ScriptedUpstream.requests``)."""

    async def relay(conversation: Conversation) -> None:
        seen = conversation.request
        method, path, _ = seen.request_line.split(" ")
        headers = {k: v for k, v in seen.headers.items() if k not in _HOP_BY_HOP}
        async with (
            httpx.AsyncClient(timeout=30) as client,
            client.stream(method, target + path, headers=headers, content=seen.body) as reply,
        ):
            kept = [
                f"{k}: {v}"
                for k, v in reply.headers.items()
                if k not in (*_HOP_BY_HOP, "content-encoding", "date", "server")
            ]
            head = [f"HTTP/1.1 {reply.status_code} {reply.reason_phrase}", *kept]
            await conversation.send(
                ("\r\n".join(head) + "\r\ntransfer-encoding: chunked\r\n\r\n").encode()
            )
            async for chunk in reply.aiter_bytes():
                await conversation.send(chunked(chunk))
        await conversation.send(b"0\r\n\r\n")

    return relay


@pytest.fixture(scope="module")
def relayed(upstream: FakeUpstreamHandle) -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream(_relay(upstream.url)) as server:
        yield server


@pytest.fixture(scope="module")
def falling_back_on_every_api(
    receiver: OtlpHttpReceiver,
    failing: ScriptedUpstream,
    relayed: ScriptedUpstream,
    serving_path: str,
) -> Iterator[ProxyInThread]:
    """``big-gpt`` (OpenAI) and ``big-claude`` (Anthropic): two deployments each that
    answer 500, then their fallbacks ``gpt`` and ``claude``, served by the fake upstream
    through ``relayed``; content not recorded."""

    def deployment(name: str, url: str, model: str, provider: str) -> dict[str, Any]:
        return {
            "id": name,
            "base_url": url if provider == "anthropic" else f"{url}/v1",
            "api_key": UPSTREAM_KEY,
            "model": model,
            "provider": provider,
        }

    models = []
    for name, provider in (("gpt", "openai"), ("claude", "anthropic")):
        failing_ones = [
            deployment(f"big-{name}-{i}", failing.url, f"big-{name}-upstream", provider)
            for i in (1, 2)
        ]
        fallback = deployment(f"{provider}-a", relayed.url, f"{name}-upstream", provider)
        models += [
            {"name": f"big-{name}", "price": PRICE, "deployments": failing_ones},
            {"name": name, "price": PRICE, "deployments": [fallback]},
        ]
    config = {
        "teams": [{"name": "research"}],
        "keys": [{"name": "app", "key": CLIENT_KEY, "team": "research"}],
        "models": models,
        "routing": {
            "retries": 2,
            "fallbacks": {"big-gpt": ["gpt"], "big-claude": ["claude"]},
            "strategy": "weighted-random",
            "cooldown": {"allowed_fails": 1000},
        },
        "telemetry": {"traces": True},
    }
    with ProxyInThread(settings_from(config)) as server:
        yield server


@pytest.mark.parametrize(
    ("api", "stream", "operation", "model"),
    SHAPES,
    ids=[f"{api}{'-stream' if stream else ''}" for api, stream, _, _ in SHAPES],
)
def test_each_api_through_a_retry_and_a_fallback_is_one_trace_continuing_the_clients(
    falling_back_on_every_api: ProxyInThread,
    receiver: OtlpHttpReceiver,
    failing: ScriptedUpstream,
    relayed: ScriptedUpstream,
    api: str,
    stream: bool,
    operation: str,
    model: str,
) -> None:
    """Every API shape, streamed and not: two 500s (first, retry), then the fallback
    answers; one trace in the client's, an attempt span each with its deployment and
    status, the stream under the fallback's attempt, each attempt's context the
    ``traceparent`` its upstream got; no prompt, answer or key in any span."""
    failed_before, relayed_before = len(failing.requests), len(relayed.requests)
    client_trace, client_span = os.urandom(16).hex(), os.urandom(8).hex()
    traceparent = {"traceparent": f"00-{client_trace}-{client_span}-01"}
    request_id, answer_text = _send(falling_back_on_every_api, api, stream, traceparent, "big-")
    assert answer_text
    spans = receiver.spans.request(request_id, spans_at_least=7 if stream else 6)
    assert {s.trace_id for s in spans} == {client_trace}

    provider = "anthropic" if model == "claude" else "openai"
    root = _one(spans, kind=SERVER)
    assert root.parent_span_id == client_span
    assert root.name == f"{operation} big-{model}"
    attributes = root.attributes
    assert attributes["gen_ai.operation.name"] == operation
    assert attributes["gen_ai.provider.name"] == provider
    assert attributes["gen_ai.request.model"] == f"big-{model}"
    assert attributes["gen_ai.response.model"] == f"{model}-upstream"
    assert attributes["gen_ai.usage.input_tokens"] > 0
    if api != "embeddings":
        assert attributes["gen_ai.usage.output_tokens"] > 0
    assert attributes["http.response.status_code"] == 200
    assert attributes["llm_proxy.retries"] == 2
    assert attributes["llm_proxy.deployment"] == f"{provider}-a"
    assert attributes["llm_proxy.key.name"] == "app"
    assert attributes["llm_proxy.team"] == "research"
    assert attributes["llm_proxy.cost_usd"] > 0
    assert _one(spans, name="admission").parent_span_id == root.span_id
    assert _one(spans, name="settlement").parent_span_id == root.span_id

    attempts = sorted((s for s in spans if s.kind == CLIENT), key=lambda s: s.start)
    assert [a.attributes["llm_proxy.attempt"] for a in attempts] == [1, 2, 3]
    kinds = [a.attributes["llm_proxy.attempt.kind"] for a in attempts]
    assert kinds == ["first", "retry", "fallback"]
    assert {a.attributes["llm_proxy.deployment"] for a in attempts[:2]} == {
        f"big-{model}-1",
        f"big-{model}-2",
    }
    for failed in attempts[:2]:
        assert failed.name == f"{operation} big-{model}-upstream"
        assert failed.attributes["http.response.status_code"] == 500
        assert failed.status_code == STATUS_ERROR
    served = attempts[2]
    assert served.name == f"{operation} {model}-upstream"
    assert served.attributes["llm_proxy.deployment"] == f"{provider}-a"
    assert served.attributes["llm_proxy.model"] == model
    assert served.attributes["http.response.status_code"] == 200
    assert all(a.parent_span_id == root.span_id for a in attempts)
    if stream:
        assert _one(spans, name="stream").parent_span_id == served.span_id
        assert served.attributes["gen_ai.response.time_to_first_chunk"] > 0

    sent = [r.headers["traceparent"] for r in failing.requests[failed_before:]]
    sent += [r.headers["traceparent"] for r in relayed.requests[relayed_before:]]
    assert sent == [f"00-{client_trace}-{a.span_id}-01" for a in attempts]

    texts = [text for span in spans for text in span.texts()]
    for secret in (PROMPT, CLIENT_KEY, UPSTREAM_KEY):
        assert not any(secret in text for text in texts), secret


def test_recorded_content_of_a_stream_is_its_text(
    receiver: OtlpHttpReceiver, upstream: FakeUpstreamHandle
) -> None:
    config = _config(upstream, record_content=True)
    with ProxyInThread(settings_from(config)) as proxy:
        request_id, _ = _send(proxy, "messages", stream=True)
        spans = receiver.spans.request(request_id, spans_at_least=5)
    root = _one(spans, kind=SERVER)
    assert PROMPT in root.attributes["gen_ai.input.messages"]
    output = orjson.loads(root.attributes["gen_ai.output.messages"])
    assert output[0]["parts"][0]["content"]
    assert all(UPSTREAM_KEY not in text for span in spans for text in span.texts())


# --- waits for a turn -----------------------------------------------------------------


def test_a_wait_for_a_paced_turn_is_a_span_with_its_cause(
    receiver: OtlpHttpReceiver, upstream: FakeUpstreamHandle
) -> None:
    config = _config(upstream)
    config["models"][0]["deployments"][0]["rpm"] = 120  # a turn every 0.5 s
    with ProxyInThread(settings_from(config)) as proxy:
        client = _openai(proxy)
        ids = []
        for _ in range(2):  # the second waits for the turn after the first's
            raw = client.embeddings.with_raw_response.create(model="gpt", input="x")
            ids.append(raw.headers["x-request-id"])
        spans = receiver.spans.request(ids[1], spans_at_least=5)
    # Its turn, reserved, then slept for (and maybe deferred for fair share first:
    # routing.lookahead commits turns at most 500 ms ahead).
    waits = sorted((s for s in spans if s.name == "wait"), key=lambda s: s.start)
    root = _one(spans, kind=SERVER)
    assert all(w.kind == INTERNAL and w.parent_span_id == root.span_id for w in waits)
    causes = [w.attributes["llm_proxy.wait.cause"] for w in waits]
    assert causes[-1] == "pacing" and set(causes) <= {"pacing", "fair_share"}, causes
    assert root.attributes["llm_proxy.queue_time_ms"] > 0
    admission = _one(spans, name="admission")
    attempt = _one(spans, kind=CLIENT)
    assert admission.end == waits[0].start <= waits[-1].end <= attempt.start


def test_a_wait_deferred_for_fair_share_is_a_span_with_its_cause(
    receiver: OtlpHttpReceiver, upstream: FakeUpstreamHandle
) -> None:
    """A turn every 2 s, ``routing.lookahead`` 100 ms: the second request's turn is
    farther than the lookahead, so it is deferred for fair share first (no turn held),
    then waits for its reserved turn; each wait a span, in that order."""
    config = _config(upstream)
    config["models"][0]["deployments"][0]["rpm"] = 30
    config["routing"] = {"lookahead": "100ms"}
    with ProxyInThread(settings_from(config)) as proxy:
        client = _openai(proxy)
        ids = [
            client.embeddings.with_raw_response.create(model="gpt", input="x").headers[
                "x-request-id"
            ]
            for _ in range(2)
        ]
        spans = receiver.spans.request(ids[1], spans_at_least=6)
    root = _one(spans, kind=SERVER)
    waits = sorted((s for s in spans if s.name == "wait"), key=lambda s: s.start)
    causes = [w.attributes["llm_proxy.wait.cause"] for w in waits]
    assert causes[0] == "fair_share" and causes[-1] == "pacing", causes
    assert all(w.parent_span_id == root.span_id for w in waits)
    assert all(a.end <= b.start for a, b in itertools.pairwise(waits))
    assert waits[-1].end <= _one(spans, kind=CLIENT).start


def test_a_wait_for_a_cooling_deployment_is_a_span_with_its_cause(
    receiver: OtlpHttpReceiver,
) -> None:
    """The only deployment fails once and cools for 1 s: the next request waits for it
    to come back (then probes it)."""
    answered = 0

    async def fails_first(conversation: Conversation) -> None:
        nonlocal answered
        answered += 1
        await (_failing if answered == 1 else _answering)(conversation)

    with ScriptedUpstream(fails_first) as upstream:
        deployment = {"id": "only", "base_url": upstream.url, "api_key": UPSTREAM_KEY}
        config = {
            "keys": [{"name": "app", "key": CLIENT_KEY}],
            "models": [{"name": "m", "deployments": [deployment]}],
            "routing": {"retries": 0, "cooldown": {"allowed_fails": 1, "time": "1s"}},
            "telemetry": {"traces": True},
        }
        with ProxyInThread(settings_from(config)) as proxy:
            client = _openai(proxy)
            messages: Any = [{"role": "user", "content": "hi"}]
            with pytest.raises(openai.InternalServerError):
                client.chat.completions.create(model="m", messages=messages)
            raw = client.chat.completions.with_raw_response.create(model="m", messages=messages)
            spans = receiver.spans.request(raw.headers["x-request-id"], spans_at_least=5)
    waits = [s for s in spans if s.name == "wait"]
    assert [w.attributes["llm_proxy.wait.cause"] for w in waits] == ["cooldown"]
    attempt = _one(spans, kind=CLIENT)
    assert attempt.attributes["http.response.status_code"] == 200
    assert waits[0].end <= attempt.start


# --- a client that leaves once it read the last event ---------------------------------

CHAT_EVENTS = [
    {"id": "c", "object": "chat.completion.chunk", "model": "m-upstream",
     "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]},
    {"id": "c", "object": "chat.completion.chunk", "model": "m-upstream", "choices": [],
     "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}},
]  # fmt: skip


async def _lingering(conversation: Conversation) -> None:
    """A whole chat stream, ``[DONE]`` last, then the connection held open a while
    before its end: the OpenAI SDK closes on ``[DONE]``, before the upstream's EOF."""
    events = [b"data: " + orjson.dumps(e) + b"\n\n" for e in CHAT_EVENTS]
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    await conversation.send(head + b"transfer-encoding: chunked\r\n\r\n")
    await conversation.send(chunked(*events, b"data: [DONE]\n\n"))
    await asyncio.sleep(1.0)
    with contextlib.suppress(ConnectionError):
        await conversation.send(b"0\r\n\r\n")


@pytest.mark.slow
def test_a_client_that_leaves_after_the_last_event_was_served_whole(
    receiver: OtlpHttpReceiver,
) -> None:
    """Not a 499 (the client left): it read everything the upstream had to say."""
    with ScriptedUpstream(_lingering) as upstream:
        deployment = {"id": "only", "base_url": upstream.url, "api_key": UPSTREAM_KEY}
        config = {
            "keys": [{"name": "app", "key": CLIENT_KEY}],
            "models": [{"name": "m", "deployments": [deployment]}],
            "telemetry": {"traces": True},
        }
        with ProxyInThread(settings_from(config)) as proxy:
            messages: Any = [{"role": "user", "content": "hi"}]
            raw = _openai(proxy).chat.completions.with_raw_response.create(
                model="m", messages=messages, stream=True
            )
            assert [c.choices[0].delta.content for c in raw.parse()] == ["hi"]
            spans = receiver.spans.request(raw.headers["x-request-id"], spans_at_least=5)
    root = _one(spans, kind=SERVER)
    assert root.attributes["http.response.status_code"] == 200
    assert root.attributes["gen_ai.usage.output_tokens"] == 1
