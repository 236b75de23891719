"""A client that writes raw bytes to a proxy on 127.0.0.1 and reads its answer: for what
an HTTP library will not send (a header line the parser refuses, a body that stops)."""

from __future__ import annotations

import socket

__all__ = ["read_answer"]


def read_answer(conn: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One answer with a ``content-length``, read within the socket's timeout (a missing
    answer fails the test): its status, headers (names lower case) and body."""
    with conn.makefile("rb") as reader:
        status = int(reader.readline().split()[1])
        headers: dict[str, str] = {}
        while (line := reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.lower()] = value.strip()
        return status, headers, reader.read(int(headers["content-length"]))
