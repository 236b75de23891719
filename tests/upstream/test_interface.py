"""The upstream request and answer classes set what httpx's constructors set, without
calling them (interface.py): checked here against the installed httpx, so an httpx that
adds an attribute fails this test, not a request."""

from __future__ import annotations

import httpx

from proxy.upstream.interface import UpstreamRequest, UpstreamResponse

URL = httpx.URL("http://127.0.0.1:9/v1/chat/completions")
OURS = {"fields", "target", "_header_source", "_content"}  # what the proxy adds


def _request() -> UpstreamRequest:
    return UpstreamRequest(URL, str(URL), {"content-type": "application/json"}, b"{}", {"a": 1})


def test_a_request_has_the_attributes_httpx_gives_one() -> None:
    ours = _request()
    theirs = UpstreamRequest.__new__(UpstreamRequest)
    httpx.Request.__init__(theirs, "POST", URL, stream=httpx.ByteStream(b"{}"), extensions={"a": 1})
    assert set(vars(ours)) - OURS == set(vars(theirs))
    for name in ("method", "url", "extensions"):
        assert getattr(ours, name) == getattr(theirs, name), name


def test_a_request_reads_as_an_httpx_request() -> None:
    request = _request()
    assert request.content == b"{}"
    assert request.headers["content-type"] == "application/json"  # built when asked
    assert request.extensions == {"a": 1}


def test_an_answer_has_the_attributes_httpx_gives_one() -> None:
    stream = httpx.ByteStream(b"hi")
    ours = UpstreamResponse(200, [(b"x-a", b"1")], stream, _request(), {"b": 2})
    theirs = UpstreamResponse.__new__(UpstreamResponse)
    httpx.Response.__init__(theirs, 200, stream=stream, request=_request(), extensions={"b": 2})
    assert set(vars(ours)) - OURS == set(vars(theirs))
    for name in vars(theirs):
        if name not in ("_request", "_headers", "stream"):
            assert getattr(ours, name) == getattr(theirs, name), name


def test_an_answer_reads_as_an_httpx_response() -> None:
    answer = UpstreamResponse(200, [(b"x-a", b"1")], httpx.ByteStream(b"hi"), _request(), {})
    assert answer.headers["x-a"] == "1"
    assert answer.read() == b"hi"
    assert answer.request.method == "POST"
    assert not answer.is_error
