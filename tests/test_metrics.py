"""proxy.observability.metrics: the contract's metrics, what each recording call does, and
multi-worker aggregation in prometheus-client's multiprocess mode."""

from __future__ import annotations

import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from support.ports import free_port

from proxy.observability.metrics import (
    CONTENT_TYPE,
    MULTIPROC_ENV,
    Metrics,
    cleanup_multiprocess_dir,
    prepare_multiprocess_dir,
)

REPO = Path(__file__).resolve().parents[1]

# name -> (type, labels), from docs/observability.md and ../shared/design.md.
CONTRACT = {
    "llmproxy_requests": ("counter", {"model", "status", "api"}),
    "llmproxy_request_duration_seconds": ("histogram", {"model"}),
    "llmproxy_upstream_requests": ("counter", {"model", "deployment", "status"}),
    "llmproxy_upstream_duration_seconds": ("histogram", {"model", "deployment"}),
    "llmproxy_time_to_first_token_seconds": ("histogram", {"model", "deployment"}),
    "llmproxy_tokens": ("counter", {"model", "deployment", "kind"}),
    "llmproxy_rate_limited": ("counter", {"scope", "model"}),
    "llmproxy_queue_wait_seconds": ("histogram", {"model"}),
    "llmproxy_queue_depth": ("gauge", {"model"}),
    "llmproxy_tier_queue_wait_seconds": ("histogram", {"model", "tier"}),
    "llmproxy_tier_queue_depth": ("gauge", {"model", "tier"}),
    "llmproxy_in_flight_requests": ("gauge", {"model", "deployment"}),
    "llmproxy_deployment_state": ("gauge", {"model", "deployment"}),
    "llmproxy_deployment_cooldowns": ("counter", {"model", "deployment", "reason"}),
    "llmproxy_deployment_failures": ("counter", {"model", "deployment", "reason"}),
    "llmproxy_limiter_fallback_active": ("gauge", set()),
    "llmproxy_redis_evicting_policy": ("gauge", set()),
    "llmproxy_pacing_margin_seconds": ("gauge", set()),
    "llmproxy_deployment_limit": ("gauge", {"model", "deployment", "kind"}),
    "llmproxy_deployment_budget_remaining": ("gauge", {"model", "deployment", "kind"}),
    "llmproxy_upstream_ratelimit_remaining": ("gauge", {"model", "deployment", "kind"}),
    "llmproxy_limiter_errors": ("counter", {"operation"}),
    "llmproxy_usage_unreadable": ("counter", {"shape", "deployment"}),
}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(body: bytes) -> Samples:
    """Sample name and labels -> value, from the exposition text."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


def scrape(metrics: Metrics) -> Samples:
    body, _ = metrics.render()
    return parse(body)


# -- the contract ---------------------------------------------------------------------------


def test_every_contract_metric_is_exposed_with_its_type_help_and_labels(
    metrics: Metrics,
) -> None:
    metrics.init_deployment("m", "d", rpm=60, tpm=1000)
    metrics.request_finished("m", 200, 0.1)
    metrics.upstream_finished("m", "d", "200", 0.1)
    metrics.first_token("m", "d", 0.1)
    metrics.rate_limited("key_rpm", "m")
    metrics.queue_wait("m", 0.1)
    metrics.cooldown("m", "d", "rate_limited")
    metrics.failure("m", "d", "timeout")
    metrics.limiter_error("take")
    metrics.usage_unreadable("chat/completions", "d")
    metrics.set_budget_remaining("m", "d", "requests", 1)
    metrics.set_upstream_remaining("m", "d", "requests", 1)

    families = {f.name: f for f in text_string_to_metric_families(metrics.render()[0].decode())}

    for name, (kind, labels) in CONTRACT.items():
        family = families[name]
        assert family.type == kind, name
        assert family.documentation, f"{name} has no help text"
        assert family.samples, f"{name} has no sample"
        for s in family.samples:
            assert set(s.labels) - {"le"} == labels, (name, s.labels)


def test_nothing_is_registered_in_the_global_registry() -> None:
    Metrics()
    Metrics()  # a second app in the same process does not clash
    assert not [n for n in REGISTRY._names_to_collectors if n.startswith("llmproxy_")]


def test_render_is_prometheus_text_format(metrics: Metrics) -> None:
    body, content_type = metrics.render()
    assert content_type == CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
    assert b"# HELP llmproxy_requests_total " in body


def test_histogram_buckets_suit_llm_traffic(metrics: Metrics) -> None:
    metrics.request_finished("m", 200, 0.1)
    metrics.upstream_finished("m", "d", "200", 0.1)
    metrics.first_token("m", "d", 0.1)
    metrics.queue_wait("m", 0.1)
    samples = scrape(metrics)

    def bounds(name: str) -> list[float]:
        return sorted(float(dict(labels)["le"]) for n, labels in samples if n == name + "_bucket")

    for name in ("llmproxy_request_duration_seconds", "llmproxy_upstream_duration_seconds"):
        assert bounds(name)[0] == 0.005 and bounds(name)[-2] == 600, name
    assert bounds("llmproxy_time_to_first_token_seconds")[0] == 0.005
    assert bounds("llmproxy_time_to_first_token_seconds")[-2] == 60
    assert bounds("llmproxy_queue_wait_seconds")[0] == 0.001
    assert bounds("llmproxy_queue_wait_seconds")[-2] == 60


# -- recording ------------------------------------------------------------------------------


def test_a_finished_request_counts_by_status_and_observes_its_duration(
    metrics: Metrics,
) -> None:
    metrics.request_finished("m", 200, 0.25)
    metrics.request_finished("m", 200, 0.75)
    metrics.request_finished("m", 429, 0.001)
    s = scrape(metrics)

    assert sample(s, "llmproxy_requests_total", model="m", status="200", api="") == 2
    assert sample(s, "llmproxy_requests_total", model="m", status="429", api="") == 1
    assert sample(s, "llmproxy_request_duration_seconds_count", model="m") == 3
    assert sample(s, "llmproxy_request_duration_seconds_sum", model="m") == pytest.approx(1.001)


def test_upstream_attempts_count_by_status_including_error_and_timeout(
    metrics: Metrics,
) -> None:
    metrics.upstream_finished("m", "d", "200", 1.0)
    metrics.upstream_finished("m", "d", "timeout", 60.0)
    metrics.upstream_finished("m", "d", "error", 0.01)
    s = scrape(metrics)

    for status in ("200", "timeout", "error"):
        assert (
            sample(s, "llmproxy_upstream_requests_total", model="m", deployment="d", status=status)
            == 1
        )
    assert sample(s, "llmproxy_upstream_duration_seconds_count", model="m", deployment="d") == 3


def test_time_to_first_token_is_observed_per_deployment(metrics: Metrics) -> None:
    metrics.first_token("m", "d", 0.3)
    s = scrape(metrics)
    assert sample(s, "llmproxy_time_to_first_token_seconds_count", model="m", deployment="d") == 1
    assert (
        sample(
            s, "llmproxy_time_to_first_token_seconds_bucket", model="m", deployment="d", le="0.35"
        )
        == 1
    )


def test_tokens_count_prompt_and_completion_separately(metrics: Metrics) -> None:
    metrics.tokens("m", "d", prompt=100, completion=20)
    metrics.tokens("m", "d", prompt=5, completion=0)
    s = scrape(metrics)
    assert sample(s, "llmproxy_tokens_total", model="m", deployment="d", kind="prompt") == 105
    assert sample(s, "llmproxy_tokens_total", model="m", deployment="d", kind="completion") == 20


def test_negative_token_counts_are_ignored_rather_than_raising(metrics: Metrics) -> None:
    metrics.tokens("m", "d", prompt=-1, completion=-5)
    s = scrape(metrics)
    assert sample(s, "llmproxy_tokens_total", model="m", deployment="d", kind="prompt") == 0


def test_rate_limited_counts_by_scope(metrics: Metrics) -> None:
    metrics.rate_limited("key_rpm", "m")
    metrics.rate_limited("key_rpm", "m")
    metrics.rate_limited("queue_full", "m")
    s = scrape(metrics)
    assert sample(s, "llmproxy_rate_limited_total", scope="key_rpm", model="m") == 2
    assert sample(s, "llmproxy_rate_limited_total", scope="queue_full", model="m") == 1


def test_queue_depth_and_in_flight_go_up_and_down(metrics: Metrics) -> None:
    metrics.queue_depth_add("m", 1)
    metrics.queue_depth_add("m", 1)
    metrics.queue_depth_add("m", -1)
    metrics.in_flight_add("m", "d", 3)
    metrics.in_flight_add("m", "d", -3)
    metrics.queue_wait("m", 0.02)
    s = scrape(metrics)
    assert sample(s, "llmproxy_queue_depth", model="m") == 1
    assert sample(s, "llmproxy_in_flight_requests", model="m", deployment="d") == 0
    assert sample(s, "llmproxy_queue_wait_seconds_count", model="m") == 1


def test_waits_are_also_counted_by_the_keys_priority_tier(metrics: Metrics) -> None:
    metrics.queue_depth_add("m", 1, tier="1")
    metrics.queue_depth_add("m", 1, tier="0")
    metrics.queue_depth_add("m", -1, tier="0")
    metrics.queue_wait("m", 0.02, tier="1")
    s = scrape(metrics)
    assert sample(s, "llmproxy_tier_queue_depth", model="m", tier="1") == 1
    assert sample(s, "llmproxy_tier_queue_depth", model="m", tier="0") == 0
    assert sample(s, "llmproxy_queue_depth", model="m") == 1  # the model's total, as before
    assert sample(s, "llmproxy_tier_queue_wait_seconds_count", model="m", tier="1") == 1


def test_deployment_state_is_0_healthy_and_1_cooling_down(metrics: Metrics) -> None:
    metrics.set_deployment_state("m", "d", True)
    assert sample(scrape(metrics), "llmproxy_deployment_state", model="m", deployment="d") == 1
    metrics.set_deployment_state("m", "d", False)
    assert sample(scrape(metrics), "llmproxy_deployment_state", model="m", deployment="d") == 0


def test_cooldowns_and_failures_count_by_reason(metrics: Metrics) -> None:
    metrics.failure("m", "d", "429")
    metrics.failure("m", "d", "429")
    metrics.cooldown("m", "d", "rate_limited")
    s = scrape(metrics)
    assert (
        sample(s, "llmproxy_deployment_failures_total", model="m", deployment="d", reason="429")
        == 2
    )
    assert (
        sample(
            s,
            "llmproxy_deployment_cooldowns_total",
            model="m",
            deployment="d",
            reason="rate_limited",
        )
        == 1
    )


def test_limiter_fallback_is_0_from_the_start_and_follows_the_limiter(
    metrics: Metrics,
) -> None:
    assert sample(scrape(metrics), "llmproxy_limiter_fallback_active") == 0
    metrics.set_fallback_active(True)
    metrics.limiter_error("take")
    metrics.usage_unreadable("chat/completions", "d")
    s = scrape(metrics)
    assert sample(s, "llmproxy_limiter_fallback_active") == 1
    assert sample(s, "llmproxy_limiter_errors_total", operation="take") == 1


def test_limits_and_remaining_budgets_are_gauges_by_kind(metrics: Metrics) -> None:
    metrics.set_deployment_limit("m", "d", "requests", 500)
    metrics.set_deployment_limit("m", "d", "tokens", 200_000)
    metrics.set_budget_remaining("m", "d", "tokens", 1234)
    metrics.set_upstream_remaining("m", "d", "requests", 499)
    metrics.set_upstream_remaining("m", "d", "requests", 498)
    s = scrape(metrics)
    labels = {"model": "m", "deployment": "d"}
    assert sample(s, "llmproxy_deployment_limit", kind="requests", **labels) == 500
    assert sample(s, "llmproxy_deployment_limit", kind="tokens", **labels) == 200_000
    assert sample(s, "llmproxy_deployment_budget_remaining", kind="tokens", **labels) == 1234
    assert sample(s, "llmproxy_upstream_ratelimit_remaining", kind="requests", **labels) == 498


def test_a_budget_kind_other_than_requests_or_tokens_is_refused(metrics: Metrics) -> None:
    with pytest.raises(ValueError, match="kind"):
        metrics.set_deployment_limit("m", "d", "rpm", 1)


def test_init_deployment_makes_its_series_visible_before_any_traffic(
    metrics: Metrics,
) -> None:
    metrics.init_deployment("m", "d", rpm=500, tpm=None)
    s = scrape(metrics)
    labels = {"model": "m", "deployment": "d"}
    assert sample(s, "llmproxy_deployment_state", **labels) == 0
    assert sample(s, "llmproxy_deployment_limit", kind="requests", **labels) == 500
    assert sample(s, "llmproxy_deployment_limit", kind="tokens", **labels) is None
    assert sample(s, "llmproxy_in_flight_requests", **labels) == 0
    assert sample(s, "llmproxy_tokens_total", kind="prompt", **labels) == 0
    assert sample(s, "llmproxy_queue_depth", model="m") == 0


def test_the_hot_path_reuses_labelled_children(
    metrics: Metrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics.request_finished("m", 200, 0.1)
    metrics.in_flight_add("m", "d", 1)

    def labels_called(*args: object, **kwargs: object) -> None:
        raise AssertionError(".labels() on the hot path")

    for metric in (metrics._requests_total, metrics._request_duration, metrics._in_flight):
        monkeypatch.setattr(metric, "labels", labels_called)
    metrics.request_finished("m", 200, 0.1)
    metrics.in_flight_add("m", "d", -1)

    assert sample(scrape(metrics), "llmproxy_requests_total", model="m", status="200", api="") == 2


def test_the_recording_methods_write_what_prometheus_clients_own_calls_write() -> None:
    # The same amounts, through the recording methods and through .labels(), give the
    # same exposition, bucket by bucket (bounds themselves included).
    amounts = [0.0, 0.001, 0.005, 0.0051, 0.1, 0.25, 1.0, 59.9, 600.0, 600.5, 1e9]
    ours, theirs = Metrics(), Metrics()
    for amount in amounts:
        ours.request_finished("m", 200, amount)
        ours.upstream_finished("m", "d", "200", amount)
        ours.first_token("m", "d", amount)
        ours.queue_wait("m", amount, tier="1")
        ours.in_flight_add("m", "d", 1)
        theirs._requests_total.labels("m", "200", "").inc()
        theirs._request_duration.labels("m").observe(amount)
        theirs._upstream_total.labels("m", "d", "200").inc()
        theirs._upstream_duration.labels("m", "d").observe(amount)
        theirs._ttft.labels("m", "d").observe(amount)
        theirs._queue_wait.labels("m").observe(amount)
        theirs._tier_queue_wait.labels("m", "1").observe(amount)
        theirs._in_flight.labels("m", "d").inc(1)
    ours.queue_depth_add("m", 0, tier="1")
    theirs._queue_depth.labels("m").inc(0)
    theirs._tier_queue_depth.labels("m", "1").inc(0)

    def values(metrics: Metrics) -> Samples:  # the _created timestamps differ, of course
        return {k: v for k, v in scrape(metrics).items() if not k[0].endswith("_created")}

    assert values(ours) == values(theirs)


# -- multiprocess mode ----------------------------------------------------------------------


def test_one_worker_needs_no_multiprocess_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    assert prepare_multiprocess_dir(1) is None
    assert MULTIPROC_ENV not in os.environ


def test_several_workers_get_a_fresh_private_dir_that_cleanup_removes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    first = prepare_multiprocess_dir(2)
    assert first is not None
    try:
        assert os.environ[MULTIPROC_ENV] == first
        assert os.listdir(first) == []
        assert stat.S_IMODE(os.stat(first).st_mode) == 0o700
        second = prepare_multiprocess_dir(2)
        assert second != first
        cleanup_multiprocess_dir(second)
    finally:
        cleanup_multiprocess_dir(first)
    assert not os.path.exists(first)


def test_env_set_after_prometheus_client_was_imported_stays_single_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # This test process imported prometheus_client long ago, without the variable.
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="proxy.metrics"):
        metrics = Metrics()
    assert metrics.multiprocess_dir is None
    assert "imported before" in caplog.text
    metrics.request_finished("m", 200, 0.1)
    assert sample(scrape(metrics), "llmproxy_requests_total", model="m", status="200", api="") == 1


# A worker: records what its arguments say, prints "ready", and stays alive (its live gauges
# count) until its stdin closes.
RECORDER = textwrap.dedent(
    """
    import sys
    from proxy.observability.metrics import Metrics
    requests, in_flight, cooling, upstream_remaining = map(int, sys.argv[1:])
    m = Metrics()
    assert m.multiprocess_dir, "not in multiprocess mode"
    m.set_deployment_state("m", "d", bool(cooling))
    m.set_deployment_limit("m", "d", "requests", 500)
    for _ in range(requests):
        m.request_finished("m", 200, 0.5)
    m.tokens("m", "d", requests * 10, requests)
    m.in_flight_add("m", "d", in_flight)
    m.queue_depth_add("m", 1)
    m.set_upstream_remaining("m", "d", "requests", upstream_remaining)
    print("ready", flush=True)
    sys.stdin.read()
    """
)
RENDERER = (
    "import sys; from proxy.observability.metrics import Metrics;"
    " sys.stdout.buffer.write(Metrics().render()[0])"
)


@pytest.fixture
def multiproc_env(tmp_path: Path) -> dict[str, str]:
    directory = tmp_path / "metrics"
    directory.mkdir()
    return {**os.environ, MULTIPROC_ENV: str(directory), "PYTHONPATH": str(REPO)}


@pytest.fixture
def workers(multiproc_env: dict[str, str]) -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def start_recorder(
    env: dict[str, str], procs: list[subprocess.Popen[str]], *args: int
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", RECORDER, *map(str, args)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    procs.append(proc)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0


def render_in_another_worker(env: dict[str, str]) -> Samples:
    out = subprocess.run(
        [sys.executable, "-c", RENDERER], env=env, capture_output=True, check=True, timeout=60
    )
    return parse(out.stdout)


@pytest.mark.slow
def test_workers_sharing_a_dir_are_rendered_as_one_replica(
    multiproc_env: dict[str, str], workers: list[subprocess.Popen[str]]
) -> None:
    # worker a: 3 requests, 2 in flight, healthy, upstream said 100 left (first)
    start_recorder(multiproc_env, workers, 3, 2, 0, 100)
    # worker b: 4 requests, 1 in flight, sees the deployment cooling, upstream said 90 (later)
    start_recorder(multiproc_env, workers, 4, 1, 1, 90)

    s = render_in_another_worker(multiproc_env)

    labels = {"model": "m", "deployment": "d"}
    # Counters and histograms: summed, each request once.
    assert sample(s, "llmproxy_requests_total", model="m", status="200", api="") == 7
    assert sample(s, "llmproxy_request_duration_seconds_count", model="m") == 7
    assert sample(s, "llmproxy_request_duration_seconds_sum", model="m") == 3.5
    assert sample(s, "llmproxy_tokens_total", kind="prompt", **labels) == 70
    # In flight and queued: the replica's total.
    assert sample(s, "llmproxy_in_flight_requests", **labels) == 3
    assert sample(s, "llmproxy_queue_depth", model="m") == 2
    # Cooling down in any worker shows as cooling down.
    assert sample(s, "llmproxy_deployment_state", **labels) == 1
    # Shared quantities: the latest value, not a sum.
    assert sample(s, "llmproxy_deployment_limit", kind="requests", **labels) == 500
    assert sample(s, "llmproxy_upstream_ratelimit_remaining", kind="requests", **labels) == 90
    assert sample(s, "llmproxy_limiter_fallback_active") == 0
    # No per-process series leak out.
    assert not any("pid" in dict(labels) for _, labels in s)


def test_a_dead_worker_keeps_its_counts_but_not_its_in_flight_requests(
    multiproc_env: dict[str, str], workers: list[subprocess.Popen[str]]
) -> None:
    a = start_recorder(multiproc_env, workers, 3, 2, 1, 100)
    start_recorder(multiproc_env, workers, 4, 1, 0, 90)

    stop(a)
    s = render_in_another_worker(multiproc_env)

    labels = {"model": "m", "deployment": "d"}
    assert sample(s, "llmproxy_requests_total", model="m", status="200", api="") == 7
    assert sample(s, "llmproxy_in_flight_requests", **labels) == 1
    assert sample(s, "llmproxy_deployment_state", **labels) == 0


# A stand-in for `llm-proxy serve --workers 2`: the parent imports
# proxy.observability.metrics (and so prometheus_client) *before* preparing the directory,
# as the CLI does, then lets uvicorn spawn the workers.
SERVE = textwrap.dedent(
    """
    import sys, uvicorn
    from proxy.observability.metrics import cleanup_multiprocess_dir, prepare_multiprocess_dir
    path = prepare_multiprocess_dir(2)
    print(path, flush=True)
    try:
        uvicorn.run("mp_app:app", port=int(sys.argv[1]), host="127.0.0.1", workers=2,
                    lifespan="off", log_level="warning", app_dir=sys.argv[2])
    finally:
        cleanup_multiprocess_dir(path)
    """
)
APP = textwrap.dedent(
    """
    import os
    from proxy.observability.metrics import Metrics

    metrics = Metrics()
    assert metrics.multiprocess_dir, "worker not in multiprocess mode"

    async def app(scope, receive, send):
        if scope["path"] == "/metrics":
            body, content_type = metrics.render()
        else:
            metrics.request_finished("m", 200, 0.01)
            body, content_type = str(os.getpid()).encode(), "text/plain"
        headers = [(b"content-type", content_type.encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    """
)


@pytest.mark.slow
def test_uvicorn_workers_count_every_request_exactly_once(tmp_path: Path) -> None:
    (tmp_path / "mp_app.py").write_text(APP)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != MULTIPROC_ENV}
    env["PYTHONPATH"] = str(REPO)
    server = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(port), str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        directory = server.stdout.readline().strip()
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/metrics", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "server did not start"
                time.sleep(0.1)

        pids = set()
        for _ in range(40):
            # A new connection each time, so the kernel may hand it to either worker.
            pids.add(httpx.get(f"{url}/hit", timeout=5).text)
        s = parse(httpx.get(f"{url}/metrics", timeout=5).content)

        assert sample(s, "llmproxy_requests_total", model="m", status="200", api="") == 40
        assert pids  # which workers served is up to the kernel; the sum must not care
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=30)
    assert not os.path.exists(directory)
