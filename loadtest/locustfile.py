"""Locust load for the proxy: OpenAI chat completions, plain and streamed.

    locust -f loadtest/locustfile.py -H http://127.0.0.1:8080            # web UI on :8089
    locust -f loadtest/locustfile.py -H http://127.0.0.1:8080 --headless -u 50 -r 50 -t 60s

It imports only Locust and the standard library, so the official Locust image can run it
as a mounted file (docker-compose.yml does). Everything is tuned by environment variables:

| variable | default | meaning |
|---|---|---|
| `LOCUST_API_KEYS` | the stack's | client keys, comma-separated, round-robin (keyless: any) |
| `LOCUST_MODEL` | `gpt-4o-mini` | the `model` every request asks for |
| `LOCUST_STREAM_SHARE` | `0.2` | share of requests sent with `"stream": true` (0..1) |
| `LOCUST_MAX_TOKENS` | `16` | `max_tokens` of every request |
| `LOCUST_PROMPT_WORDS` | `12` | random words per prompt (plus a nonce: no cache can answer) |
| `LOCUST_WAIT` | `0` | pause between a user's requests: seconds (`0.5`) or a range (`0.5-2`) |
| `LOCUST_USER_RATE` | (none) | req/s per user (`constant_throughput`); wins over `LOCUST_WAIT` |
| `LOCUST_TIMEOUT` | `60` | seconds before a request counts as failed |

Locust entries: `chat` (plain) and `chat stream` (the whole stream, first byte to
`[DONE]`). The time to the first content token of streams is not a Locust entry (it would
count as extra requests in `Aggregated`): it is collected from every worker and printed
when the run ends (`TTFT ms: n=.. p50=.. p90=.. p99=..`), and with `--csv PREFIX` written
to `PREFIX_ttft.csv`. A 429 counts as a failure with its `error.code`
(`model_capacity`, `queue_full`, `key_rpm`, ...), so the failures table shows whose
limit refused it.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from locust import FastHttpUser, between, constant, constant_throughput, events, task

CHAT_PATH = "/v1/chat/completions"

# A small vocabulary is enough: random order plus a nonce makes every prompt unique.
WORDS = (
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
    "river",
    "mountain",
    "cloud",
    "stone",
    "paper",
    "signal",
    "vector",
    "budget",
    "window",
    "token",
    "limit",
    "replica",
    "queue",
)


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    return float(raw) if raw else default


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default


# config/stack/proxy.yaml's client keys: the README's Locust command works against
# `make stack` as pasted, and a proxy with no keys configured accepts any.
STACK_KEYS = "sk-stack-team-a,sk-stack-team-b,sk-stack-team-c,sk-stack-team-d"


def _keys() -> list[str]:
    raw = os.environ.get("LOCUST_API_KEYS") or STACK_KEYS
    return [k.strip() for k in raw.split(",") if k.strip()]


def wait_time_from_env() -> Callable[..., float]:
    """`LOCUST_USER_RATE` (per-user req/s) wins; else `LOCUST_WAIT` as `x` or `lo-hi`."""
    rate = _env_float("LOCUST_USER_RATE", 0.0)
    if rate > 0:
        return constant_throughput(rate)
    spec = os.environ.get("LOCUST_WAIT", "0").strip() or "0"
    if "-" in spec.lstrip("-"):
        low, high = (float(part) for part in spec.split("-", 1))
        return between(low, high)
    return constant(float(spec))


def random_prompt(words: int, rng: random.Random) -> str:
    """Random words and a nonce: defeats any response or prompt cache on the way."""
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"[{uuid.uuid4().hex}] {text}"


def chat_body(stream: bool, rng: random.Random) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": os.environ.get("LOCUST_MODEL", "gpt-4o-mini"),
        "messages": [{"role": "user", "content": random_prompt(PROMPT_WORDS, rng)}],
        "max_tokens": MAX_TOKENS,
    }
    if stream:
        body["stream"] = True
    return body


def error_code(text: str | None) -> str:
    """The OpenAI-shaped error's `code` (or `type`), for the failures table."""
    try:
        error = json.loads(text or "")["error"]
        return str(error.get("code") or error.get("type"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return "unparseable error body"


def first_token_seen(line: bytes) -> bool:
    """True for an SSE `data:` line whose delta carries content (not the role chunk)."""
    if not line.startswith(b"data:"):
        return False
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return False
    try:
        choices = json.loads(payload).get("choices") or []
    except ValueError:
        return False
    return any((c.get("delta") or {}).get("content") for c in choices)


def sse_lines(response: Any) -> Iterator[bytes]:
    """The body's lines as they arrive.

    geventhttpclient's public ``read(n)`` waits for n bytes and ``readline()`` for
    ``\\r\\n``, so a short SSE body would arrive whole and the first-token time would be
    the stream's end. Its parser's ``readline(sep)`` returns each ``\\n``-terminated line
    as soon as it is in.
    """
    raw = getattr(response, "_response", None)
    if raw is not None and hasattr(raw, "readline"):
        while line := raw.readline(b"\n"):
            yield line
        return
    buffer = b""  # fallback: chunked reads (first-token times then err late, never early)
    for chunk in response.iter_content(chunk_size=1024, decode_content=False):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        yield from (line + b"\n" for line in lines)
    if buffer:
        yield buffer


STREAM_SHARE = min(max(_env_float("LOCUST_STREAM_SHARE", 0.2), 0.0), 1.0)
MAX_TOKENS = _env_int("LOCUST_MAX_TOKENS", 16)
PROMPT_WORDS = _env_int("LOCUST_PROMPT_WORDS", 12)
TIMEOUT = _env_float("LOCUST_TIMEOUT", 60.0)
_key_cycle = itertools.cycle(_keys() or [""])


# Times to the first token of this process's streams; workers send theirs to the master
# with each report, so the master (or a local run) holds them all at the end.
TTFT_MS: list[float] = []


def ttft_summary(samples: list[float]) -> dict[str, float]:
    """Count and nearest-rank percentiles (ms) of the times to first token."""
    if not samples:
        return {"count": 0}
    ordered = sorted(samples)

    def rank(p: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(p * len(ordered)) - 1))]

    return {"count": len(ordered), "p50": rank(0.5), "p90": rank(0.9), "p99": rank(0.99)}


