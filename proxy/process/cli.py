"""``llm-proxy``: serve, check-config, the built-in fake upstream, and the showcase.

    llm-proxy serve [--config PATH] [--host H] [--port P] [--workers N]
                    [--ssl-certfile PEM --ssl-keyfile PEM]
    llm-proxy check-config PATH
    llm-proxy fake-upstream [options]      (see docs/fake_upstream.md)
    llm-proxy showcase [--calls N] [--rps N] [--latency S] [--retries N] [--png PATH]

``serve`` without ``--config`` runs the embedded demo (proxy/process/demo.py): the built-in
fake upstream in the same process and an in-memory limiter, so nothing else is needed; it
prints what to try. Whatever stops a start (proxy/process/ports.py,
proxy/process/startup.py) is one line on stderr per problem, each naming what to change,
exit 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from proxy.config import fast_paths
from proxy.config.settings import ConfigError, Settings, config_warnings, load_settings
from proxy.observability.otlp import traces_problem
from proxy.process.config_watch import file_signature
from proxy.process.ports import listen_problem
from proxy.process.startup import (
    Problems,
    StartupError,
    redis_problem,
    tls_problem,
    warn_about_unreachable_upstreams,
    wrong_paths,
)

__all__ = ["main"]

logger = logging.getLogger("proxy")

DEMO_UPSTREAM_PORT = 8001
DEMO_UPSTREAM_PORT_ENV = "LLM_PROXY_DEMO_UPSTREAM_PORT"
LOG_LEVEL_ENV = "LLM_PROXY_LOG_LEVEL"

SERVE_ENVIRONMENT = f"""\
environment variables (a flag wins over its variable):
  LLM_PROXY_HOST          default of --host (127.0.0.1)
  LLM_PROXY_PORT          default of --port (8000)
  LLM_PROXY_WORKERS       default of --workers (1)
  LLM_PROXY_SSL_CERTFILE  default of --ssl-certfile
  LLM_PROXY_SSL_KEYFILE   default of --ssl-keyfile
  {DEMO_UPSTREAM_PORT_ENV}
                          the embedded demo's fake upstream port ({DEMO_UPSTREAM_PORT})
  {LOG_LEVEL_ENV}     log level of the embedded demo, and of a config's start-up
                          until its server.log_level applies (info)
  ${{VAR}}                  any variable the config file names (see config/example.yaml)
