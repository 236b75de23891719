"""The upstream transports' contract, the same for the lean one (lean.py) and the general
one (client.py over aiohttp), on asyncio's loop and on uvloop (the CLI's), over plain
HTTP and over TLS (``scheme``): answers framed every way HTTP/1.1 frames them, streams
passed on chunk by chunk with backpressure, keep-alive reuse only after a complete answer
(one pool per TLS context), and every broken upstream (refused, reset, silent, garbled,
cut short; an unknown CA, a wrong host name, a handshake met with garbage) classified
alike by upstream/errors.py.

The upstreams are small asyncio servers on 127.0.0.1 (support/raw_upstream.py) that each
test scripts; TLS ones use a test CA (support/tls.py) that the client trusts through the
deployment's context (``Egress.ssl``), as a private CA is configured."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvloop
from support.ports import free_port
from support.raw_upstream import Answer, Conversation, Greeter, RawUpstream, answer, chunked
from support.tls import CertificateAuthority, openssl_available

from proxy.catalog.catalog import EGRESS, Egress
from proxy.upstream import lean
from proxy.upstream.client import HEADER_MAP, UpstreamTransport, create_transport
from proxy.upstream.forward import TransportFailure, UnusableAnswer, read_body, send

Run = Callable[[Callable[[UpstreamTransport], Awaitable[None]]], None]

TIMEOUTS = {"connect": 2.0, "read": 0.3, "write": 2.0, "pool": 2.0}
JSON = "content-type: application/json"


@dataclass(frozen=True)
class Scheme:
    """Plain HTTP, or TLS with a server certificate from the test CA and a client context
    that trusts it (the deployment's ``Egress.ssl``)."""

    server: ssl.SSLContext | None = None
    egress: Egress | None = None

    def serve(self, reply: Answer) -> RawUpstream:
        return RawUpstream(reply, tls=self.server)

    def request(self, url: str, body: bytes = b'{"model":"m"}') -> httpx.Request:
        request = _request(url, body)
        if self.egress is not None:
            request.extensions[EGRESS] = self.egress
        return request


PLAIN = Scheme()


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    if not openssl_available():
        pytest.skip("openssl is not installed")
    return CertificateAuthority.make(tmp_path_factory.mktemp("ca"))


def _trusting(ca: CertificateAuthority) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca.ca)


@pytest.fixture(params=["http", "https"])
def scheme(request: pytest.FixtureRequest) -> Scheme:
    if request.param == "http":
        return PLAIN
    ca: CertificateAuthority = request.getfixturevalue("ca")
    return Scheme(ca.server_context(), Egress(ssl=_trusting(ca)))


@pytest.fixture(params=["asyncio", "uvloop"])
def loop_factory(request: pytest.FixtureRequest) -> Callable[[], asyncio.AbstractEventLoop]:
    return asyncio.new_event_loop if request.param == "asyncio" else uvloop.new_event_loop


@pytest.fixture(params=["lean", "general"])
def run(
    request: pytest.FixtureRequest, loop_factory: Callable[[], asyncio.AbstractEventLoop]
) -> Run:
    """Runs a scenario with a fresh transport (lean or general) on a fresh loop."""
    is_lean = request.param == "lean"

    def runner(scenario: Callable[[UpstreamTransport], Awaitable[None]]) -> None:
        async def main() -> None:
            transport = create_transport(lean=is_lean)
            try:
                await scenario(transport)
            finally:
                await transport.aclose()

        with asyncio.Runner(loop_factory=loop_factory) as loop:
            loop.run(main())

    return runner


def _request(url: str, body: bytes = b'{"model":"m"}') -> httpx.Request:
    headers = {"authorization": "Bearer sk-up", "content-length": str(len(body))}
    request = httpx.Request(
        "POST",
        f"{url}/v1/chat/completions",
        stream=httpx.ByteStream(body),
        headers=headers,
        extensions={"timeout": TIMEOUTS},
    )
    request.read()
    return request


