"""A client that writes raw bytes to a proxy on 127.0.0.1 and reads its answer: for what
an HTTP library will not send (a header line the parser refuses, a body that stops)."""

from __future__ import annotations

import socket

__all__ = ["read_answer", "read_to_close"]


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


def read_to_close(conn: socket.socket) -> tuple[str, int, dict[str, str], bytes]:
    """Everything the peer sends until it closes the connection (within the socket's
    timeout: one left open fails the test), as an answer: its HTTP version
    (``HTTP/1.1``), status, headers (names lower case) and body as sent (framing
    included: a chunked body stays chunked)."""
    received = bytearray()
    while chunk := conn.recv(65536):
        received += chunk
    head, _, body = bytes(received).partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    version, status = status_line.split()[:2]
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.lower()] = value.strip()
    return version, int(status), headers, body
