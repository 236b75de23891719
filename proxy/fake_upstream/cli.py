"""`python -m proxy.fake_upstream`: serve a fake OpenAI upstream in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import typing
from collections.abc import Callable

from proxy.process.ports import listen_problem

from .config import FakeUpstreamConfig, parse_latency
from .runner import serve


def build_parser(prog: str = "python -m proxy.fake_upstream") -> argparse.ArgumentParser:
    defaults = FakeUpstreamConfig()
    parser = argparse.ArgumentParser(
        prog=prog,
        description="A fast fake OpenAI-compatible (and Anthropic Messages) upstream with a "
        "strict rate limit, latency and failure injection. Options can be changed at runtime "
        "with POST /control.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--host", default=defaults.host, help="address to listen on")
    add("--port", type=int, default=defaults.port, help="port, 0 = any free")
    add("--latency", default="0", help="seconds before answering: 0.05 or a range 0.02-0.2")
    add(
        "--stream-chunks",
        type=int,
        default=defaults.stream_chunks,
        help="content chunks per stream",
    )
    add("--chunk-delay", type=float, default=defaults.chunk_delay, help="seconds between chunks")
    add("--completion-tokens", type=int, default=defaults.completion_tokens, help="per answer")
    add("--rpm", type=int, default=None, help="requests per window (unset: unlimited)")
    add("--tpm", type=int, default=None, help="tokens per window (unset: unlimited)")
    add("--itpm", type=int, default=None, help="input tokens per window (unset: unlimited)")
    add("--otpm", type=int, default=None, help="output tokens per window (unset: unlimited)")
    add("--window", type=float, default=defaults.window, help="limit window in seconds")
    add(
        "--quantum",
        type=float,
        default=None,
        help="also enforce the limits pro rata over every QUANTUM seconds (unset: off)",
    )
    add(
        "--no-ratelimit-headers",
        dest="ratelimit_headers",
        action="store_false",
        help="send no x-ratelimit-* headers (429s keep retry-after)",
    )
    add("--fail-rate", type=float, default=0.0, help="share of requests answered fail-status")
    add("--fail-status", type=int, default=defaults.fail_status, help="injected status")
    add("--hang-rate", type=float, default=0.0, help="share of requests never answered")
    add("--drop-rate", type=float, default=0.0, help="share of connections closed unanswered")
    add("--fail-after-chunks", type=int, default=0, help="cut streams after K chunks (0 = off)")
    add(
        "--error-after-chunks",
        type=int,
        default=0,
        help="end streams after K events with the API's in-stream error (0 = off)",
    )
    add("--seed", type=int, default=None, help="seed of the random draws")
    add("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    add("--aws-access-key-id", default=None, help="Bedrock: the SigV4 key id checked")
    add(
        "--aws-secret-access-key",
        default=os.environ.get("FAKE_UPSTREAM_AWS_SECRET"),
        help="Bedrock: the SigV4 secret signatures are recomputed with"
        " (default: $FAKE_UPSTREAM_AWS_SECRET)",
    )
    add("--models", default=",".join(defaults.models), help="what GET /v1/models lists")
    add(
        "--azure",
        action="store_true",
        help="act as Azure OpenAI: /openai/deployments/{model}/..., the api-key header,"
        " the api-version query parameter; --models names the deployments",
    )
    add(
        "--azure-api-versions",
        default=",".join(defaults.azure_api_versions),
        help="the api-version values accepted in Azure mode",
    )
    add("--embedding-dims", type=int, default=defaults.embedding_dims, help="vector size")
    add("--cache-read-tokens", type=int, default=0, help="input tokens reported as cache reads")
    add("--cache-write-tokens", type=int, default=0, help="input tokens reported as cache writes")
    add(
        "--prompt-cache",
        action="store_true",
        help="Messages API: cache what cache_control marks, as Anthropic does (reads are"
        " reported as cache_read_input_tokens and not counted by --itpm)",
    )
    add("--access-log", action="store_true", help="log every request (slower)")
    add("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="")
    return parser


def config_from_args(args: argparse.Namespace) -> FakeUpstreamConfig:
    models = tuple(name.strip() for name in args.models.split(",") if name.strip())
    return FakeUpstreamConfig(
        host=args.host,
        port=args.port,
        latency=parse_latency(args.latency),
        stream_chunks=args.stream_chunks,
        chunk_delay=args.chunk_delay,
        completion_tokens=args.completion_tokens,
        rpm=args.rpm,
        tpm=args.tpm,
        itpm=args.itpm,
        otpm=args.otpm,
        window=args.window,
        quantum=args.quantum,
        ratelimit_headers=args.ratelimit_headers,
        fail_rate=args.fail_rate,
        fail_status=args.fail_status,
        hang_rate=args.hang_rate,
        drop_rate=args.drop_rate,
        fail_after_chunks=args.fail_after_chunks,
        error_after_chunks=args.error_after_chunks,
        seed=args.seed,
        api_key=args.api_key,
        models=models,
        azure=args.azure,
        azure_api_versions=tuple(
            v.strip() for v in args.azure_api_versions.split(",") if v.strip()
        ),
        embedding_dims=args.embedding_dims,
        cache_read_tokens=args.cache_read_tokens,
        cache_write_tokens=args.cache_write_tokens,
        prompt_cache=args.prompt_cache,
        access_log=args.access_log,
        aws_access_key_id=args.aws_access_key_id,
        aws_secret_access_key=args.aws_secret_access_key,
    )


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop  # optional: a faster event loop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main(argv: list[str] | None = None, prog: str = "python -m proxy.fake_upstream") -> None:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        _fail(prog, str(exc))
    problem = listen_problem(
        config.host,
        config.port,
        "the fake upstream",
        port_fix="pass --port N",
        host_fix="pass --host ADDRESS",
    )
    if problem is not None:
        _fail(prog, problem)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(message)s")
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(serve(config))


def _fail(prog: str, message: str) -> typing.NoReturn:
    """One line on stderr, exit 1: what is wrong and which option changes it."""
    print(f"{prog}: {message}", file=sys.stderr)
    raise SystemExit(1)
