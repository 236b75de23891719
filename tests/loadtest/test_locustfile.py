"""The locustfile's helpers. Importing locust monkey-patches the standard library with
gevent, so this runs them in a child interpreter, never in the test process."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
