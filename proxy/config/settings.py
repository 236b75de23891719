"""Typed configuration: YAML in, validated ``Settings`` out.

Any string may be ``${VAR}`` or ``${VAR:-default}``; durations are seconds or strings such
as ``500ms``, ``30s``, ``2m``, ``1m30s``; sizes are bytes or ``10MiB``; unknown keys are
errors. Every problem is reported at once, each naming the file and the field path.
"""

from __future__ import annotations

import difflib
import gc
import hashlib
import importlib.util
import os
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import orjson
import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from proxy.config import limit_kinds, model_names, yaml_load
from proxy.config.keys import ConfigKeys, KeysBuilder, plain_digest
from proxy.config.secrets import redaction_warning

__all__ = [
    "AdminConfig",
    "ConfigError",
    "LimitRule",
    "Settings",
    "Team",
    "TelemetryConfig",
    "config_warnings",
    "load_settings",
    "parse_settings",
]


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


def _lower(value: object) -> object:
    """Choices are case-insensitive: ``INFO`` is ``info``."""
    return value.lower() if isinstance(value, str) else value


Duration = Annotated[float, BeforeValidator(parse_duration)]


def parse_pacing_margin(value: object) -> object:
    """``auto`` (any case), or a duration from 0 to 1 s (``routing.pacing_margin``)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise ValueError(f"expected auto or a duration such as 20ms: {exc}") from None
    if seconds > 1.0:
        raise ValueError("a pacing margin is at most 1s (auto measures one of 1ms..100ms)")
    return seconds


# ``routing.pacing_margin``: "auto", or seconds.
PacingMargin = Annotated[Literal["auto"] | float, BeforeValidator(parse_pacing_margin)]
ByteSize = Annotated[int, BeforeValidator(parse_size), Field(gt=0)]
PositiveInt = Annotated[int, Field(gt=0)]


# --- schema ---------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# What the limiter connects to (proxy/limiter/redis/runner.py): a single Redis, TLS, a unix
# socket, or a Redis Cluster.
_REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")


class SentinelConfig(_Strict):
    """A Sentinel-managed primary (instead of ``redis.url``): the sentinels at ``nodes``
    name the primary of ``master``, and name its successor after a failover."""

    master: str = Field(min_length=1)
    nodes: list[str] = Field(min_length=1)
    # For the primary, and the sentinels unless sentinel_password is set.
    username: SecretStr = SecretStr("")
    password: SecretStr = SecretStr("")
    # The sentinels' own password (their default user), when theirs is not the primary's.
    sentinel_password: SecretStr = SecretStr("")
    # TLS to the sentinels and the primary: true (the system's trust store) or a CA file.
    tls: bool | TlsConfig = False

    @field_validator("nodes")
    @classmethod
    def _host_ports(cls, nodes: list[str]) -> list[str]:
        for node in nodes:
            sentinel_address(node)
        return nodes

    def addresses(self) -> list[tuple[str, int]]:
        return [sentinel_address(node) for node in self.nodes]


def sentinel_address(node: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as a pair; ValueError naming the node otherwise."""
    host, _, port = node.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"a sentinel is host:port, e.g. 10.0.0.5:26379 (got {node!r})")
    return host, int(port)


class RedisConfig(_Strict):
    url: str = ""
    sentinel: SentinelConfig | None = None
    on_error: Annotated[Literal["local", "reject"], BeforeValidator(_lower)] = "local"
    # Per Redis call: an ailing Redis must not stall traffic, but on a saturated machine
    # 50 ms timed out healthy calls and made replicas flap into their fallback shares.
    timeout: Duration = 0.1

    @property
    def shared(self) -> bool:
        """Whether budgets live in Redis (a URL or a Sentinel-managed primary)."""
        return bool(self.url) or self.sentinel is not None

    @model_validator(mode="after")
    def _one_target(self) -> RedisConfig:
        if self.url and self.sentinel is not None:
            raise ValueError("set either url or sentinel, not both")
        return self

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        scheme = value.partition("://")[0].lower() if "://" in value else ""
        if value and scheme not in _REDIS_SCHEMES:
            raise ValueError(
                "must be a redis://, rediss://, unix:// or redis+cluster:// URL, or empty"
                f" for the in-memory limiter (got {value!r})"
            )
        return value


# The kinds a rate window may count (proxy/costs.py; usd is for budgets, not windows), and
# any kind registered beside them (proxy/config/limit_kinds.py).
LimitKind = Literal["requests", "tokens", "input_tokens", "output_tokens"]
_LIMIT_KINDS: tuple[LimitKind, ...] = get_args(LimitKind)
_REGISTERED = "registered_kind"  # where a registered kind's (name, amount) is kept


@dataclass(frozen=True, slots=True)
class LimitRule:
    """One configured window: at most ``amount`` ``kind`` per ``per`` seconds; with
    ``models``, counting only the requests of those model groups (empty: every one)."""

    kind: str  # a LimitKind, or a registered kind's name
    amount: int
    per: float
    models: tuple[str, ...] = ()


class LimitSpec(_Strict):
    """The general form of a limit: ``{requests: N, per: 1d}``, ``{tokens: N, per: 30d}``,
    ``{input_tokens: N, per: 1m}``, ``{output_tokens: N, per: 1m}``, or a registered
    kind's (``limit_kinds.KINDS``): one kind each."""

    requests: PositiveInt | None = None
    tokens: PositiveInt | None = None
    input_tokens: PositiveInt | None = None
    output_tokens: PositiveInt | None = None
    per: Annotated[Duration, Field(ge=1.0)]
    # Counts and limits only these model groups' requests (a filter, not a new window
    # kind: docs/limiter.md); unset, every request of its owner.
    models: list[str] | None = Field(default=None, min_length=1)
    registered_kind: tuple[str, PositiveInt] | None = None  # written by _registered only

    @model_validator(mode="before")
    @classmethod
    def _registered(cls, data: Any) -> Any:
        """A registered kind's field (``streams: 2``) kept as ``registered_kind``."""
        if not isinstance(data, dict):
            return data
        if _REGISTERED in data:
            raise ValueError(f"unknown field '{_REGISTERED}'")
        given = [name for name in data if name in limit_kinds.KINDS]
        if not given:
            return data
        rest = {k: v for k, v in data.items() if k not in given}
        return {**rest, _REGISTERED: (given[0], data[given[0]])} if len(given) == 1 else data

    @model_validator(mode="after")
    def _one_kind(self) -> LimitSpec:
        given = [kind for kind in _LIMIT_KINDS if getattr(self, kind) is not None]
        if len(given) + (self.registered_kind is not None) != 1:
            *others, last = (f"'{kind}'" for kind in (*_LIMIT_KINDS, *limit_kinds.KINDS))
            raise ValueError(f"give exactly one of {', '.join(others)} or {last} (with 'per')")
        return self

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """As the config writes it: a registered kind under its own name."""
        out: dict[str, Any] = handler(self)
        registered = out.pop(_REGISTERED, None)
        if registered is not None:
            name, amount = registered
            out = {name: amount, **out}
        return out

    def rule(self) -> LimitRule:
        models = tuple(sorted(set(self.models or ())))
        if self.registered_kind is not None:
            return LimitRule(*self.registered_kind, self.per, models)
        for kind in _LIMIT_KINDS:
            amount = getattr(self, kind)
            if amount is not None:
                return LimitRule(kind, amount, self.per, models)
        raise AssertionError("validated: one kind is given")


