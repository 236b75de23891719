"""Start-up checks that turn "cannot listen" into one line that says what to do."""

from __future__ import annotations

import errno
import socket

__all__ = ["listen_problem"]


def listen_problem(
    host: str, port: int, what: str, *, port_fix: str, host_fix: str | None = None
) -> str | None:
    """None if ``host:port`` can be listened on now; else one line naming ``what`` wanted
    it, why it cannot have it, and the fix: ``port_fix`` (the flag or variable that moves
    the port) or ``host_fix`` (the one that changes the address) as the cause calls for."""
    where = f"{host}:{port} for {what}"
    if not 0 <= port <= 65535:
        return f"cannot listen on {where} (a port is 0-65535); {port_fix}"
    if port == 0:
        return None  # any free port: nothing to check
    address_fix = host_fix or port_fix
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except socket.gaierror as exc:
        return f"cannot listen on {where} (unknown address: {exc.strerror}); {address_fix}"
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return f"cannot listen on {where} (already in use); {port_fix}"
        if exc.errno == errno.EACCES:
            reason = "permission denied: ports below 1024 need privileges"
            return f"cannot listen on {where} ({reason}); {port_fix}"
        if exc.errno == errno.EADDRNOTAVAIL:
            return f"cannot listen on {where} (not an address of this machine); {address_fix}"
        return f"cannot listen on {where} ({exc.strerror}); {port_fix}"
    return None
