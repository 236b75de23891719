"""Prometheus metrics of the proxy.

One :class:`Metrics` object per process owns its own ``CollectorRegistry``: nothing is
registered in prometheus-client's global registry, so tests can build many apps per process.
The request pipeline calls the small recording methods below; each one looks its labelled
children up in a dict keyed by the label tuple, because ``.labels()`` validates and locks on
every call and is too slow for the hot path.

Label values must come from the config (model and deployment names, or the literal
``"unknown"``) and from the fixed vocabularies named here, never from client input, so the
number of series stays bounded.

Several uvicorn workers (``--workers N``) use prometheus-client's multiprocess mode:

* prometheus-client picks its value class once, when ``prometheus_client.values`` is first
  imported: with ``PROMETHEUS_MULTIPROC_DIR`` set, every metric is backed by a per-process
  mmap file in that directory. So the variable must be set before a worker imports
  prometheus_client. uvicorn *spawns* its workers (fresh interpreters that inherit the
  environment), hence the CLI calls :func:`prepare_multiprocess_dir` in the parent before
  starting them, and :func:`cleanup_multiprocess_dir` after they have stopped.
* :meth:`Metrics.render` then merges every worker's file with ``MultiProcessCollector``:
  counters and histograms are summed (files of dead workers stay, so nothing is lost; the
  directory is fresh per start, so nothing from an earlier run is counted again), and each
  gauge is merged by the mode that makes its number right (see ``_GAUGE_MODES``).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from typing import Final, Generic, Literal, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import values as _prom_values
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

__all__ = [
    "CONTENT_TYPE",
    "LIMITER_OPERATIONS",
    "LIMIT_KINDS",
    "MULTIPROC_ENV",
    "RATE_LIMIT_SCOPES",
    "RELOAD_RESULTS",
    "Metrics",
    "cleanup_multiprocess_dir",
    "mark_worker_dead",
    "prepare_multiprocess_dir",
]

log = logging.getLogger("proxy.metrics")

MULTIPROC_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"

# The classic text format; every Prometheus server understands it.
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

# ``kind`` of the budget gauges; the names of OpenAI's x-ratelimit-*-requests/-tokens headers.
LIMIT_KINDS: Final = frozenset({"requests", "tokens"})

# Known ``scope`` values of llmproxy_rate_limited_total (others are accepted: the pipeline
# owns the vocabulary; this list documents it).
RATE_LIMIT_SCOPES: Final = (
    "key_rpm",
    "key_tpm",
    "key_parallel",  # and key_<window> of any other window of a key
    "team_rpm",
    "team_tpm",
    "team_parallel",  # and team_<window> of any other window of a team
    "model_capacity",
    "queue_full",
    "model_unavailable",  # 503: every deployment cooling down
    "request_too_large",
)

# What the limiter asks its shared storage (labels of llmproxy_limiter_errors_total).
LIMITER_OPERATIONS: Final = ("acquire_key", "reserve", "settle", "snapshot", "heartbeat")

# Outcomes of a config reload (labels of llmproxy_config_reloads_total).
RELOAD_RESULTS: Final = ("success", "failure")

# Operations on run-time client keys and teams and their results
# (llmproxy_key_operations_total): fixed sets, never a name (an API caller's input).
KEY_OPERATIONS: Final = (
    "create",
    "update",
    "rotate",
    "revoke",
    "team_create",
    "team_update",
    "team_delete",
)
# unknown: sent to the shared store, whose answer never came (it may have happened).
KEY_RESULTS: Final = ("success", "invalid", "conflict", "not_found", "unavailable", "unknown")

# LLM calls last from milliseconds (cached, tiny embeddings) to many minutes (long generations).
DURATION_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
)  # fmt: skip
TTFT_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
    20.0, 30.0, 60.0,
)  # fmt: skip
QUEUE_WAIT_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
)  # fmt: skip

_GaugeMode = Literal["livesum", "livemax", "livemostrecent"]

# How each gauge is merged across workers. "live*" modes drop the values of dead workers
# (see mark_worker_dead), so a crashed worker's in-flight requests do not linger.
_GAUGE_MODES: Final[dict[str, _GaugeMode]] = {
    # Each worker counts its own requests: the replica's number is the sum.
    "queue_depth": "livesum",
    "tier_queue_depth": "livesum",
    "in_flight": "livesum",
    # Cooling down or in fallback in any worker is what an operator must see.
    "deployment_state": "livemax",
    "fallback_active": "livemax",
    "redis_evicting_policy": "livemax",
    # The pacing margin in force: every worker paces with the largest it knows of.
    "pacing_margin": "livemax",
    # The upstream's own view, the same for every worker: the latest report is the truth.
    "upstream_remaining": "livemostrecent",
}
# The limiter's limit and remaining budget: with a shared (Redis) limiter every worker sees the
# same bucket, so the latest value is the truth; with the in-memory one each worker holds its
# own share of the budget, so the replica's number is the sum of the shares.
_BUDGET_MODES: Final[dict[bool, _GaugeMode]] = {True: "livemostrecent", False: "livesum"}


class Metrics:
    """Every metric of the proxy, in a registry of its own.

    ``budget_shared`` says how the limiter's limit and remaining budget are merged across
    workers: True (Redis backend) when every worker sees the same shared bucket, so the
    latest value wins; False (in-memory backend) when each worker enforces its own share, so
    each worker sets its share and the shares add up. It matters only with several workers.

    In multiprocess mode create one instance per process: two instances in one process would
    write the same entries of the same mmap file.
    """

    def __init__(self, *, budget_shared: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.multiprocess_dir = _multiprocess_dir()
        self._render_registry = self.registry
        if self.multiprocess_dir is not None:
            # The aggregating registry reads every worker's files; self.registry still
            # holds this process's own values (handy in tests and for debugging).
            self._render_registry = CollectorRegistry(auto_describe=False)
            MultiProcessCollector(  # type: ignore[no-untyped-call]
                self._render_registry, path=self.multiprocess_dir
            )

        reg = self.registry
        self._requests_total = Counter(
            "llmproxy_requests_total",
            "Client requests answered by the proxy, by model, HTTP status and API.",
            ["model", "status", "api"],
            registry=reg,
        )
        self._request_duration = Histogram(
            "llmproxy_request_duration_seconds",
            "Time from receiving a client request to the end of its response, queueing "
            "and retries included.",
            ["model"],
            unit="seconds",
            buckets=DURATION_BUCKETS,
            registry=reg,
        )
        self._upstream_total = Counter(
            "llmproxy_upstream_requests_total",
            "Requests sent to upstream deployments, by HTTP status, or error/timeout when "
            "no response arrived.",
            ["model", "deployment", "status"],
            registry=reg,
        )
        self._upstream_duration = Histogram(
            "llmproxy_upstream_duration_seconds",
            "Time from sending a request upstream to the end of its response.",
            ["model", "deployment"],
            unit="seconds",
            buckets=DURATION_BUCKETS,
            registry=reg,
        )
        self._ttft = Histogram(
            "llmproxy_time_to_first_token_seconds",
            "Time from sending a streaming request upstream to its first content chunk.",
            ["model", "deployment"],
            unit="seconds",
            buckets=TTFT_BUCKETS,
            registry=reg,
        )
        self._tokens_total = Counter(
            "llmproxy_tokens_total",
            "Tokens reported by the upstream's usage, by kind (prompt or completion).",
            ["model", "deployment", "kind"],
            registry=reg,
        )
        self._rate_limited_total = Counter(
            "llmproxy_rate_limited_total",
            "Requests the proxy answered with 429, by whose limit it was (scope).",
            ["scope", "model"],
            registry=reg,
        )
        self._queue_wait = Histogram(
            "llmproxy_queue_wait_seconds",
            "Time a request waited for a budget before being forwarded or rejected.",
            ["model"],
            unit="seconds",
            buckets=QUEUE_WAIT_BUCKETS,
            registry=reg,
        )
        self._queue_depth = Gauge(
            "llmproxy_queue_depth",
            "Requests currently waiting for a budget.",
            ["model"],
            multiprocess_mode=_GAUGE_MODES["queue_depth"],
            registry=reg,
        )
        # The same by priority tier (keys[].priority, from the config): fair share at work.
        self._tier_queue_wait = Histogram(
            "llmproxy_tier_queue_wait_seconds",
            "Time a request waited for a budget, by its key's priority tier.",
            ["model", "tier"],
            unit="seconds",
            buckets=QUEUE_WAIT_BUCKETS,
            registry=reg,
        )
        self._tier_queue_depth = Gauge(
            "llmproxy_tier_queue_depth",
            "Requests currently waiting for a budget, by their key's priority tier.",
            ["model", "tier"],
            multiprocess_mode=_GAUGE_MODES["tier_queue_depth"],
            registry=reg,
        )
        self._in_flight = Gauge(
            "llmproxy_in_flight_requests",
            "Requests currently being forwarded to a deployment.",
            ["model", "deployment"],
            multiprocess_mode=_GAUGE_MODES["in_flight"],
            registry=reg,
        )
        self._deployment_state = Gauge(
            "llmproxy_deployment_state",
            "Deployment state: 0 healthy, 1 cooling down (not chosen).",
            ["model", "deployment"],
            multiprocess_mode=_GAUGE_MODES["deployment_state"],
            registry=reg,
        )
        self._cooldowns_total = Counter(
            "llmproxy_deployment_cooldowns_total",
            "Times a deployment was put into cooldown, by reason.",
            ["model", "deployment", "reason"],
            registry=reg,
        )
        self._failures_total = Counter(
            "llmproxy_deployment_failures_total",
            "Failed upstream attempts counted against a deployment's health, by reason.",
            ["model", "deployment", "reason"],
            registry=reg,
        )
        self._fallback_active = Gauge(
            "llmproxy_limiter_fallback_active",
            "1 while the shared limiter (Redis) is unreachable and local limits apply.",
            multiprocess_mode=_GAUGE_MODES["fallback_active"],
            registry=reg,
        )
        self._redis_evicting_policy = Gauge(
            "llmproxy_redis_evicting_policy",
            "1 when the limiter's Redis has an allkeys-* maxmemory-policy: it may evict"
            " budgets, which then read as full.",
            multiprocess_mode=_GAUGE_MODES["redis_evicting_policy"],
            registry=reg,
        )
        self._pacing_margin = Gauge(
            "llmproxy_pacing_margin_seconds",
            "The pacing margin in force (routing.pacing_margin): windows of a minute or less"
            " are paced for turns this late; measured (auto: the largest need of the live"
            " replicas) or fixed.",
            multiprocess_mode=_GAUGE_MODES["pacing_margin"],
            registry=reg,
        )
        self._limiter_errors_total = Counter(
            "llmproxy_limiter_errors_total",
            "Errors talking to the shared limiter backend (Redis), by operation.",
            ["operation"],
            registry=reg,
        )
        self._deployment_limit = Gauge(
            "llmproxy_deployment_limit",
            "Per-minute limit the proxy enforces for a deployment, by kind (requests or tokens).",
            ["model", "deployment", "kind"],
            multiprocess_mode=_BUDGET_MODES[budget_shared],
            registry=reg,
        )
        self._budget_remaining = Gauge(
            "llmproxy_deployment_budget_remaining",
            "Budget the proxy's limiter had left for a deployment at its last decision, by "
            "kind (requests or tokens).",
            ["model", "deployment", "kind"],
            multiprocess_mode=_BUDGET_MODES[budget_shared],
            registry=reg,
        )
        self._usage_unreadable_total = Counter(
            "llmproxy_usage_unreadable_total",
            "Answers with status 200 whose usage their API shape could not read (settled at "
            "the estimate), by shape and deployment.",
            ["shape", "deployment"],
            registry=reg,
        )
        self._shadow_rejections_total = Counter(
            "llmproxy_shadow_rejections_total",
            "Requests of a key in shadow mode that its own limit would have refused (they "
            "went on), by key and limit (the 429's code: key_rpm, key_tokens_30d, "
            "key_parallel...).",
            ["key", "limit"],
            registry=reg,
        )
        self._spend_usd_total = Counter(
            "llmproxy_spend_usd",
            "Dollars spent: the upstream's reported usage at the deployment's price, by"
            ' client key, its team ("" for none) and model group.',
            ["key", "team", "model"],
            registry=reg,
        )
        self._owner_budget_remaining = Gauge(
            "llmproxy_budget_remaining",
            "What is left of a budget in its current period (usd, tokens...) at its last"
            " check, by owner (a key's or a team's name) and budget (its 429 code:"
            " key_budget_usd_month, team_budget_tokens_day...).",
            ["owner", "budget"],
            multiprocess_mode=_BUDGET_MODES[budget_shared],
            registry=reg,
        )
        self._upstream_remaining = Gauge(
            "llmproxy_upstream_ratelimit_remaining",
            "Remaining budget the upstream last reported in its x-ratelimit-remaining-* "
            "headers, by kind (requests or tokens).",
            ["model", "deployment", "kind"],
            multiprocess_mode=_GAUGE_MODES["upstream_remaining"],
            registry=reg,
        )

        self._config_reloads_total = Counter(
            "llmproxy_config_reloads_total",
            "Config reloads (SIGHUP or POST /admin/reload), by result: success (in force)"
            " or failure (invalid file, nothing changed).",
            ["result"],
            registry=reg,
        )

        self._key_operations_total = Counter(
            "llmproxy_key_operations_total",
            "Operations on client keys and teams through the admin API, by operation"
            " (create, update, rotate, revoke; team_create, team_update, team_delete) and"
            " result.",
            ["operation", "result"],
            registry=reg,
        )
        self._key_store_lost_total = Counter(
            "llmproxy_key_store_lost_total",
            "Times this process found that a shared store of the admin API (client keys,"
            " teams; Redis) had lost its data (wiped: a restart without persistence, a"
            " failover to an empty replica, FLUSHALL; or rolled back), each also an error"
            " log line.",
            registry=reg,
        )

        # Children by label values (see the module docstring).
        self._c_requests = _Children(self._requests_total)
        self._c_request_duration = _Children(self._request_duration)
        self._c_upstream = _Children(self._upstream_total)
        self._c_upstream_duration = _Children(self._upstream_duration)
        self._c_ttft = _Children(self._ttft)
        self._c_tokens = _Children(self._tokens_total)
        self._c_rate_limited = _Children(self._rate_limited_total)
        self._c_queue_wait = _Children(self._queue_wait)
        self._c_queue_depth = _Children(self._queue_depth)
        self._c_tier_queue_wait = _Children(self._tier_queue_wait)
        self._c_tier_queue_depth = _Children(self._tier_queue_depth)
        self._c_in_flight = _Children(self._in_flight)
        self._c_state = _Children(self._deployment_state)
        self._c_cooldown = _Children(self._cooldowns_total)
        self._c_failure = _Children(self._failures_total)
        self._c_limiter_error = _Children(self._limiter_errors_total)
        self._c_limit = _Children(self._deployment_limit)
        self._c_budget = _Children(self._budget_remaining)
        self._c_upstream_remaining = _Children(self._upstream_remaining)
        self._c_shadow = _Children(self._shadow_rejections_total)
        self._c_spend = _Children(self._spend_usd_total)
        self._c_owner_budget = _Children(self._owner_budget_remaining)
        self._c_unreadable = _Children(self._usage_unreadable_total)
        # Zero series from the start: "errors by operation" reads 0, not "no data".
        for operation in LIMITER_OPERATIONS:
            self._c_limiter_error(operation)
        for result in RELOAD_RESULTS:
            self._config_reloads_total.labels(result)
        for operation in KEY_OPERATIONS:
            self._key_operations_total.labels(operation, "success")

        # Visible from the first scrape, before any Redis trouble.
        self._fallback_active.set(0)

    # -- request pipeline -------------------------------------------------------------------

    def request_finished(self, model: str, status: int, duration: float, api: str = "") -> None:
        """A client request through ``api`` (``shapes.base.api_label``) was answered with
        ``status`` after ``duration`` seconds."""
        self._c_requests.writer(model, status, api)(1.0)
        self._c_request_duration.writer(model)(duration)

    def upstream_finished(self, model: str, deployment: str, status: str, duration: float) -> None:
        """An upstream attempt ended: ``status`` is the HTTP status as a string, or
        the failure's reason (``"timeout"``...) when no response arrived."""
        self._c_upstream.writer(model, deployment, status)(1.0)
        self._c_upstream_duration.writer(model, deployment)(duration)

    def first_token(self, model: str, deployment: str, seconds: float) -> None:
        self._c_ttft.writer(model, deployment)(seconds)

    def tokens(self, model: str, deployment: str, prompt: int, completion: int) -> None:
        # Both series exist from the first report on. Counters refuse negative
        # increments; a zero one is a needless mmap write.
        prompt_total = self._c_tokens.writer(model, deployment, "prompt")
        completion_total = self._c_tokens.writer(model, deployment, "completion")
        if prompt > 0:
            prompt_total(prompt)
        if completion > 0:
            completion_total(completion)

    def rate_limited(self, scope: str, model: str) -> None:
        """The proxy answered 429 because of ``scope``'s limit (see RATE_LIMIT_SCOPES)."""
        self._c_rate_limited(scope, model).inc()

    def spend(self, key: str, team: str, model: str, usd: float) -> None:
        """A request's dollars (its priced usage); a key's series starts at its first."""
        if usd > 0:
            self._c_spend.writer(key, team, model)(usd)

    def set_owner_budget_remaining(self, owner: str, budget: str, remaining: float) -> None:
        """What a key's or a team's budget had left at its latest check."""
        self._c_owner_budget(owner, budget).set(remaining)

    def shadow_rejection(self, key: str, limit: str) -> None:
        """A shadow-mode key's request that ``limit`` would have refused went on."""
        self._c_shadow(key, limit).inc()

    def init_shadow_key(self, key: str, limits: Iterable[str]) -> None:
        """Start-up: a shadow key's series at 0 for each of its limits."""
        for limit in limits:
            self._c_shadow(key, limit)

    def queue_wait(self, model: str, seconds: float, tier: str = "0") -> None:
        self._c_queue_wait.writer(model)(seconds)
        self._c_tier_queue_wait.writer(model, tier)(seconds)

    def queue_depth_add(self, model: str, delta: int, tier: str = "0") -> None:
        self._c_queue_depth.writer(model)(delta)
        self._c_tier_queue_depth.writer(model, tier)(delta)

    def in_flight_add(self, model: str, deployment: str, delta: int) -> None:
        self._c_in_flight.writer(model, deployment)(delta)

    # -- deployment health ------------------------------------------------------------------

    def set_deployment_state(self, model: str, deployment: str, cooling: bool) -> None:
        self._c_state(model, deployment).set(1.0 if cooling else 0.0)

    def cooldown(self, model: str, deployment: str, reason: str) -> None:
        self._c_cooldown(model, deployment, reason).inc()

    def failure(self, model: str, deployment: str, reason: str) -> None:
        self._c_failure(model, deployment, reason).inc()

    def usage_unreadable(self, shape: str, deployment: str) -> None:
        self._c_unreadable(shape, deployment).inc()

    # -- limiter ----------------------------------------------------------------------------

    def set_fallback_active(self, active: bool) -> None:
        self._fallback_active.set(1.0 if active else 0.0)

    def set_redis_evicting_policy(self, evicting: bool) -> None:
        self._redis_evicting_policy.set(1.0 if evicting else 0.0)

    def set_pacing_margin(self, seconds: float) -> None:
        self._pacing_margin.set(seconds)

    def limiter_error(self, operation: str) -> None:
        self._c_limiter_error(operation).inc()

    def set_deployment_limit(self, model: str, deployment: str, kind: str, value: float) -> None:
        """The per-minute limit this process enforces (the configured rpm/tpm, or this
        worker's share of it; see ``budget_shared``); ``kind``: ``"requests"``/``"tokens"``."""
        self._c_limit(model, deployment, _kind(kind)).set(value)

    def set_budget_remaining(self, model: str, deployment: str, kind: str, value: float) -> None:
        self._c_budget(model, deployment, _kind(kind)).set(value)

    def set_upstream_remaining(self, model: str, deployment: str, kind: str, value: float) -> None:
        """What the upstream's ``x-ratelimit-remaining-{requests,tokens}`` header said."""
        self._c_upstream_remaining(model, deployment, _kind(kind)).set(value)

    def init_deployment(
        self, model: str, deployment: str, *, rpm: float | None, tpm: float | None
    ) -> None:
        """Start-up: make a configured deployment's series exist before any traffic, so
        dashboards show it (healthy, idle, its limits) from the first scrape."""
        self.set_deployment_state(model, deployment, False)
        if rpm is not None:
            self.set_deployment_limit(model, deployment, "requests", rpm)
        if tpm is not None:
            self.set_deployment_limit(model, deployment, "tokens", tpm)
        self.in_flight_add(model, deployment, 0)
        self.queue_depth_add(model, 0)
        for kind in ("prompt", "completion"):
            self._c_tokens(model, deployment, kind)

    def forget_deployment(self, model: str, deployment: str) -> None:
        """A reload removed the deployment: drop its state series (its counters are
        history). In multiprocess mode a worker's file keeps the last values until the
        worker restarts; prometheus-client cannot delete them there."""
        for children in (self._c_state, self._c_in_flight, self._c_limit, self._c_budget):
            children.forget(lambda values: values[:2] == (model, deployment))

    def forget_deployment_limit(self, model: str, deployment: str, kind: str) -> None:
        """A reload removed the deployment's per-minute limit of ``kind``."""
        self._c_limit.forget(lambda values: values == (model, deployment, _kind(kind)))

    # -- config -----------------------------------------------------------------------------

    def config_reloaded(self, result: str, share: float = 1.0) -> None:
        """A reload ended with ``result`` (RELOAD_RESULTS) in this process. ``share``: this
        worker's part of one reload (1/N with N workers, which all reload together), so
        the merged counter counts reloads of the replica, not of its workers."""
        if result not in RELOAD_RESULTS:
            raise ValueError(f"result must be one of {RELOAD_RESULTS}, not {result!r}")
        self._config_reloads_total.labels(result).inc(share)

    def key_operation(self, operation: str, result: str) -> None:
        """An admin API operation on a client key or a team ended with ``result``
        (KEY_RESULTS)."""
        if operation not in KEY_OPERATIONS or result not in KEY_RESULTS:
            raise ValueError(f"unknown key operation or result: {operation!r}, {result!r}")
        self._key_operations_total.labels(operation, result).inc()

    def key_store_lost(self) -> None:
        """This process found that a shared store (keys, teams) had lost its data."""
        self._key_store_lost_total.inc()

    # -- exposition -------------------------------------------------------------------------

    def render(self) -> tuple[bytes, str]:
        """Body and content type of ``GET /metrics``: in multiprocess mode, every worker's
        values merged."""
        if self.multiprocess_dir is not None:
            _reap_dead_workers(self.multiprocess_dir)
        return generate_latest(self._render_registry), CONTENT_TYPE


