"""The client key's share of a request's CPU over Redis, alone: its check, settlement and
headers (the default config's key: rpm and tpm, from its lease).

    python -m loadtest.key_path                      # this tree
    python -m loadtest.key_path --baseline 1d0d38c   # and a revision, in turns

One process per measurement runs the pipeline's key steps in a loop as a request does
(``Pipeline._check_key``, its settlement once the usage is read, ``key_headers``), over
a private redis-server (one for the run, emptied before each measurement), with the
key's lease renewed as it runs out: what is left is the Python of the key's path,
without the forwarding, the deployment's turn or the server. It prints the best of
several repetitions in CPU nanoseconds per request, less a loop that only makes the
request's ``Call``. Trees are measured in turns, three times each: on these shared
2-core machines a single figure moves by 5-10%, a change of 15% or more reads through.
``loadtest.cost`` counts whole requests (instructions, noise-free); this isolates the
key's part, where the leases' timing makes that count unsteady.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_REQUEST = (
    b'{"model":"gpt-4o-mini","max_tokens":16,'
    b'"messages":[{"role":"user","content":"Say hello in one short sentence please."}]}'
)
_USED = {"requests": 1.0, "tokens": 26.0, "input_tokens": 10.0, "output_tokens": 16.0}
_WARMUP, _COUNT, _REPEAT, _TURNS = 3_000, 20_000, 3, 3


def _config() -> dict[str, object]:
    deployment = {"id": "fake", "base_url": "http://127.0.0.1:9/v1", "api_key": "sk-up"}
    key = {"name": "bench", "key": "sk-bench-client", "rpm": 100_000_000, "tpm": 10_000_000_000}
    return {"keys": [key], "models": [{"name": "gpt-4o-mini", "deployments": [deployment]}]}


async def _measure(
    url: str, count: int = _COUNT, warmup: int = _WARMUP, repeat: int = _REPEAT
) -> tuple[float, float]:
    """(key path, base) in CPU ns per request, each the best of ``repeat`` runs of
    ``count``; every key check is allowed (a refusal raises)."""
    import httpx

    from proxy.config.settings import parse_settings
    from proxy.limiter.factory import create_limiter
    from proxy.observability.metrics import Metrics
    from proxy.pipeline.pipeline import Pipeline, _parse_body
    from proxy.request.call import Arrival, Ask, Call, Caller
    from proxy.request.request_ids import new_request_id
    from proxy.shapes.chat import CHAT

    limiter = create_limiter(url, replica_id="key-path", timeout=30.0)
    await limiter.start()
    transport = httpx.MockTransport(lambda request: httpx.Response(500))
    pipeline = Pipeline(parse_settings(_config()), limiter, transport, Metrics(budget_shared=True))
    key = pipeline.keys.authenticate("Bearer sk-bench-client")
    assert key is not None
    body = _parse_body(_REQUEST)

    async def base() -> None:
        arrival = Arrival(new_request_id(), CHAT, time.perf_counter())
        Call(arrival, ask=Ask(cost=CHAT.estimate(body, 4096)))

    async def one() -> None:
        arrival = Arrival(new_request_id(), CHAT, time.perf_counter())
        ask = Ask("gpt-4o-mini", cost=CHAT.estimate(body, 4096))
        call = Call(arrival, caller=Caller(key.name), ask=ask)
        limits = pipeline.keys.limits(key, pipeline.catalog.key_limits)
        assert limits is not None
        limits = pipeline.catalog.ask_limits(key, limits, ask.model)
        check = pipeline._check_key(call, limits, False)
        settlement = pipeline._key_settlement(call, limits, check, None)
        (await check) if not check.done() else check.result()
        call.trip.used = _USED
        call.trip.charge(ask.cost)
        pipeline._settle_soon(settlement)  # as Pipeline._answered does
        verdict = call.admission.verdict
        assert verdict is not None
        CHAT.key_headers(verdict, time.time())

    for _ in range(warmup):
        await one()
    best = {"base": float("inf"), "key": float("inf")}
    for name, step in (("base", base), ("key", one)) * repeat:
        started = time.process_time()
        for i in range(count):
            await step()
            if i % 256 == 0:
                await asyncio.sleep(0)  # the batched settlements go out
        best[name] = min(best[name], (time.process_time() - started) / count * 1e9)
    await limiter.aclose()
    return best["key"] - best["base"], best["base"]


def _child(url: str) -> None:
    """One measurement, of the ``proxy`` package on ``PYTHONPATH``, over the Redis at
    ``url``; prints the two figures and where that package is."""
    import uvloop

    key, base = uvloop.run(_measure(url))
    print(f"{key:.0f} {base:.0f} {sys.modules['proxy'].__file__}")


def _run(tree: Path, url: str) -> tuple[float, float]:
    """One measurement of the tree at ``tree`` (its ``proxy`` package), in a child, over
    the emptied Redis at ``url``."""
    from loadtest.bench.servers import flush_redis

    flush_redis(url)
    with tempfile.TemporaryDirectory() as elsewhere:  # not the work tree's ``proxy``
        done = subprocess.run(
            [sys.executable, __file__, "--child", url],
            env={**os.environ, "PYTHONPATH": str(tree)},
            cwd=elsewhere, capture_output=True, text=True, timeout=600, check=True,
        )  # fmt: skip
    key, base, where = done.stdout.split()
    if not where.startswith(str(tree)):
        raise SystemExit(f"measured {where}, not the tree at {tree}")
    return float(key), float(base)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.key_path", description=__doc__)
    parser.add_argument("--baseline", metavar="REV", help="also measure this git revision")
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child)
        return 0
    from loadtest.bench.servers import Processes, start_redis, trees

    with tempfile.TemporaryDirectory() as tmp, trees(args.baseline) as measured:
        procs = Processes(Path(tmp))
        try:
            url = start_redis(procs)
            _compare(measured, url)
        finally:
            procs.stop_all()
    return 0


def _compare(measured: dict[str, Path], url: str) -> None:
    """Each tree of ``measured`` (by name) ``_TURNS`` times, in turns; then their ranges."""
    figures: dict[str, list[float]] = {name: [] for name in measured}
    for _ in range(_TURNS):
        for name, tree in measured.items():
            key, base = _run(tree, url)
            figures[name].append(key)
            print(f"{name}: key path {key:,.0f} ns per request (base {base:,.0f})", flush=True)
    line = ", ".join(f"{name} {min(f):,.0f}-{max(f):,.0f}" for name, f in figures.items())
    print(f"key path, CPU ns per request (range of {_TURNS} runs): {line}")


if __name__ == "__main__":
    raise SystemExit(main())