"""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["fake-upstream"]:
        # Its options are its own: hand them over untouched (argparse's REMAINDER
        # would stop at the first --option).
        from proxy.fake_upstream import main as fake_main

        fake_main(argv[1:], prog="llm-proxy fake-upstream")
        return 0
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        try:
            return _serve(args)
        except StartupError as exc:
            for problem in exc.problems:
                print(f"llm-proxy: {problem}", file=sys.stderr)
            return 1
    if args.command == "check-config":
        return _check_config(args.path)
    if args.command == "showcase":
        return _showcase(args)
    parser.print_help()
    return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llm-proxy", description="A rate-limiting reverse proxy for LLM APIs."
    )
    commands = parser.add_subparsers(dest="command")
    serve = commands.add_parser(
        "serve",
        help="serve the proxy",
        description="Serve the proxy. Without --config: the embedded demo (the built-in fake\n"
        "upstream on 127.0.0.1:8001, limited to 2 requests a second; the in-memory limiter;\n"
        "a demo client key and admin key). It prints what to try.",
        epilog=SERVE_ENVIRONMENT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "--config", metavar="PATH", help="YAML config file (default: the embedded demo)"
    )
    # Defaults come from the environment after parsing (_resolve_options), so a bad
    # variable is one line, not a traceback.
    serve.add_argument(
        "--host",
        metavar="ADDRESS",
        help="address to listen on (env LLM_PROXY_HOST; default 127.0.0.1)",
    )
    serve.add_argument(
        "--port", metavar="N", type=int, help="port to listen on (env LLM_PROXY_PORT; default 8000)"
    )
    serve.add_argument(
        "--workers",
        metavar="N",
        type=int,
        help="worker processes (env LLM_PROXY_WORKERS; default 1); with Redis they share"
        " budgets, without it each holds 1/N of every budget",
    )
    serve.add_argument(
        "--ssl-certfile",
        metavar="PEM",
        help="serve HTTPS with this PEM certificate (chain) (env LLM_PROXY_SSL_CERTFILE)",
    )
    serve.add_argument(
        "--ssl-keyfile",
        metavar="PEM",
        help="the certificate's private key, PEM (env LLM_PROXY_SSL_KEYFILE)",
    )
    check = commands.add_parser(
        "check-config",
        help="validate a config file",
        description="Validate a config file: every problem at once (exit 1), or a summary"
        " (exit 0); warnings for what is valid but probably not meant.",
    )
    check.add_argument("path")
    commands.add_parser(
        "fake-upstream", help="run the built-in fake OpenAI upstream (see its --help)"
    )
    show = commands.add_parser(
        "showcase",
        help="naive client calls vs the same through the proxy, side by side",
        description="The same concurrent calls by the OpenAI SDK (its default retries),"
        " straight at a strict fake upstream and through the proxy: a table, and a"
        " timeline PNG (needs matplotlib; `make showcase` installs it).",
    )
    show.add_argument("--calls", type=int, default=10, help="concurrent calls (10)")
    show.add_argument("--rps", type=int, default=2, help="the upstream's requests a second (2)")
    show.add_argument(
        "--latency", default="2-5", help="the upstream's answer time, seconds: 3 or 2-5 (2-5)"
    )
    show.add_argument("--retries", type=int, default=2, help="the client's retries (2)")
    show.add_argument(
        "--png",
        default="showcase.png",
        help="where to draw the timeline (showcase.png; '': no picture)",
    )
    return parser


def _showcase(args: argparse.Namespace) -> int:
    from proxy.fake_upstream import parse_latency
    from proxy.showcase.command import showcase
    from proxy.showcase.scenario import Scenario

    try:
        latency = parse_latency(args.latency)
    except ValueError as exc:
        print(f"llm-proxy showcase: --latency {args.latency!r}: {exc}", file=sys.stderr)
        return 2
    low, high = latency if isinstance(latency, tuple) else (latency, latency)
    # Bounded: it is a demonstration on this machine, not a load test.
    if not (1 <= args.calls <= 1000 and 1 <= args.rps <= 1000 and 0 <= args.retries <= 10):
        print("llm-proxy showcase: --calls 1-1000, --rps 1-1000, --retries 0-10", file=sys.stderr)
        return 2
    if high > 60:
        print("llm-proxy showcase: --latency at most 60 s", file=sys.stderr)
        return 2
    scenario = Scenario(args.calls, args.rps, (low, high), args.retries)
    return showcase(scenario, Path(args.png) if args.png else None)


def _check_config(path: str) -> int:
    try:
        settings = load_settings(path)
    except ConfigError as exc:
        print(f"{path}: {len(exc.problems)} problem(s):", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    for warning in config_warnings(settings) + wrong_paths(settings):
        print(f"{path}: warning: {warning}", file=sys.stderr)
    print(_summary(path, settings))
    return 0


def _summary(path: str, settings: Settings) -> str:
    deployments = sum(len(m.deployments) for m in settings.models)
    limiter = "redis" if settings.redis.shared else "in-memory"
    keys = f"{len(settings.keys)} client key(s)" if settings.keys else "no client keys (open)"
    if settings.teams:
        keys += f", {len(settings.teams)} team(s)"
    lines = [
        f"{path}: OK",
        f"  {len(settings.models)} model(s), {deployments} deployment(s), {keys}",
        f"  limiter: {limiter}; routing: {settings.routing.strategy},"
        f" max_wait {settings.routing.max_wait:g}s, retries {settings.routing.retries}",
    ]
    for model in settings.models:
        ids = ", ".join(d.id for d in model.deployments)
        also = f" (also {', '.join(model.aliases)})" if model.aliases else ""
        lines.append(f"  - {model.name}{also}: {ids}")
    return "\n".join(lines)


def _resolve_options(args: argparse.Namespace) -> str:
    """Fill what the command line left out from the environment, then check it all: every
    problem is reported, one line each. Returns the start-up's log level."""
    problems = Problems()
    _resolve_listening(args, problems)
    _resolve_tls(args, problems)
    if args.port is not None:
        problems.add(
            listen_problem(
                args.host,
                args.port,
                "the proxy",
                port_fix="pass --port N or set LLM_PROXY_PORT=N",
                host_fix="pass --host ADDRESS or set LLM_PROXY_HOST=ADDRESS",
            )
        )
    if args.config is None:
        _resolve_demo(args, problems)
    problems.add(_fast_paths_problem())
    log_level = os.environ.get(LOG_LEVEL_ENV, "").strip().lower() or "info"
    try:
        _configure_logging(log_level, LOG_LEVEL_ENV)
    except StartupError as exc:
        problems.add(str(exc))
    problems.raise_any()
    return log_level