_M = TypeVar("_M", Counter, Gauge, Histogram)


class _Children(Generic[_M]):
    """A metric's labelled children, looked up in a dict keyed by the label values:
    ``.labels()`` validates and locks on every call, too slow for the hot path.
    :meth:`writer` gives a child's write, its bound method looked up once."""

    __slots__ = ("_children", "_metric", "_writers")
    _metric: _M
    _children: dict[tuple[object, ...], _M]
    _writers: dict[tuple[object, ...], Callable[[float], None]]

    def __init__(self, metric: _M) -> None:
        self._metric = metric
        self._children = {}
        self._writers = {}

    def __call__(self, *values: object) -> _M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*(str(v) for v in values))
        return child

    def writer(self, *values: object) -> Callable[[float], None]:
        """The child's ``inc`` (counter, gauge) or ``observe`` (histogram)."""
        write = self._writers.get(values)
        if write is None:
            child = self(*values)
            write = child.observe if isinstance(child, Histogram) else child.inc
            self._writers[values] = write
        return write

    def forget(self, which: Callable[[tuple[object, ...]], bool]) -> None:
        """Remove the children whose label values ``which`` selects."""
        for values in [v for v in self._children if which(v)]:
            del self._children[values]
            self._writers.pop(values, None)
            self._metric.remove(*(str(v) for v in values))


