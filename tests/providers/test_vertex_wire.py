"""Vertex AI's wire (pure parts): URLs and bodies per shape, the region's endpoint,
Google's errors read strictly (a liar's RetryInfo), and the token held until its
refresh moment, refreshed once for many requests, a failed refresh a deployment out of
reach whose cause is logged without the token."""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from proxy.catalog.catalog import shape_urls
from proxy.config.settings import Deployment, vertex_base_url
from proxy.errors import InvalidRequest, UpstreamUnavailable
from proxy.providers import provider_of
from proxy.providers.google_errors import retry_delay
from proxy.providers.google_token import EARLY, GoogleToken, describe, refresh_moment
from proxy.providers.vertex import VERTEX_SHAPES, VERTEX_VERSION, VertexWire

PROJECT = "test-project"
BODY = {"model": "claude", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


def _deployment(**extra: Any) -> Deployment:
    fields = {"id": "vx", "provider": "vertex", "project": PROJECT, "region": "us-east5"}
    return Deployment.model_validate({**fields, **extra})


def _wire(**extra: Any) -> VertexWire:
    d = _deployment(**extra)
    wire = provider_of("vertex").wire(d)
    assert isinstance(wire, VertexWire)
    return wire


def test_the_region_names_the_endpoint_unless_base_url_does() -> None:
    assert _deployment().base_url == "https://us-east5-aiplatform.googleapis.com"
    assert _deployment(region="global").base_url == "https://aiplatform.googleapis.com"
    assert vertex_base_url("eu") == "https://aiplatform.eu.rep.googleapis.com"
    assert _deployment(base_url="http://127.0.0.1:9/").base_url == "http://127.0.0.1:9"


def test_messages_go_to_raw_predict_without_model_and_with_vertex_version() -> None:
    wire = _wire()
    prefix = f"https://us-east5-aiplatform.googleapis.com/v1/projects/{PROJECT}/locations/us-east5"
    url, body = wire.outgoing("messages", "claude-sonnet-4-5@20250929", False, orjson.dumps(BODY))
    assert url == f"{prefix}/publishers/anthropic/models/claude-sonnet-4-5@20250929:rawPredict"
    sent = orjson.loads(body)
    assert "model" not in sent and sent["anthropic_version"] == VERTEX_VERSION
    assert sent["messages"] == BODY["messages"]
    url, _ = wire.outgoing("messages", None, True, orjson.dumps({**BODY, "stream": True}))
    assert url == f"{prefix}/publishers/anthropic/models/claude:streamRawPredict"


def test_a_clients_version_is_replaced_and_token_counts_keep_the_model() -> None:
    wire = _wire()
    raw = orjson.dumps({**BODY, "anthropic_version": "2023-06-01"})
    _, body = wire.outgoing("messages", None, False, raw)
    assert orjson.loads(body)["anthropic_version"] == VERTEX_VERSION
    url, body = wire.outgoing("messages/count_tokens", "claude-x@1", False, orjson.dumps(BODY))
    assert url.endswith("/publishers/anthropic/models/count-tokens:rawPredict")
    assert orjson.loads(body)["model"] == "claude-x@1"


def test_a_clients_model_name_cannot_leave_its_path_segment() -> None:
    url, _ = _wire().outgoing("messages", "../../x?y=1#z:rawPredict", False, orjson.dumps(BODY))
    tail = url.rsplit("/models/", 1)[1]
    assert "/" not in tail and "?" not in tail and "#" not in tail
    assert tail.endswith(":rawPredict") and tail.count(":") == 1
    with pytest.raises(InvalidRequest):
        _wire().outgoing("messages", None, False, orjson.dumps({"max_tokens": 5}))


def test_generate_content_goes_to_googles_publisher_models() -> None:
    """The Gemini API's shape (``generateContent``): the model in the path, streamed as
    server-sent events (``alt=sse``)."""
    wire = _wire(region="global")
    gemini = {"model": "gemini-2.5-flash", "contents": [{"parts": [{"text": "hi"}]}]}
    url, body = wire.outgoing("generateContent", None, False, orjson.dumps(gemini))
    assert url == (
        f"https://aiplatform.googleapis.com/v1/projects/{PROJECT}/locations/global"
        "/publishers/google/models/gemini-2.5-flash:generateContent"
    )
    assert orjson.loads(body) == {"contents": gemini["contents"]}
    url, _ = wire.outgoing("generateContent", "gemini-2.5-pro", True, orjson.dumps(gemini))
    assert url.endswith("/google/models/gemini-2.5-pro:streamGenerateContent?alt=sse")
    with pytest.raises(InvalidRequest):
        wire.outgoing("embeddings", "m", False, orjson.dumps(gemini))


@pytest.mark.parametrize(
    ("model", "group", "shapes"),
    [
        ("claude-sonnet-4-5@20250929", "x", {"messages", "messages/count_tokens"}),
        ("Claude-Haiku", "x", {"messages", "messages/count_tokens"}),
        ("gemini-2.5-flash", "claude", {"generateContent"}),  # the deployment's model decides
        (None, "claude-*", {"messages", "messages/count_tokens"}),  # else its group's name
        (None, "gemini-*", {"generateContent"}),
        (None, "*", {"generateContent"}),
    ],
)
def test_a_deployment_serves_its_models_api_only(
    model: str | None, group: str, shapes: set[str]
) -> None:
    """Anthropic's models the Messages API, Google's ``generateContent``: a request of
    the other API is refused by the proxy, never sent for a 404 that would cool it."""
    extra = {} if model is None else {"model": model}
    urls = shape_urls(_deployment(**extra), group)
    assert set(urls) == shapes
    publisher = "anthropic" if "messages" in shapes else "google"
    assert all(f"/publishers/{publisher}/models/" in text for _, text in urls.values())
    assert {"messages", "messages/count_tokens", "generateContent"} == VERTEX_SHAPES


def test_googles_crlf_events_reach_the_reader_as_lf_and_lf_events_pass_as_they_are() -> None:
    """Vertex AI's streams (Google's models', perhaps Anthropic's) may end lines in CRLF:
    made LF wherever the chunks are cut; a CR the stream ends on is dropped."""
    events = b'data: {"candidates": []}\r\n\r\ndata: {"usageMetadata": {}}\r\n\r\n'
    for cut in range(len(events) + 1):
        reframer = _wire().reframer()
        assert reframer is not None
        out = b"".join([*reframer.feed(events[:cut]), *reframer.feed(events[cut:])])
        assert out == events.replace(b"\r\n", b"\n")
    anthropic_events = b'event: ping\ndata: {"type": "ping"}\n\n'
    reframer = _wire().reframer()
    assert reframer is not None
    assert b"".join(reframer.feed(anthropic_events)) == anthropic_events
    assert b"".join(reframer.feed(b"data: {}\r")) == b"data: {}"  # cut after a CR
    reframer.end()


def _throttled(details: list[Any]) -> bytes:
    error = {"code": 429, "message": "Quota exceeded", "status": "RESOURCE_EXHAUSTED"}
    return orjson.dumps({"error": {**error, "details": details}})


RETRY = "type.googleapis.com/google.rpc.RetryInfo"


@pytest.mark.parametrize(
    ("delay", "seconds"),
    [("30s", 30.0), ("1.5s", 1.5), ("0.000000001s", 1e-9), ("86400s", 86400.0)],
)
def test_retry_info_is_read(delay: str, seconds: float) -> None:
    assert retry_delay(_throttled([{"@type": RETRY, "retryDelay": delay}])) == seconds


@pytest.mark.parametrize(
    "body",
    [
        _throttled([{"@type": RETRY, "retryDelay": "-5s"}]),
        _throttled([{"@type": RETRY, "retryDelay": "1e9s"}]),
        _throttled([{"@type": RETRY, "retryDelay": "99999999999s"}]),
        _throttled([{"@type": RETRY, "retryDelay": "86401s"}]),  # over a day
        _throttled([{"@type": RETRY, "retryDelay": "NaNs"}]),
        _throttled([{"@type": RETRY, "retryDelay": 30}]),
        _throttled([{"@type": RETRY, "retryDelay": "\uff13\uff10s"}]),  # full-width digits
        _throttled([{"@type": "type.googleapis.com/google.rpc.Help", "retryDelay": "3s"}]),
        _throttled("3s"),  # type: ignore[arg-type]
        b'{"error": {"code": 429, "details": [{"@type": "' + RETRY.encode() + b'", "retryD',
        b"[]",
        b"not json",
    ],
)
def test_a_liars_retry_info_says_nothing(body: bytes) -> None:
    assert retry_delay(body) is None


def test_vertex_reads_retry_info_and_the_hold_is_bounded_where_used() -> None:
    from proxy.providers.ratelimits import UpstreamBudget
    from proxy.providers.vertex import VERTEX
    from proxy.upstream.outcomes import classify_status

    hint = VERTEX.throttled(_throttled([{"@type": RETRY, "retryDelay": "3600s"}]))
    outcome = classify_status(429, {}, UpstreamBudget(), 0.0, 30.0, 60.0, hint)
    assert outcome.rate_limited and outcome.cool_for == 60.0
    headed = classify_status(429, {"retry-after": "2"}, UpstreamBudget(), 0.0, 30.0, 60.0, 7.0)
    assert headed.cool_for == 2.0  # a header, when sent, wins


def test_googles_not_found_is_the_configs_fault_unless_the_client_named_the_model() -> None:
    vertex = provider_of("vertex")
    body = orjson.dumps({"error": {"code": 404, "message": "no", "status": "NOT_FOUND"}})
    wrong = vertex.misconfigured(404, body, 30.0)
    assert wrong is not None and wrong.reason == "misconfigured"
    assert vertex.misconfigured(404, body, 30.0, asked=True) is None
    anthropic_404 = b'{"type": "error", "error": {"type": "not_found_error"}}'
    assert vertex.misconfigured(404, anthropic_404, 30.0) is None
    assert vertex.misconfigured(400, body, 30.0) is None


def test_the_refresh_moment_is_five_minutes_early_or_half_a_short_life() -> None:
    assert refresh_moment(1000.0, 1000.0 + 3600) == 1000.0 + 3600 - EARLY
    assert refresh_moment(1000.0, 1010.0) == 1005.0
    assert refresh_moment(1000.0, 900.0) == 1000.0  # expired already: refreshed next time
    assert refresh_moment(1000.0, None) == 1000.0 + EARLY


class _Credentials:
    """google-auth's credentials as the token sees them: ``refresh`` (blocking) sets
    ``token`` and ``expiry``."""

    def __init__(self, lifetime: float, clock: list[float], fail: bool = False) -> None:
        self.lifetime, self.clock, self.fail = lifetime, clock, fail
        self.token: str | None = None
        self.expiry: datetime | None = None
        self.refreshed = 0
        self.threads: set[int] = set()
        self.gate = threading.Event()
        self.gate.set()

    def refresh(self, request: object) -> None:
        self.threads.add(threading.get_ident())
        self.gate.wait(5)
        if self.fail:
            raise RuntimeError(f"invalid_grant: Bad token {self.token} sent back")
        self.refreshed += 1
        self.token = f"ya29.token-{self.refreshed}"
        moment = self.clock[0] + self.lifetime
        self.expiry = datetime.fromtimestamp(moment, UTC).replace(tzinfo=None)


async def test_many_requests_share_one_refresh_off_the_loop() -> None:
    clock = [1000.0]
    credentials = _Credentials(3600.0, clock)
    credentials.gate.clear()
    token = GoogleToken("vx", clock=lambda: clock[0], loader=lambda: credentials)
    waiting = [asyncio.create_task(token.bearer()) for _ in range(20)]
    await asyncio.sleep(0.05)  # all waiting on the one refresh, the loop free meanwhile
    credentials.gate.set()
    assert set(await asyncio.gather(*waiting)) == {"ya29.token-1"}
    assert credentials.refreshed == 1
    assert threading.get_ident() not in credentials.threads


async def test_the_token_is_refreshed_before_it_expires() -> None:
    clock = [1000.0]
    credentials = _Credentials(3600.0, clock)
    token = GoogleToken("vx", clock=lambda: clock[0], loader=lambda: credentials)
    assert await token.bearer() == "ya29.token-1"
    clock[0] += 3600 - EARLY - 1
    assert await token.bearer() == "ya29.token-1"
    clock[0] += 1  # five minutes before it expires: still sent, its successor fetched
    assert await token.bearer() == "ya29.token-1"
    for _ in range(100):
        if credentials.refreshed == 2:
            break
        await asyncio.sleep(0.01)
    assert await token.bearer() == "ya29.token-2"
    clock[0] += 3600  # run out (no request for an hour): the next one waits for a new one
    assert await token.bearer() == "ya29.token-3"


async def test_a_failed_refresh_is_unavailable_and_logged_without_the_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = [1000.0]
    credentials = _Credentials(60.0, clock)
    token = GoogleToken("vx", clock=lambda: clock[0], loader=lambda: credentials)
    first = await token.bearer()
    clock[0] += 59  # past the minute's last quarter: it is not sent any more
    credentials.fail = True
    with caplog.at_level(logging.WARNING, "proxy.upstream"), pytest.raises(UpstreamUnavailable):
        await token.bearer()
    logged = caplog.text
    assert "vx" in logged and "invalid_grant" in logged and first not in logged
    refreshed = credentials.refreshed
    with pytest.raises(UpstreamUnavailable):  # at once: not the token endpoint again
        await token.bearer()
    assert credentials.refreshed == refreshed


def test_a_refresh_error_is_described_by_kind_and_bounded_words() -> None:
    said = describe(ValueError("x" * 5000 + " ya29.secret"), "ya29.secret")
    assert said.startswith("ValueError: ") and len(said) < 300 and "ya29.secret" not in said
    assert describe(RuntimeError(("a", {"b": 1}))) == "RuntimeError"
