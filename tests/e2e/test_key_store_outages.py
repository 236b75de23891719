"""The admin API's key store when Redis misbehaves, through real replicas: two (or three)
``llm-proxy serve`` processes whose config file has no client keys (they all live in the
admin API) on a private redis-server that the test stalls (SIGSTOP), or restarts empty.

Whatever Redis does, no replica answers 200 to a request without a valid key: a replica
started while the store does not answer is not ready and answers 503
``key_store_unavailable`` in each API's shape; a store that lost its data is detected (an
error line, ``llmproxy_key_store_lost_total``, ``/admin/state``'s ``key_store``), filled
again from what the replicas knew, and its keys stay revocable on every replica within a
second; a revoke whose answer Redis did not give in time says its outcome is unknown,
and its retry says plainly what it did (revoked now, or already). Audit lines always
name the key."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from support.proxy_server import ProxyProcess, start_together
from support.redis_server import RedisServer, redis_available
from support.waiting import wait_until

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread
from proxy.keys.redis_backend import RECORDS

pytestmark = pytest.mark.skipif(not redis_available(), reason="redis-server is not installed")

ADMIN = {"authorization": "Bearer admin-secret-key"}
PROPAGATION = 1.0  # the promise: every replica within a second
MODEL = "gpt-4o-mini"


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0)) as handle:
        yield handle


def _config(upstream: FakeUpstreamHandle, redis_url: str) -> dict[str, Any]:
    """No client key in the file: every key lives in the admin API (the key store)."""
    return {
        "redis": {"url": redis_url, "timeout": "200ms"},
        "admin": {"keys": ["admin-secret-key"]},
        "models": [{"name": MODEL, "deployments": [{"id": "a", "base_url": upstream.base_url}]}],
    }


def _chat(proxy: ProxyProcess, secret: str | None) -> tuple[int, str | None]:
    """Status and error code of a chat completion through the OpenAI SDK (no key: none)."""
    client = openai.OpenAI(
        base_url=proxy.base_url, api_key=secret or "-", max_retries=0, timeout=10
    )
    headers = {} if secret else {"Authorization": openai.omit}  # no key at all
    try:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            extra_headers=headers,
        )
    except openai.APIStatusError as failed:
        return failed.status_code, getattr(failed, "code", None)
    return 200, None


def _responses(proxy: ProxyProcess, secret: str | None) -> tuple[int, str | None]:
    client = openai.OpenAI(
        base_url=proxy.base_url, api_key=secret or "-", max_retries=0, timeout=10
    )
    headers = {} if secret else {"Authorization": openai.omit}
    try:
        client.responses.create(model=MODEL, input="hi", extra_headers=headers)
    except openai.APIStatusError as failed:
        return failed.status_code, getattr(failed, "code", None)
    return 200, None


def _messages(proxy: ProxyProcess) -> tuple[int, dict[str, Any]]:
    """A keyless Anthropic Messages request through the Anthropic SDK: status and body."""
    client = anthropic.Anthropic(base_url=proxy.url, api_key="-", max_retries=0, timeout=10)
    try:
        client.messages.create(
            model=MODEL,
            max_tokens=5,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"X-Api-Key": anthropic.omit},
        )
    except anthropic.APIStatusError as failed:
        return failed.status_code, failed.response.json()
    return 200, {}


def _within(seconds: float, proxy: ProxyProcess, secret: str, status: int) -> None:
    deadline = time.monotonic() + seconds
    while (got := _chat(proxy, secret)[0]) != status:
        assert time.monotonic() < deadline, f"still {got} after {seconds} s"


def _live(proxy: ProxyProcess) -> ProxyProcess:
    """Launched and answering /health/live (ready or not)."""
    proxy.launch()

    def answers() -> bool:
        assert proxy.process is not None and proxy.process.poll() is None, proxy.logs()
        try:
            return httpx.get(f"{proxy.url}/health/live", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(answers, timeout=30, what="the replica to answer /health/live")
    return proxy


def _create(proxy: ProxyProcess, name: str) -> str:
    created = httpx.post(f"{proxy.url}/admin/keys", headers=ADMIN, json={"name": name}, timeout=10)
    assert created.status_code == 201, created.text
    return str(created.json()["key"])


def _audit(proxy: ProxyProcess) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in proxy.logs().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("message") == "key operation"]


def _ready(proxy: ProxyProcess) -> tuple[int, str]:
    """``/health/ready``'s status and what it says of the key store."""
    answer = httpx.get(f"{proxy.url}/health/ready", timeout=10)
    return answer.status_code, answer.json()["key_store"]


