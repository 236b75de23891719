"""proxy.observability.logs: one JSON object per line, one line per request, and never a secret."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from proxy.observability.logs import (
    RequestLog,
    client_text,
    configure_logging,
    log_request,
    logging_config,
    redact,
)

LOGGERS = ("proxy", "proxy.access", "uvicorn", "uvicorn.error", "uvicorn.access")


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """configure_logging changes process-wide state: put it back after each test."""
    root = logging.getLogger()
    saved = [(root, root.handlers[:], root.level, root.propagate, root.disabled)]
    for name in LOGGERS:
        lg = logging.getLogger(name)
        saved.append((lg, lg.handlers[:], lg.level, lg.propagate, lg.disabled))
    yield
    for lg, handlers, level, propagate, disabled in saved:
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate, lg.disabled = propagate, disabled


@pytest.fixture
def stream() -> io.StringIO:
    out = io.StringIO()
    configure_logging("info", stream=out)
    return out


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def request_entry(**overrides: Any) -> RequestLog:
    fields: dict[str, Any] = {
        "request_id": "req-1",
        "key_name": "team-a",
        "model": "gpt-4o-mini",
        "deployment": "openai-a",
        "status": 200,
        "latency_ms": 123.456,
        "queue_wait_ms": 7.0,
        "prompt_tokens": 12,
        "completion_tokens": 34,
        "retries": 1,
        "error_code": None,
        "api": "responses",
    }
    return RequestLog(**(fields | overrides))


def test_a_log_line_is_a_json_object_with_ts_level_logger_message_and_extras(
    stream: io.StringIO,
) -> None:
    logging.getLogger("proxy.routing").warning(
        "deployment %s cooling down", "openai-a", extra={"deployment": "openai-a", "for_s": 30}
    )

    (line,) = lines(stream)
    assert line == line | {
        "level": "warning",
        "logger": "proxy.routing",
        "message": "deployment openai-a cooling down",
        "deployment": "openai-a",
        "for_s": 30,
    }
    assert line["ts"].endswith("Z") and "T" in line["ts"]


def test_an_exception_is_logged_with_its_traceback_on_the_same_line(
    stream: io.StringIO,
) -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("proxy").exception("request failed")

    (line,) = lines(stream)
    assert line["level"] == "error"
    assert "RuntimeError: boom" in line["exc"]


def test_records_below_the_level_are_dropped() -> None:
    out = io.StringIO()
    configure_logging("warning", stream=out)
    logging.getLogger("proxy").info("chatty")
    logging.getLogger("proxy").warning("important")
    assert [line["message"] for line in lines(out)] == ["important"]


def test_an_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="loud"):
        configure_logging("loud")


def test_text_mode_writes_readable_lines() -> None:
    out = io.StringIO()
    configure_logging("info", json=False, stream=out)
    logging.getLogger("proxy").info("hello", extra={"deployment": "a"})
    assert out.getvalue().rstrip().endswith("info proxy: hello deployment=a")


# -- one line per request -------------------------------------------------------------------


def test_log_request_writes_one_line_with_every_field(stream: io.StringIO) -> None:
    log_request(request_entry())

    (line,) = lines(stream)
    assert line == line | {
        "logger": "proxy.access",
        "message": "request",
        "request_id": "req-1",
        "key_name": "team-a",
        "model": "gpt-4o-mini",
        "deployment": "openai-a",
        "status": 200,
        "latency_ms": 123.46,
        "queue_wait_ms": 7.0,
        "prompt_tokens": 12,
        "completion_tokens": 34,
        "retries": 1,
        "error_code": None,
    }


def test_a_rejected_request_logs_its_error_code(stream: io.StringIO) -> None:
    log_request(request_entry(status=429, deployment=None, error_code="key_rpm"))
    (line,) = lines(stream)
    assert (line["status"], line["deployment"], line["error_code"]) == (429, None, "key_rpm")
    assert line["api"] == "responses"  # the API it came through


def test_the_request_log_has_no_place_for_a_key_or_a_prompt() -> None:
    names = {f.name for f in dataclasses.fields(RequestLog)}
    assert names == {
        "request_id",
        "key_name",
        "model",
        "deployment",
        "status",
        "latency_ms",
        "queue_wait_ms",
        "prompt_tokens",
        "completion_tokens",
        "retries",
        "error_code",
        "shadow_rejection",
        "cost_usd",
        "api",
        "requested_model",
    }


def test_client_text_is_bounded_and_printable() -> None:
    """What a log line quotes of client input (an unknown model's name)."""
    assert client_text("gpt-4o-mini") == "gpt-4o-mini"
    assert client_text("a\nb\r\x1b[31m\u2028\x00") == "a\\nb\\r\\x1b[31m\\u2028\\x00"
    assert client_text("é ü 模型") == "é ü 模型"  # printable, kept
    assert client_text("x" * 200) == "x" * 200
    assert client_text("x" * 201) == "x" * 200 + "..."
    assert len(client_text("\n" * 10_000)) == 203  # escapes count against the bound


def test_request_lines_can_be_silenced_by_level(stream: io.StringIO) -> None:
    logging.getLogger("proxy.access").setLevel(logging.WARNING)
    log_request(request_entry())
    assert stream.getvalue() == ""


# -- redaction ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("upstream said: Authorization: Bearer abc.DEF-123_x", "abc.DEF-123_x"),
        ("bad header bearer eyJhbGciOiJIUzI1NiJ9.payload.sig", "eyJhbGciOiJIUzI1NiJ9"),
        ("key sk-proj-AbCdEf123456789 rejected", "AbCdEf123456789"),
        ("anthropic sk-ant-api03-xyzxyzxyz", "api03-xyzxyzxyz"),
        ("GET https://x/v1?api_key=s3cr3t&model=m", "s3cr3t"),
        ('{"api-key": "s3cr3t-value"}', "s3cr3t-value"),
        ("x-api-key: s3cr3t", "s3cr3t"),
    ],
)
def test_redact_masks_credentials(text: str, secret: str) -> None:
    masked = redact(text)
    assert secret not in masked
    assert "[REDACTED]" in masked


