"""The peer gateway the bench measures beside the proxy: TensorZero's Rust gateway, as its
PyPI wheel embeds it (``tensorzero._start_http_gateway``, run by ``peer_gateway``).

What it is given, so that it does the same job as the proxy and talks to nothing but
127.0.0.1: its OpenAI-compatible provider (``type = "openai"``) pointed at the bench's fake
upstream with an API key read from an environment variable; one rate-limit rule that
applies to every request (``always``) and never trips, which puts its Redis (Valkey)
limiter on the request's path, in the bench's private redis-server; no ClickHouse, no
Postgres (observability off); its pseudonymous usage analytics off, both in the config and
by environment, and every variable that could send it elsewhere (proxies, OpenTelemetry,
its own service URLs and keys) removed from its environment.
"""

from __future__ import annotations

from collections.abc import Mapping

from loadtest.bench.model import MODEL

UPSTREAM_KEY_VARIABLE = "BENCH_UPSTREAM_API_KEY"
UPSTREAM_KEY = "sk-bench-upstream"  # the proxy's deployment sends the same
REDIS_DB = 2  # the proxies use 0 (and 1, a baseline's): the peer's keys stay apart
# Both limits far above anything a 2-core machine can do: checked, never binding.
NEVER_TRIPS = 1_000_000_000
# The peer's one rule, by name (`--peer-rule`): what it limits. Ours, in the default config,
# limits a key's requests and tokens; "requests" is the cheaper rule, for comparison.
RULES: dict[str, dict[str, int]] = {
    "requests+tokens": {
        "model_inferences_per_minute": NEVER_TRIPS,
        "tokens_per_minute": NEVER_TRIPS,
    },
    "requests": {"model_inferences_per_minute": NEVER_TRIPS},
}
DEFAULT_RULE = "requests+tokens"

# Dropped from the gateway's environment: anything that could point it elsewhere.
_DROPPED_PREFIXES = ("TENSORZERO_", "OTEL_", "OPENAI_", "RUST_LOG")
_DROPPED = {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"}


def tensorzero_config(upstream_url: str, rule: str = DEFAULT_RULE) -> str:
    """The gateway's TOML: one model routed to the fake upstream, one rate-limit rule
    (``rule``, a name in RULES)."""
    limits = "".join(f"{name} = {value}\n" for name, value in RULES[rule].items())
    return f"""\
# Written by loadtest/bench/peer.py for one bench run.
[gateway]
disable_pseudonymous_usage_analytics = true
observability.enabled = false  # no ClickHouse

[models."{MODEL}"]
routing = ["fake"]

[models."{MODEL}".providers.fake]
type = "openai"
api_base = "{upstream_url}/v1/"
model_name = "{MODEL}"
api_key_location = "env::{UPSTREAM_KEY_VARIABLE}"

# Applies to every request, never trips: the Redis limiter is on the path, as ours is.
[rate_limiting]
enabled = true

[[rate_limiting.rules]]
always = true
{limits}"""


def valkey_url(redis_url: str) -> str:
    """The bench's redis-server, in the peer's own database."""
    return f"{redis_url.rsplit('/', 1)[0]}/{REDIS_DB}"


def gateway_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` without what could send the gateway elsewhere, plus its upstream key and
    the analytics switch (also off in its config: either suffices)."""
    env = {
        name: value
        for name, value in base.items()
        if name.upper() not in _DROPPED and not name.upper().startswith(_DROPPED_PREFIXES)
    }
    env["TENSORZERO_DISABLE_PSEUDONYMOUS_USAGE_ANALYTICS"] = "1"
    env["NO_COLOR"] = "1"  # plain log lines (its errors are quoted in the bench's)
    env[UPSTREAM_KEY_VARIABLE] = UPSTREAM_KEY
    return env