def _key_store(proxy: ProxyProcess) -> dict[str, Any]:
    state = httpx.get(f"{proxy.url}/admin/state", headers=ADMIN, timeout=10).json()
    return dict(state["key_store"])


def _lost_total(proxy: ProxyProcess) -> float:
    for line in httpx.get(f"{proxy.url}/metrics", timeout=10).text.splitlines():
        if line.startswith("llmproxy_key_store_lost_total "):
            return float(line.split()[1])
    return 0.0


def test_a_replica_started_while_the_store_does_not_answer_is_not_ready_and_never_open(
    upstream: FakeUpstreamHandle, disposable_redis: RedisServer, tmp_path: Path
) -> None:
    config = _config(upstream, disposable_redis.url)
    with ExitStack() as stack:
        [a] = start_together(stack, [ProxyProcess(config, tmp_path, name="a")])
        secret = _create(a, "svc-1")
        assert _chat(a, None) == (401, "missing_api_key")
        disposable_redis.freeze()  # a stalled Redis: connections open, nothing answers
        stack.callback(disposable_redis.thaw)
        b = ProxyProcess(config, tmp_path, name="b")
        stack.callback(b.stop)
        _live(b)

        for answer in (_chat(b, None), _responses(b, None), _chat(b, secret), _chat(b, "sk-x")):
            assert answer == (503, "key_store_unavailable")
        status, body = _messages(b)
        assert status == 503 and body["type"] == "error", body
        assert "key store" in body["error"]["message"]
        assert _ready(b) == (503, "unread")
        # The running replica cannot read it either: not ready, it holds keys from it.
        wait_until(lambda: _ready(a) == (503, "unreachable"), 10, "a: store unreachable")
        # The replica that read the store before knows the key, and that keys exist.
        assert _chat(a, secret) == (200, None)
        assert _chat(a, None) == (401, "missing_api_key")
        assert _responses(a, None) == (401, "missing_api_key")

        disposable_redis.thaw()
        b.wait_ready()  # the store read: ready, and what it read is in force
        a.wait_ready()
        assert _ready(b) == (200, "current")
        assert _chat(b, secret) == (200, None)
        assert _chat(b, None) == (401, "missing_api_key")
        assert _responses(b, None) == (401, "missing_api_key")


@dataclass
class _Running:
    """Two replicas on the test's Redis, and ``svc-1`` (its ``secret``) working on both."""

    config: dict[str, Any]
    stack: ExitStack
    a: ProxyProcess
    b: ProxyProcess
    secret: str


@pytest.fixture
def running(
    upstream: FakeUpstreamHandle, disposable_redis: RedisServer, tmp_path: Path
) -> Iterator[_Running]:
    config = _config(upstream, disposable_redis.url)
    with ExitStack() as stack:
        a, b = start_together(stack, [ProxyProcess(config, tmp_path, name=n) for n in "ab"])
        secret = _create(a, "svc-1")
        _within(PROPAGATION, b, secret, 200)
        yield _Running(config, stack, a, b, secret)


def test_a_store_restarted_empty_is_detected_refilled_and_its_keys_stay_revocable(
    running: _Running, disposable_redis: RedisServer, tmp_path: Path
) -> None:
    a, b, secret = running.a, running.b, running.secret
    disposable_redis.stop()
    disposable_redis.start()  # no persistence: the store is empty

    c = ProxyProcess(running.config, tmp_path, name="c")  # started after the loss
    running.stack.callback(c.stop)
    c.start()
    for proxy in (a, b, c):  # keys live in the admin API: an empty store opens nothing
        assert _chat(proxy, None) == (401, "missing_api_key")
        assert _responses(proxy, None) == (401, "missing_api_key")

    with disposable_redis.client() as redis:  # the replicas filled it again
        wait_until(lambda: redis.hexists(RECORDS, "svc-1"), 10, "svc-1 written back")
    assert _chat(a, secret) == (200, None) and _chat(b, secret) == (200, None)
    _within(10, c, secret, 200)  # c, which read the store empty, reads it filled
    for proxy in (a, b):  # each replica saw the loss: a metric, a field, an error line
        wait_until(lambda p=proxy: _lost_total(p) >= 1, 10, "the loss to be counted")
        store = _key_store(proxy)
        assert store["losses_detected"] >= 1 and store["last_loss"]["at"], store
        errors = [
            line
            for line in proxy.logs().splitlines()
            if '"level":"error"' in line.replace(" ", "") and "lost its data" in line
        ]
        assert errors, proxy.logs()[-3000:]
    assert _key_store(c)["losses_detected"] == 0  # it knew of nothing lost

    revoked = httpx.delete(f"{b.url}/admin/keys/svc-1", headers=ADMIN, timeout=10)
    assert revoked.status_code == 204, revoked.text
    for proxy in (a, b, c):
        _within(PROPAGATION, proxy, secret, 401)
        listed = httpx.get(f"{proxy.url}/admin/keys", headers=ADMIN, timeout=10).json()
        assert "svc-1" not in [k["name"] for k in listed["keys"]]