# The shorthands, as (field, kind, seconds): rpm/tpm per minute, rpd/tpd per day.
_SHORTHANDS: tuple[tuple[str, LimitKind, float], ...] = (
    ("rpm", "requests", 60.0),
    ("tpm", "tokens", 60.0),
    ("rpd", "requests", 86400.0),
    ("tpd", "tokens", 86400.0),
)


# A price or a dollar budget: a finite number, never negative (no NaN, no infinity).
Usd = Annotated[float, Field(ge=0, allow_inf_nan=False)]
BUDGET_KINDS = ("usd", "tokens", "requests", "input_tokens", "output_tokens")


class BudgetSpec(_Strict):
    """A quota for a calendar period (UTC): ``{usd: 50, period: month}``, ``{tokens:
    2000000, period: day, models: [gpt-4o]}``; nothing returns before the boundary."""

    usd: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    tokens: PositiveInt | None = None
    requests: PositiveInt | None = None
    input_tokens: PositiveInt | None = None
    output_tokens: PositiveInt | None = None
    period: Annotated[Literal["day", "week", "month"], BeforeValidator(_lower)]
    models: list[str] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_kind(self) -> BudgetSpec:
        given = [kind for kind in BUDGET_KINDS if getattr(self, kind) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(BUDGET_KINDS)} (with 'period')")
        return self

    @property
    def kind(self) -> str:
        return next(kind for kind in BUDGET_KINDS if getattr(self, kind) is not None)

    @property
    def limit(self) -> float:
        return float(getattr(self, self.kind))


class PriceSpec(_Strict):
    """USD per 1M tokens; a cache price not given is the input price (pricing.py)."""

    input: Usd = 0.0
    output: Usd = 0.0
    cached_input: Usd | None = None
    cache_read: Usd | None = None
    cache_write: Usd | None = None