async def _fetch(
    transport: UpstreamTransport, url: str, scheme: Scheme = PLAIN
) -> tuple[httpx.Response, bytes]:
    return await _fetch_request(transport, scheme.request(url))


async def _fetch_request(
    transport: UpstreamTransport, request: httpx.Request
) -> tuple[httpx.Response, bytes]:
    response = await send(transport, request, "d")
    return response, await read_body(response, "d")


async def _wait_for(condition: Callable[[], object], timeout: float = 5.0) -> None:
    """Poll ``condition`` on the loop, bounded: never a fixed sleep standing in for it."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


def _replying(data: bytes) -> Callable[[Conversation], Coroutine[Any, Any, None]]:
    async def reply(conversation: Conversation) -> None:
        await conversation.send(data)

    return reply


# --- answers --------------------------------------------------------------------------


@pytest.mark.slow
def test_a_buffered_answer_arrives_whole_with_its_headers(run: Run, scheme: Scheme) -> None:
    async def scenario(transport: UpstreamTransport) -> None:
        reply = answer(b'{"ok":true}', JSON, "X-Upstream: yes", status="201 Created")
        async with scheme.serve(_replying(reply)) as upstream:
            response, body = await _fetch(transport, upstream.url, scheme)
        assert (response.status_code, body) == (201, b'{"ok":true}')
        assert response.extensions[HEADER_MAP]["x-upstream"] == "yes"
        assert response.headers["content-type"] == "application/json"
        seen = upstream.requests[0]
        assert seen.request_line == "POST /v1/chat/completions HTTP/1.1"
        assert seen.body == b'{"model":"m"}'
        assert seen.headers["host"] == upstream.url.split("://")[1]
        assert seen.headers["authorization"] == "Bearer sk-up"

    run(scenario)


def test_an_interim_answer_is_skipped_for_the_real_one_that_follows(
    run: Run, scheme: Scheme
) -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n"

    async def scenario(transport: UpstreamTransport) -> None:
        reply = answer(b'{"ok":true}', JSON, "X-Upstream: yes")
        async with scheme.serve(_replying(interim + reply)) as upstream:
            for _ in range(2):  # and the connection carries the next request
                response, body = await _fetch(transport, upstream.url, scheme)
                assert (response.status_code, body) == (200, b'{"ok":true}')
                assert response.extensions[HEADER_MAP]["x-upstream"] == "yes"
                assert "link" not in response.extensions[HEADER_MAP]
            assert upstream.connections == 1

    run(scenario)


def test_a_chunked_answer_and_one_that_ends_at_close_are_read_whole(
    run: Run, scheme: Scheme
) -> None:
    async def until_close(conversation: Conversation) -> None:
        await conversation.send(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil-close")
        conversation.close()

    async def scenario(transport: UpstreamTransport) -> None:
        reply = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        reply += chunked(b"hello", b" ", b"world") + b"0\r\n\r\n"
        async with scheme.serve(_replying(reply)) as upstream:
            assert (await _fetch(transport, upstream.url, scheme))[1] == b"hello world"
        async with scheme.serve(until_close) as upstream:
            assert (await _fetch(transport, upstream.url, scheme))[1] == b"until-close"

    run(scenario)


def test_a_buffered_answer_far_over_the_streams_high_water_mark_is_read_whole(
    run: Run, scheme: Scheme
) -> None:
    """The backpressure that holds a lagging stream's upstream back never holds back a
    body read whole: nobody takes its parts before its end."""
    big = b"e" * (8 * lean.HIGH_WATER)
    parts = [big[i : i + 65536] for i in range(0, len(big), 65536)]
    streamed = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    streamed += chunked(*parts) + b"0\r\n\r\n"

    async def scenario(transport: UpstreamTransport) -> None:
        for reply in (answer(big, JSON), streamed):
            async with scheme.serve(_replying(reply)) as upstream:
                response = await send(transport, scheme.request(upstream.url), "d")
                assert await read_body(response, "d", limit=len(big)) == big

    run(scenario)


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_body_over_the_bound_it_is_read_with_is_refused_and_its_connection_dropped(
    run: Run, scheme: Scheme, framing: str
) -> None:
    body = b"z" * 300_000
    if framing == "chunked":
        reply = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        reply += chunked(*(body[i : i + 10_000] for i in range(0, len(body), 10_000)))
        reply += b"0\r\n\r\n"
    else:
        reply = answer(body, JSON)

    async def scenario(transport: UpstreamTransport) -> None:
        async with scheme.serve(_replying(reply)) as upstream:
            response = await send(transport, scheme.request(upstream.url), "d")
            with pytest.raises(UnusableAnswer) as refused:
                await read_body(response, "d", limit=100_000)
            assert refused.value.reason == "too_large"
            assert "100000 bytes" in refused.value.error.message
            response, content = await _fetch(transport, upstream.url, scheme)  # served anew
            assert content == body
            assert upstream.connections == 2  # the refused one was not reused

    run(scenario)


def test_a_stream_is_passed_on_chunk_by_chunk_as_it_arrives(run: Run, scheme: Scheme) -> None:
    async def scenario(transport: UpstreamTransport) -> None:
        received: list[bytes] = []

        async def sse(conversation: Conversation) -> None:
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            await conversation.send(head + b"transfer-encoding: chunked\r\n\r\n")
            await conversation.send(chunked(b"data: 1\n\n"))
            await _wait_for(lambda: received)  # the second only once the first is through
            await conversation.send(chunked(b"data: 2\n\n") + b"0\r\n\r\n")

        async with scheme.serve(sse) as upstream:
            response = await send(transport, scheme.request(upstream.url), "d")
            async for chunk in response.aiter_raw():
                received.append(chunk)
            await response.aclose()
        assert b"".join(received) == b"data: 1\n\ndata: 2\n\n"
        assert received[0] == b"data: 1\n\n"

    run(scenario)


@pytest.mark.slow
def test_a_consumer_that_lags_holds_the_upstream_back(run: Run, scheme: Scheme) -> None:
    total = 64 * 1024 * 1024
    sent = [0]

    async def flood(conversation: Conversation) -> None:
        await conversation.send(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % total)
        piece = b"x" * 65536
        while sent[0] < total:
            await conversation.send(piece)
            sent[0] += len(piece)

    async def scenario(transport: UpstreamTransport) -> None:
        async with scheme.serve(flood) as upstream:
            response = await send(transport, scheme.request(upstream.url), "d")
            chunks = response.aiter_raw()
            size = len(await anext(chunks))
            # Nobody reads now: the upstream must come to a halt before its end.
            seen, still = [-1], [0]

            def halted() -> bool:
                still[0] = still[0] + 1 if sent[0] == seen[0] else 0
                seen[0] = sent[0]
                return still[0] >= 20

            await _wait_for(halted, timeout=30)
            assert sent[0] < total
            async for chunk in chunks:
                size += len(chunk)
            await response.aclose()
        assert size == total

    run(scenario)


# --- connections ----------------------------------------------------------------------


def test_a_connection_is_reused_after_a_complete_answer_only(run: Run, scheme: Scheme) -> None:
    gate = asyncio.Event()

    async def reply(conversation: Conversation) -> None:
        if len(conversation.request.body) > 1:  # a complete answer at once
            await conversation.send(answer(b"{}", JSON))
            return
        await conversation.send(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        await gate.wait()  # the body only after the client has given up on it
        await conversation.send(b"{}")

    async def scenario(transport: UpstreamTransport) -> None:
        async with scheme.serve(reply) as upstream:
            for _ in range(3):
                await _fetch(transport, upstream.url, scheme)
            assert upstream.connections == 1
            # An answer left unfinished closes its connection: the next request opens one.
            response = await send(transport, scheme.request(upstream.url, b"{"), "d")
            await response.aclose()
            gate.set()
            await _fetch(transport, upstream.url, scheme)
            assert upstream.connections == 2

    run(scenario)


def test_a_stream_the_client_leaves_closes_the_upstream_connection(
    run: Run, scheme: Scheme
) -> None:
    async def endless(conversation: Conversation) -> None:
        await conversation.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        while True:
            await conversation.send(chunked(b"data: more\n\n"))
            await asyncio.sleep(0.01)

    async def scenario(transport: UpstreamTransport) -> None:
        async with scheme.serve(endless) as upstream:
            response = await send(transport, scheme.request(upstream.url), "d")
            async for _ in response.aiter_raw():
                break
            await response.aclose()
            await _wait_for(lambda: upstream.closed_by_client == 1)

    run(scenario)


def test_idle_connections_expire_before_the_upstream_drops_them(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
    monkeypatch: pytest.MonkeyPatch,
    scheme: Scheme,
) -> None:
    monkeypatch.setattr(lean, "IDLE_EXPIRY", 0.0)  # every idle connection is too old
    monkeypatch.setattr(lean, "TLS_IDLE_EXPIRY", 0.0)

    async def main() -> None:
        transport = create_transport(lean=True)
        async with scheme.serve(_replying(answer(b"{}"))) as upstream:
            await _fetch(transport, upstream.url, scheme)
            await _fetch(transport, upstream.url, scheme)
        await transport.aclose()
        assert upstream.connections == 2

    with asyncio.Runner(loop_factory=loop_factory) as loop:
        loop.run(main())


def test_the_lean_pool_is_bounded_and_requests_queue_for_a_connection(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], scheme: Scheme
) -> None:
    async def main() -> None:
        transport = create_transport(max_connections=1)
        async with scheme.serve(_replying(answer(b"{}"))) as upstream:
            fetches = (_fetch(transport, upstream.url, scheme) for _ in range(4))
            bodies = await asyncio.gather(*fetches)
        await transport.aclose()
        assert [body for _, body in bodies] == [b"{}"] * 4
        assert upstream.connections == 1

    with asyncio.Runner(loop_factory=loop_factory) as loop:
        loop.run(main())


# --- broken upstreams -----------------------------------------------------------------

HEAD_100 = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b'{"a"'


async def _reset(c: Conversation) -> None:
    c.reset()


async def _close(c: Conversation) -> None:
    c.close()


async def _garbage(c: Conversation) -> None:
    await c.send(b"NONSENSE\r\n\r\n")
    c.close()


async def _silent(c: Conversation) -> None:
    await c.stall()


async def _short(c: Conversation) -> None:
    await c.send(HEAD_100)
    c.close()


async def _stalls_mid_body(c: Conversation) -> None:
    await c.send(HEAD_100)
    await c.stall()


_head_read: dict[str, bool] = {"yes": False}


async def _resets_mid_body(c: Conversation) -> None:
    await c.send(HEAD_100)
    await _wait_for(lambda: _head_read["yes"])  # or the reset could overtake the head
    c.reset()


async def _chunked_cut_short(c: Conversation) -> None:
    await c.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(b"hello"))
    c.close()


BROKEN = {
    "reset": (_reset, "reset"),
    "closed before answering": (_close, "protocol"),
    "garbage": (_garbage, "protocol"),
    "silent": (_silent, "timeout"),
    "cut short": (_short, "protocol"),
    "stalls mid-body": (_stalls_mid_body, "timeout"),
    "resets mid-body": (_resets_mid_body, "protocol"),
    "chunked, cut short": (_chunked_cut_short, "protocol"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_upstream_is_classified_alike(run: Run, scheme: Scheme, case: str) -> None:
    behaviour, reason = BROKEN[case]

    _head_read["yes"] = False

    async def scenario(transport: UpstreamTransport) -> None:
        async with scheme.serve(behaviour) as upstream:
            with pytest.raises(TransportFailure) as failure:
                response = await send(transport, scheme.request(upstream.url), "d")
                _head_read["yes"] = True
                await read_body(response, "d")
        assert failure.value.reason == reason

    run(scenario)


@pytest.mark.parametrize("case", ["cut short", "stalls mid-body", "resets mid-body"])
def test_a_stream_broken_mid_body_raises_an_httpx_error(
    run: Run, scheme: Scheme, case: str
) -> None:
    behaviour, _ = BROKEN[case]

    _head_read["yes"] = False

    async def scenario(transport: UpstreamTransport) -> None:
        async with scheme.serve(behaviour) as upstream:
            response = await send(transport, scheme.request(upstream.url), "d")
            _head_read["yes"] = True
            with pytest.raises(httpx.HTTPError):
                async for _ in response.aiter_raw():
                    pass
            await response.aclose()

    run(scenario)


@pytest.mark.parametrize(
    ("host", "reason"), [("127.0.0.1:{port}", "refused"), ("no-such-host.invalid", "dns")]
)
def test_an_unreachable_upstream_says_why(run: Run, host: str, reason: str) -> None:
    async def scenario(transport: UpstreamTransport) -> None:
        with pytest.raises(TransportFailure) as failure:
            await _fetch(transport, "http://" + host.format(port=free_port()))
        assert failure.value.reason == reason

    run(scenario)


def test_a_connection_that_cannot_be_made_in_time_is_a_connect_timeout(run: Run) -> None:
    # A listening socket whose accept queue is full: the kernel drops further SYNs.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = []
        for _ in range(8):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)

        async def scenario(transport: UpstreamTransport) -> None:
            request = _request(f"http://127.0.0.1:{port}")
            request.extensions["timeout"] = {**TIMEOUTS, "connect": 0.2, "pool": 0.2}
            with pytest.raises(TransportFailure) as failure:
                await send(transport, request, "d")
            assert failure.value.reason == "connect_timeout"

        try:
            run(scenario)
        finally:
            for filler in fillers:
                filler.close()


# --- which transport ------------------------------------------------------------------


@pytest.mark.parametrize("how", ["environment", "deployment"])
def test_a_plain_http_upstream_behind_an_egress_proxy_is_reached_through_it(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    # The "egress proxy" is a raw server that answers itself; the upstream is nowhere.
    for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    upstream = f"http://127.0.0.1:{free_port()}"

    async def main() -> None:
        transport = create_transport()  # the lean one on: the choice is what is tested
        async with RawUpstream(_replying(answer(b"{}"))) as egress:
            request = _request(upstream)
            if how == "environment":
                monkeypatch.setenv("HTTP_PROXY", egress.url)
            else:
                request.extensions[EGRESS] = Egress(proxy=egress.url)
            assert (await _fetch_request(transport, request))[1] == b"{}"
        await transport.aclose()
        # A proxy gets the absolute form of the target: the request went through it.
        assert egress.requests[0].request_line.startswith(f"POST {upstream}/v1/")

    with asyncio.Runner(loop_factory=loop_factory) as loop:
        loop.run(main())


def test_no_proxy_lets_a_plain_http_upstream_be_reached_directly(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")  # nothing there
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")

    async def main() -> None:
        transport = create_transport()
        async with RawUpstream(_replying(answer(b"{}"))) as upstream:
            assert (await _fetch(transport, upstream.url))[1] == b"{}"
        await transport.aclose()
        assert upstream.requests[0].request_line == "POST /v1/chat/completions HTTP/1.1"

    with asyncio.Runner(loop_factory=loop_factory) as loop:
        loop.run(main())


# --- TLS ------------------------------------------------------------------------------


def test_an_upstream_that_closes_an_idle_connection_fails_no_request(
    run: Run, scheme: Scheme
) -> None:
    hung_up = [0]

    async def reply_and_hang_up(conversation: Conversation) -> None:
        await conversation.send(answer(b"{}", JSON))  # keep-alive as far as it says
        await conversation.hang_up()  # then closed while idle, once the client has seen it
        hung_up[0] += 1

    async def scenario(transport: UpstreamTransport) -> None:
        async with scheme.serve(reply_and_hang_up) as upstream:
            for done in range(3):
                assert (await _fetch(transport, upstream.url, scheme))[1] == b"{}"
                await _wait_for(lambda: hung_up[0] > done)  # noqa: B023
        assert upstream.connections == 3

    run(scenario)


def test_deployments_with_different_tls_settings_never_share_a_connection(
    run: Run, ca: CertificateAuthority
) -> None:
    first, second = (
        Scheme(ca.server_context(), Egress(ssl=_trusting(ca))),
        Scheme(ca.server_context(), Egress(ssl=_trusting(ca))),
    )

    async def scenario(transport: UpstreamTransport) -> None:
        async with first.serve(_replying(answer(b"{}"))) as upstream:
            for _ in range(2):
                await _fetch(transport, upstream.url, first)
            assert upstream.connections == 1
            await _fetch(transport, upstream.url, second)  # the same origin, another context
            assert upstream.connections == 2
            await _fetch(transport, upstream.url, first)
            assert upstream.connections == 2

    run(scenario)


TLS_FAILURES = {
    "unknown CA": "tls_certificate",  # no deployment context: the system's trust store
    "wrong host name": "tls_certificate",  # the certificate names 127.0.0.1 only
    "handshake garbage": "tls_handshake",  # a plain HTTP answer to the client's hello
    "silent handshake": "connect_timeout",  # the handshake counts within connect timeout
}


@pytest.mark.parametrize("case", list(TLS_FAILURES))
def test_a_tls_upstream_that_cannot_be_trusted_says_why(
    run: Run, ca: CertificateAuthority, case: str
) -> None:
    trusting = Scheme(None, Egress(ssl=_trusting(ca)))

    async def scenario(transport: UpstreamTransport) -> None:
        with pytest.raises(TransportFailure) as failure:
            if case == "handshake garbage":
                async with Greeter(b"HTTP/1.1 400 Bad Request\r\n\r\n") as greeter:
                    await _fetch(transport, greeter.url, trusting)
            if case == "silent handshake":
                async with Greeter(None) as greeter:
                    request = trusting.request(greeter.url)
                    request.extensions["timeout"] = {**TIMEOUTS, "connect": 0.2, "read": 5.0}
                    await _fetch_request(transport, request)
            async with RawUpstream(_replying(answer(b"{}")), tls=ca.server_context()) as upstream:
                if case == "unknown CA":
                    await _fetch(transport, upstream.url, Scheme())
                await _fetch(transport, upstream.url.replace("127.0.0.1", "localhost"), trusting)
        assert failure.value.reason == TLS_FAILURES[case]

    run(scenario)


def test_a_client_certificate_the_upstream_requires_and_misses_fails_it(
    run: Run, ca: CertificateAuthority
) -> None:
    # TLS 1.3: the client's side of the handshake completes before the server checks the
    # certificate; its alert then closes the connection, which asyncio reports without the
    # alert. aiohttp writes the head and the body apart and meets a reset; the lean
    # transport writes once and meets the close.
    async def scenario(transport: UpstreamTransport) -> None:
        server = ca.server_context(require_client_cert=True)
        async with RawUpstream(_replying(answer(b"{}")), tls=server) as upstream:
            with pytest.raises(TransportFailure) as failure:
                await _fetch(transport, upstream.url, Scheme(None, Egress(ssl=_trusting(ca))))
        assert failure.value.reason in ("reset", "protocol")
        assert not upstream.requests

    run(scenario)


def _lean_pool(transport: UpstreamTransport, url: str) -> Any:
    assert transport._lean is not None
    port = httpx.URL(url).port
    (pool,) = [p for p in transport._lean._pools.values() if p.port == port]
    return pool


@pytest.mark.parametrize(
    ("keep_alive", "expiry"),
    [(None, lean.TLS_IDLE_EXPIRY), ("timeout=30, max=100", 29.0), ("timeout=1", 0.5),
     ("timeout=3600", lean.TLS_MAX_EXPIRY), ("max=5", lean.TLS_IDLE_EXPIRY)],
)  # fmt: skip
def test_idle_tls_connections_live_as_long_as_the_upstream_says(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
    ca: CertificateAuthority,
    keep_alive: str | None,
    expiry: float,
) -> None:
    scheme = Scheme(ca.server_context(), Egress(ssl=_trusting(ca)))
    headers = [JSON] if keep_alive is None else [JSON, f"Keep-Alive: {keep_alive}"]

    async def main() -> None:
        transport = create_transport(lean=True)
        async with scheme.serve(_replying(answer(b"{}", *headers))) as upstream:
            response, _ = await _fetch(transport, upstream.url, scheme)
            assert isinstance(response.stream, lean.LeanStream)  # TLS on the lean transport
            assert _lean_pool(transport, upstream.url).expiry == expiry
        async with PLAIN.serve(_replying(answer(b"{}", *headers))) as upstream:
            await _fetch(transport, upstream.url)
            assert _lean_pool(transport, upstream.url).expiry == lean.IDLE_EXPIRY
        await transport.aclose()

    with asyncio.Runner(loop_factory=loop_factory) as loop:
        loop.run(main())


def test_an_upstream_seen_closing_idle_tls_connections_sooner_shortens_their_expiry(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], ca: CertificateAuthority
) -> None:
    scheme = Scheme(ca.server_context(), Egress(ssl=_trusting(ca)))
    hung_up = [0]

    async def reply(conversation: Conversation) -> None:
        if conversation.connection == 0:
            await conversation.send(answer(b"{}"))
            await conversation.hang_up()  # idle for less than the expiry
            hung_up[0] += 1
        else:  # and then says it keeps them longer: the shorter one still holds
            await conversation.send(answer(b"{}", "Keep-Alive: timeout=30"))

    async def main() -> None:
        transport = create_transport(lean=True)
        async with scheme.serve(reply) as upstream:
            await _fetch(transport, upstream.url, scheme)
            pool = _lean_pool(transport, upstream.url)
            await _wait_for(lambda: hung_up[0])
            assert pool.expiry == lean.IDLE_EXPIRY
            await _fetch(transport, upstream.url, scheme)
            assert pool.expiry == lean.IDLE_EXPIRY
            assert upstream.connections == 2
        await transport.aclose()

    with asyncio.Runner(loop_factory=loop_factory) as loop:
        loop.run(main())


def test_a_reused_connection_times_out_by_its_new_requests_read_timeout(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    """The lean transport keeps one read timer per connection across its exchanges: one
    armed for a long timeout does not delay a later request's shorter one."""
    served = [0]

    async def reply(conversation: Conversation) -> None:
        served[0] += 1
        if served[0] == 1:
            await conversation.send(answer(b"{}"))
        else:
            await conversation.stall()

    async def main() -> None:
        transport = create_transport(lean=True)
        async with PLAIN.serve(reply) as upstream:
            patient = PLAIN.request(upstream.url)
            patient.extensions["timeout"] = {**TIMEOUTS, "read": 60.0}
            await _fetch_request(transport, patient)
            with pytest.raises(TransportFailure) as failure:
                async with asyncio.timeout(10):  # not the first request's 60 s
                    await _fetch(transport, upstream.url)  # read: 0.3 s
            assert failure.value.reason == "timeout"
            assert upstream.connections == 1
        await transport.aclose()

    with asyncio.Runner(loop_factory=loop_factory) as loop:
        loop.run(main())