def _kind(kind: str) -> str:
    if kind not in LIMIT_KINDS:
        raise ValueError(f"kind must be one of {sorted(LIMIT_KINDS)}, not {kind!r}")
    return kind


# -- multiprocess mode ------------------------------------------------------------------------


def _multiprocess_dir() -> str | None:
    """The directory this process's metrics live in, or None in single-process mode.

    The truth is prometheus-client's value class, fixed when it was imported; the
    environment variable only tells where the files are.
    """
    # Public names only: anything but its in-process MutexValue is its mmap-backed class.
    mmap_backed = _prom_values.ValueClass is not _prom_values.MutexValue
    path = os.environ.get(MULTIPROC_ENV)
    if mmap_backed:
        if not path or not os.path.isdir(path):
            raise RuntimeError(
                f"prometheus_client is in multiprocess mode but {MULTIPROC_ENV}={path!r} "
                "is not a directory"
            )
        return path
    if path:
        # Set after prometheus_client was imported here: values live in this process
        # only, so rendering them is the only truthful thing to do.
        log.warning(
            "%s is set but prometheus_client was imported before it; "
            "metrics of this process are not shared with other workers",
            MULTIPROC_ENV,
        )
    return None


def prepare_multiprocess_dir(workers: int) -> str | None:
    """Call in the CLI's parent process before starting ``workers`` uvicorn workers.

    With more than one worker: creates a fresh private directory (0700; a reused one would
    count an earlier run's requests again), exports it as ``PROMETHEUS_MULTIPROC_DIR`` so the
    spawned workers inherit it before they import prometheus_client, and returns it.
    With one worker: returns None and changes nothing.
    """
    if workers <= 1:
        return None
    path = tempfile.mkdtemp(prefix="llmproxy-metrics-")
    os.environ[MULTIPROC_ENV] = path
    return path


