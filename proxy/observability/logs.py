"""Structured logs: one JSON object per line.

Every line has ``ts`` (UTC, ISO 8601, milliseconds), ``level``, ``logger`` and ``message``,
then the record's extra fields (``log.info("...", extra={"deployment": "a"})``) and ``exc``
for a traceback. uvicorn's error logs go through the same handler, so they look the same.

One line per request comes from :func:`log_request` (logger ``proxy.access``); uvicorn's own
access log is redundant with it and the CLI turns it off.

Secrets never belong in a log: :class:`RequestLog` has no field for a key or a prompt, and
:class:`RedactingFilter`, installed on the handler, masks anything that looks like a bearer
token, an ``sk-...`` key or an ``api_key=...`` value in messages, extra fields and
tracebacks, as a second line of defence.

Configure with :func:`configure_logging` in-process, or hand :func:`logging_config` to uvicorn
as ``log_config``: uvicorn applies it in each worker it spawns (a spawned worker does not
inherit the parent's logging set-up).
"""

from __future__ import annotations

import logging
import logging.config
import re
import time
from dataclasses import dataclass
from typing import IO, Any, Final

import orjson

__all__ = [
    "JsonFormatter",
    "RedactingFilter",
    "RequestLog",
    "TextFormatter",
    "client_text",
    "configure_logging",
    "log_request",
    "logging_config",
    "redact",
]

ACCESS_LOGGER: Final = "proxy.access"

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
# (uvicorn adds color_message, a duplicate of the message with terminal colours.)
_STANDARD = logging.LogRecord("", 0, "", 0, "", None, None).__dict__
_RECORD_ATTRS: Final = frozenset(_STANDARD) | {"message", "asctime", "taskName", "color_message"}

_MASK: Final = "[REDACTED]"
_SECRET = re.compile(
    # api_key=..., "authorization": "Bearer ...", x-api-key: ... (keep the name, mask the value)
    r"(?i)(?P<name>\b(?:x-)?api[-_]?key|\bauthorization)(?P<sep>[\"']?\s*[:=]\s*[\"']?)"
    r"(?:bearer\s+)?[^\s\"',;&}]+"
    # Bearer <token>
    r"|\b(?P<scheme>bearer)\s+[A-Za-z0-9._~+/=-]+"
    # OpenAI/Anthropic-style keys: sk-..., sk-proj-..., sk-ant-...
    r"|\bsk-[A-Za-z0-9_-]{6,}"
)
_SENSITIVE_KEYS: Final = frozenset(
    {"authorization", "api_key", "api-key", "apikey", "x-api-key", "key", "password", "secret"}
)


def _mask(m: re.Match[str]) -> str:
    if m.group("name") is not None:
        return f"{m.group('name')}{m.group('sep')}{_MASK}"
    if m.group("scheme") is not None:
        return f"{m.group('scheme')} {_MASK}"
    return f"sk-{_MASK}"