def test_a_revoke_redis_stalled_on_says_its_outcome_is_unknown_and_its_retry_is_plain(
    running: _Running, disposable_redis: RedisServer
) -> None:
    a, b, secret = running.a, running.b, running.secret
    disposable_redis.freeze()
    running.stack.callback(disposable_redis.thaw)
    stalled = httpx.delete(f"{a.url}/admin/keys/svc-1", headers=ADMIN, timeout=30)
    disposable_redis.thaw()  # Redis runs what it had been sent, if it got the revoke
    assert stalled.status_code == 503, stalled.text
    error = stalled.json()["error"]
    assert error["code"] == "key_store_unavailable"
    assert "outcome is unknown" in error["message"]

    retried = httpx.delete(f"{a.url}/admin/keys/svc-1", headers=ADMIN, timeout=10)
    deadline = time.monotonic() + 10
    while retried.status_code == 503 and time.monotonic() < deadline:
        retried = httpx.delete(f"{a.url}/admin/keys/svc-1", headers=ADMIN, timeout=10)
    # Whether Redis ran the stalled revoke when it resumed or not (it may never have
    # left the proxy), the retry says plainly: revoked now, or revoked already.
    assert retried.status_code in (204, 404), retried.text
    if retried.status_code == 404:
        assert retried.json()["error"]["code"] == "key_revoked"
        assert "was revoked at" in retried.json()["error"]["message"]
    for proxy in (a, b):
        _within(PROPAGATION, proxy, secret, 401)

    # 20 creates of one name at once: one is made, 19 refused; every line names it.
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda _: _status_of_create(b, "svc-2"), range(20)))
    assert sorted(answers) == [201] + [409] * 19

    revokes = [
        (line["key_name"], line["result"]) for line in _audit(a) if line["operation"] == "revoke"
    ]
    # The stalled revoke: unknown; its retry: what it answered (a 503 between them, if
    # Redis was not answering yet, says unavailable).
    last = "not_found" if retried.status_code == 404 else "success"
    assert revokes[0] == ("svc-1", "unknown") and revokes[-1] == ("svc-1", last), revokes
    assert {name for name, _ in revokes} == {"svc-1"}
    creates = [line for line in _audit(b) if line["operation"] == "create"]
    assert len(creates) == 20 and {line["key_name"] for line in creates} == {"svc-2"}
    assert sorted(line["result"] for line in creates) == ["conflict"] * 19 + ["success"]


def _status_of_create(proxy: ProxyProcess, name: str) -> int:
    return httpx.post(
        f"{proxy.url}/admin/keys", headers=ADMIN, json={"name": name}, timeout=10
    ).status_code


