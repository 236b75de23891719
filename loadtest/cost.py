"""The proxy's own cost per request in instructions: noise-free, unlike req/s.

    python -m loadtest.cost                       # this tree: memory, Redis, no limits
    python -m loadtest.cost --baseline 70e910d    # and as of a revision, side by side
    python -m loadtest.cost --server --mode redis # a real worker, HTTP server included
    python -m loadtest.cost --server --mode redis-default  # the default config (burst 1)
    python -m loadtest.cost --server --mode redis --mix real  # the real-traffic row's mix
    python -m loadtest.cost --baseline 70e910d --runs 3  # three runs each, in turns

One process runs the request pipeline in-process (``Pipeline.handle``: auth, parsing,
the key check, the limiter, routing, the reply, metrics and the log line) over an
in-process upstream that answers at once, so what is counted is the proxy's Python and
nothing else (with Redis, a private redis-server's own work is not counted: the
proxy's side of the limiter is). Under ``valgrind --tool=callgrind`` the instruction
count of a run is repeatable whatever else the machine does (the 2-core machines here are shared and
wall-clock figures move by 10-20% between runs); two runs of different lengths are
subtracted so start-up cancels out. Without valgrind it prints CPU time per request,
which is noisy. This is a microscope for changes to the Python path; ``make bench`` is
still the measure of what a client sees.

``--server`` counts a real worker instead: ``llm-proxy serve --workers 1`` under callgrind
(instrumented only while it serves), the fake upstream and a private Redis beside it, and
one keep-alive client sending requests one at a time. What is counted is then the whole
user-space path of a request in the proxy: uvicorn and the proxy's HTTP protocol, the
pipeline, the lean upstream client and the Redis client (the kernel's work is not).
``--mix real`` sends the real-traffic row's requests instead of one chat request
(``loadtest/bench/traffic.py``'s ``REAL``: its 1,000 keys and three groups on OpenAI
chat, Anthropic Messages and OpenAI Responses, 20% streamed, drawn from a seeded PRNG:
the same sequence every run); its config is that row's (Redis only).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

MODES = ("memory", "redis", "nolimits", "redis-default")
_SHORT, _LONG = 100, 400  # requests (per repetition) of the two subtracted runs
_REPEAT = 5

_REQUEST = (
    b'{"model":"gpt-4o-mini","max_tokens":16,'
    b'"messages":[{"role":"user","content":"Say hello in one short sentence please."}]}'
)
_ANSWER = (
    b'{"id":"x","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":10,"completion_tokens":16,"total_tokens":26}}'
)


def _config(mode: str) -> dict[str, object]:
    """As in the benchmark (loadtest/bench/servers.proxy_config): auth on, limits that
    never bind; ``nolimits``: no limit at all; ``redis-default``: the default config's
    deployment (``burst`` unset: 1, exact pacing)."""
    deployment: dict[str, object] = {
        "id": "fake", "base_url": "http://127.0.0.1:9/v1", "api_key": "sk-up", "timeout": "30s",
    }  # fmt: skip
    key: dict[str, object] = {"name": "bench", "key": "sk-bench-client"}
    if mode == "redis-default":
        deployment.update(rpm=6_000_000)
        key.update(rpm=100_000_000, tpm=10_000_000_000)
    elif mode != "nolimits":
        deployment.update(rpm=100_000_000, burst=100_000)
        key.update(rpm=100_000_000, tpm=10_000_000_000)
    return {
        "keys": [key],
        "models": [{"name": "gpt-4o-mini", "deployments": [deployment]}],
        "server": {"log_level": "warning"},
    }


async def _requests(
    mode: str, count: int, warmup: int, tune_gc: bool = False, redis_url: str = ""
) -> float:
    """Run ``warmup`` then ``_REPEAT`` x ``count`` requests; the best CPU us per request.
    ``tune_gc``: as the CLI's processes run (``app.tune_garbage_collector``)."""
    import httpx

    try:
        from proxy.config.settings import parse_settings
        from proxy.observability.metrics import Metrics
        from proxy.pipeline.pipeline import Pipeline
    except ImportError:  # a revision from before the packages (issue 53's layers)
        from proxy.metrics import Metrics  # type: ignore[no-redef]

        from proxy.config import parse_settings  # type: ignore[no-redef]
        from proxy.pipeline import Pipeline  # type: ignore[no-redef]

    try:
        from proxy.limiter.factory import create_limiter
    except ImportError:  # a revision from before the factory module (70e910d)
        from proxy.limiter import create_limiter  # type: ignore[attr-defined,no-redef]

    shape: object = "chat/completions"  # a baseline's endpoint, before the API shapes
    try:
        from proxy.shapes.chat import CHAT

        shape = CHAT
    except ImportError:
        pass

    # Under valgrind the loop runs some 50x slower: a Redis reply must not time out.
    limiter = create_limiter(redis_url or None, replica_id="cost", timeout=30.0)
    await limiter.start()

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=_ANSWER, headers={"content-type": "application/json"})

    pipeline = Pipeline(
        parse_settings(_config(mode)),
        limiter,
        httpx.MockTransport(answer),
        Metrics(budget_shared=bool(redis_url)),
    )
    headers = [("content-type", "application/json")]
    auth = "Bearer sk-bench-client"
    for _ in range(warmup):
        await pipeline.handle(shape, _REQUEST, headers, pipeline.keys.authenticate(auth))
    if tune_gc:
        try:
            from proxy.process.app import tune_garbage_collector
        except ImportError:  # before the packages
            from proxy.app import tune_garbage_collector  # type: ignore[no-redef]

        tune_garbage_collector()
    best = float("inf")
    for _ in range(_REPEAT):
        started = time.process_time()
        for _ in range(count):
            reply = await pipeline.handle(
                shape, _REQUEST, headers, pipeline.keys.authenticate(auth)
            )
            await asyncio.sleep(0)  # the bookkeeping scheduled after the answer runs
            if reply.status != 200:
                raise SystemExit(f"unexpected answer {reply.status}: {reply.body!r}")
        best = min(best, (time.process_time() - started) / count * 1e6)
    await limiter.aclose()
    return best