def redact(text: str) -> str:
    """``text`` with anything that looks like a credential masked."""
    return _SECRET.sub(_mask, text)


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {
            k: _MASK if str(k).lower() in _SENSITIVE_KEYS else _redact_value(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_redact_value(v) for v in value]
    return value


class RedactingFilter(logging.Filter):
    """Masks credentials in a record's message, string extras and traceback (in place, so
    every handler sees the masked record). Install it on handlers: a logger's filters do not
    see records propagated from its children."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args or not isinstance(record.msg, str):
            record.msg, record.args = redact(record.getMessage()), None
        elif _SECRET.search(record.msg):
            record.msg = redact(record.msg)
        fields = record.__dict__
        # A set difference runs in C: most records have no extras, a request line has 11.
        for name in fields.keys() - _RECORD_ATTRS:
            value = fields[name]
            if name.lower() in _SENSITIVE_KEYS:
                fields[name] = _MASK
            elif isinstance(value, str):
                if _SECRET.search(value):
                    fields[name] = redact(value)
            elif isinstance(value, dict | list | tuple):
                fields[name] = _redact_value(value)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


_second: tuple[int, str] = (-1, "")


def _timestamp(created: float) -> str:
    # strftime costs more than the rest of a line: format each second once.
    global _second
    second = int(created)
    cached = _second
    if cached[0] != second:
        cached = _second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    return f"{cached[1]}.{int((created - second) * 1000):03d}Z"


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _RECORD_ATTRS}


def _traceback(formatter: logging.Formatter, record: logging.LogRecord) -> str | None:
    if record.exc_info and not record.exc_text:
        record.exc_text = formatter.formatException(record.exc_info)
    if record.stack_info:
        return f"{record.exc_text}\n{record.stack_info}" if record.exc_text else record.stack_info
    return record.exc_text or None


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, extra fields, exc."""

    # uvicorn sets use_colors on the "default"/"access" formatters of a dict log_config.
    def __init__(self, use_colors: bool | None = None) -> None:
        super().__init__()

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        payload.update(_extras(record))
        tb = _traceback(self, record)
        if tb:
            payload["exc"] = tb
        return orjson.dumps(payload, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


class TextFormatter(logging.Formatter):
    """Human-readable lines for development: ``ts level logger: message key=value ...``."""

    def __init__(self, use_colors: bool | None = None) -> None:
        super().__init__()

    def format(self, record: logging.LogRecord) -> str:
        parts = [
            _timestamp(record.created),
            record.levelname.lower(),
            f"{record.name}:",
            record.getMessage(),
        ]
        parts += [f"{k}={v}" for k, v in _extras(record).items()]
        line = " ".join(parts)
        tb = _traceback(self, record)
        return f"{line}\n{tb}" if tb else line


def _level(level: str) -> int:
    name = level.upper()
    if name == "TRACE":  # uvicorn's level below DEBUG
        return 5
    value = logging.getLevelName(name)
    if not isinstance(value, int):
        raise ValueError(f"unknown log level {level!r}")
    return value


def logging_config(
    level: str = "info", json: bool = True, stream: str | IO[str] = "ext://sys.stderr"
) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` dict: one handler on the root logger, uvicorn's
    loggers routed through it, uvicorn's access log off. Fit for ``uvicorn.run(log_config=)``.
    """
    lvl = _level(level)
    formatter = (
        "proxy.observability.logs.JsonFormatter"
        if json
        else "proxy.observability.logs.TextFormatter"
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"redact": {"()": "proxy.observability.logs.RedactingFilter"}},
        # uvicorn expects formatters named "default" and "access" (see its use_colors).
        "formatters": {"default": {"()": formatter}, "access": {"()": formatter}},
        "handlers": {
            "default": {
                "class": "logging.StreamHandler",
                "formatter": "default",
                "filters": ["redact"],
                "stream": stream,
            }
        },
        "root": {"handlers": ["default"], "level": lvl},
        "loggers": {
            "proxy": {"level": lvl, "propagate": True},
            "uvicorn": {"handlers": [], "level": lvl, "propagate": True},
            "uvicorn.error": {"handlers": [], "level": lvl, "propagate": True},
            "uvicorn.access": {"handlers": [], "propagate": False},
            # One INFO line per upstream call from httpx would double the log volume and
            # cost time on the hot path; the proxy's own request line says it all.
            "httpx": {"level": "WARNING"},
            "httpcore": {"level": "WARNING"},
        },
    }


def configure_logging(
    level: str = "info", json: bool = True, stream: str | IO[str] = "ext://sys.stderr"
) -> None:
    """Set up logging in this process (see :func:`logging_config`)."""
    logging.config.dictConfig(logging_config(level, json, stream))


@dataclass(slots=True)
class RequestLog:
    """What one line per request says. Deliberately no field for a key or a prompt."""

    request_id: str
    key_name: str | None
    model: str  # the configured group ("unknown": none has the name asked for)
    deployment: str | None
    status: int
    latency_ms: float
    queue_wait_ms: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    retries: int = 0
    error_code: str | None = None
    shadow_rejection: str | None = None  # a shadow key's limit that would have refused it
    cost_usd: float | None = None  # its usage priced (a priced deployment that reported it)
    api: str = ""  # the API it came through (shapes.base.api_label)
    # The name the client asked for (``model`` is the group that served it: its name,
    # an alias, a name its pattern matches; none: what to configure): ``client_text``'s.
    requested_model: str | None = None


CLIENT_TEXT_LIMIT: Final = 200  # characters of client input a log line quotes


def client_text(text: str, limit: int = CLIENT_TEXT_LIMIT) -> str:
    r"""Client input as a log line may quote it: its first ``limit`` characters (``...``
    after them if there were more), each one that is not printable (a line break that
    would forge a line of the text format, a terminal's escape) written as its escape
    (``\n``, ``\x1b``, ``\u2028``)."""
    shown = text[:limit]
    if not shown.isprintable():
        shown = "".join(c if c.isprintable() else _escape(c) for c in shown)
    if len(text) > limit or len(shown) > limit:
        return shown[:limit] + "..."
    return shown


def _escape(character: str) -> str:
    return character.encode("unicode_escape").decode("ascii")


_access_log = logging.getLogger(ACCESS_LOGGER)


def log_request(entry: RequestLog) -> None:
    """Write ``entry`` as one line (message ``"request"``, fields at the top level)."""
    if not _access_log.isEnabledFor(logging.INFO):
        return
    # A record built here skips the caller lookup and extra-key checks of Logger.info(), and
    # the fields are spelled out rather than dataclasses.asdict(), which deep-copies.
    record = logging.LogRecord(ACCESS_LOGGER, logging.INFO, __file__, 0, "request", None, None)
    record.__dict__.update(
        request_id=entry.request_id,
        key_name=entry.key_name,
        model=entry.model,
        deployment=entry.deployment,
        status=entry.status,
        latency_ms=round(entry.latency_ms, 2),
        queue_wait_ms=round(entry.queue_wait_ms, 2),
        prompt_tokens=entry.prompt_tokens,
        completion_tokens=entry.completion_tokens,
        retries=entry.retries,
        error_code=entry.error_code,
        shadow_rejection=entry.shadow_rejection,
        cost_usd=entry.cost_usd,
        api=entry.api,
        requested_model=entry.requested_model,
    )
    _access_log.handle(record)
