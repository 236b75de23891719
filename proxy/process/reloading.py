"""Config reload in a running process: SIGHUP, or ``POST /admin/reload``.

A reload re-reads the config file. A valid one becomes a new ``Pipeline`` over the same
limiter and transport, swapped in at once (the forwarding endpoints read
``app.state.pipeline`` per request): requests already running or waiting for their turn
finish under the old pipeline, which is retired once they are done. Budgets live in the
limiter, keyed by owner and window name (``base.Window``), so a window that did not
change keeps its state and a changed one meets its new limit with what was spent. An
invalid file changes nothing: one log line with every problem. Both count in
``llmproxy_config_reloads_total{result}``. What a running process cannot take
(``config_changes.RESTART_ONLY``) stays as it was, and the reload says so.

Under ``serve --workers N`` uvicorn's supervisor would restart the workers on SIGHUP
(losing in-memory budgets); ``supervisor.Supervisor`` passes the signal on to every worker
instead, and ``POST /admin/reload`` in one worker asks the supervisor to, then answers
with its own reload's result.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from proxy.catalog.catalog import Catalog
from proxy.config.changes import ConfigChanges, ReloadResult, config_changes, in_force
from proxy.config.read import read_document_apart
from proxy.config.settings import ClientKey, ConfigError, Settings, config_warnings, parse_settings
from proxy.limiter.base import ManagedLimiter
from proxy.observability.metrics import Metrics
from proxy.observability.observer import StateObserver, publish_configured_state, shadow_keys_of
from proxy.pipeline.auth import KeyStore, open_when_empty
from proxy.pipeline.pipeline import Pipeline
from proxy.process.release import release_in_slices

if TYPE_CHECKING:
    from proxy.observability.tracing import Tracing

__all__ = ["Reloader", "hold_sighup"]

logger = logging.getLogger("proxy.reload")

# How long POST /admin/reload waits for its worker's own reload once it has asked the
# supervisor (which looks at its signals twice a second).
FAN_OUT_TIMEOUT = 30.0

_early_sighups: list[int] = []

_OPEN_ACCESS_REFUSED = (
    "keys: none left, which would let anyone use the proxy; set server.open_access: true"
    " to allow that"
)


def hold_sighup() -> None:
    """Until a ``Reloader`` takes over, a SIGHUP is remembered rather than fatal (its
    default action): a process still starting reloads as soon as it can. A worker of
    ``supervisor.Supervisor`` starts with SIGHUP blocked (pending, not fatal): from here
    on it is delivered."""
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, lambda signum, frame: _early_sighups.append(signum))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})


class Reloader:
    """Owns what a reload replaces in one process: ``state.pipeline`` and
    ``state.settings`` (the app's state), the observer's catalog, the published series."""

    def __init__(
        self,
        state: Any,
        config_path: str | None,
        *,
        limiter: ManagedLimiter,
        transport: httpx.AsyncBaseTransport,
        metrics: Metrics,
        observer: StateObserver,
        share: float,
        workers: int = 1,
        supervisor: int | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.state = state
        self.config_path = config_path
        self.limiter = limiter
        self.transport = transport
        self.metrics = metrics
        self.observer = observer
        self.share = share
        self.workers = max(workers, 1)
        self.supervisor = supervisor
        self.tracing = tracing  # the process's, kept by every pipeline (telemetry.traces)
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._retired: set[Pipeline] = set()
        self._releasing = 0
        self._reloaded = asyncio.Condition()
        self.generation = 0  # reloads done (or failed) in this process
        self.last: ReloadResult | None = None
        self._signal_installed = False

    @property
    def retiring(self) -> int:
        """Replaced pipelines whose requests or bookkeeping are not done yet."""
        return len(self._retired)

    # -- triggers ----------------------------------------------------------------------

    def install_signal(self) -> None:
        """SIGHUP reloads this process (main thread only; elsewhere: no signal)."""
        if not hasattr(signal, "SIGHUP"):
            return
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._on_sighup)
        except (RuntimeError, ValueError):  # not the main thread (tests run apps in threads)
            logger.debug("SIGHUP not handled here: not the main thread")
            return
        self._signal_installed = True
        if _early_sighups:
            _early_sighups.clear()
            self._on_sighup()

    def _on_sighup(self) -> None:
        logger.info("SIGHUP: reloading the config")
        self._spawn(self.reload())

    async def reload_everywhere(self) -> ReloadResult:
        """``POST /admin/reload``: every worker of this process group reloads (through
        the supervisor when there is one); this worker's result."""
        if self.supervisor is None or os.getppid() != self.supervisor:
            return await self.reload()
        async with self._reloaded:
            seen = self.generation
            try:
                os.kill(self.supervisor, signal.SIGHUP)
            except ProcessLookupError:  # the supervisor is gone: this worker alone
                return await self.reload()
            await asyncio.wait_for(
                self._reloaded.wait_for(lambda: self.generation > seen), FAN_OUT_TIMEOUT
            )
        assert self.last is not None
        return self.last

    # -- the reload --------------------------------------------------------------------

    async def reload(self) -> ReloadResult:
        async with self._lock:
            result = await self._reload()
        self.metrics.config_reloaded("success" if result.ok else "failure", 1 / self.workers)
        async with self._reloaded:
            self.generation += 1
            self.last = result
            self._reloaded.notify_all()
        return result

    async def _reload(self) -> ReloadResult:
        path = self.config_path
        if path is None:
            return self._failed("<embedded demo>", ["no config file to re-read (embedded demo)"])
        old: Settings = self.state.settings
        previous: Pipeline = self.state.pipeline
        try:
            # Off the event loop: reading, validating, comparing and indexing 100,000 keys,
            # and what the new pipeline is built from.
            ready = await asyncio.to_thread(_prepare, path, old, previous, self.share)
        except ConfigError as exc:
            return self._failed(path, exc.problems)
        loaded, settings, changes = ready.loaded, ready.settings, ready.changes
        runtime = previous.keys.runtime
        # No keys left anywhere (a store not read yet may hold some: it opens nothing).
        if not loaded.keys and (runtime is None or (runtime.known and len(runtime) == 0)):
            if not loaded.server.open_access:
                logger.warning("config reload refused: it would leave no client keys (open access)")
                return self._failed(path, [_OPEN_ACCESS_REFUSED])
            logger.warning(
                "config reload: no client keys and server.open_access: true; the proxy"
                " accepts requests from anyone"
            )
        pipeline = Pipeline(
            settings,
            self.limiter,
            self.transport,
            self.metrics,
            self.share,
            previous=previous,
            key_store=ready.key_store,
            catalog=ready.catalog,
            tracing=self.tracing,
        )
        # One step, no await: every request from here on gets the new pipeline.
        self.state.pipeline = pipeline
        self.state.settings = settings
        self.observer.follow(pipeline.catalog)
        publish_configured_state(
            settings, self.metrics, self.share, previous=old, shadow_keys=ready.shadow_keys
        )
        self._retire(previous, ready.retired)
        for warning in config_warnings(settings):
            logger.warning("config: %s", warning)
        logger.info("config reloaded from %s", path, extra={"changes": changes.as_dict()})
        if changes.restart_needed:
            logger.warning(
                "config reload: %s changed but needs a restart; the running value stays",
                ", ".join(changes.restart_needed),
            )
        return ReloadResult(True, changes=changes)

    def _failed(self, source: str, problems: list[str]) -> ReloadResult:
        logger.error(
            "config reload failed, nothing changed: %s: %d problem(s): %s",
            source,
            len(problems),
            "; ".join(problems),
            extra={"problems": problems},
        )
        return ReloadResult(False, problems=tuple(problems))

    @property
    def releasing(self) -> int:
        """Retired configs whose keys are still being freed (``release.py``)."""
        return self._releasing

    def _retire(self, pipeline: Pipeline, hold: list[object]) -> None:
        """Once ``pipeline``'s requests are done it is dropped; what it alone referenced
        of its keys (``hold``, kept alive meanwhile) is then freed in a thread, a slice at
        a time, not on the event loop in one go."""
        self._retired.add(pipeline)
        self._releasing += 1
        retiring = [pipeline]  # the task's only reference, dropped before the release

        async def retire() -> None:
            try:
                await retiring[0].retire()
                self._retired.discard(retiring.pop())
                await asyncio.to_thread(release_in_slices, hold)
            finally:
                self._releasing -= 1

        self._spawn(retire())

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """At shutdown (requests are over): stop listening, finish retired pipelines'
        bookkeeping."""
        if self._signal_installed:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            hold_sighup()  # never the default action (exit) while shutting down
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for pipeline in list(self._retired):
            await pipeline.drain()


@dataclass(frozen=True, slots=True)
class _Prepared:
    """What a reload's thread hands the event loop: the new config and what its pipeline
    is built from, and ``retired``: the outgoing config's keys and index entries."""

    loaded: Settings
    settings: Settings  # loaded, as a running process applies it (config_changes.in_force)
    changes: ConfigChanges
    key_store: KeyStore
    catalog: Catalog
    shadow_keys: list[ClientKey]
    retired: list[object]


def _prepare(path: str, old: Settings, previous: Pipeline, share: float) -> _Prepared:
    """In a thread: the file read, validated (a key whose entry did not change is the
    one in force), compared, its keys indexed, the catalog built; the outgoing keys
    referenced (``retired``) so that dropping the old pipeline frees none of them on the
    event loop. The collector is held off meanwhile and what
    was built frozen (``gc.freeze``, as at start-up): a full collection over 100,000 new
    keys would hold the GIL, and the event loop, for a quarter of a second; a frozen
    object is still freed when no longer referenced."""
    gc.disable()
    try:
        document = read_document_apart(path)
        loaded = parse_settings(document, path, previous=old)
        if isinstance(document, dict) and isinstance(document.get("keys"), list):
            release_in_slices(document.pop("keys"))  # 100,000 entries: ~10 ms at once
        del document
        settings = in_force(old, loaded)
        try:
            catalog = Catalog(settings, share)
        except (OSError, ssl.SSLError, ValueError) as exc:  # e.g. a TLS file unreadable now
            raise ConfigError(path, [f"models: cannot be used: {exc}"]) from None
        retired: list[object] = [*previous.settings.keys.held(), *previous.keys.held()]
        retired += previous.catalog.held()
        result = _Prepared(
            loaded,
            settings,
            config_changes(old, loaded),
            KeyStore(loaded.keys, open_when_empty=open_when_empty(settings)),
            catalog,
            shadow_keys_of(settings),
            retired,
        )
        gc.freeze()
        return result
    finally:
        gc.enable()