def _child(mode: str, count: int) -> float:
    """One measured run, in the process callgrind watches (with its own redis-server)."""
    import uvloop

    if not mode.startswith("redis"):
        return uvloop.run(_requests(mode, count, warmup=200, tune_gc=True))
    with tempfile.TemporaryDirectory() as workdir, socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        redis = subprocess.Popen(
            [
                "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", workdir,
            ],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            url = f"redis://127.0.0.1:{port}"
            return uvloop.run(_requests(mode, count, 200, tune_gc=True, redis_url=url))
        finally:
            redis.terminate()
            redis.wait(timeout=10)


def _instructions(source: Path, mode: str, lengths: tuple[int, int] = (_SHORT, _LONG)) -> int:
    """Instructions per request of the tree at ``source`` (callgrind, two run lengths:
    ``lengths`` requests per repetition)."""
    counts = []
    short, long = lengths
    for count in lengths:
        with tempfile.TemporaryDirectory() as tmp:
            run = subprocess.run(
                [
                    "valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out",
                    sys.executable, __file__, "--child", mode, str(count),
                ],
                env={**os.environ, "PYTHONPATH": str(source)},  # its `proxy` package
                cwd=tmp, capture_output=True, text=True, timeout=900, check=True,
            )  # fmt: skip
        found = re.search(r"Collected : (\d+)", run.stderr)
        if found is None:
            raise SystemExit(f"callgrind printed no count:\n{run.stderr[-2000:]}")
        counts.append(int(found.group(1)))
    return round((counts[1] - counts[0]) / (_REPEAT * (long - short)))


_SERVED = 400  # requests counted per --server run (after 200 uninstrumented)
MIXES = ("bench", "real")
Request = tuple[str, dict[str, str], bytes]  # path, headers, body


def bench_requests(api_key: str) -> Callable[[], Request]:
    """The bench's one chat request, again and again."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"}
    return lambda: ("/v1/chat/completions", headers, _REQUEST)


def real_requests(seed: int = 1) -> Callable[[], Request]:
    """The real-traffic row's requests as ``bench_traffic.lua`` draws them: a key
    uniformly, a group by its share, streamed at the shape's rate (a seeded PRNG)."""
    import random

    from loadtest.bench import traffic

    shape = traffic.REAL
    draw = random.Random(seed)
    prompt = "Benchmark: say something short."

    def request() -> Request:
        key = traffic.key_secret(draw.randrange(shape.keys))
        [group] = draw.choices(shape.groups, weights=[g.share for g in shape.groups])
        fields: dict[str, object] = {"model": group.model}
        if group.api == "responses":
            fields |= {"max_output_tokens": 16, "input": prompt}
        else:
            fields |= {"max_tokens": 16, "messages": [{"role": "user", "content": prompt}]}
        if draw.randrange(100) < shape.stream_percent:
            fields["stream"] = True
        headers = {"Content-Type": "application/json"}
        if group.api == "messages":
            headers |= {"anthropic-version": traffic.ANTHROPIC_VERSION, "x-api-key": key}
        else:
            headers["Authorization"] = f"Bearer {key}"
        return traffic.PATHS[group.api], headers, json.dumps(fields).encode()

    return request


def served_config(tmp: str, upstream: str, redis: str, mode: str, mix: str = "bench") -> str:
    """The bench's config for ``mode`` (``mix`` real: the real-traffic row's) written
    into ``tmp``; its path. (A Redis reply under valgrind or a profiler takes far longer
    than the default 0.1 s.)"""
    import yaml

    from loadtest.bench import traffic
    from loadtest.bench.configs import proxy_config
    from loadtest.bench.model import DEFAULT_CONFIG, LARGE_BURST

    shared = redis if mode.startswith("redis") else None
    bench = DEFAULT_CONFIG if mode == "redis-default" else LARGE_BURST
    if mix == "real":
        if shared is None:
            raise SystemExit("--mix real runs on Redis (--mode redis), as its row does")
        groups = {g.model: [upstream] for g in traffic.REAL.groups}
        config = traffic.proxy_config(traffic.REAL, groups, shared)
    else:
        config = proxy_config(upstream, shared, mode != "nolimits", bench)
    if shared:
        config["redis"] = {"url": redis, "timeout": "30s"}
    path = Path(tmp) / "proxy.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def wait_live(proxy: subprocess.Popen[bytes], port: int, log: Callable[[], str]) -> None:
    """Until the proxy on ``port`` answers /health/live (it may start slowly, watched)."""
    from loadtest.bench.servers import http_ok
    from loadtest.topology import LOOPBACK

    deadline = time.monotonic() + 300
    while not http_ok(f"http://{LOOPBACK}:{port}/health/live"):
        if proxy.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the proxy did not start:\n{log()[-2000:]}")
        time.sleep(0.5)


def _served_instructions(source: Path, mode: str, mix: str = "bench") -> int:
    """Instructions per request of one real worker of the tree at ``source``."""
    from loadtest.bench.servers import servers
    from loadtest.bench.wrk import API_KEY
    from loadtest.topology import LOOPBACK, free_port

    with tempfile.TemporaryDirectory() as tmp, servers(Path(tmp)) as (procs, upstream, redis):
        path = served_config(tmp, upstream, redis, mode, mix)
        port = free_port()
        out = Path(tmp) / "callgrind.out"
        proxy = procs.start(
            "proxy",
            [
                "valgrind", "--tool=callgrind", "--instr-atstart=no",
                f"--callgrind-out-file={out}", sys.executable, "-m", "proxy", "serve",
                "--config", path, "--host", LOOPBACK, "--port", str(port),
                "--workers", "1",
            ],
            source,
        )  # fmt: skip
        wait_live(proxy, port, lambda: procs.log("proxy"))
        requests = real_requests() if mix == "real" else bench_requests(API_KEY)
        with Client(port, requests) as client:
            client.send(200)
            _callgrind(proxy.pid, "-i", "on")
            client.send(_SERVED)
            _callgrind(proxy.pid, "-i", "off")
        _callgrind(proxy.pid, "-d")
        counted = sum(
            int(m.group(1))
            for dump in Path(tmp).glob("callgrind.out*")
            for m in re.finditer(r"^totals: (\d+)", dump.read_text(), re.MULTILINE)
        )
        return round(counted / _SERVED)


def _callgrind(pid: int, *command: str) -> None:
    subprocess.run(
        ["callgrind_control", *command, str(pid)], check=True, capture_output=True, timeout=120
    )


class Client:
    """One keep-alive connection posting ``requests``' requests, one at a time (a
    stream read to its end)."""

    def __init__(self, port: int, requests: Callable[[], Request]) -> None:
        import http.client

        self._connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self._requests = requests

    def send(self, count: int) -> None:
        for _ in range(count):
            path, headers, body = self._requests()
            self._connection.request("POST", path, body, headers)
            response = self._connection.getresponse()
            answer = response.read()
            if response.status != 200:
                raise SystemExit(f"unexpected answer {response.status} to {path}: {answer!r}")

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self._connection.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.cost", description=__doc__)
    parser.add_argument("--baseline", metavar="REV", help="also measure this git revision")
    parser.add_argument("--mode", choices=MODES, action="append", help="default: both")
    parser.add_argument("--server", action="store_true", help="a real worker over HTTP (see above)")
    parser.add_argument(
        "--mix", choices=MIXES, default="bench", help="with --server: the requests sent (above)"
    )
    parser.add_argument(
        "--runs", type=int, default=1, help="runs of each tree, in turns (the median reported)"
    )
    parser.add_argument(
        "--lengths",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=(_SHORT, _LONG),
        metavar="SHORT,LONG",
        help=f"requests per repetition of the two subtracted runs (default {_SHORT},{_LONG})",
    )
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(_child(args.child[0], int(args.child[1])))
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is needed (apt-get install -y valgrind)", file=sys.stderr)
        return 2
    from loadtest.bench.servers import trees

    with trees(args.baseline) as measured:
        for mode in args.mode or MODES:
            runs: dict[str, list[int]] = {name: [] for name in measured}
            for _ in range(args.runs):  # in turns: the trees' runs alternate
                for name, tree in measured.items():
                    if args.server:
                        runs[name].append(_served_instructions(tree, mode, args.mix))
                    else:
                        runs[name].append(_instructions(tree, mode, args.lengths))
            print(_report(mode, runs, args), flush=True)
    return 0


def _report(mode: str, runs: dict[str, list[int]], args: argparse.Namespace) -> str:
    """One line: each tree's count per request (its median, and every run's when there
    were several), and their ratio."""
    medians = {name: statistics.median(counts) for name, counts in runs.items()}
    line = ", ".join(
        f"{name} {medians[name]:,.0f}"
        + (f" ({', '.join(f'{n:,}' for n in counts)})" if len(counts) > 1 else "")
        for name, counts in runs.items()
    )
    if args.baseline:
        line += f" (now / {args.baseline}: {medians['now'] / medians[args.baseline]:.4f}x)"
    where = f"served ({args.mix} mix), " if args.server else ""
    return f"{mode}: {where}instructions per request: {line}"


if __name__ == "__main__":
    raise SystemExit(main())
