"""The Gemini API, pure: its shape (the model and stream in the URL, the key in a header or
the query, usage from ``usageMetadata``, Google's errors) and its provider (the URL, the
CRLF stream made LF, a 429's ``RetryInfo`` read strictly and bounded). Scripted liars:
a bad retry delay, a negative count, a stream cut mid-frame."""

from __future__ import annotations

import orjson
import pytest

from proxy import shapes
from proxy.config.settings import parse_settings
from proxy.costs import TokenUsage
from proxy.errors import InvalidRequest, ModelNotFound, RateLimited
from proxy.providers.gemini import GEMINI, MAX_RETRY_DELAY, CrLf, GeminiWire, retry_delay
from proxy.providers.ratelimits import UpstreamBudget
from proxy.shapes.base import RequestTarget
from proxy.shapes.gemini import GENERATE_CONTENT, GOOGLE_KEY, GeminiStreamUsage, usage_of
from proxy.shapes.sse import UsageTap
from proxy.upstream.outcomes import classify_status

BODY = {"contents": [{"role": "user", "parts": [{"text": "x" * 40}]}]}


def _target(method: str, query: str = "", model: str = "gemini-2.5-flash") -> RequestTarget:
    return RequestTarget({"model": model, "method": method}, query)


def test_its_paths_are_templates_matched_with_the_model_and_method() -> None:
    found = shapes.match("/v1beta/models/gemini-2.5-flash:streamGenerateContent", "alt=sse")
    assert found is not None
    shape, target = found
    assert shape is GENERATE_CONTENT
    assert shape.model_of({}, target) == "gemini-2.5-flash"
    assert shape.streamed({}, target) is True
    assert shapes.match("/v1beta/models/a/b:generateContent") is None  # no slash in a model
    assert shapes.surface("/v1beta/models/x:countTokens") is GENERATE_CONTENT  # Google's errors


def test_a_stream_is_served_only_as_server_sent_events_and_only_its_two_methods() -> None:
    assert GENERATE_CONTENT.streamed({"stream": True}, _target("generateContent")) is False
    with pytest.raises(InvalidRequest):
        GENERATE_CONTENT.streamed({}, _target("streamGenerateContent"))  # a JSON array
    with pytest.raises(ModelNotFound):
        GENERATE_CONTENT.streamed({}, _target("countTokens"))
    with pytest.raises(InvalidRequest):  # which key counts would be ambiguous
        _target("generateContent", "key=a&key=b").arg("key")


def test_the_key_in_each_place_google_s_clients_send_it() -> None:
    assert GOOGLE_KEY.secret("x-goog-api-key", " k1 ") == "k1"
    assert GOOGLE_KEY.secret("authorization", "Bearer k2") == "k2"
    assert GOOGLE_KEY.secret("key", "k3") == "k3"
    assert GOOGLE_KEY.secret("x-goog-api-key", "  ") is None
    assert GOOGLE_KEY.query == ("key",)


def test_the_estimate_reads_the_parts_and_the_nested_cap_per_candidate() -> None:
    body = {**BODY, "generationConfig": {"maxOutputTokens": 50, "candidateCount": 2}}
    GENERATE_CONTENT.check(body)
    cost = GENERATE_CONTENT.estimate(body, 4096)
    assert cost["output_tokens"] == 100
    assert 10 < cost["input_tokens"] < 30
    for bad in ({"contents": []}, {**BODY, "generationConfig": {"maxOutputTokens": -1}}):
        with pytest.raises(InvalidRequest):
            GENERATE_CONTENT.check(bad)


def test_usage_metadata_as_counted() -> None:
    usage = usage_of(
        {
            "promptTokenCount": 100,
            "cachedContentTokenCount": 400,  # a liar: more cached than the prompt
            "candidatesTokenCount": 20,
            "thoughtsTokenCount": 30,
            "toolUsePromptTokenCount": 5,
        }
    )
    assert usage == TokenUsage(input_tokens=105, output_tokens=50, cached_input=100)
    assert usage_of({"promptTokenCount": -3, "candidatesTokenCount": 2}) is None  # no count
    assert usage_of({"promptTokenCount": "9"}) is None
    assert usage_of({}) is None


