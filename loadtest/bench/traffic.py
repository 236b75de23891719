"""The real-traffic benchmark's shapes: client keys, model groups, the proxy's config and
what wrk's script (``loadtest/bench_traffic.lua``) is told to send. *pure*

A shape is what a team runs: many client keys (``sk-bench-000123``, listed in the config
by ``key_sha256`` as a deployment keeps them), each with ``rpm`` and ``tpm`` limits of
its tier, some low enough that the traffic reaches them; several model groups of several
deployments at provider-tier limits, on three API shapes (OpenAI chat, Anthropic Messages
through ``provider: anthropic`` deployments, OpenAI Responses), a share of requests
streamed. wrk draws each request's key uniformly, its group by the groups' shares and
whether it streams, from a seeded PRNG (the same sequence every run).

``SATURATED`` is the other shape: few keys of equal weight, one group of strict
upstreams (a fake upstream process each), demand about twice the group's limit.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

KEY_FORMAT = "sk-bench-{:06d}"  # the lua script formats the same: "sk-bench-%06d"
UPSTREAM_KEY = "sk-bench-upstream"
ANTHROPIC_VERSION = "2023-06-01"


@dataclass(frozen=True)
class Tier:
    """A tier of client keys: every ``every``-th key from ``offset`` (``every`` 0: the
    keys no other tier takes)."""

    name: str
    rpm: int
    tpm: int
    every: int = 0
    offset: int = 0


# 1 key in 10 may send 30 a minute (a trial tier), 1 in 20 has 1,500 tokens a minute
# (about 55 requests of the bench's): at 1,000 keys and 1,500 req/s or more, each key
# sends 90 a minute or more, so these two tiers reach their limits (429 key_rpm,
# key_tpm) and the others (3,000 a minute) do not.
TIERS = (
    Tier("rpm-bound", rpm=30, tpm=40_000, every=10, offset=0),
    Tier("tpm-bound", rpm=3_000, tpm=1_500, every=20, offset=5),
    Tier("standard", rpm=3_000, tpm=1_000_000),
)


def tier_of(index: int, tiers: tuple[Tier, ...] = TIERS) -> Tier:
    for tier in tiers:
        if tier.every and index % tier.every == tier.offset:
            return tier
    return next(t for t in tiers if not t.every)


@dataclass(frozen=True)
class Group:
    """A model group: ``deployments`` deployments of one provider at one tier's limits,
    asked on one client route (``api``: chat, messages or responses)."""

    model: str
    provider: str  # openai | anthropic
    api: str  # chat | messages | responses
    deployments: int
    rpm: int
    tpm: int | None = None
    input_tpm: int | None = None  # Anthropic's ITPM / OTPM, as `limits:` windows
    output_tpm: int | None = None
    share: int = 1  # relative share of the requests


PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}

# OpenAI's tier-5 limits for gpt-4o-mini and gpt-4o; an Anthropic group at a custom tier
# (20,000 rpm, 2M input and 400k output tokens a minute). Shares by capacity: at 7,000
# req/s the groups run at 77%, 63% and 63% of their pace (at most 5.7% below their
# limits: routing.pacing_margin), so the 0 ms rows measure the proxy, not waits for turns.
GROUPS = (
    Group("gpt-4o-mini", "openai", "chat", 10, rpm=30_000, tpm=150_000_000, share=55),
    Group(
        "claude-sonnet",
        "anthropic",
        "messages",
        10,
        rpm=20_000,
        input_tpm=2_000_000,
        output_tpm=400_000,
        share=30,
    ),
    Group("gpt-4o", "openai", "responses", 10, rpm=10_000, tpm=30_000_000, share=15),
)


@dataclass(frozen=True)
class Shape:
    """One benchmark configuration: its keys, its groups, its streamed share."""

    name: str
    keys: int
    groups: tuple[Group, ...] = GROUPS
    stream_percent: int = 20
    tiers: tuple[Tier, ...] = TIERS
    weight: int | None = None  # every key's weight (fair share), if set
    key_max_wait: str | None = None  # every key's own max_wait, if set

    def describe(self) -> str:
        """The shape in a sentence a user recognises."""
        deployments = sum(g.deployments for g in self.groups)
        rpms = sorted({g.rpm for g in self.groups})
        span = f"{rpms[0]:,}" if len(rpms) == 1 else f"{rpms[0]:,}-{rpms[-1]:,}"
        apis = ", ".join(f"{g.model} ({g.api}, {g.share}%)" for g in self.groups)
        return (
            f"{self.keys:,} keys, {deployments} deployments at {span} rpm in"
            f" {len(self.groups)} groups ({apis}), {self.stream_percent}% streamed"
        )


REAL = Shape("real", keys=1_000)
MANY_KEYS = Shape("100k-keys", keys=100_000)


def key_secret(index: int) -> str:
    return KEY_FORMAT.format(index)


def key_entry(index: int, shape: Shape) -> dict[str, object]:
    """A client key as the config lists it: its sha256, not the secret."""
    tier = tier_of(index, shape.tiers)
    entry: dict[str, object] = {
        "name": f"key-{index:06d}",
        "key_sha256": hashlib.sha256(key_secret(index).encode()).hexdigest(),
        "rpm": tier.rpm,
        "tpm": tier.tpm,
    }
    if shape.weight is not None:
        entry["weight"] = shape.weight
    if shape.key_max_wait is not None:
        entry["max_wait"] = shape.key_max_wait
    return entry


def deployment_entries(group: Group, base_urls: list[str]) -> list[dict[str, object]]:
    """The group's deployments, the ``i``-th at ``base_urls[i % len(base_urls)]`` (the
    scheme and host of a fake upstream)."""
    entries: list[dict[str, object]] = []
    for i in range(group.deployments):
        url = base_urls[i % len(base_urls)]
        entry: dict[str, object] = {
            "id": f"{group.model}-{i:02d}",
            "base_url": url if group.provider == "anthropic" else f"{url}/v1",
            "api_key": UPSTREAM_KEY,
            "rpm": group.rpm,
            "timeout": "30s",
        }
        if group.provider != "openai":
            entry["provider"] = group.provider
        if group.tpm is not None:
            entry["tpm"] = group.tpm
        limits = [
            {kind: amount, "per": "1m"}
            for kind, amount in (
                ("input_tokens", group.input_tpm),
                ("output_tokens", group.output_tpm),
            )
            if amount is not None
        ]
        if limits:
            entry["limits"] = limits
        entries.append(entry)
    return entries


def proxy_config(
    shape: Shape, upstreams: dict[str, list[str]], redis_url: str
) -> dict[str, object]:
    """The proxy's config for ``shape``; ``upstreams``: each group's fake upstream base
    URLs (one shared by all, or one per deployment for strict ones)."""
    return {
        "redis": {"url": redis_url},
        "keys": [key_entry(i, shape) for i in range(shape.keys)],
        "models": [
            {"name": g.model, "deployments": deployment_entries(g, upstreams[g.model])}
            for g in shape.groups
        ],
        "server": {"log_level": "warning"},
    }


def wrk_env(shape: Shape, ports: list[int] | None = None, seed: int = 1) -> dict[str, str]:
    """What bench_traffic.lua reads: the keys, the groups (``api:model:share``), the
    streamed share, the seed and the replicas' ports (thread i to port i mod n)."""
    return {
        "BENCH_KEYS": str(shape.keys),
        "BENCH_GROUPS": ",".join(f"{g.api}:{g.model}:{g.share}" for g in shape.groups),
        "BENCH_STREAM_PERCENT": str(shape.stream_percent),
        "BENCH_SEED": str(seed),
        "BENCH_PORTS": ",".join(str(p) for p in ports or []),
        "BENCH_ANTHROPIC_VERSION": ANTHROPIC_VERSION,
    }
