"""What `serve` checks before it starts (the CLI's one-line failures are in test_cli.py)."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator

import pytest
from support.ports import free_port
from support.raw_upstream import Conversation, answer
from support.redis_server import TLS_USER, TlsRedisServer
from support.scripted_upstream import ScriptedUpstream
from support.waiting import wait_until

from proxy.config.settings import parse_settings
from proxy.process.startup import (
    Problems,
    StartupError,
    env_int,
    redis_problem,
    warn_about_unreachable_upstreams,
    wrong_paths,
)

_MINIMAL = {
    "models": [{"name": "m", "deployments": [{"id": "d", "base_url": "http://127.0.0.1:1/v1"}]}]
}


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def warnings() -> Iterator[_Records]:
    handler = _Records()
    logger = logging.getLogger("proxy")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@pytest.mark.slow
def test_an_upstream_nothing_answers_at_is_named_in_a_warning(warnings: _Records) -> None:
    """Its requests would all get 502 while /health/ready says ready (a deployment is
    usable until it fails): the log says so at start-up, naming its deployments, never
    its key; an upstream that answers gets no warning."""
    dead = free_port()
    with socket.create_server(("127.0.0.1", 0)) as alive:
        up = alive.getsockname()[1]
        deployments = [
            {"id": "a", "base_url": f"http://127.0.0.1:{dead}/v1", "api_key": "sk-a-secret"},
            {"id": "b", "base_url": f"http://127.0.0.1:{dead}/v1"},
            {"id": "c", "base_url": f"http://127.0.0.1:{up}/v1"},
        ]
        settings = parse_settings({"models": [{"name": "m", "deployments": deployments}]})
        warn_about_unreachable_upstreams(settings, timeout=5)
        alive.settimeout(10)
        alive.accept()[0].close()  # c's probe got through
        wait_until(lambda: warnings.messages, timeout=10, what="a warning")
    (message,) = warnings.messages
    assert f"127.0.0.1:{dead}" in message and "deployment(s) a, b" in message
    assert "is it running?" in message and "502" in message
    assert "sk-a-secret" not in message


def test_an_upstream_that_listens_just_after_start_up_is_no_warning(warnings: _Records) -> None:
    """The README's recipe starts the fake upstream in the background, then `serve`: the
    upstream's port is bound a moment after the check begins. Start-up gives a loopback
    upstream a short while to listen (``startup.COMING_UP``) before it warns."""
    with socket.socket() as late:
        late.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        port = late.getsockname()[1]
        deployments = [{"id": "late", "base_url": f"http://127.0.0.1:{port}/v1"}]
        settings = parse_settings({"models": [{"name": "m", "deployments": deployments}]})
        warn_about_unreachable_upstreams(settings, timeout=5)
        threading.Event().wait(0.2)  # the upstream's process still starting
        late.listen()
        late.settimeout(10)
        late.accept()[0].close()  # the probe got through
        for probe in [t for t in threading.enumerate() if t.name == "upstream-probe"]:
            probe.join(timeout=10)
    assert warnings.messages == []


def test_a_variable_that_must_be_a_number_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LLM_PROXY_PORT", " 8100 ")
    assert env_int("LLM_PROXY_PORT", 8000) == 8100
    monkeypatch.setenv("LLM_PROXY_PORT", "")
    assert env_int("LLM_PROXY_PORT", 8000) == 8000
    monkeypatch.setenv("LLM_PROXY_PORT", "80a")
    with pytest.raises(StartupError, match=r"LLM_PROXY_PORT='80a' is not a whole number"):
        env_int("LLM_PROXY_PORT", 8000)


def test_problems_are_collected_and_raised_together(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_PROXY_PORT", "eighty")
    monkeypatch.setenv("LLM_PROXY_WORKERS", "3")
    problems = Problems()
    assert problems.env_int("LLM_PROXY_PORT", 8000) is None
    assert problems.env_int("LLM_PROXY_WORKERS", 1) == 3
    problems.add(None)  # a check that found nothing
    problems.add("cannot listen on 127.0.0.1:8001 for the demo's fake upstream")
    with pytest.raises(StartupError) as raised:
        problems.raise_any()
    assert len(raised.value.problems) == 2
    assert "LLM_PROXY_PORT='eighty'" in raised.value.problems[0]
    assert str(raised.value).splitlines() == list(raised.value.problems)
    Problems().raise_any()  # none: nothing raised


async def _not_an_llm_api(conversation: Conversation) -> None:
    await conversation.send(
        answer(b"404 page not found", "content-type: text/plain", status="404 Not Found")
    )


async def _an_llm_api(conversation: Conversation) -> None:
    error = b'{"error": {"message": "model is required", "type": "invalid_request_error"}}'
    await conversation.send(
        answer(error, "content-type: application/json", status="400 Bad Request")
    )


def test_a_base_url_where_every_endpoint_answers_404_is_named_at_start_up(
    warnings: _Records,
) -> None:
    """A base_url missing its /v1 in front of a local server: all its requests would
    be 502s. Start-up names the deployment and the URL (never the key); a deployment
    whose server answers its paths (here 400 to the probe's empty body) is not named."""
    with ScriptedUpstream(_not_an_llm_api) as wrong, ScriptedUpstream(_an_llm_api) as right:
        deployments = [
            {"id": "wrong", "base_url": wrong.url, "api_key": "sk-wrong-secret-123"},
            {"id": "right", "base_url": f"{right.url}/v1", "api_key": "sk-right-secret-123"},
        ]
        settings = parse_settings({"models": [{"name": "m", "deployments": deployments}]})
        warn_about_unreachable_upstreams(settings, timeout=5)
        wait_until(lambda: warnings.messages, timeout=10, what="a warning")
        (message,) = warnings.messages
        assert wrong_paths(settings, timeout=5) == [message]
        probes = wrong.requests
    assert message.startswith("deployment wrong:")
    assert f"{wrong.url}/chat/completions answers 404" in message and "/v1" in message
    assert "secret" not in message
    assert all("authorization" not in probe.headers for probe in probes)  # no key sent


@pytest.mark.slow
def test_a_redis_that_answers_is_no_problem(tls_redis_url: str) -> None:
    settings = parse_settings({**_MINIMAL, "redis": {"url": tls_redis_url}}, env={})
    assert redis_problem(settings) is None


def test_a_redis_nothing_answers_at_is_a_warning_not_a_failure(warnings: _Records) -> None:
    url = f"redis://127.0.0.1:{free_port()}"
    settings = parse_settings({**_MINIMAL, "redis": {"url": url}}, env={})
    assert redis_problem(settings, timeout=1.0) is None
    [message] = [m for m in warnings.messages if "does not answer" in m]
    assert url in message and "redis.on_error=local" in message


def test_a_wrong_acl_password_names_the_field_not_the_secret(tls_redis: TlsRedisServer) -> None:
    url = tls_redis.tls_url(TLS_USER, "wrong-secret", tls_redis.ca.ca)
    settings = parse_settings({**_MINIMAL, "redis": {"url": url}}, env={})
    problem = redis_problem(settings)
    assert problem is not None and problem.startswith("redis.url: rediss://127.0.0.1:")
    assert "refused the user or password" in problem and "wrong-secret" not in problem
