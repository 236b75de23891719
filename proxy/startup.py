"""What ``serve`` checks before it starts, so that a mistake is one line saying what to do
instead of a traceback: variables that must be numbers, the TLS files, and (a warning,
not a failure) upstreams that nothing answers at."""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
from collections import defaultdict
from urllib.parse import urlsplit

from proxy.config import Settings

__all__ = [
    "Problems",
    "StartupError",
    "env_int",
    "tls_problem",
    "warn_about_unreachable_upstreams",
]

logger = logging.getLogger("proxy")


class StartupError(Exception):
    """The process cannot start: one line per problem, each saying why and what to change."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class Problems:
    """What stops a start, collected so that every one is reported at once, not just the
    first (two busy ports, two bad variables: two lines)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, problem: str | None) -> None:
        if problem is not None:
            self.lines.append(problem)

    def env_int(self, name: str, default: int) -> int | None:
        """``env_int``, or None (and the problem noted) if the variable is not a number."""
        try:
            return env_int(name, default)
        except StartupError as exc:
            self.lines.extend(exc.problems)
            return None

    def raise_any(self) -> None:
        if self.lines:
            raise StartupError(*self.lines)


def env_int(name: str, default: int) -> int:
    """The whole number in the environment variable ``name``, or ``default`` if unset."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise StartupError(
            f"{name}={raw!r} is not a whole number; set e.g. {name}={default}, or unset it"
        ) from None


def tls_problem(certfile: str | None, keyfile: str | None) -> str | None:
    """None if the TLS options are absent or usable; else one line saying what is wrong."""
    if not certfile and not keyfile:
        return None
    if not certfile:
        return "--ssl-keyfile needs --ssl-certfile (or LLM_PROXY_SSL_CERTFILE) too"
    for flag, path in (("--ssl-certfile", certfile), ("--ssl-keyfile", keyfile)):
        if path is None:
            continue
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            return f"cannot read {flag} {path} ({exc.strerror}); pass a readable PEM file"
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(certfile, keyfile)
    except ssl.SSLError as exc:
        reason = _TLS_REASONS.get(exc.reason, str(exc.reason).lower().replace("_", " "))
        return (
            f"cannot use the TLS certificate {certfile} ({reason}); --ssl-certfile takes a"
            " PEM certificate (chain), --ssl-keyfile its unencrypted PEM private key"
        )
    return None


# OpenSSL's reason codes, in words.
_TLS_REASONS = {
    None: "not a PEM certificate and private key",
    "PEM_LIB": "not a PEM certificate and private key",
    "KEY_VALUES_MISMATCH": "the private key is not this certificate's",
}


_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def warn_about_unreachable_upstreams(settings: Settings, timeout: float = 3.0) -> None:
    """In the background, try one TCP connection to each upstream address on this machine
    and log a warning for each that nothing answers at: its requests would all fail with 502 while
    /health/ready still says ready (a deployment is usable until it fails)."""
    by_address: dict[tuple[str, int], list[str]] = defaultdict(list)
    for group in settings.models:
        for deployment in group.deployments:
            parts = urlsplit(deployment.base_url)
            try:
                port = parts.port or (443 if parts.scheme == "https" else 80)
            except ValueError:
                continue  # not a port: the request itself will say so
            # Only this machine's: a remote upstream may be reachable only through an
            # egress proxy (HTTPS_PROXY, proxy_url), which a bare TCP probe would not use.
            if parts.hostname in _LOCAL_HOSTS:
                by_address[(parts.hostname, port)].append(deployment.id)
    for address, ids in by_address.items():
        threading.Thread(
            target=_probe, args=(address, ids, timeout), name="upstream-probe", daemon=True
        ).start()


def _probe(address: tuple[str, int], ids: list[str], timeout: float) -> None:
    try:
        with socket.create_connection(address, timeout=timeout):
            return
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
    host, port = address
    reason += "; is it running?"
    logger.warning(
        "upstream %s:%d of deployment(s) %s does not answer (%s): their requests fail"
        " with 502 until it does",
        host,
        port,
        ", ".join(ids),
        reason,
    )