def _resolve_listening(args: argparse.Namespace, problems: Problems) -> None:
    """The host, port and workers left out taken from the environment; a variable that
    is not a number, or fewer than one worker, is a problem."""
    if args.host is None:
        args.host = os.environ.get("LLM_PROXY_HOST", "").strip() or "127.0.0.1"
    if args.port is None:
        args.port = problems.env_int("LLM_PROXY_PORT", 8000)
    if args.workers is None:
        args.workers = problems.env_int("LLM_PROXY_WORKERS", 1)
    if args.workers is not None and args.workers < 1:
        problems.add(
            f"{args.workers} workers: pass --workers N or set LLM_PROXY_WORKERS=N (N >= 1)"
        )


def _resolve_tls(args: argparse.Namespace, problems: Problems) -> None:
    """The certificate and key left out taken from the environment (empty: none); a
    pair that cannot serve TLS is a problem."""
    args.ssl_certfile = args.ssl_certfile or os.environ.get("LLM_PROXY_SSL_CERTFILE") or None
    args.ssl_keyfile = args.ssl_keyfile or os.environ.get("LLM_PROXY_SSL_KEYFILE") or None
    problems.add(tls_problem(args.ssl_certfile, args.ssl_keyfile))


def _resolve_demo(args: argparse.Namespace, problems: Problems) -> None:
    """The embedded demo runs one worker, its fake upstream on a port from the
    environment (or 8001) that must be free."""
    if args.workers is not None and args.workers > 1:
        problems.add("the embedded demo runs one worker; pass --config for more")
    args.demo_upstream_port = problems.env_int(DEMO_UPSTREAM_PORT_ENV, DEMO_UPSTREAM_PORT)
    if args.demo_upstream_port is not None:
        problems.add(
            listen_problem(
                "127.0.0.1",
                args.demo_upstream_port,
                "the demo's fake upstream",
                port_fix=f"set {DEMO_UPSTREAM_PORT_ENV}=N",
            )
        )


def _configure_logging(level: str, where: str) -> None:
    from proxy.observability.logs import configure_logging

    try:
        configure_logging(level)
    except ValueError:
        raise StartupError(
            f"{where}: unknown log level {level!r}; use debug, info, warning or error"
        ) from None


def _serve(args: argparse.Namespace) -> int:
    log_level = _resolve_options(args)
    if args.config is None:
        return _serve_demo(args, log_level)
    seen = file_signature(args.config)  # before reading: a change from here on is reloaded
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"{args.config}: {problem}", file=sys.stderr)
        return 1
    # A SIGHUP reloads the config: from here on it waits for the app (no default exit).
    if args.workers > 1:
        from proxy.process.supervisor import block_sighup

        block_sighup()
    else:
        from proxy.process.reloading import hold_sighup

        hold_sighup()
    _configure_logging(settings.server.log_level, f"{args.config}: server.log_level")
    _refuse_start(args.config, settings)
    warn_about_unreachable_upstreams(settings)
    from proxy.api.protocol import BODY_TIMEOUT_ENV, HEADER_TIMEOUT_ENV

    # Read by the HTTP protocol of this process and of spawned workers.
    os.environ[HEADER_TIMEOUT_ENV] = str(settings.server.header_timeout)
    os.environ[BODY_TIMEOUT_ENV] = str(settings.server.body_timeout)
    if args.workers > 1:
        return _serve_workers(args, settings)
    from proxy.process.app import create_app

    app = create_app(
        settings, tune_gc=True, config_path=os.path.abspath(args.config), config_seen=seen
    )
    _run(app, args, settings.server.log_level)
    return 0


def _refuse_start(path: str, settings: Settings) -> None:
    """What in the config stops a start: its Redis refusing the proxy, traces that
    cannot be exported (every problem at once, one line each, naming the file)."""
    problems = Problems()
    problems.add(redis_problem(settings))
    problems.add(traces_problem() if settings.telemetry.traces else None)
    problems.lines = [f"{path}: {line}" for line in problems.lines]
    problems.raise_any()


