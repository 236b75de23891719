"""Start-up checks that turn "address already in use" into one line that says what to do."""

from __future__ import annotations

import errno
import socket

__all__ = ["busy_port_message"]


def busy_port_message(host: str, port: int, what: str, fix: str) -> str | None:
    """None if ``host:port`` can be listened on now; else one line naming ``what`` wanted
    it and ``fix`` (the flag or variable that moves it)."""
    if port == 0:
        return None
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        reason = "already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        return f"cannot listen on {host}:{port} for {what} ({reason}); {fix}"
    return None