class _Prober:
    """From a thread, until stopped: requests without a key and with a key no one made, to
    every replica it is given, through the SDKs, each answer's status noted with the
    phase of Redis it met (``phase``, set by the test)."""

    def __init__(self, replicas: list[ProxyProcess]) -> None:
        self.replicas = list(replicas)
        self.phase = "healthy"
        self.seen: dict[str, list[int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def add(self, replica: ProxyProcess) -> None:
        self.replicas = [*self.replicas, replica]

    def rounds(self, phase: str) -> int:
        return len(self.seen.get(phase, [])) // 4

    def during(self, phase: str, rounds: int = 2) -> None:
        """Probe ``phase`` for at least ``rounds`` rounds of every replica."""
        self.phase = phase
        wait_until(lambda: self.rounds(phase) >= rounds * len(self.replicas), 60, phase)

    def _run(self) -> None:
        asks: list[Callable[[ProxyProcess], int]] = [
            lambda r: _chat(r, None)[0],
            lambda r: _chat(r, "sk-llmp-no-one-made-this")[0],
            lambda r: _responses(r, None)[0],
            lambda r: _messages(r)[0],
        ]
        while not self._stop.is_set():
            for replica in self.replicas:
                for ask in asks:
                    before = self.phase
                    status = ask(replica)
                    # A phase is named before Redis is changed: an answer is of a phase
                    # only if it was asked and answered within it.
                    phase = before if self.phase == before else "between"
                    self.seen.setdefault(phase, []).append(status)


@pytest.mark.slow  # about two minutes: four outages, each probed on every replica
def test_no_replica_answers_200_without_a_valid_key_whatever_redis_does(
    upstream: FakeUpstreamHandle, disposable_redis: RedisServer, tmp_path: Path
) -> None:
    """Keys only in the admin API; Redis killed (a replica started meanwhile: nothing
    listens at its address), restarted empty, stalled, then wiped by ``FLUSHALL``, while a
    prober asks every replica without a key and with a made-up one: never a 200, on chat,
    ``/v1/responses`` and Messages. The key made before keeps working where it is known,
    comes back on every replica after each loss, and stays revocable."""
    config = _config(upstream, disposable_redis.url)
    with ExitStack() as stack:
        a, b = start_together(stack, [ProxyProcess(config, tmp_path, name=n) for n in "ab"])
        secret = _create(a, "svc-1")
        _within(PROPAGATION, b, secret, 200)
        prober = stack.enter_context(_Prober([a, b]))
        prober.during("healthy")

        prober.phase = "killed"  # named before it happens: a round may straddle it
        disposable_redis.kill()  # connections refused from now on
        c = ProxyProcess(config, tmp_path, name="c")
        stack.callback(c.stop)
        _live(c)
        prober.add(c)
        prober.during("killed")
        assert _ready(c) == (503, "unread")
        for answer in (_chat(c, secret), _chat(c, None), _responses(c, None)):
            assert answer == (503, "key_store_unavailable")
        wait_until(lambda: _ready(a) == (503, "unreachable"), 10, "a: store unreachable")
        assert _chat(a, secret) == (200, None)  # a key it knows keeps working

        prober.phase = "restarted empty"
        disposable_redis.start()  # empty: no persistence
        prober.during("restarted empty")
        for proxy in (a, b, c):
            proxy.wait_ready()
        for proxy in (a, b, c):
            _within(10, proxy, secret, 200)  # written back by a and b; c reads it
        for proxy in (a, b):
            wait_until(lambda p=proxy: _lost_total(p) >= 1, 10, "the loss to be counted")

        prober.phase = "stalled"
        disposable_redis.freeze()
        try:
            prober.during("stalled")
        finally:
            disposable_redis.thaw()

        lost = [(proxy, _lost_total(proxy)) for proxy in (a, b, c)]
        prober.phase = "flushed"
        with disposable_redis.client() as redis:
            redis.flushall()
            prober.during("flushed")
            for proxy, before in lost:  # each replica saw this loss: a metric and a field
                wait_until(lambda p=proxy, n=before: _lost_total(p) > n, 10, "the FLUSHALL counted")
                assert _key_store(proxy)["losses_detected"] >= 1
            wait_until(lambda: redis.hexists(RECORDS, "svc-1"), 10, "svc-1 written back")
        revoked = httpx.delete(f"{c.url}/admin/keys/svc-1", headers=ADMIN, timeout=10)
        assert revoked.status_code == 204, revoked.text
        for proxy in (a, b, c):
            _within(PROPAGATION, proxy, secret, 401)
        prober.during("revoked")
        prober.stop()  # before the replicas stop

    print({phase: sorted(set(statuses)) for phase, statuses in prober.seen.items()})
    for phase, statuses in prober.seen.items():
        assert 200 not in statuses, (phase, statuses)
        assert set(statuses) <= {401, 503}, (phase, statuses)
    assert set(prober.seen["healthy"]) == {401}
    for proxy in (a, b, c):
        errors = [line for line in proxy.logs().splitlines() if "lost its data" in line]
        assert errors and all('"level":"error"' in e.replace(" ", "") for e in errors)