def _serve_demo(args: argparse.Namespace, log_level: str) -> int:
    from proxy.fake_upstream import FakeUpstreamConfig, run_in_thread
    from proxy.process.app import create_app
    from proxy.process.demo import demo_settings, instructions, upstream_options

    # _resolve_options checked the port (and that the demo runs one worker).
    config = FakeUpstreamConfig(port=args.demo_upstream_port, **upstream_options())
    upstream = run_in_thread(config)
    logger.info("Demo: built-in fake upstream at %s", upstream.url)
    try:
        app = create_app(demo_settings(upstream.url), tune_gc=True)
        print(instructions(_url(args), upstream.url), flush=True)
        _run(app, args, log_level)
    finally:
        upstream.stop()
    return 0


def _fast_paths_problem() -> str | None:
    try:
        fast_paths.disabled()
    except ValueError as exc:
        return str(exc)
    return None


def _url(args: argparse.Namespace) -> str:
    """Where a client on this machine reaches the server that ``args`` describe."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(args.host, args.host)
    if ":" in host:
        host = f"[{host}]"
    scheme = "https" if args.ssl_certfile else "http"
    return f"{scheme}://{host}:{args.port}"


def _serve_workers(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from proxy.observability.metrics import cleanup_multiprocess_dir, prepare_multiprocess_dir
    from proxy.process.supervisor import run_supervised
    from proxy.process.worker_env import CONFIG_ENV, SUPERVISOR_ENV, WORKERS_ENV

    # Set before the workers start, so each imports prometheus-client in multiprocess mode.
    metrics_dir = prepare_multiprocess_dir(args.workers)
    os.environ[CONFIG_ENV] = os.path.abspath(args.config)
    os.environ[WORKERS_ENV] = str(args.workers)
    if not settings.redis.shared:
        logger.info(
            "In-memory limiter with %d workers: each worker holds 1/%d of every budget.",
            args.workers,
            args.workers,
        )
    # Workers pass POST /admin/reload to this process, which passes SIGHUP to them all.
    os.environ[SUPERVISOR_ENV] = str(os.getpid())
    try:
        run_supervised(
            uvicorn.Config(
                "proxy.process.app:create_app_from_env",
                factory=True,
                workers=args.workers,
                **_uvicorn_options(args, settings.server.log_level),
            )
        )
    finally:
        if metrics_dir is not None:
            cleanup_multiprocess_dir(metrics_dir)
    return 0


def _run(app: Any, args: argparse.Namespace, log_level: str) -> None:
    import uvicorn

    uvicorn.run(app, **_uvicorn_options(args, log_level))


# On SIGTERM, how long requests in flight (streams included) may finish before they are
# cancelled; an orchestrator's grace period must exceed it (deploy/kubernetes/).
GRACEFUL_SHUTDOWN_SECONDS = 30

# By name: uvicorn imports it where it serves, and the parent of several workers, which
# does not serve, need not import the app's code for it.
HTTP_PROTOCOL = "proxy.api.direct:DirectReplyProtocol"
# The same protocol's timeouts and limits, every reply through uvicorn's ASGI cycle.
ASGI_PROTOCOL = "proxy.api.protocol:HeaderTimeoutProtocol"


def _uvicorn_options(args: argparse.Namespace, log_level: str) -> dict[str, Any]:
    from proxy.observability.logs import logging_config

    return {
        "host": args.host,
        "port": args.port,
        "ssl_certfile": args.ssl_certfile,
        "ssl_keyfile": args.ssl_keyfile,
        "loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        "http": HTTP_PROTOCOL if fast_paths.enabled("protocol") else ASGI_PROTOCOL,
        "access_log": False,  # the proxy writes its own structured line per request
        # Workers are spawned: they get the logging set-up through uvicorn, not from us.
        "log_config": logging_config(log_level),
        "timeout_graceful_shutdown": GRACEFUL_SHUTDOWN_SECONDS,
        "backlog": 4096,
        # The proxy never uses the client's address; skipping the middleware saves time.
        "proxy_headers": False,
        "server_header": False,
    }


if __name__ == "__main__":
    sys.exit(main())