def cleanup_multiprocess_dir(path: str | None) -> None:
    """Call in the parent after the workers have stopped: removes the directory and the
    environment variable :func:`prepare_multiprocess_dir` set."""
    if path is None:
        return
    if os.environ.get(MULTIPROC_ENV) == path:
        del os.environ[MULTIPROC_ENV]
    shutil.rmtree(path, ignore_errors=True)


def mark_worker_dead(pid: int, path: str | None = None) -> None:
    """Forget the live gauges (in-flight, queue depth, states) of a worker that died.

    Its counters and histograms stay: they are history. :meth:`Metrics.render` calls this
    for every worker that is gone, so nobody has to; a supervisor that knows a pid died may
    call it too.
    """
    path = path or os.environ.get(MULTIPROC_ENV)
    if not path:
        return
    # Two workers rendering at once may both remove the same file.
    with contextlib.suppress(FileNotFoundError):
        mark_process_dead(pid, path)  # type: ignore[no-untyped-call]


_LIVE_GAUGE_FILE = re.compile(r"gauge_live[a-z]+_(\d+)\.db$")


def _reap_dead_workers(path: str) -> None:
    pids = {
        int(m.group(1))
        for name in glob.glob(os.path.join(glob.escape(path), "gauge_live*_*.db"))
        if (m := _LIVE_GAUGE_FILE.search(name))
    }
    for pid in pids:
        if not _pid_alive(pid):
            mark_worker_dead(pid, path)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True
