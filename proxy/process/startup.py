"""What ``serve`` checks before it starts, so that a mistake is one line saying what to do
instead of a traceback: variables that must be numbers, the TLS files, the limiter's
Redis refusing its credentials or TLS certificate, and (warnings, not failures)
upstreams, or a Redis, that nothing answers at, or where no OpenAI-compatible API
answers (every endpoint 404: a base_url missing its /v1; ``check-config`` says so too);
with ``telemetry.traces`` on, the OpenTelemetry packages and the exporter's protocol."""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from proxy.config.settings import Deployment, Settings, TelemetryConfig
from proxy.observability.otlp import traces_problem

if TYPE_CHECKING:
    from proxy.observability.tracing import Tracing

__all__ = [
    "Problems",
    "StartupError",
    "env_int",
    "redis_problem",
    "tls_problem",
    "traces_problem",
    "warn_about_unreachable_upstreams",
    "wrong_paths",
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


def redis_problem(settings: Settings, timeout: float = 1.0) -> str | None:
    """One line if the limiter's Redis refuses the proxy: a wrong user or password, a TLS
    certificate its CA does not vouch for, an ACL without PING. None if it answers, if
    there is none, or if nothing answers (an outage: ``redis.on_error`` applies until it
    does; a warning). Under Sentinel each sentinel is asked, then the primary it names."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
    from redis.sentinel import Sentinel

    from proxy.limiter.factory import sentinel_target
    from proxy.limiter.redis.runner import shown
    from proxy.limiter.redis.sentinel import client_options

    config = settings.redis
    options = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    servers: list[tuple[str, redis.Redis]] = []
    if config.sentinel is not None:
        field, target = "redis.sentinel", sentinel_target(config.sentinel)
        fix = "redis.sentinel.tls.ca_file"
        sentinel_kwargs, primary_kwargs = client_options(target, options)
        for host, port in target.nodes:
            servers.append((f"sentinel {host}:{port}", redis.Redis(host, port, **sentinel_kwargs)))
        sentinels = Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
            list(target.nodes), sentinel_kwargs=sentinel_kwargs, **primary_kwargs
        )
        primary = sentinels.master_for(target.master)  # type: ignore[no-untyped-call,unused-ignore]
        servers.append((f"the primary of {target.master!r}", primary))
    elif config.url:
        scheme, _, rest = config.url.partition("://")
        field, fix = "redis.url", "?ssl_ca_certs=/path/to/ca.pem in redis.url"
        where = shown(config.url)
        url = f"{scheme.removesuffix('+cluster')}://{rest}"
        servers.append((where, redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), **options)))
    else:
        return None
    try:
        for where, client in servers:
            try:
                client.ping()
            except redis.exceptions.NoPermissionError as exc:
                return (
                    f"{field}: the Redis user may not run what the proxy needs ({exc}); give"
                    " it the ACL of docs/production.md"
                )
            except redis.RedisError as exc:
                if _auth_refused(exc):
                    return f"{field}: {where} refused the user or password; correct them in {field}"
                if _tls_refused(exc):
                    return (
                        f"{field}: the TLS certificate of {where} is not trusted"
                        f" ({_reason(exc)}); name the CA that signed it: {fix}"
                    )
                if not isinstance(exc, redis.ConnectionError | redis.TimeoutError):
                    return f"{field}: {where} answered with an error: {exc}"
                logger.warning(
                    "Redis: %s does not answer (%s): starting; redis.on_error=%s applies"
                    " until it does.",
                    where,
                    _reason(exc),
                    config.on_error,
                )
    finally:
        for _, client in servers:
            client.close()
    return None


def _auth_refused(exc: BaseException) -> bool:
    from redis.exceptions import AuthenticationError

    text = str(exc)
    return isinstance(exc, AuthenticationError) or any(
        sign in text for sign in ("WRONGPASS", "invalid username", "NOAUTH")
    )


def _tls_refused(exc: BaseException) -> bool:
    """Whether a certificate check failed somewhere in ``exc``'s chain."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(
            seen
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _reason(exc: BaseException) -> str:
    if type(exc).__name__ == "MasterNotFoundError":
        return "no sentinel names a primary"
    text = str(exc).split(". ", 1)[-1] if "connecting to" in str(exc) else str(exc)
    return text.strip().rstrip(".")[:300]


_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
# An upstream on this machine started just before the proxy (the README's
# `fake-upstream ... &` then `serve`) is given this long to listen before it is warned
# about: its process is still starting, not missing. Tried again every _RETRY seconds.
COMING_UP = 2.0
_RETRY = 0.1


def warn_about_unreachable_upstreams(
    settings: Settings, timeout: float = 3.0, grace: float = COMING_UP
) -> None:
    """In the background, connect to each upstream address on this machine (again and
    again for ``grace`` seconds while nothing listens there yet) and log a warning for
    each that nothing answers at: its requests would all fail with 502 while
    /health/ready still says ready (a deployment is usable until it fails)."""
    by_address: dict[tuple[str, int], list[str]] = defaultdict(list)
    for deployment in _on_this_machine(settings):
        parts = urlsplit(deployment.base_url)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            continue  # not a port: the request itself will say so
        assert parts.hostname is not None
        by_address[(parts.hostname, port)].append(deployment.id)
    for address, ids in by_address.items():
        threading.Thread(
            target=_probe, args=(address, ids, timeout, grace), name="upstream-probe", daemon=True
        ).start()
    if by_address:
        threading.Thread(
            target=_warn_about_wrong_paths,
            args=(settings, timeout, list(by_address), grace),
            name="upstream-path-probe",
            daemon=True,
        ).start()


def _on_this_machine(settings: Settings) -> list[Deployment]:
    """The deployments whose upstream is on this machine: only those are probed (a remote
    one may be reachable only through an egress proxy, HTTPS_PROXY or proxy_url, which a
    bare probe would not use)."""
    return [
        d
        for group in settings.models
        for d in group.deployments
        if urlsplit(d.base_url).hostname in _LOCAL_HOSTS
    ]


def _warn_about_wrong_paths(
    settings: Settings, timeout: float, addresses: list[tuple[str, int]], grace: float
) -> None:
    for address in addresses:  # those coming up: their paths can be asked once they listen
        _connect(address, timeout, grace)
    for warning in wrong_paths(settings, timeout):
        logger.warning("%s", warning)


def wrong_paths(settings: Settings, timeout: float = 3.0) -> list[str]:
    """A warning for each deployment on this machine whose every endpoint answers 404
    (its requests would all fail with 502 ``upstream_error``): one small POST of ``{}``
    per endpoint, without credentials, at most ``timeout`` seconds each, deployments in
    parallel. Only this machine's, as for ``warn_about_unreachable_upstreams``; one that
    does not answer, or answers anything else, is not warned about here."""
    local = _on_this_machine(settings)
    if not local:
        return []
    with ThreadPoolExecutor(max_workers=min(len(local), 8)) as pool:
        found = list(pool.map(lambda d: _wrong_path(d, timeout), local))
    return [warning for warning in found if warning is not None]


def _wrong_path(deployment: Deployment, timeout: float) -> str | None:
    import httpx  # here: the supervisor's process never needs it

    from proxy.catalog.catalog import egress, shape_urls

    try:
        urls = [text for _, text in shape_urls(deployment).values()]
        context = egress(deployment).ssl
        with httpx.Client(verify=context or True, timeout=timeout, trust_env=False) as client:
            for url in urls:
                answered = client.post(url, content=b"{}", headers=_PROBE_HEADERS)
                if answered.status_code != 404:
                    return None
    except (httpx.HTTPError, OSError, ValueError):
        return None  # not answering: the TCP probe says so
    return (
        f"deployment {deployment.id}: {urls[0]} answers 404 (as every endpoint of its"
        f" base_url {deployment.base_url}): no OpenAI-compatible API there, its requests"
        " fail with 502; is base_url missing /v1?"
    )


_PROBE_HEADERS = {"content-type": "application/json"}


def _connect(address: tuple[str, int], timeout: float, grace: float) -> OSError | None:
    """None once a TCP connection to ``address`` is made; what the last attempt met if
    none was within ``grace`` seconds (tried every ``_RETRY``)."""
    deadline = time.monotonic() + grace
    while True:
        try:
            with socket.create_connection(address, timeout=timeout):
                return None
        except OSError as exc:
            if time.monotonic() >= deadline:
                return exc
        time.sleep(_RETRY)


def _probe(address: tuple[str, int], ids: list[str], timeout: float, grace: float) -> None:
    exc = _connect(address, timeout, grace)
    if exc is None:
        return
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


def tracing_for(config: TelemetryConfig) -> Tracing | None:
    """The process's tracer provider when ``telemetry.traces`` is on (None: off, and
    OpenTelemetry is not imported); raises ``StartupError`` naming the extra to install
    when its packages are missing."""
    if not config.traces:
        return None
    problem = traces_problem()
    if problem is not None:
        raise StartupError(f"telemetry: {problem}")
    from proxy.observability.tracing import start_tracing  # OpenTelemetry from here on

    return start_tracing()
