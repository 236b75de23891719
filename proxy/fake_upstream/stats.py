"""Counters of what the fake upstream received and answered (read by tests and benchmarks)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass(slots=True)
class LastRequest:
    """The latest request on /v1/*: enough to prove what a proxy forwarded."""

    method: str
    path: str
    headers: Mapping[str, str]  # the live request headers; lower-cased on snapshot
    body: Any = None  # the parsed JSON body, when it parsed

    def snapshot(self) -> dict[str, Any]:
        body = self.body
        model = body.get("model") if isinstance(body, dict) else None
        return {
            "method": self.method,
            "path": self.path,
            "headers": {name.lower(): value for name, value in self.headers.items()},
            "model": model,
            "body": body,
        }


@dataclass(slots=True)
class Stats:
    """Plain counters; only the server's event loop thread writes them."""

    requests: int = 0  # everything received on /v1/*
    served: int = 0  # 2xx answers completed (a stream counts once it ended normally)
    rejected: int = 0  # 429s from the rate limit
    failed: int = 0  # injected error statuses (fail_rate)
    hung: int = 0  # injected hangs (hang_rate)
    dropped: int = 0  # connections closed without any answer (drop_rate)
    streams_cut: int = 0  # streams cut after `fail_after_chunks` chunks
    streams_errored: int = 0  # streams ended by an in-stream error (`error_after_chunks`)
    client_disconnects: int = 0  # clients that went away before the answer ended
    in_flight: int = 0
    max_in_flight: int = 0
    prompt_tokens_served: int = 0
    completion_tokens_served: int = 0
    admitted_tokens: int = 0  # what the rate limit counted: prompt + max_tokens
    # What an input-token limit (`itpm`) counts of admitted requests: uncached input and
    # cache writes; and the cache reads it does not count.
    input_tokens_admitted: int = 0
    cache_read_tokens_admitted: int = 0
    first_admitted: float | None = None  # monotonic time of the first admission
    last_admitted: float | None = None
    by_status: dict[int, int] = field(default_factory=dict)
    # "METHOD /route/{template}": which instance got which call
    by_endpoint: dict[str, int] = field(default_factory=dict)
    # 429s per window kind: requests, tokens, input_tokens, output_tokens
    rejected_by_kind: dict[str, int] = field(default_factory=dict)
    # response ids (GET/DELETE/cancel/input_items, previous_response_id) not created here
    unknown_response_ids: int = 0
    follow_ups: int = 0  # requests whose previous_response_id this instance created
    last_request: LastRequest | None = None

    def enter(self) -> None:
        self.in_flight += 1
        if self.in_flight > self.max_in_flight:
            self.max_in_flight = self.in_flight

    def count_status(self, status: int) -> None:
        self.by_status[status] = self.by_status.get(status, 0) + 1

    def count_endpoint(self, request: web.Request) -> None:
        resource = request.match_info.route.resource
        path = resource.canonical if resource is not None else request.path
        key = f"{request.method} {path}"
        self.by_endpoint[key] = self.by_endpoint.get(key, 0) + 1

    def count_rejection(self, kind: str) -> None:
        self.rejected += 1
        self.rejected_by_kind[kind] = self.rejected_by_kind.get(kind, 0) + 1

    def admitted(self, now: float, cost: int) -> None:
        """A request passed the rate limit at ``now``, costing ``cost`` tokens."""
        self.admitted_tokens += cost
        if self.first_admitted is None:
            self.first_admitted = now
        self.last_admitted = now

    def input_admitted(self, counted: int, cache_read: int) -> None:
        """An admitted request's input: ``counted`` by an input-token limit, and
        ``cache_read`` from the prompt cache (not counted)."""
        self.input_tokens_admitted += counted
        self.cache_read_tokens_admitted += cache_read

    def count_served(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.served += 1
        self.prompt_tokens_served += prompt_tokens
        self.completion_tokens_served += completion_tokens

    def fresh(self) -> Stats:
        """Zeroed counters that keep the requests still in flight (so they end at 0)."""
        return Stats(in_flight=self.in_flight, max_in_flight=self.in_flight)

    def snapshot(self, peak_window_requests: int) -> dict[str, Any]:
        last = self.last_request
        return {
            "requests": self.requests,
            "served": self.served,
            "rejected": self.rejected,
            "failed": self.failed,
            "hung": self.hung,
            "dropped": self.dropped,
            "streams_cut": self.streams_cut,
            "streams_errored": self.streams_errored,
            "client_disconnects": self.client_disconnects,
            "by_status": {str(status): n for status, n in sorted(self.by_status.items())},
            "by_endpoint": dict(sorted(self.by_endpoint.items())),
            "rejected_by_kind": dict(sorted(self.rejected_by_kind.items())),
            "unknown_response_ids": self.unknown_response_ids,
            "follow_ups": self.follow_ups,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "peak_window_requests": peak_window_requests,
            "admitted_tokens": self.admitted_tokens,
            "input_tokens_admitted": self.input_tokens_admitted,
            "cache_read_tokens_admitted": self.cache_read_tokens_admitted,
            # Seconds between the first and the latest admission: the span a measured
            # throughput is over.
            "admitted_span": (
                self.last_admitted - self.first_admitted
                if self.first_admitted is not None and self.last_admitted is not None
                else 0.0
            ),
            "tokens_served": self.prompt_tokens_served + self.completion_tokens_served,
            "prompt_tokens_served": self.prompt_tokens_served,
            "completion_tokens_served": self.completion_tokens_served,
            "last_request": last.snapshot() if last is not None else None,
        }
