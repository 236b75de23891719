"""The locustfile's helpers. Importing locust monkey-patches the standard library with
gevent, so this runs them in a child interpreter, never in the test process."""

from __future__ import annotations

import csv
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from support.ports import free_port
from support.waiting import wait_until

from proxy.fake_upstream import FakeUpstreamConfig, run_in_thread

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("locust") is None, reason="locust is not installed (dev extra)"
)

CHECKS = r"""
import random
from loadtest import locustfile as lf

rng = random.Random(1)
a, b = lf.random_prompt(5, rng), lf.random_prompt(5, rng)
assert a != b and len(a.split()) == 6, (a, b)
body = lf.chat_body(True, rng)
assert body["stream"] is True and body["max_tokens"] == 7 and body["model"] == "m-1"
assert lf.chat_body(False, rng).get("stream") is None
assert lf.first_token_seen(b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n')
assert not lf.first_token_seen(b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n')
assert not lf.first_token_seen(b"data: [DONE]\n") and not lf.first_token_seen(b"\n")
assert lf.error_code('{"error": {"code": "model_capacity"}}') == "model_capacity"
assert lf.error_code("nope") == "unparseable error body"
assert lf._keys() == ["k1", "k2"]
assert lf.STREAM_SHARE == 0.5
assert lf.ttft_summary([]) == {"count": 0}
summary = lf.ttft_summary([float(ms) for ms in range(1, 101)])
assert summary == {"count": 100, "p50": 50.0, "p90": 90.0, "p99": 99.0}, summary
print("ok")
"""


@pytest.mark.slow
def test_locustfile_helpers() -> None:
    env = {
        **os.environ,
        "LOCUST_API_KEYS": "k1, k2,",
        "LOCUST_MODEL": "m-1",
        "LOCUST_MAX_TOKENS": "7",
        "LOCUST_STREAM_SHARE": "0.5",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-c", CHECKS], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.slow
def test_without_keys_given_locust_uses_the_stacks_client_keys() -> None:
    """The README's standalone Locust command against `make stack` works as pasted."""
    import yaml

    stack = yaml.safe_load((ROOT / "config/stack/proxy.yaml").read_text())
    defaults = [k["key"].split(":-", 1)[1].rstrip("}") for k in stack["keys"]]
    env = {k: v for k, v in os.environ.items() if k != "LOCUST_API_KEYS"}
    env["PYTHONPATH"] = str(ROOT)
    code = "from loadtest import locustfile as lf; print(','.join(lf._keys()))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().split(",") == defaults


@pytest.mark.slow
def test_time_to_first_token_is_reported_outside_locusts_totals(tmp_path: Path) -> None:
    """A short headless run with two worker processes against a proxy without client
    keys (the demo's key has a small limit of its own): Locust's rows are the requests
    themselves (`Aggregated` = `chat` + `chat stream`, no TTFT row), and the time to first
    token of every stream reaches the master and its own CSV."""
    port = free_port()
    upstream = run_in_thread(FakeUpstreamConfig(port=0, latency=0.01))
    config = tmp_path / "proxy.yaml"
    deployment = {"id": "fake", "base_url": f"{upstream.url}/v1", "api_key": "sk-fake-upstream"}
    config.write_text(
        yaml.safe_dump({"models": [{"name": "gpt-4o-mini", "deployments": [deployment]}]})
    )
    demo = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        wait_until(lambda: _ready(port), timeout=30, what="the proxy ready")
        load_env = {**os.environ, "LOCUST_STREAM_SHARE": "0.5", "LOCUST_USER_RATE": "5"}
        done = subprocess.run(
            [sys.executable, "-m", "locust", "-f", str(ROOT / "loadtest/locustfile.py"),
             "--headless", "-u", "2", "-r", "2", "-t", "3s", "--processes", "2",
             "--host", f"http://127.0.0.1:{port}", "--csv", str(tmp_path / "run"),
             "--only-summary"],
            capture_output=True, text=True, env=load_env, timeout=120, cwd=tmp_path,
        )  # fmt: skip
    finally:
        os.killpg(demo.pid, signal.SIGTERM)
        demo.wait(timeout=15)
        upstream.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    with (tmp_path / "run_stats.csv").open() as f:
        rows = {row["Name"]: int(row["Request Count"]) for row in csv.DictReader(f)}
    assert set(rows) == {"chat", "chat stream", "Aggregated"}, rows
    assert rows["Aggregated"] == rows["chat"] + rows["chat stream"]
    with (tmp_path / "run_ttft.csv").open() as f:
        (ttft,) = list(csv.DictReader(f))
    assert int(ttft["count"]) == rows["chat stream"] > 0
    assert float(ttft["p50_ms"]) <= float(ttft["p99_ms"])
    assert f"TTFT ms: n={rows['chat stream']} " in done.stdout + done.stderr


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
