"""A Google OAuth2 access token for a deployment, from google-auth: a service account's
key file (``credentials_file``) or the Application Default Credentials, for the
``cloud-platform`` scope; refreshed before it expires, off the event loop (google-auth
is blocking), one refresh shared by every request that needs it, in the background
while the old token is still good.

A token that cannot be had (the token endpoint down or refusing, a key file gone bad)
is ``errors.UpstreamUnavailable``: the deployment is not reachable now, its request is
tried elsewhere. The cause is logged by its kind and Google's error code, never with
the key, the assertion or a token.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from proxy.errors import UpstreamUnavailable

__all__ = ["EARLY", "SCOPES", "GoogleToken", "refresh_moment"]

logger = logging.getLogger("proxy.upstream")

SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
# A token is refreshed this long before it expires (half its life when it lives less
# than twice that): requests never carry one that expires on the way.
EARLY = 300.0
# A token past its refresh moment is still sent until this long before it expires
# (while its successor is fetched in the background), never closer.
USABLE_MARGIN = 60.0
# The token endpoint's whole answer is awaited at most this long (google-auth's default
# is 120 s, which would hold every request of the deployment that long).
TOKEN_TIMEOUT = 10.0
# After a failed refresh, requests are refused at once for this long instead of each
# waiting on the token endpoint again (the deployment is cooled meanwhile anyway).
RETRY_AFTER_FAILURE = 2.0
_CAUSE_CHARS = 200  # the most of an error's own words logged


def refresh_moment(now: float, expiry: float | None) -> float:
    """When a token got at ``now`` that expires at ``expiry`` (epoch; None: not said)
    is refreshed: ``EARLY`` before it expires, or half its life when that is shorter."""
    if expiry is None:
        return now + EARLY
    lifetime = max(expiry - now, 0.0)
    return now + lifetime - min(EARLY, lifetime / 2)


def usable_until(now: float, expiry: float | None) -> float:
    """Until when a token got at ``now`` is still sent while its successor is fetched:
    a minute before it expires (a quarter of its life when that is shorter)."""
    if expiry is None:
        return now + EARLY
    lifetime = max(expiry - now, 0.0)
    return now + lifetime - min(USABLE_MARGIN, lifetime / 4)


Loader = Callable[[], Any]  # google.auth.credentials.Credentials, loaded (blocking)


class GoogleToken:
    """One deployment's bearer token (``bearer``), held until its refresh moment."""

    def __init__(
        self,
        deployment: str,
        credentials_file: str = "",
        *,
        clock: Callable[[], float] = time.time,
        timeout: float = TOKEN_TIMEOUT,
        loader: Loader | None = None,
    ) -> None:
        self._deployment = deployment
        self._clock = clock
        self._timeout = timeout
        self._load = loader or functools.partial(load_credentials, credentials_file)
        self._credentials: Any = None
        self._request: Any = None
        self._token: str | None = None
        self._refresh_at = 0.0
        self._usable_until = 0.0
        self._failed_until = 0.0
        self._background: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.refreshes = 0  # how many refreshes succeeded (tests, /admin views)

    async def bearer(self) -> str:
        """The token to send now; raises ``UpstreamUnavailable`` when none can be had.
        Past its refresh moment a token still good for a while is sent while a new one
        is fetched in the background: no request waits on a refresh but the first and
        one after a token ran out."""
        token, now = self._token, self._clock()
        if token is not None and now < self._refresh_at:
            return token
        if token is not None and now < self._usable_until:
            if self._background is None or self._background.done():
                self._background = asyncio.create_task(self._renew_quietly())
            return token
        return await self._renew()

    async def _renew_quietly(self) -> None:
        with contextlib.suppress(UpstreamUnavailable):  # logged; the next request retries
            await self._renew()

    async def _renew(self) -> str:
        async with self._lock:  # one refresh; those waiting then take its token
            token = self._token
            if token is not None and self._clock() < self._refresh_at:
                return token
            if self._clock() < self._failed_until:
                raise self._unavailable()
            try:
                fresh, expiry = await asyncio.to_thread(self._refresh)
            except Exception as exc:  # google-auth's, requests', a key file's: all one
                self._failed_until = self._clock() + RETRY_AFTER_FAILURE
                logger.warning(
                    "deployment %s: its Google access token could not be refreshed: %s",
                    self._deployment,
                    describe(exc, self._token),
                )
                raise self._unavailable() from None
            now = self._clock()
            self._token, self._refresh_at = fresh, refresh_moment(now, expiry)
            self._usable_until = usable_until(now, expiry)
            self.refreshes += 1
            return fresh

    def _unavailable(self) -> UpstreamUnavailable:
        return UpstreamUnavailable(
            f"The upstream deployment '{self._deployment}' cannot be reached now: its"
            " Google access token could not be refreshed.",
            code="upstream_error",
        )

    def _refresh(self) -> tuple[str, float | None]:
        """A new token and its expiry (epoch; None: not said). Blocking: run in a
        thread, one at a time (the lock)."""
        import google.auth.transport.requests

        if self._credentials is None:
            self._credentials = self._load()
            self._request = functools.partial(
                google.auth.transport.requests.Request(), timeout=self._timeout
            )
        credentials = self._credentials
        credentials.refresh(self._request)
        token = credentials.token
        if not isinstance(token, str) or not token:
            raise ValueError("the token endpoint answered without an access token")
        return token, _epoch(credentials.expiry)


def load_credentials(credentials_file: str) -> Any:
    """The service account of ``credentials_file``, or the Application Default
    Credentials when none is named (blocking: files, maybe the metadata server)."""
    if credentials_file:
        from google.oauth2 import service_account

        load: Callable[..., Any] = service_account.Credentials.from_service_account_file
        return load(credentials_file, scopes=list(SCOPES))
    import google.auth

    credentials, _project = google.auth.default(scopes=list(SCOPES))
    return credentials


def _epoch(expiry: datetime | None) -> float | None:
    """google-auth's expiry (a naive UTC datetime) as epoch seconds."""
    if not isinstance(expiry, datetime):
        return None
    if expiry.tzinfo is None:
        expiry = expiry.replace(tzinfo=UTC)
    return expiry.timestamp()


def describe(exc: BaseException, token: str | None = None) -> str:
    """An error of a refresh as logs may show it: its kind and the start of its own
    words (google-auth's are Google's error code and description), any token cut out."""
    first = exc.args[0] if exc.args else ""
    words = first if isinstance(first, str) else ""
    if token:
        words = words.replace(token, "[redacted]")
    words = " ".join(words.split())[:_CAUSE_CHARS]
    return f"{type(exc).__name__}: {words}" if words else type(exc).__name__
