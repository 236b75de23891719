"""Typed configuration: YAML in, validated ``Settings`` out.

Any string may be ``${VAR}`` or ``${VAR:-default}``; durations are seconds or strings such
as ``500ms``, ``30s``, ``2m``, ``1m30s``; sizes are bytes or ``10MiB``; unknown keys are
errors. Every problem is reported at once, each naming the file and the field path.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

__all__ = ["ConfigError", "LimitRule", "Settings", "load_settings", "parse_settings"]


class ConfigError(Exception):
    """A config file that cannot be used; ``problems`` lists every reason."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


# --- value parsers ------------------------------------------------------------------

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|KiB|MB|MiB|GB|GiB)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1,
    "kb": 1000,
    "kib": 1024,
    "mb": 10**6,
    "mib": 2**20,
    "gb": 10**9,
    "gib": 2**30,
}


def parse_duration(value: object) -> float:
    """Seconds from a number or a string like ``500ms``, ``30s``, ``2m``, ``1m30s``, ``30d``."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 500ms or 2m")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION_PART.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text:
                raise ValueError(
                    f"invalid duration {value!r}: use seconds or e.g. 500ms, 30s, 2m"
                ) from None
            seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    else:
        raise ValueError("expected a duration such as 30s, 500ms or 2m")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


def parse_size(value: object) -> int:
    """Bytes from a number or a string like ``10MiB``."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 10MiB")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and (match := _SIZE.match(value)):
        return int(float(match.group(1)) * _SIZE_UNITS[(match.group(2) or "b").lower()])
    raise ValueError(f"invalid size {value!r}: use bytes or e.g. 512KiB, 10MiB")


Duration = Annotated[float, BeforeValidator(parse_duration)]
ByteSize = Annotated[int, BeforeValidator(parse_size), Field(gt=0)]
PositiveInt = Annotated[int, Field(gt=0)]


# --- schema ---------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RedisConfig(_Strict):
    url: str = ""
    on_error: Literal["local", "reject"] = "local"
    # Per Redis call: an ailing Redis must not stall traffic, but on a saturated machine
    # 50 ms timed out healthy calls and made replicas flap into their fallback shares.
    timeout: Duration = 0.1


LimitKind = Literal["requests", "tokens"]


@dataclass(frozen=True, slots=True)
class LimitRule:
    """One configured window: at most ``amount`` ``kind`` per ``per`` seconds."""

    kind: LimitKind
    amount: int
    per: float


class LimitSpec(_Strict):
    """The general form of a limit: ``{requests: N, per: 1d}`` or ``{tokens: N, per: 30d}``."""

    requests: PositiveInt | None = None
    tokens: PositiveInt | None = None
    per: Annotated[Duration, Field(ge=1.0)]

    @model_validator(mode="after")
    def _one_kind(self) -> LimitSpec:
        if (self.requests is None) == (self.tokens is None):
            raise ValueError("give exactly one of 'requests' or 'tokens' (with 'per')")
        return self

    def rule(self) -> LimitRule:
        if self.requests is not None:
            return LimitRule("requests", self.requests, self.per)
        assert self.tokens is not None
        return LimitRule("tokens", self.tokens, self.per)


# The shorthands, as (field, kind, seconds): rpm/tpm per minute, rpd/tpd per day.
_SHORTHANDS: tuple[tuple[str, LimitKind, float], ...] = (
    ("rpm", "requests", 60.0),
    ("tpm", "tokens", 60.0),
    ("rpd", "requests", 86400.0),
    ("tpd", "tokens", 86400.0),
)