def test_a_stream_s_usage_is_known_only_once_a_candidate_finished() -> None:
    reader = GeminiStreamUsage()
    tap = UsageTap(reader, strip_usage_event=False)
    first = {"candidates": [{"content": {}}], "usageMetadata": {"promptTokenCount": 9}}
    tap.feed(b"data: " + orjson.dumps(first) + b"\n\n")
    assert tap.usage is None  # cut here: charged as a stream without usage
    last = {
        "candidates": [{"finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 7},
    }
    event = b"data: " + orjson.dumps(last) + b"\n\n"
    tap.feed(event[:20])  # an event split across chunks is read once whole
    tap.feed(event[20:])
    assert tap.usage == TokenUsage(input_tokens=9, output_tokens=7)


def test_crlf_events_become_lf_whatever_the_chunks_cut() -> None:
    stream = b'data: {"a":1}\r\n\r\ndata: {"b":2}\r\n\r\n'
    for cut in range(1, len(stream)):
        reframer = CrLf()
        out = b"".join([*reframer.feed(stream[:cut]), *reframer.feed(stream[cut:])])
        reframer.end()
        assert out == b'data: {"a":1}\n\ndata: {"b":2}\n\n', cut


def test_the_wire_puts_the_model_escaped_and_the_method_in_the_url() -> None:
    wire = GeminiWire("https://example.test")
    url, body = wire.outgoing("generateContent", "gemini-2.5-flash", False, b"{}")
    assert body == b"{}"  # the shape's body as it is
    assert url == "https://example.test/v1beta/models/gemini-2.5-flash:generateContent"
    url, _ = wire.outgoing("generateContent", "a?b#c/../d", True, b"{}")
    assert url.endswith("/models/a%3Fb%23c%2F..%2Fd:streamGenerateContent?alt=sse")
    with pytest.raises(InvalidRequest):
        wire.outgoing("generateContent", None, False, b"{}")


def _retry(delay: object) -> bytes:
    detail = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}
    return orjson.dumps(
        {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": [detail]}}
    )


@pytest.mark.parametrize(
    ("body", "seconds"),
    [
        (_retry("38s"), 38.0),
        (_retry("0.5s"), 0.5),
        (_retry("-1s"), None),  # liars: negative, another unit, a number, no unit
        (_retry("1m"), None),
        (_retry(38), None),
        (_retry("38"), None),
        (_retry("1e9s"), None),
        (_retry("NaNs"), None),
        (_retry(f"{int(MAX_RETRY_DELAY) + 1}s"), None),  # past a day: not believed
        (_retry("9" * 40 + "s"), None),
        (b'{"error": {"details": "no"}}', None),
        (b"<html>quota</html>", None),
        (b"", None),
    ],
)
def test_a_429_s_retry_delay_is_read_strictly_and_bounded(
    body: bytes, seconds: float | None
) -> None:
    assert retry_delay(body) == seconds
    assert GEMINI.throttled(body) == seconds


def test_the_delay_holds_the_deployment_when_no_header_says_one_at_most_max_hold() -> None:
    outcome = classify_status(429, {}, UpstreamBudget(), 0.0, 30.0, 300.0, 38.0)
    assert outcome.rate_limited and outcome.cool_for == 38.0
    outcome = classify_status(429, {}, UpstreamBudget(), 0.0, 30.0, 10.0, 38.0)
    assert outcome.cool_for == 10.0  # server.max_upstream_hold bounds it
    outcome = classify_status(429, {"retry-after": "2"}, UpstreamBudget(), 0.0, 30.0, 300.0, 38.0)
    assert outcome.cool_for == 2.0  # a header, when sent, is more precise


def test_a_key_google_says_is_invalid_is_the_config_s_fault() -> None:
    invalid = b'{"error": {"code": 400, "details": [{"reason": "API_KEY_INVALID"}]}}'
    wrong = GEMINI.misconfigured(400, invalid, 30.0)
    assert wrong is not None and wrong.reason == "auth"
    assert GEMINI.misconfigured(400, b'{"error": {"code": 400}}', 30.0) is None
    assert (
        GEMINI.misconfigured(404, b'{"error": {"status": "NOT_FOUND"}}', 30.0, asked=True) is None
    )


def test_errors_in_google_s_shape_with_retry_info() -> None:
    error = RateLimited("Rate limit reached.", code="key_rpm", retry_after=2.2)
    body = orjson.loads(GENERATE_CONTENT.error_body(error))["error"]
    assert (body["code"], body["status"]) == (429, "RESOURCE_EXHAUSTED")
    retry = [d for d in body["details"] if d["@type"].endswith("RetryInfo")]
    assert retry == [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "3s"}]


def test_a_gemini_deployment_needs_no_base_url_and_others_still_do() -> None:
    def settings(deployment: dict[str, object]) -> object:
        model = {"name": "m", "deployments": [{"id": "d", **deployment}]}
        return parse_settings({"models": [model]}, "<test>", env={})

    gemini = settings({"provider": "gemini", "api_key": "AIza-0123456789"})
    assert gemini.models[0].deployments[0].base_url == "https://generativelanguage.googleapis.com"  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="base_url"):
        settings({"provider": "openai"})
