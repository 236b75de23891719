"""What every upstream transport hands over beyond httpx's API (client.py, lean.py)."""

from __future__ import annotations

import httpx

__all__ = ["HEADER_MAP", "UpstreamStream"]

# A response extension: its headers as a dict, names lowercase (the last of repeats).
HEADER_MAP = "proxy.header_map"


class UpstreamStream(httpx.AsyncByteStream):
    """An upstream answer's body: streamed chunk by chunk as it arrives, or read whole."""

    async def read(self) -> bytes:
        """The whole body in one go (a buffered answer)."""
        raise NotImplementedError
