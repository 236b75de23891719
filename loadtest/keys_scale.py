"""Client keys at scale: start-up, memory, reload and admin reads with N keys.

    python -m loadtest.keys_scale --keys 100000 --source config
    python -m loadtest.keys_scale --keys 100000 --source api          # keys in Redis
    python -m loadtest.keys_scale --keys 100000 --source config --code /tmp/baseline

One ``llm-proxy serve`` (1 worker) in front of the built-in fake upstream (a process of
its own). ``--source config``: N keys in the YAML file, each with rpm and tpm; ``api``: N
keys created through the admin API's store in a Redis started for the run (written
straight to Redis in bulk, as N ``POST /admin/keys`` would leave them), one in the file.
``--code``: another checkout to measure (the commit before issue 31, for the side by side
of docs/benchmarks.md), run from its root with this interpreter.

Measured: start to ready (``/health/ready`` 200), the serving process's RSS, the reload
(``POST /admin/reload`` after a change of one key's rpm) and the longest request stall
during it (4 clients sending requests all along: the slowest answer seen while the reload
runs, against the slowest before it), ``GET /admin/state`` and the first page of
``GET /admin/keys``. Prints one JSON object. Not a CI test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

ADMIN_KEY = "admin-secret-key"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
HERE = Path(__file__).resolve().parent.parent
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _secret(i: int) -> str:
    return f"sk-client-{i:07d}"


def _config(keys: int, upstream: str, redis_url: str, source: str) -> dict[str, Any]:
    in_file = keys if source == "config" else 1
    return {
        "redis": {"url": redis_url},
        "admin": {"keys": [ADMIN_KEY]},
        "keys": [
            {"name": f"key-{i}", "key": _secret(i), "rpm": 100_000, "tpm": 100_000_000}
            for i in range(in_file)
        ],
        "models": [{"name": "gpt-4o-mini", "deployments": [{"id": "a", "base_url": upstream}]}],
    }


def _seed_redis(redis_url: str, keys: int) -> None:
    """N run-time keys as the API stores them (records, version, change log)."""
    import redis

    from proxy.keys import redis_backend
    from proxy.keys.records import KeyRecord, digest_of

    client = redis.Redis.from_url(redis_url)
    now = time.time()
    pipe = client.pipeline(transaction=False)
    for i in range(1, keys):
        spec = {"rpm": 100_000, "tpm": 100_000_000}
        record = KeyRecord(f"api-{i}", spec, digest_of(_secret(i)), now, now)
        pipe.hset(redis_backend.RECORDS, record.name, record.to_json())
        if i % 5000 == 0:
            pipe.execute()
    pipe.set(redis_backend.VERSION, keys)
    pipe.execute()


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _start(argv: list[str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv,
        cwd=cwd,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(cwd)},
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


async def _drive(
    url: str,
    secret: str,
    until: asyncio.Event,
    latencies: list[tuple[float, float]],
    failures: list[float],
) -> None:
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
    }
    async with httpx.AsyncClient(
        timeout=60, headers={"authorization": f"Bearer {secret}"}
    ) as client:
        while not until.is_set():
            start = time.monotonic()
            try:
                answer = await client.post(f"{url}/v1/chat/completions", json=body)
                ok = answer.status_code == 200
            except httpx.HTTPError:
                ok = False
            latencies.append((start, time.monotonic() - start))
            if not ok:
                failures.append(start)


async def _reload_under_load(url: str, config_path: Path, changed: str) -> dict[str, float]:
    """The file is rewritten (``changed``, made beforehand: dumping 100,000 keys in this
    process would slow its clients) and reloaded while 4 clients send requests."""
    stop = asyncio.Event()
    latencies: list[tuple[float, float]] = []
    failures: list[float] = []
    clients = [
        asyncio.create_task(_drive(url, _secret(0), stop, latencies, failures)) for _ in range(4)
    ]
    await asyncio.sleep(2.0)  # a steady state first
    await asyncio.to_thread(config_path.write_text, changed)
    async with httpx.AsyncClient(timeout=300, headers=ADMIN) as admin:
        begin = time.monotonic()
        answer = await admin.post(f"{url}/admin/reload")
        end = time.monotonic()
    assert answer.status_code == 200, answer.text
    await asyncio.sleep(1.0)
    stop.set()
    await asyncio.gather(*clients)
    before = [d for s, d in latencies if s + d < begin]
    during = [d for s, d in latencies if s + d >= begin and s <= end]
    return {
        "reload_s": round(end - begin, 3),
        "slowest_request_before_ms": round(1000 * max(before, default=0), 1),
        "slowest_request_during_reload_ms": round(1000 * max(during, default=0), 1),
        "requests_during_reload": len(during),
        "failed_requests": len(failures),
    }


def measure(keys: int, source: str, code: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        processes: list[subprocess.Popen[bytes]] = []
        try:
            up_port = _port()
            processes.append(
                _start(
                    [sys.executable, "-m", "proxy", "fake-upstream", "--port", str(up_port)],
                    HERE,
                    work / "upstream.log",
                )
            )
            redis_url = ""
            if source == "api":
                redis_port = _port()
                processes.append(
                    _start(
                        [
                            "redis-server",
                            "--port",
                            str(redis_port),
                            "--save",
                            "",
                            "--appendonly",
                            "no",
                        ],
                        work,
                        work / "redis.log",
                    )
                )
                redis_url = f"redis://127.0.0.1:{redis_port}"
                _wait(lambda: _answers(redis_url))
                _seed_redis(redis_url, keys)
            config = _config(keys, f"http://127.0.0.1:{up_port}/v1", redis_url, source)
            config_path = work / "proxy.yaml"
            config_path.write_text(yaml.dump(config, Dumper=_DUMPER))
            port = _port()
            url = f"http://127.0.0.1:{port}"
            started = time.monotonic()
            proxy = _start(
                [
                    sys.executable,
                    "-m",
                    "proxy",
                    "serve",
                    "--config",
                    str(config_path),
                    "--port",
                    str(port),
                    "--workers",
                    "1",
                ],
                code,
                work / "proxy.log",
            )
            processes.append(proxy)
            _wait(lambda: _ready(url), timeout=600)
            ready = time.monotonic() - started
            # The API's last key answers once the store has loaded (with Redis).
            probe = _secret(keys - 1)
            results: dict[str, Any] = {
                "keys": keys,
                "source": source,
                "code": str(code),
                "start_to_ready_s": round(ready, 2),
                "rss_mb": round(_rss_mb(proxy.pid), 1),
                "last_key_answers": _status(url, probe) == 200,
            }
            begin = time.monotonic()
            state = httpx.get(f"{url}/admin/state", headers=ADMIN, timeout=300)
            results["admin_state_s"] = round(time.monotonic() - begin, 3)
            results["admin_state_kib"] = round(len(state.content) / 1024, 1)
            begin = time.monotonic()
            page = httpx.get(
                f"{url}/admin/keys", headers=ADMIN, params={"per_page": 100}, timeout=300
            )
            results["admin_keys_first_page_s"] = (
                round(time.monotonic() - begin, 3) if page.status_code == 200 else None
            )
            config["keys"][0]["rpm"] = 99_999
            changed = yaml.dump(config, Dumper=_DUMPER)
            results.update(asyncio.run(_reload_under_load(url, config_path, changed)))
            results["rss_after_reload_mb"] = round(_rss_mb(proxy.pid), 1)
            return results
        finally:
            for process in reversed(processes):
                _stop(process)


def _answers(redis_url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(redis_url).ping())
    except redis.RedisError:
        return False


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _status(url: str, secret: str) -> int:
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
    }
    return httpx.post(
        f"{url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {secret}"}
    ).status_code


def _wait(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError("not ready in time")
        time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--source", choices=("config", "api"), default="config")
    parser.add_argument("--code", type=Path, default=HERE, help="the checkout to run")
    args = parser.parse_args()
    print(json.dumps(measure(args.keys, args.source, args.code.resolve())))


if __name__ == "__main__":
    main()
