"""The embedded demo (``llm-proxy serve`` without ``--config``): what it serves, and what
it tells a new user to try.

A demo that answers like OpenAI shows an echo, not a rate limiter; so its fake upstream
enforces a strict limit (2 requests a second, 429 beyond it), its one client key has a
small limit of its own, and an admin key opens ``/admin``. Two groups share the upstream,
each paced to half of it: ``gpt-4o-mini`` (OpenAI's API) and ``claude-*``, a pattern that
serves every name Claude Code sends (Anthropic's Messages API, on the same fake), so that
Claude Code needs only ``ANTHROPIC_BASE_URL`` and the key. config/demo.yaml is the same
configuration as a file (a test keeps them equal). *pure*
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.config.settings import Settings, parse_settings

__all__ = [
    "DEMO_ADMIN_KEY",
    "DEMO_CLAUDE",
    "DEMO_KEY",
    "DEMO_KEY_RPM",
    "DEMO_MODEL",
    "EXAMPLE_REQUESTS",
    "LEFT_FOR_THE_LIMIT",
    "UPSTREAM_RPS",
    "Try",
    "demo_settings",
    "instructions",
    "tries",
    "upstream_options",
]

DEMO_MODEL = "gpt-4o-mini"
DEMO_CLAUDE = "claude-*"  # every name Claude Code sends: claude-opus-4-8, claude-haiku-4-5...
DEMO_KEY = "demo-key"
DEMO_KEY_RPM = 10
DEMO_ADMIN_KEY = "demo-admin"
UPSTREAM_RPS = 2
GROUPS = 2  # the groups on the one upstream (its one account): each paced to its share
GROUP_RPM = UPSTREAM_RPS * 60 // GROUPS
BURST = 6  # a burst the key's limit admits whole: paced, none refused
OVER_THE_KEY = DEMO_KEY_RPM + 2  # at least two over a full bucket: 429 at once
EXAMPLE_REQUESTS = 2  # example.py's: a completion, then a stream
# What the steps before the key's limit leave of it (it refills one every 6 s).
LEFT_FOR_THE_LIMIT = DEMO_KEY_RPM - EXAMPLE_REQUESTS - BURST


def upstream_options() -> dict[str, Any]:
    """The demo upstream's ``FakeUpstreamConfig`` options (but its port): strict, as a
    provider is, and slow enough to see requests overlap."""
    return {"rpm": UPSTREAM_RPS, "window": 1.0, "latency": (0.2, 0.6)}


def demo_settings(upstream_url: str) -> Settings:
    """The demo's proxy: two groups on the fake upstream at ``upstream_url``, each paced
    to half its limit (OpenAI's API for ``gpt-4o-mini``, Anthropic's for any ``claude-*``
    name, sent upstream as asked); one client key with its own limit; one admin key."""
    openai = {"id": "fake-openai", "base_url": f"{upstream_url}/v1"}
    anthropic = {"id": "fake-anthropic", "provider": "anthropic", "base_url": upstream_url}
    return parse_settings(
        {
            "keys": [{"name": "demo", "key": DEMO_KEY, "rpm": DEMO_KEY_RPM}],
            "models": [
                {
                    "name": name,
                    "deployments": [
                        {**deployment, "api_key": "fake-upstream-key", "rpm": GROUP_RPM}
                    ],
                }
                for name, deployment in ((DEMO_MODEL, openai), (DEMO_CLAUDE, anthropic))
            ],
            "routing": {"max_wait": "10s"},
            "admin": {"keys": [DEMO_ADMIN_KEY]},
        },
        source="<embedded demo>",
        env={},
    )


@dataclass(frozen=True, slots=True)
class Try:
    """One thing to try: what it shows, and the shell command that shows it."""

    what: str
    command: str


def tries(proxy_url: str) -> list[Try]:
    """What to try against the demo at ``proxy_url`` (curl and a POSIX shell)."""
    chat = f"{proxy_url}/v1/chat/completions"
    body = {"model": DEMO_MODEL, "messages": [{"role": "user", "content": "Hello"}]}
    post = (
        f"curl -s -o /dev/null -D - {chat} \\\n"
        f"    -H 'Authorization: Bearer {DEMO_KEY}' -H 'Content-Type: application/json' \\\n"
        f"    -d {shlex.quote(orjson.dumps(body).decode())} \\\n"
    )

    def concurrently(count: int, headers: list[str]) -> str:
        patterns = " ".join(f"-e '^{h}'" for h in ["HTTP/", *headers])
        return f"for i in $(seq {count}); do\n  {post}    | grep -i {patterns} &\ndone; wait"

    sdk = ".venv/bin/python example.py"
    if proxy_url != "http://127.0.0.1:8000":
        sdk = f"OPENAI_BASE_URL={proxy_url}/v1 {sdk}"
    return [
        Try("The OpenAI SDK (the README's example.py, with the demo key):", sdk),
        Try(
            f"A burst of {BURST} at once: {DEMO_MODEL} has {GROUP_RPM // 60} of the"
            f" upstream's {UPSTREAM_RPS} requests a second, so the proxy paces them\n"
            "   instead of failing them (every answer 200; x-llm-proxy-queue-ms: how long"
            " each waited for its turn):",
            concurrently(BURST, ["x-llm-proxy-queue-ms"]),
        ),
        Try(
            f"Past the key's own limit, {OVER_THE_KEY} at once: its {DEMO_KEY_RPM} a minute"
            f" (one more every {60 // DEMO_KEY_RPM} s) are shared with the steps above"
            f" ({EXAMPLE_REQUESTS + BURST} requests),\n   so about {LEFT_FOR_THE_LIMIT} get 200"
            " (more if you waited) and the rest 429 at once, with retry-after and"
            " x-ratelimit-*:",
            concurrently(OVER_THE_KEY, ["retry-after:", "x-ratelimit-remaining-requests"]),
        ),
        Try(
            f"The admin page, in a browser (user: anything, password: {DEMO_ADMIN_KEY}),"
            " or its JSON:",
            f"{proxy_url}/admin\n"
            f"curl -s {proxy_url}/admin/state -H 'Authorization: Bearer {DEMO_ADMIN_KEY}'",
        ),
        Try(
            f"Claude Code (npm install -g @anthropic-ai/claude-code), its own model names"
            f" served by the pattern {DEMO_CLAUDE}\n   (its requests count against the"
            " key's 10 a minute too: after the steps above, it may retry a while):",
            f"ANTHROPIC_BASE_URL={proxy_url} ANTHROPIC_API_KEY={DEMO_KEY} claude -p 'say hi'",
        ),
    ]


def instructions(proxy_url: str, upstream_url: str) -> str:
    """What start-up prints: what the demo is, its keys, and what to try."""
    lines = [
        "",
        f"The demo: the proxy on {proxy_url}, in front of a fake OpenAI and Anthropic"
        f" upstream ({upstream_url}) that takes {UPSTREAM_RPS} requests a second and"
        f" answers 429 beyond that;\n{DEMO_MODEL} and any {DEMO_CLAUDE} model each have"
        " half of it.",
        f"  client key: {DEMO_KEY}  (its own limit: {DEMO_KEY_RPM} requests a minute)",
        f"  admin key:  {DEMO_ADMIN_KEY}",
        "",
        "Try, in another terminal:",
    ]
    for number, attempt in enumerate(tries(proxy_url), 1):
        lines += ["", f"{number}. {attempt.what}"]
        lines += [f"   {line}" for line in attempt.command.splitlines()]
    return "\n".join([*lines, ""])
