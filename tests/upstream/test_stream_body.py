"""A streamed answer's end is told once, whatever cuts it short (``StreamBody``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx

from proxy.shapes.chat import CHAT
from proxy.shapes.sse import UsageTap
from proxy.upstream.redact import StreamRedactor
from proxy.upstream.stream import StreamBody


class _SlowToClose(httpx.AsyncByteStream):
    """An upstream body whose connection takes long to close."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'data: {"choices": []}\n\n'

    async def aclose(self) -> None:
        await asyncio.sleep(10.0)


def test_a_stream_cancelled_while_its_upstream_closes_still_tells_its_end() -> None:
    ends: list[str] = []

    async def on_close(end: str) -> None:
        ends.append(end)

    async def scenario() -> None:
        response = httpx.Response(200, stream=_SlowToClose())
        body = StreamBody(
            response,
            UsageTap(CHAT.stream_usage(), strip_usage_event=False),
            StreamRedactor(b"sk-upstream"),
            lambda: None,
            on_close,
            CHAT.stream_error,
        )
        closing = asyncio.create_task(body.aclose())
        await asyncio.sleep(0.05)  # in the upstream's close
        closing.cancel()
        await asyncio.gather(closing, return_exceptions=True)
        await body.aclose()  # told once: a second close tells nothing

    asyncio.run(scenario())
    assert ends == ["abandoned"]