def test_redact_leaves_ordinary_text_alone() -> None:
    text = "deployment openai-a cooling down for 30s after 3 failures (429, task-7)"
    assert redact(text) == text


def test_secrets_are_masked_in_messages_args_extras_and_tracebacks(
    stream: io.StringIO,
) -> None:
    log = logging.getLogger("proxy.upstream")
    log.info("calling with Bearer %s", "tok-123456", extra={"note": "key sk-abcdef123456"})
    log.info("headers", extra={"headers": {"Authorization": "Bearer tok-123456"}})
    log.info("config", extra={"api_key": "plain-secret"})
    try:
        raise ValueError("upstream rejected sk-abcdef123456")
    except ValueError:
        log.exception("failed")

    text = stream.getvalue()
    for secret in ("tok-123456", "abcdef123456", "plain-secret"):
        assert secret not in text
    assert len(lines(stream)) == 4


# -- uvicorn --------------------------------------------------------------------------------


def test_uvicorn_error_logs_look_like_ours_and_its_access_log_is_off(
    stream: io.StringIO,
) -> None:
    logging.getLogger("uvicorn.error").info(
        "Started server process [%d]", 42, extra={"color_message": "\x1b[36m42\x1b[0m"}
    )
    logging.getLogger("uvicorn.access").info('127.0.0.1 - "GET / HTTP/1.1" 200')

    (line,) = lines(stream)
    assert line == line | {"logger": "uvicorn.error", "message": "Started server process [42]"}
    assert "color_message" not in line


@pytest.mark.parametrize("use_colors", [None, False])
def test_uvicorn_accepts_the_dict_config_it_applies_in_each_worker(
    use_colors: bool | None,
) -> None:
    out = io.StringIO()
    config = uvicorn.Config(
        "proxy.process.app:create_app_from_env",
        log_config=logging_config("info", stream=out),
        use_colors=use_colors,
        access_log=False,
    )
    config.configure_logging()
    logging.getLogger("uvicorn.error").info("hello from a worker")
    assert lines(out)[-1]["message"] == "hello from a worker"