class _Limited(_Strict):
    """Limits as data: the shorthands and ``limits`` make one list of windows."""

    rpm: PositiveInt | None = None
    tpm: PositiveInt | None = None
    rpd: PositiveInt | None = None
    tpd: PositiveInt | None = None
    limits: list[LimitSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _distinct_windows(self) -> _Limited:
        seen: set[tuple[str, float]] = set()
        for rule in self.limit_rules():
            if (rule.kind, rule.per) in seen:
                raise ValueError(
                    f"two limits on {rule.kind} per {rule.per:g}s: give each window once"
                    " (rpm/tpm are per 1m, rpd/tpd per 1d)"
                )
            seen.add((rule.kind, rule.per))
        return self

    def limit_rules(self) -> list[LimitRule]:
        """Every configured window: the shorthands first, then ``limits`` in order."""
        rules = [
            LimitRule(kind, amount, per)
            for field, kind, per in _SHORTHANDS
            if (amount := getattr(self, field)) is not None
        ]
        return rules + [spec.rule() for spec in self.limits]


class ClientKey(_Limited):
    name: str = Field(min_length=1)
    key: SecretStr | None = None
    key_sha256: str | None = None
    max_parallel: PositiveInt | None = None
    models: list[str] | None = None

    @field_validator("key_sha256")
    @classmethod
    def _hex_digest(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", value):
            raise ValueError("must be 64 hex characters (a sha256 digest)")
        return value.lower() if value else value

    @model_validator(mode="after")
    def _one_secret(self) -> ClientKey:
        has_key = self.key is not None and self.key.get_secret_value() != ""
        if has_key == (self.key_sha256 is not None):
            raise ValueError("give exactly one of 'key' (non-empty) or 'key_sha256'")
        return self

    def digest(self) -> bytes:
        """The sha256 of the key, whichever way it was given."""
        if self.key_sha256 is not None:
            return bytes.fromhex(self.key_sha256)
        assert self.key is not None
        return hashlib.sha256(self.key.get_secret_value().encode()).digest()


class Deployment(_Limited):
    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")
    base_url: str = Field(pattern=r"^https?://[^\s/]+")
    api_key: SecretStr = SecretStr("")
    model: str | None = None
    burst: PositiveInt | None = None
    weight: float = Field(default=1.0, gt=0)
    timeout: Duration = 60.0

    @field_validator("base_url")
    @classmethod
    def _strip_slash(cls, value: str) -> str:
        return value.rstrip("/")


class ModelGroup(_Strict):
    name: str = Field(min_length=1)
    deployments: list[Deployment] = Field(min_length=1)


# The routing strategies (proxy/routing/strategies.py orders for each of them).
Strategy = Literal["least-wait", "weighted-random", "least-busy", "lowest-latency"]


class CooldownConfig(_Strict):
    allowed_fails: PositiveInt = 3
    window: Duration = 60.0
    time: Duration = 30.0


class RoutingConfig(_Strict):
    strategy: Strategy = "least-wait"
    max_wait: Duration = 30.0
    max_queue: Annotated[int, Field(ge=0)] = 1000
    retries: Annotated[int, Field(ge=0)] = 2
    cooldown: CooldownConfig = CooldownConfig()
    fallbacks: dict[str, list[str]] = Field(default_factory=dict)


class ServerConfig(_Strict):
    """Process-level knobs (an extension of the contract's file; all optional)."""

    max_body_size: ByteSize = 10 * 2**20
    # Completion tokens assumed for budgeting when a request sets no max_tokens.
    default_max_tokens: PositiveInt = 256
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # A connection must send complete request headers within this (slow-header attacks).
    header_timeout: Annotated[Duration, Field(gt=0)] = 10.0
    # Non-empty: GET /metrics needs "Authorization: Bearer <token>".
    metrics_token: SecretStr = SecretStr("")


class Settings(_Strict):
    redis: RedisConfig = RedisConfig()
    keys: list[ClientKey] = Field(default_factory=list)
    models: list[ModelGroup] = Field(min_length=1)
    routing: RoutingConfig = RoutingConfig()
    server: ServerConfig = ServerConfig()

    def group(self, name: str) -> ModelGroup | None:
        return next((m for m in self.models if m.name == name), None)


def _reference_problems(settings: Settings) -> list[str]:
    """Checks that span sections: unique names and ids, known model references."""
    problems = _duplicates("models", [m.name for m in settings.models], "name")
    problems += _duplicates("keys", [k.name for k in settings.keys], "name")
    ids = [d.id for m in settings.models for d in m.deployments]
    problems += _duplicates("models[].deployments", ids, "id")
    names = {m.name for m in settings.models}
    for i, key in enumerate(settings.keys):
        problems += [
            f"keys[{i}].models: unknown model {m!r}" for m in key.models or [] if m not in names
        ]
    for source, targets in settings.routing.fallbacks.items():
        problems += [
            f"routing.fallbacks.{source}: unknown model {m!r}"
            for m in [source, *targets]
            if m not in names
        ]
    return problems


def _duplicates(where: str, values: list[str], field: str) -> list[str]:
    seen: set[str] = set()
    dupes = sorted({v for v in values if v in seen or seen.add(v)})  # type: ignore[func-returns-value]
    return [f"{where}: duplicate {field} {v!r}" for v in dupes]


# --- loading --------------------------------------------------------------------------

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _interpolate(node: Any, path: str, env: Mapping[str, str], problems: list[str]) -> Any:
    """Replace ``${VAR}``/``${VAR:-default}`` in every string of the YAML tree."""
    if isinstance(node, dict):
        return {k: _interpolate(v, _join(path, str(k)), env, problems) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, f"{path}[{i}]", env, problems) for i, v in enumerate(node)]
    if not isinstance(node, str):
        return node

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        problems.append(f"{path}: environment variable {name} is not set")
        return ""

    return _ENV_REF.sub(substitute, node)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _loc_to_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path = f"{path}[{part}]" if isinstance(part, int) else _join(path, part)
    return path or "(top level)"


def parse_settings(
    data: object, source: str = "<config>", env: Mapping[str, str] | None = None
) -> Settings:
    """Validate an already-parsed YAML document."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, ["(top level): expected a mapping of sections"])
    problems: list[str] = []
    data = _interpolate(data, "", os.environ if env is None else env, problems)
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            message = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                message = "unknown key"
            problems.append(f"{_loc_to_path(tuple(err['loc']))}: {message}")
        raise ConfigError(source, problems) from None
    problems += _reference_problems(settings)
    if problems:
        raise ConfigError(source, problems)
    return settings


def load_settings(path: str | Path, env: Mapping[str, str] | None = None) -> Settings:
    """Read and validate a YAML config file."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(source, [f"cannot read file: {exc.strerror}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, [f"invalid YAML: {exc}"]) from None
    return parse_settings(data, source, env)