class _Limited(_Strict):
    """Limits as data: the shorthands and ``limits`` make one list of windows."""

    rpm: PositiveInt | None = None
    tpm: PositiveInt | None = None
    rpd: PositiveInt | None = None
    tpd: PositiveInt | None = None
    limits: list[LimitSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _distinct_windows(self) -> _Limited:
        if not self.limits:  # the shorthands alone are distinct windows (a test says so)
            return self
        seen: set[tuple[str, float, tuple[str, ...]]] = set()
        for rule in self.limit_rules():
            if (rule.kind, rule.per, rule.models) in seen:
                models = f" for models {list(rule.models)}" if rule.models else ""
                raise ValueError(
                    f"two limits on {rule.kind} per {rule.per:g}s{models}: give each window"
                    " once (rpm/tpm are per 1m, rpd/tpd per 1d)"
                )
            seen.add((rule.kind, rule.per, rule.models))
        return self

    def limit_rules(self) -> list[LimitRule]:
        """Every configured window: the shorthands first, then ``limits`` in order."""
        rules = [
            LimitRule(kind, amount, per)
            for field, kind, per in _SHORTHANDS
            if (amount := getattr(self, field)) is not None
        ]
        return rules + [spec.rule() for spec in self.limits]


class _Owner(_Limited):
    """An owner of windows: a client key or a team (the same limit fields, the same
    windows; a key in a team is checked against both in one step)."""

    name: str = Field(min_length=1)
    max_parallel: PositiveInt | None = None
    budgets: list[BudgetSpec] = Field(default_factory=list)
    # What its budgets do with a request they cannot pay whole: refuse it (429), or
    # clamp its output cap to what they have left (proxy/limiter/core/edge.py).
    budget_edge: Annotated[Literal["refuse", "clamp"], BeforeValidator(_lower)] = "refuse"

    @cached_property
    def model_scoped(self) -> bool:
        """Whether a window or a budget of it counts only some models' requests (asked
        of a key per request: ``Catalog.ask_limits``; worked out once, so a key with
        other limits is validated anew, never ``model_copy(update=...)``'d)."""
        return any(spec.models for spec in self.limits) or any(b.models for b in self.budgets)

    @field_validator("budgets")
    @classmethod
    def _distinct_budgets(cls, value: list[BudgetSpec]) -> list[BudgetSpec]:
        seen: set[tuple[str, str, tuple[str, ...]]] = set()
        for b in value:
            scope = (b.kind, b.period, tuple(sorted(b.models or ())))
            if scope in seen:
                raise ValueError(
                    f"two budgets of {b.kind} per {b.period}"
                    + (f" on {', '.join(scope[2])}" if scope[2] else "")
                    + ": give each once"
                )
            seen.add(scope)
        return value


class Team(_Owner):
    """Limits shared by every key naming it (``keys[].team``)."""


class ClientKey(_Owner):
    key: SecretStr | None = None
    key_sha256: str | None = None
    team: str | None = Field(default=None, min_length=1)
    models: list[str] | None = None
    # Fair share of a saturated model (docs/limiter.md): a higher priority's waiting
    # requests go first; within a priority, turns in proportion to weight.
    priority: int = 0
    weight: float = Field(default=1.0, gt=0)
    max_wait: Duration | None = None  # this key's bound on waiting (default routing.max_wait)
    # Shadow mode: the key's own limits are counted and would-be refusals reported, but
    # its requests go on (to try limits out before enforcing them).
    shadow: bool = False

    @field_validator("key_sha256")
    @classmethod
    def _hex_digest(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", value):
            raise ValueError("must be 64 hex characters (a sha256 digest)")
        return value.lower() if value else value

    # The digest, computed once where the key is validated.
    _sha256: bytes = PrivateAttr(default=b"")
    # Who the key is, beyond its name (``identity``): an API key's id ("": its name).
    _identity: str = PrivateAttr(default="")

    @model_validator(mode="after")
    def _one_secret(self) -> ClientKey:
        has_key = self.key is not None and self.key.get_secret_value() != ""
        if has_key == (self.key_sha256 is not None):
            raise ValueError("give exactly one of 'key' (non-empty) or 'key_sha256'")
        private = self._private()  # not pydantic's __setattr__: 100,000 keys at start-up
        if self.key_sha256 is not None:
            private["_sha256"] = bytes.fromhex(self.key_sha256)
        else:
            assert self.key is not None
            private["_sha256"] = hashlib.sha256(self.key.get_secret_value().encode()).digest()
        return self

    def digest(self) -> bytes:
        """The sha256 of the key, whichever way it was given."""
        return typing.cast(bytes, self._private()["_sha256"])

    def identity(self) -> str:
        """Who owns what this key stores (a stored response, ``affinity.Owner``): a config
        key's name (its secret changed in the file is its rotation: the config has no
        other), an API key's id, made with it and kept by a rotation or a change, never
        by a new key given a revoked one's name (``keys/records.py``)."""
        identity = typing.cast(str, self._private()["_identity"])
        return identity or self.name

    def identified_as(self, identity: str) -> None:
        """Set once, as it is built (an API key's record)."""
        self._private()["_identity"] = identity

    def _private(self) -> dict[str, Any]:
        # Pydantic's dict of private attributes, read directly: ``self._sha256`` goes
        # through ``BaseModel.__getattr__``, 0.15 s over 100,000 keys at start-up.
        private = self.__pydantic_private__
        assert private is not None
        return private


class TlsConfig(_Strict):
    """How a deployment's HTTPS is checked: the system's trust store and verification on,
    unless a CA bundle, a client certificate (mTLS) or ``verify: false`` says otherwise."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    verify: bool = True

    @model_validator(mode="after")
    def _files(self) -> TlsConfig:
        if self.key_file and not self.cert_file:
            raise ValueError("key_file needs cert_file (the client certificate)")
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ValueError(f"{name}: no such file {path!r}")
        return self


# Headers a deployment's `headers` may not set: the proxy's own credential and framing.
RESERVED_HEADERS = frozenset(
    {
        "authorization",
        "api-key",
        "x-api-key",
        "host",
        "content-length",
        "content-type",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-authorization",
        "te",
        "trailer",
        "upgrade",
    }
)


@dataclass(frozen=True)
class AwsConfig:
    """A Bedrock deployment's AWS side, from its fields (``Deployment.aws``): its region
    (signed into every request), and its credentials; without them, botocore's default
    chain (the environment, the shared files' ``profile``, a container's or an instance's
    role) finds them."""

    region: str
    access_key_id: SecretStr
    secret_access_key: SecretStr
    session_token: SecretStr
    profile: str  # a named profile of the shared files (the chain only)


_AWS_REGION = r"^[a-z]{2}(-[a-z]+)+-\d{1,2}$"
_BEDROCK = ("bedrock", "bedrock-converse")
_AWS_FIELDS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token", "aws_profile")


def _aws_problem(d: Deployment) -> str | None:
    """What is wrong with a deployment's AWS fields (naming the field); None: nothing."""
    given = [f for f in _AWS_FIELDS if _given(getattr(d, f))]
    if d.provider not in _BEDROCK:
        return f"{given[0]}: is only for Bedrock's providers" if given else None
    if importlib.util.find_spec("botocore") is None:  # found, not imported
        return "provider: needs botocore, which signs its requests: the bedrock extra"
    keys = (_given(d.aws_access_key_id), _given(d.aws_secret_access_key))
    if keys[0] != keys[1]:
        return "aws_access_key_id: goes together with aws_secret_access_key"
    if _given(d.aws_session_token) and not keys[0]:
        return "aws_session_token: needs aws_access_key_id and aws_secret_access_key"
    if d.aws_profile and keys[0]:
        return "aws_profile: is for the default chain, not with aws_access_key_id"
    return None


def _owned_by(owner: str, value: str, info: ValidationInfo) -> bool:
    """Whether a field of provider ``owner`` is to be checked further: required with that
    provider, an error with any other (False: the provider itself is wrong, the error to
    report)."""
    provider = info.data.get("provider")
    if provider is None:
        return False
    if provider == owner and not value:
        raise ValueError(f"is required with provider: {owner}")
    if provider != owner and value:
        raise ValueError(f"is only for provider: {owner} (this deployment is {provider})")
    return True


def _given(value: SecretStr | str) -> bool:
    return bool(value.get_secret_value() if isinstance(value, SecretStr) else value)


# How a deployment is reached (proxy/providers/): OpenAI's paths and bearer key, Azure
# OpenAI's /openai/deployments/{deployment}/... with ?api-version= and an api-key header,
# Anthropic's /v1/messages with x-api-key, AWS Bedrock's /model/{id}/invoke (or its
# Converse API's /converse), signed; the Gemini API's
# /v1beta/models/{model}:generateContent with x-goog-api-key; Google Vertex AI's
# publisher models with a bearer token from google-auth; and any provider a program
# registers (``providers.register`` adds its name here). The names only: the config
# imports no provider (imports point down, to the config).
PROVIDER_NAMES: list[str] = [
    "openai", "azure", "anthropic", "bedrock", "bedrock-converse", "gemini", "vertex",
]  # fmt: skip


def _provider_name(value: object) -> object:
    name = value.lower() if isinstance(value, str) else value
    if name not in PROVIDER_NAMES:
        *others, last = (repr(known) for known in PROVIDER_NAMES)
        raise ValueError(f"must be one of {', '.join(others)} or {last} (got {value!r})")
    return name


Provider = Annotated[str, BeforeValidator(_provider_name)]
# Where a provider's deployments are when their base_url is not given (None: required;
# Vertex AI's: its region's, ``_vertex_defaults``).
_BASE_URLS = {"gemini": "https://generativelanguage.googleapis.com"}
_AZURE_FIELDS = ("deployment", "api_version")
_VERTEX_FIELDS = ("project",)
# A Google Cloud project ID (6-30 characters: lowercase letters, digits, hyphens; a
# letter first, no hyphen last), a legacy domain-scoped one (``example.com:my-project``)
# too; a Vertex AI location (``us-east5``, ``europe-west1``, ``global``, ``us``, ``eu``).
_GCP_PROJECT = r"^(?:[a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$"
_GCP_REGION = r"^[a-z][a-z0-9-]*[a-z0-9]$"
# What a service-account key file must hold (google-auth's ``from_service_account_info``).
_SERVICE_ACCOUNT_FIELDS = ("client_email", "private_key", "token_uri")


def vertex_base_url(region: str) -> str:
    """Vertex AI's endpoint for ``region`` (Google's, as Anthropic's Vertex SDK names them):
    ``global`` and the multi-regions ``us`` and ``eu`` have hosts of their own."""
    if region == "global":
        return "https://aiplatform.googleapis.com"
    if region in ("us", "eu"):
        return f"https://aiplatform.{region}.rep.googleapis.com"
    return f"https://{region}-aiplatform.googleapis.com"


def _vertex_defaults(data: object) -> object:
    """A Vertex AI or Bedrock deployment's ``base_url`` when none is given: its region's
    endpoint."""
    if not isinstance(data, dict) or data.get("base_url"):
        return data
    provider, region = data.get("provider"), data.get("region")
    provider = provider.lower() if isinstance(provider, str) else provider
    if not isinstance(region, str):
        return data
    if provider == "vertex" and re.match(_GCP_REGION, region):
        return {**data, "base_url": vertex_base_url(region)}
    if provider in _BEDROCK and re.match(_AWS_REGION, region):
        return {**data, "base_url": f"https://bedrock-runtime.{region}.amazonaws.com"}
    return data


def _service_account_problem(path: str) -> str | None:
    """What is wrong with a service-account key file (never its content: it holds the
    private key); None: usable."""
    try:
        info = orjson.loads(Path(path).read_bytes())
    except FileNotFoundError:
        return f"no such file {path!r}"
    except OSError as exc:
        return f"cannot read {path!r} ({exc.strerror})"
    except orjson.JSONDecodeError:
        return f"{path!r} is not a JSON service-account key file"
    if not isinstance(info, dict) or info.get("type") != "service_account":
        return f'{path!r} is not a service-account key file (its "type" must be "service_account")'
    missing = [f for f in _SERVICE_ACCOUNT_FIELDS if not isinstance(info.get(f), str)]
    if missing:
        return f"{path!r} lacks {', '.join(missing)}"
    return None


# What may appear in an Azure URL's path segment or query value without escaping.
_URL_SAFE = r"^[A-Za-z0-9_.-]+$"


class Deployment(_Limited):
    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")
    provider: Provider = "openai"
    base_url: str = Field(default="", validate_default=True)
    api_key: SecretStr = SecretStr("")
    # Azure only: the deployment's name in the URL and the api-version query parameter.
    deployment: str = Field(default="", validate_default=True)
    api_version: str = Field(default="", validate_default=True)
    # Vertex AI only (providers/vertex.py): the Google Cloud project and region in the URL,
    # and the service account's key file (none: Application Default Credentials).
    project: str = Field(default="", validate_default=True)
    region: str = Field(default="", validate_default=True)
    credentials_file: str = ""
    model: str | None = None
    burst: PositiveInt | None = None
    weight: float = Field(default=1.0, gt=0)
    timeout: Duration = 60.0
    # Sent with every upstream request (OpenAI-Organization, a gateway's own header).
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    tls: TlsConfig = TlsConfig()
    # An egress proxy for this deployment; wins over HTTPS_PROXY / HTTP_PROXY / NO_PROXY.
    proxy_url: SecretStr = SecretStr("")
    # USD per 1M tokens; wins over its group's price.
    price: PriceSpec | None = None
    # Bedrock only: its credentials (else botocore's default chain); its region is ``region``.
    aws_access_key_id: SecretStr = SecretStr("")
    aws_secret_access_key: SecretStr = SecretStr("")
    aws_session_token: SecretStr = SecretStr("")
    aws_profile: str = ""  # a named profile of the shared files (the chain only)

    @model_validator(mode="before")
    @classmethod
    def _base_url_default(cls, data: object) -> object:
        return _vertex_defaults(data)

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str, info: ValidationInfo) -> str:
        """An http(s) URL, without its trailing slash; the provider's own when none is
        given (the Gemini API's), else required."""
        if not value:
            value = _BASE_URLS.get(info.data.get("provider") or "", "")
            if not value:
                raise ValueError("Field required")
        if not re.match(r"^https?://[^\s/]+", value):
            raise ValueError(f"must be a URL starting with http:// or https:// (got {value!r})")
        return value.rstrip("/")

    @field_validator("limits")
    @classmethod
    def _no_model_filter(cls, value: list[LimitSpec]) -> list[LimitSpec]:
        if any(spec.models is not None for spec in value):
            raise ValueError(
                "'models' filters a key's or a team's window; a deployment serves one model"
            )
        for spec in value:  # its charge would be kept, never given back (limit_kinds.py)
            if spec.registered_kind is not None and limit_kinds.held(spec.registered_kind[0]):
                raise ValueError(
                    f"'{spec.registered_kind[0]}' counts requests in flight: it limits keys"
                    " and teams only"
                )
        return value

    @field_validator(*_AZURE_FIELDS)
    @classmethod
    def _azure_only(cls, value: str, info: ValidationInfo) -> str:
        if not _owned_by("azure", value, info):
            return value
        if value and not re.match(_URL_SAFE, value):
            raise ValueError("may contain only letters, digits and _ . -")
        return value

    @field_validator(*_VERTEX_FIELDS)
    @classmethod
    def _vertex_only(cls, value: str, info: ValidationInfo) -> str:
        if not _owned_by("vertex", value, info):
            return value
        if value and not re.match(_GCP_PROJECT, value):
            raise ValueError(f"is not a Google Cloud {info.field_name} name ({value!r})")
        return value

    @field_validator("region")
    @classmethod
    def _region(cls, value: str, info: ValidationInfo) -> str:
        """Vertex AI's location or Bedrock's AWS region: required there, nowhere else."""
        provider = info.data.get("provider")
        if provider is None:
            return value  # the provider itself is wrong: that is the error to report
        cloud = "Google Cloud" if provider == "vertex" else "AWS"
        if provider not in ("vertex", *_BEDROCK):
            if value:
                raise ValueError(
                    f"is only for Vertex AI and Bedrock (this deployment is {provider})"
                )
            return value
        if not value:
            raise ValueError(f"is required with provider: {provider}")
        if not re.match(_GCP_REGION if provider == "vertex" else _AWS_REGION, value):
            raise ValueError(f"is not an {cloud} region name ({value!r})")
        return value

    @field_validator("credentials_file")
    @classmethod
    def _service_account(cls, value: str, info: ValidationInfo) -> str:
        provider = info.data.get("provider")
        if value and provider is not None and provider != "vertex":
            raise ValueError(f"is only for provider: vertex (this deployment is {provider})")
        problem = _service_account_problem(value) if value else None
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _no_vertex_key(self) -> Deployment:
        if self.provider == "vertex" and self.api_key.get_secret_value():
            raise ValueError(
                "api_key: not used with provider: vertex (its bearer token comes from"
                " credentials_file or the Application Default Credentials)"
            )
        return self

    @model_validator(mode="after")
    def _aws_fields(self) -> Deployment:
        problem = _aws_problem(self)
        if problem is not None:
            raise ValueError(problem)
        return self

    @property
    def aws(self) -> AwsConfig | None:
        """A Bedrock deployment's region and credentials, as its provider reads them."""
        if self.provider not in _BEDROCK:
            return None
        return AwsConfig(
            self.region,
            self.aws_access_key_id,
            self.aws_secret_access_key,
            self.aws_session_token,
            self.aws_profile,
        )

    @field_validator("headers")
    @classmethod
    def _not_reserved(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        reserved = sorted(name for name in value if name.lower() in RESERVED_HEADERS)
        if reserved:
            raise ValueError(
                f"may not set {', '.join(reserved)}: the proxy sets the credential and framing"
            )
        return value

    @field_validator("proxy_url")
    @classmethod
    def _proxy_scheme(cls, value: SecretStr) -> SecretStr:
        url = value.get_secret_value()
        if url and not re.match(r"^https?://[^\s/]+", url):
            raise ValueError("must be an http:// or https:// URL of the egress proxy")
        return value


class ModelGroup(_Strict):
    # What clients send as ``model``; with ``*`` in it, a pattern (model_names.py).
    name: str = Field(min_length=1)
    # Other names clients send for this group, exact (model_names.py checks them).
    aliases: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    deployments: list[Deployment] = Field(min_length=1)
    # USD per 1M tokens for every deployment without its own.
    price: PriceSpec | None = None


# The routing strategies (proxy/routing/strategies.py orders for each of them).
Strategy = Literal["least-wait", "weighted-random", "least-busy", "lowest-latency"]
AnyCaseStrategy = Annotated[Strategy, BeforeValidator(_lower)]


class CooldownConfig(_Strict):
    allowed_fails: PositiveInt = 3
    window: Duration = 60.0
    time: Duration = 30.0


class RoutingConfig(_Strict):
    strategy: AnyCaseStrategy = "least-wait"
    max_wait: Duration = 30.0
    max_queue: Annotated[int, Field(ge=0)] = 1000
    # Fair share (docs/limiter.md): turns that must wait are committed at most this far
    # ahead, split between the waiting keys by priority and weight. Half a second: a key
    # arriving at a saturated model waits about that, and 5 turns at 10 req/s split
    # finely enough. 0: off, turns are committed up to max_wait ahead, first come first served.
    lookahead: Annotated[Duration, Field(ge=0)] = 0.5
    retries: Annotated[int, Field(ge=0)] = 2
    # How late a turn may reach an upstream (a replica's event loop or clock late, the
    # network) and no upstream window of a second or more see more than its limit:
    # deployments are paced that much below it (docs/limiter.md, "late turns"). ``auto``:
    # the lateness the live replicas measure, 1ms..100ms (catalog/pacing.py); or fixed.
    pacing_margin: PacingMargin = "auto"
    cooldown: CooldownConfig = CooldownConfig()
    fallbacks: dict[str, list[str]] = Field(default_factory=dict)


class ServerConfig(_Strict):
    """Process-level knobs (an extension of the contract's file; all optional)."""

    max_body_size: ByteSize = 10 * 2**20
    # The largest upstream answer read whole (buffered; decoded if gzipped): past it a
    # 502, never unbounded memory. Streams pass chunk by chunk and are never held.
    max_upstream_body_size: ByteSize = 64 * 2**20
    # Completion tokens assumed for budgeting when a request sets no max_tokens.
    default_max_tokens: PositiveInt = 256
    log_level: Annotated[Literal["debug", "info", "warning", "error"], BeforeValidator(_lower)] = (
        "info"
    )
    # A connection must send complete request headers within this (slow-header attacks).
    header_timeout: Annotated[Duration, Field(gt=0)] = 10.0
    # A request's body must arrive in full within this (408 and the connection closed): a
    # stalled upload holds no socket and no memory for long.
    body_timeout: Annotated[Duration, Field(gt=0)] = 30.0
    # A reload that would leave no client keys is refused unless true (design.md).
    open_access: bool = False
    # Non-empty: GET /metrics needs "Authorization: Bearer <token>".
    metrics_token: SecretStr = SecretStr("")
    # The longest any upstream header (retry-after, resets) may hold a deployment: a
    # lying or broken upstream cannot take a deployment out for longer.
    max_upstream_hold: Annotated[Duration, Field(gt=0)] = 300.0
    # Above 0: look at the config file this often and reload when it changed (a mounted
    # Kubernetes ConfigMap is swapped in place; config_watch.py). 0: only SIGHUP and POST.
    watch_config: Annotated[Duration, Field(ge=0)] = 0.0


class AdminConfig(_Strict):
    """Bearer keys for ``/admin/*``; none (or only empty ones): the endpoints are off."""

    keys: list[SecretStr] = Field(default_factory=list)

    def secrets(self) -> list[str]:
        """The configured keys, without the empty ones an unset ``${VAR:-}`` leaves."""
        return [k.get_secret_value() for k in self.keys if k.get_secret_value()]


class TelemetryConfig(_Strict):
    """OpenTelemetry (design.md, fourth release): the exporter is configured by the
    standard ``OTEL_*`` variables (proxy/observability/tracing.py); off, nothing of it is
    imported."""

    traces: bool = False  # one trace per request; read at start (a change needs a restart)
    record_content: bool = False  # prompts and completions in spans only when true


class Settings(_Strict):
    redis: RedisConfig = RedisConfig()
    teams: list[Team] = Field(default_factory=list)
    # Validated as a list of ClientKey; parse_settings builds plain entries lazily.
    keys: ConfigKeys[ClientKey] = Field(default_factory=lambda: ConfigKeys.of([]))
    models: list[ModelGroup] = Field(min_length=1)
    routing: RoutingConfig = RoutingConfig()
    server: ServerConfig = ServerConfig()
    admin: AdminConfig = AdminConfig()
    telemetry: TelemetryConfig = TelemetryConfig()

    def group(self, name: str) -> ModelGroup | None:
        return next((m for m in self.models if m.name == name), None)

    def team(self, name: str) -> Team | None:
        return next((t for t in self.teams if t.name == name), None)


def _reference_problems(data: Mapping[str, Any]) -> list[str]:
    """Checks that span sections (unique names and ids, known model references), on the
    raw document: reported in the same pass as the field errors, whatever else is wrong.
    One pass over the keys, looking only at the fields an entry has (100,000 keys)."""
    models = [m for m in _items(data.get("models")) if isinstance(m, dict)]
    names = _names(models)
    teams = [t for t in _items(data.get("teams")) if isinstance(t, dict)]
    team_names = _names(teams)
    known = _Known(set(names), _served_names(models), team_names, set(team_names))
    keys = _key_references(data.get("keys"), known)
    problems = _duplicates("models", names, "name")
    problems += model_names.problems(_items(data.get("models")))
    problems += _duplicates("keys", keys.names, "name")
    problems += _duplicates("models[].deployments", _deployment_ids(models), "id")
    problems += _duplicates("teams", team_names, "name")
    problems += keys.named
    for i, team in enumerate(_items(data.get("teams"))):
        problems += _scoped_model_problems(f"teams[{i}]", team, known)
    problems += keys.scoped
    return problems + _fallback_problems(data.get("routing"), known)


def _names(entries: list[dict[Any, Any]]) -> list[str]:
    """The entries' string names, in order: what duplicates and references are among."""
    return [e["name"] for e in entries if isinstance(e.get("name"), str)]


def _deployment_ids(models: list[dict[Any, Any]]) -> list[str]:
    """Every string ``id`` of the models' deployments: unique across all groups."""
    return [
        d["id"]
        for m in models
        for d in _items(m.get("deployments"))
        if isinstance(d, dict) and isinstance(d.get("id"), str)
    ]


@dataclass(frozen=True)
class _Known:
    """The names a reference may use: the groups' (with what serves other names, for
    the hint) and the teams' (a list for the suggestion, a set for the look-up)."""

    models: set[str]
    served: model_names.ModelNames
    team_names: list[str]
    teams: set[str]

    def unknown_models(self, where: str, values: object) -> list[str]:
        """A problem for each string of ``values`` naming no group, with a hint."""
        return [
            f"{where}: unknown model {m!r}{_hint(m, self.models, self.served)}"
            for m in _items(values)
            if isinstance(m, str) and m not in self.models
        ]

    def unknown_team(self, where: str, team: object) -> list[str]:
        """A problem if ``team`` is a non-empty string naming no team."""
        if not isinstance(team, str) or not team or team in self.teams:
            return []
        return [f"{where}: unknown team {team!r}{_suggest(team, self.team_names)}"]


@dataclass
class _KeyReferences:
    """What one pass over the raw keys finds: their names, their allow-lists' and teams'
    unknown names, their windows' and budgets' unknown models (reported apart)."""

    names: list[str]
    named: list[str]
    scoped: list[str]


def _key_references(keys: object, known: _Known) -> _KeyReferences:
    """One pass over the raw key entries, looking only at the fields an entry has."""
    found = _KeyReferences([], [], [])
    for i, key in enumerate(_items(keys)):
        if not isinstance(key, dict):
            continue
        name = key.get("name")
        if isinstance(name, str):
            found.names.append(name)
        if "models" in key:
            found.named += known.unknown_models(f"keys[{i}].models", key["models"])
        found.named += known.unknown_team(f"keys[{i}].team", key.get("team"))
        if "limits" in key or "budgets" in key:
            found.scoped += _scoped_model_problems(f"keys[{i}]", key, known)
    return found


def _fallback_problems(routing: object, known: _Known) -> list[str]:
    """A fallback's source or target naming no group."""
    fallbacks = routing.get("fallbacks") if isinstance(routing, dict) else None
    if not isinstance(fallbacks, dict):
        return []
    problems: list[str] = []
    for source, targets in fallbacks.items():
        where = f"routing.fallbacks.{source}"
        problems += known.unknown_models(where, [source, *_items(targets)])
    return problems


def _served_names(models: list[dict[Any, Any]]) -> model_names.ModelNames:
    """The names the raw ``models`` entries serve (the well-formed ones' names and
    aliases): what an unknown reference is told of (``_hint``)."""
    groups: list[tuple[str, list[str]]] = []
    for m in models:
        name, aliases = m.get("name"), _items(m.get("aliases"))
        if isinstance(name, str):
            groups.append((name, [a for a in aliases if isinstance(a, str)]))
    return model_names.ModelNames(groups)


def _hint(name: str, known: set[str], served: model_names.ModelNames) -> str:
    """After "unknown model": what serves ``name`` (an alias, a name a pattern matches:
    references name groups), else a close group name."""
    return served.hint(name) or _suggest(name, known)


def _scoped_model_problems(where: str, owner: object, known: _Known) -> list[str]:
    """A window's or a budget's ``models`` naming no configured group is an error: it
    would count nothing, silently (a typo must not leave a limit unenforced)."""
    if not isinstance(owner, dict):
        return []
    problems: list[str] = []
    for field in ("limits", "budgets"):
        for j, spec in enumerate(_items(owner.get(field))):
            scoped = spec.get("models") if isinstance(spec, dict) else None
            problems += known.unknown_models(f"{where}.{field}[{j}].models", scoped)
    return problems


def _items(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _suggest(name: str, choices: set[str] | list[str]) -> str:
    close = difflib.get_close_matches(name, sorted(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _duplicates(where: str, values: list[Any], field: str) -> list[str]:
    seen: set[str] = set()
    dupes = sorted({v for v in values if v in seen or seen.add(v)})  # type: ignore[func-returns-value]
    return [f"{where}: duplicate {field} {v!r}" for v in dupes]


# --- loading --------------------------------------------------------------------------

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _interpolate(node: Any, path: str, env: Mapping[str, str], problems: list[str]) -> Any:
    """Replace ``${VAR}``/``${VAR:-default}`` in every string of the YAML tree."""
    # A value naming an unset variable gets one problem (this one), not a second one
    # from its empty stand-in: parse_settings drops field errors at the same path.
    if isinstance(node, dict):
        return {k: _interpolate(v, _join(path, str(k)), env, problems) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, f"{path}[{i}]", env, problems) for i, v in enumerate(node)]
    if not isinstance(node, str) or "${" not in node:
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


def _mentions_variables(document: dict[Any, Any]) -> bool:
    """Whether any string of ``document`` may hold a ``${VAR}``: orjson's passes over it
    instead of the walk that rebuilds it (0.15 s at 100,000 keys); the key list a
    thousand keys a pass (a reload's thread holds the GIL for each); a part that JSON
    cannot carry (bytes, a set, a huge integer) counts as holding one."""
    keys = document.get("keys")
    parts: list[Any] = [{k: v for k, v in document.items() if k != "keys"}]
    if isinstance(keys, list):
        parts += [keys[start : start + 1000] for start in range(0, len(keys), 1000)]
    else:
        parts.append(keys)
    for part in parts:
        try:
            text = orjson.dumps(part, option=orjson.OPT_NON_STR_KEYS)
        except TypeError:  # orjson.JSONEncodeError
            return True
        if b"${" in text:
            return True
    return False


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _loc_to_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path = f"{path}[{part}]" if isinstance(part, int) else _join(path, part)
    return path or "(top level)"


def parse_settings(
    data: object,
    source: str = "<config>",
    env: Mapping[str, str] | None = None,
    previous: Settings | None = None,
) -> Settings:
    """Validate an already-parsed YAML document: every problem at once, in plain words.
    ``previous``: the config in force (a reload); a key whose entry did not change is
    the key in force."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, ["(top level): expected a mapping of sections"])
    data, unset = _substituted(data, env)
    settings, errors = _validate(data, None if previous is None else previous.keys)
    problems = unset + _field_problems(errors, unset)
    problems += _reference_problems(typing.cast(dict[str, Any], data))
    if problems or settings is None:
        raise ConfigError(source, problems)
    return settings


def _substituted(
    data: dict[Any, Any], env: Mapping[str, str] | None
) -> tuple[dict[Any, Any], list[str]]:
    """The document with its ``${VAR}`` replaced (``env``, else the process's), and a
    problem for each variable that is not set; untouched if it names none."""
    unset: list[str] = []
    if _mentions_variables(data):
        data = _interpolate(data, "", os.environ if env is None else env, unset)
    return data, unset


def _field_problems(errors: list[Any], unset: list[str]) -> list[str]:
    """Pydantic's errors in plain words, but those an unset variable's empty stand-in
    caused: that variable has its problem already (``unset``)."""
    unset_paths = {p.split(": ", 1)[0] for p in unset}
    problems = []
    for err in errors:
        path = _loc_to_path(tuple(err["loc"]))
        if not any(_within(unset_path, path) for unset_path in unset_paths):
            problems.append(f"{path}: {_plain(err)}")
    return problems


def _validate(
    data: Any, known: Sequence[ClientKey] | None = None
) -> tuple[Settings | None, list[Any]]:
    """The settings, or None and pydantic's errors (every one, keys in their place).
    A plain key entry (``config_keys.plain_digest``) is checked by its types and kept
    as read, its model built on first use; any other is validated in full here.
    ``known``: the keys in force (a reload): an unchanged entry keeps its key."""
    keys = data.get("keys")
    if not isinstance(keys, list):  # none, or not a list: pydantic says so
        try:
            return Settings.model_validate(data), []
        except ValidationError as exc:
            return None, list(exc.errors())
    found = KeysBuilder(ClientKey.model_validate, known)
    errors: list[Any] = []
    for i, entry in enumerate(keys):
        digest = plain_digest(entry)
        if digest is not None:
            found.plain(entry, digest)
            continue
        try:
            found.validated(ClientKey.model_validate(entry))
        except ValidationError as exc:
            errors += [{**err, "loc": ("keys", i, *err["loc"])} for err in exc.errors()]
    try:
        settings = Settings.model_validate({**data, "keys": []})
    except ValidationError as exc:
        return None, list(exc.errors()) + errors
    if errors:
        return None, errors
    return settings.model_copy(update={"keys": found.done()}), []


def _within(path: str, scope: str) -> bool:
    """True if ``path`` is ``scope`` or inside it: the empty stand-in of an unset variable
    at ``path`` may fail a check of the whole ``scope`` (``keys[0]`` without its key)."""
    return path == scope or path.startswith((f"{scope}.", f"{scope}["))


def config_warnings(settings: Settings) -> list[str]:
    """What is valid but probably not meant (logged at start-up, shown by check-config)."""
    warnings = budget_warnings(settings)
    for i, group in enumerate(settings.models):
        for j, d in enumerate(group.deployments):
            warnings += _deployment_warnings(f"models[{i}].deployments[{j}]", d)
    return warnings


def _deployment_warnings(where: str, d: Deployment) -> list[str]:
    """A deployment's settings that work but are probably not meant: no certificate
    check, a key in the clear, a base URL its requests would go wrong under."""
    warnings = []
    if not d.tls.verify:
        warnings.append(
            f"{where}.tls.verify: false: the upstream's certificate is not checked"
            " (a lab upstream only)"
        )
    unredacted = redaction_warning(d.api_key.get_secret_value())
    if unredacted is not None:
        warnings.append(f"{where}.api_key: {unredacted}")
    mistake = _base_url_mistake(d)
    if mistake is not None:
        warnings.append(f"{where}.base_url: {mistake}")
    return warnings


def _base_url_mistake(d: Deployment) -> str | None:
    """The provider's path part given (or left out) in ``base_url``: where its requests
    would go instead; None if the URL looks right."""
    url = d.base_url.lower()
    if d.provider == "azure" and url.endswith("/openai"):
        return (
            "give the resource's URL without /openai;"
            f" requests would go to {d.base_url}/openai/deployments/..."
        )
    if d.provider == "openai" and "api.openai.com" in url and not url.endswith("/v1"):
        return (
            "OpenAI's API is under /v1"
            f" ({d.base_url}/v1); requests would go to {d.base_url}/chat/completions"
        )
    if d.provider == "anthropic" and url.endswith("/v1"):
        return f"give Anthropic's URL without /v1; requests would go to {d.base_url}/v1/messages"
    return None


def budget_warnings(settings: Settings) -> list[str]:
    """Budgets that cannot hold what they promise: forgotten on restart without Redis, or
    a dollar budget over traffic that has no price (it costs 0)."""
    budgeted = _budgeted(settings)
    if not budgeted:
        return []
    warnings = []
    if not settings.redis.url and settings.redis.sentinel is None:
        warnings.append(
            "budgets: without redis.url budgets are counted in this process only"
            " (each worker its share) and forgotten on restart"
        )
    unpriced = _unpriced_groups(settings)
    every_group = [g.name for g in settings.models]
    for where, owner in budgeted:
        warnings += _free_traffic_warnings(where, owner, unpriced, every_group)
    return warnings


def _unpriced_groups(settings: Settings) -> set[str]:
    """The groups with no price of their own and a deployment without one: some of
    their requests cost 0."""
    return {
        g.name
        for g in settings.models
        if g.price is None and any(d.price is None for d in g.deployments)
    }


def _budgeted(settings: Settings) -> list[tuple[str, ClientKey | Team]]:
    """The keys and teams with budgets, each with its place in the file."""
    # A key with budgets is among those validated in full (config_keys.py).
    budgeted: list[tuple[str, ClientKey | Team]] = [
        (f"keys[{settings.keys.position(k.name)}]", k) for k in settings.keys.full() if k.budgets
    ]
    return budgeted + [(f"teams[{i}]", t) for i, t in enumerate(settings.teams) if t.budgets]


def _free_traffic_warnings(
    where: str, owner: ClientKey | Team, unpriced: set[str], every_group: list[str]
) -> list[str]:
    """The owner's dollar budgets that reach an unpriced group: its requests cost 0."""
    allowed = owner.models if isinstance(owner, ClientKey) else None
    warnings = []
    for j, budget in enumerate(owner.budgets):
        if budget.kind != "usd":
            continue
        free = sorted(set(budget.models or allowed or every_group) & unpriced)
        if free:
            warnings.append(
                f"{where}.budgets[{j}]: a budget in usd, but {', '.join(free)} has a"
                " deployment without a price: its requests cost 0"
            )
    return warnings


# Pydantic's phrases, in the words of this file's reader.
_PLAIN = {
    "missing": "is required",
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "string_too_short": "must not be empty",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping of settings",
}


def _plain(err: Any) -> str:
    """A pydantic error in plain words: a fixed phrase, one that reads the error, else
    pydantic's own message."""
    kind = err["type"]
    if kind in _PLAIN:
        return _PLAIN[kind]
    phrase = _PHRASED.get(kind)
    plain = phrase(err, err.get("ctx") or {}) if phrase is not None else None
    if plain is not None:
        return plain
    message = str(err["msg"]).removeprefix("Value error, ")
    return message.replace("Input should be", "must be")


def _unknown_key(err: Any, ctx: Mapping[str, Any]) -> str:
    """An unknown key, with the closest key the model there accepts."""
    return f"unknown key{_suggest(str(err['loc'][-1]), _fields_at(err['loc'][:-1]))}"


def _too_short(err: Any, ctx: Mapping[str, Any]) -> str:
    """An empty list needs an item; an empty string or mapping must not be empty."""
    return "needs at least one item" if isinstance(err["input"], list) else "must not be empty"


def _pattern_mismatch(err: Any, ctx: Mapping[str, Any]) -> str | None:
    """The two patterns the schema has, said plainly; None: pydantic's message."""
    field = err["loc"][-1]
    if field == "base_url":
        return f"must be a URL starting with http:// or https:// (got {err['input']!r})"
    if field == "id":
        return "may contain only letters, digits and _ . : -"
    return None


# Pydantic's phrases that read the error (its input, its place, its ``ctx``).
_PHRASED: dict[str, Callable[[Any, Mapping[str, Any]], str | None]] = {
    "extra_forbidden": _unknown_key,
    "too_short": _too_short,
    "greater_than": lambda err, ctx: f"must be greater than {ctx.get('gt')}",
    "greater_than_equal": lambda err, ctx: f"must be at least {ctx.get('ge')}",
    "literal_error": lambda err, ctx: (
        f"must be one of {ctx.get('expected')} (got {err['input']!r})"
    ),
    "string_pattern_mismatch": _pattern_mismatch,
}


def _fields_at(loc: tuple[int | str, ...]) -> list[str]:
    """The keys the model at ``loc`` (a pydantic error location) accepts."""
    model: Any = Settings
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if hasattr(model, "model_fields") else None
        if field is None:
            return []
        model = _model_in(field.annotation)
    return list(model.model_fields) if hasattr(model, "model_fields") else []


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside ``list[X]``, ``X | None``, ``dict[str, X]``..."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def load_settings(path: str | Path, env: Mapping[str, str] | None = None) -> Settings:
    """Read and validate a YAML config file. The collector is held off meanwhile: the
    passes it made over the million objects of 100,000 keys' document doubled the time
    (7.2 s to 3.7 s); start-up collects once and freezes what it built afterwards
    (``app.tune_garbage_collector``)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return parse_settings(read_document(path), str(path), env)
    finally:
        if enabled:
            gc.enable()


def read_document(path: str | Path) -> Any:
    """The YAML document of a config file, not yet validated (``ConfigError`` if it
    cannot be read or is not YAML)."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(source, [f"cannot read file: {exc.strerror}"]) from None
    try:
        data = yaml_load.load(text)
    except yaml.YAMLError:
        # Again with the pure-Python parser, whose messages _yaml_problem knows.
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(source, [_yaml_problem(exc)]) from None
    return data


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """Line and column of a YAML syntax error (not PyYAML's ``in "<unicode string>"``)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is None:
        return f"invalid YAML: {problem}"
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    hint = next((h for start, h in _YAML_HINTS if problem.startswith(start)), None)
    if hint is not None:
        return f"invalid YAML at {where}: {hint} (YAML says: {problem})"
    context = getattr(exc, "context", None)
    return f"invalid YAML at {where}: {problem}" + (f" ({context})" if context else "")


# PyYAML's commonest complaints, in words that point at the usual cause.
_YAML_HINTS = (
    ("found character '\\t'", "a tab; YAML indents with spaces"),
    ("expected <block end>", "the indentation does not line up with the lines above"),
    (
        "mapping values are not allowed here",
        "an unexpected ':' (check the indentation, or quote a value containing ': ')",
    ),
    ("could not find expected ':'", "a line that is not 'key: value' (a missing ':'?)"),
)