@events.report_to_master.add_listener
def _send_ttft(client_id: str, data: dict[str, Any], **kwargs: Any) -> None:
    data["ttft_ms"] = TTFT_MS[:]
    TTFT_MS.clear()


@events.worker_report.add_listener
def _receive_ttft(client_id: str, data: dict[str, Any], **kwargs: Any) -> None:
    TTFT_MS.extend(data.get("ttft_ms", []))


@events.quitting.add_listener
def _report_ttft(environment: Any, **kwargs: Any) -> None:
    if type(environment.runner).__name__ == "WorkerRunner":
        return  # its samples went to the master
    summary = ttft_summary(TTFT_MS)
    if summary["count"]:
        print(
            f"TTFT ms: n={summary['count']:.0f} p50={summary['p50']:.0f}"
            f" p90={summary['p90']:.0f} p99={summary['p99']:.0f}",
            flush=True,
        )
    prefix = getattr(environment.parsed_options, "csv_prefix", None)
    if prefix and summary["count"]:
        with open(f"{prefix}_ttft.csv", "w") as f:
            f.write("count,p50_ms,p90_ms,p99_ms\n")
            f.write(
                f"{summary['count']:.0f},{summary['p50']:.1f},{summary['p90']:.1f},"
                f"{summary['p99']:.1f}\n"
            )


class ChatUser(FastHttpUser):
    """One client of the proxy with its own key; plain and streamed chat completions."""

    wait_time = wait_time_from_env()
    network_timeout = TIMEOUT
    connection_timeout = 10.0

    def on_start(self) -> None:
        self.rng = random.Random()
        key = next(_key_cycle)
        self.headers = {"authorization": f"Bearer {key}"} if key else {}

    @task
    def chat(self) -> None:
        if self.rng.random() < STREAM_SHARE:
            self._streamed()
        else:
            self._plain()

    def _plain(self) -> None:
        body = chat_body(False, self.rng)
        with self.client.post(
            CHAT_PATH, json=body, headers=self.headers, name="chat", catch_response=True
        ) as response:
            if response.status_code != 200:
                response.failure(f"{response.status_code} {error_code(response.text)}")
            elif b'"choices"' not in (response.content or b""):
                response.failure("200 without choices")
            else:
                response.success()

    def _streamed(self) -> None:
        body = chat_body(True, self.rng)
        started = time.perf_counter()
        with self.client.post(
            CHAT_PATH,
            json=body,
            headers=self.headers,
            name="chat stream",
            catch_response=True,
            stream=True,
        ) as response:
            if response.status_code != 200:
                response.failure(f"{response.status_code} {error_code(response.text)}")
                return
            ttft: float | None = None
            done = False
            size = 0
            try:
                for line in sse_lines(response):
                    size += len(line)
                    if ttft is None and first_token_seen(line):
                        ttft = (time.perf_counter() - started) * 1000
                    done = done or line.strip() == b"data: [DONE]"
            except Exception as exc:  # a dropped stream is a failure, not a crash
                response.failure(f"stream broken: {exc!r}")
                return
            # Locust stops the clock at the headers for stream=True: report the whole stream.
            response.request_meta["response_time"] = (time.perf_counter() - started) * 1000
            response.request_meta["response_length"] = size
            if not done:
                response.failure("stream ended without [DONE]")
                return
            response.success()
        if ttft is not None:
            TTFT_MS.append(ttft)
