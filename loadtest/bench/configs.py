"""The proxy's configurations the bench runs, and each stated rule by rule beside the
peer's (the report's "Configurations" section is generated from these, so it says what
ran). *pure*

* ``default``: what users run. A key with ``rpm`` and ``tpm``, a deployment with ``rpm``
  and no ``burst`` (the default, 1: turns exactly 60/rpm apart, each asked of Redis).
* ``large-burst``: the bench's own, a deployment far from its limits with ``burst:
  100000``, so that leases answer almost every request without a Redis round trip.
"""

from __future__ import annotations

from loadtest.bench import peer
from loadtest.bench.model import DEFAULT_CONFIG, LARGE_BURST, MODEL
from loadtest.bench.wrk import API_KEY

KEY_RPM = 100_000_000
KEY_TPM = 10_000_000_000
LARGE_BURST_RPM = 100_000_000
BURST = 100_000
# The default config's deployment: 6,000,000 a minute is 100,000 req/s (turns 10 us
# apart), over 10x the most the 2-core machine served at 64 connections (8,405 req/s,
# docs/benchmarks.md at 69f3652): the load never reaches the pacing, so no request waits
# more than a few microseconds for its turn, and none is refused.
DEFAULT_RPM = 6_000_000
UPSTREAM_KEY = peer.UPSTREAM_KEY


def proxy_config(
    upstream_url: str,
    redis_url: str | None,
    limits: bool = True,
    config: str = LARGE_BURST,
) -> dict[str, object]:
    """Auth on, limits that never bind: what is measured is the proxy's own cost. Without
    ``limits``, no key or deployment limit at all: the proxy's cost without its limiter.
    ``config``: LARGE_BURST (the bench's deployment) or DEFAULT_CONFIG (no ``burst``)."""
    deployment: dict[str, object] = {
        "id": "fake",
        "base_url": f"{upstream_url}/v1",
        "api_key": UPSTREAM_KEY,
        "timeout": "30s",
    }
    key: dict[str, object] = {"name": "bench", "key": API_KEY}
    if limits:
        key |= {"rpm": KEY_RPM, "tpm": KEY_TPM}
        if config == DEFAULT_CONFIG:
            deployment["rpm"] = DEFAULT_RPM
        elif config == LARGE_BURST:
            deployment |= {"rpm": LARGE_BURST_RPM, "burst": BURST}
        else:
            raise ValueError(f"unknown bench config {config!r}")
    return {
        "redis": {"url": redis_url or ""},
        "keys": [key],
        "models": [{"name": MODEL, "deployments": [deployment]}],
        "server": {"log_level": "warning"},
    }


def _limits(entry: dict[str, object], names: tuple[str, ...]) -> str:
    found = [f"`{name}: {entry[name]}`" for name in names if name in entry]
    return ", ".join(found) or "none"


def _ours(config: str) -> dict[str, str]:
    """One proxy config's rules, read from the dict the bench writes."""
    settings = proxy_config("http://upstream", "redis://redis/0", config=config)
    key = settings["keys"][0]  # type: ignore[index]
    deployment = settings["models"][0]["deployments"][0]  # type: ignore[index]
    pacing = _limits(deployment, ("rpm", "burst"))
    if "burst" not in deployment:
        turn_us = 60e6 / deployment["rpm"]
        pacing += f", `burst` unset (the default, 1: turns {turn_us:g} us apart)"
    return {
        "client auth": f"a client key (`{key['name']}`), sha256-checked on every request",
        "client key's limits": _limits(key, ("rpm", "tpm")),
        "deployment's limits": pacing,
        "limiter": "Redis (the bench's redis-server, database 0), 2 workers",
        "metrics": "on (Prometheus, the default)",
    }


def _theirs(rule: str) -> dict[str, str]:
    limits = ", ".join(f"`{name} = {value}`" for name, value in peer.RULES[rule].items())
    return {
        "client auth": "none (its gateway has no client keys in this setup)",
        "client key's limits": f"one rule, `always = true` (every request): {limits}",
        "deployment's limits": "none (no pacing of a provider)",
        "limiter": f"Redis (the same redis-server, database {peer.REDIS_DB}), one process",
        "metrics": "observability off (no ClickHouse)",
    }


RULE_NAMES = ("client auth", "client key's limits", "deployment's limits", "limiter", "metrics")


def configuration_table(peer_rule: str) -> list[str]:
    """Markdown rows: each rule, in our default config, the bench's, and the peer's."""
    columns = (_ours(DEFAULT_CONFIG), _ours(LARGE_BURST), _theirs(peer_rule))
    md = [
        "| rule | ours: one key, one deployment at 6,000,000 rpm"
        f" | ours: large-burst config (the bench's) | TensorZero, rule `{peer_rule}` |",
        "|---|---|---|---|",
    ]
    for rule in RULE_NAMES:
        md.append(f"| {rule} | " + " | ".join(column[rule] for column in columns) + " |")
    return md
