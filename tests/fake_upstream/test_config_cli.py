"""Options: validation, latency forms, the CLI (flags and a real process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from proxy.fake_upstream import FakeUpstreamConfig, parse_latency
from proxy.fake_upstream.cli import build_parser, config_from_args

ROOT = Path(__file__).resolve().parents[2]


def test_latency_forms() -> None:
    assert parse_latency(0.05) == 0.05
    assert parse_latency("0.05") == 0.05
    assert parse_latency("0.02-0.2") == (0.02, 0.2)
    assert parse_latency([0.1, 0.1]) == 0.1
    assert FakeUpstreamConfig(latency="0.02-0.2").latency_range == (0.02, 0.2)
    for bad in ("fast", "0.2-0.1", "-1", [1], True):
        with pytest.raises(ValueError):
            parse_latency(bad)


def test_config_validation() -> None:
    assert FakeUpstreamConfig(rpm=0, tpm=0).rpm is None
    for bad in (
        {"fail_rate": 1.5},
        {"fail_rate": 0.6, "drop_rate": 0.6},
        {"fail_status": 200},
        {"window": 0},
        {"stream_chunks": 0},
        {"rpm": -1},
        {"port": 70000},
    ):
        with pytest.raises(ValueError):
            FakeUpstreamConfig(**bad)
    config = FakeUpstreamConfig()
    with pytest.raises(ValueError, match="fixed"):
        config.updated({"host": "0.0.0.0"})
    with pytest.raises(ValueError):
        config.updated({"fail_rate": True})
    assert config.updated({"rpm": 10}).rpm == 10
    assert config.rpm is None  # updates make copies


def test_cli_flags_map_to_the_config() -> None:
    argv = ["--port", "0", "--latency", "0.01-0.02", "--rpm", "60", "--tpm", "1000"]
    argv += ["--window", "1", "--fail-rate", "0.1", "--seed", "3", "--models", "a, b"]
    config = config_from_args(build_parser().parse_args(argv))
    assert config.latency == (0.01, 0.02)
    assert (config.rpm, config.tpm, config.window) == (60, 1000, 1.0)
    assert (config.fail_rate, config.seed, config.models) == (0.1, 3, ("a", "b"))


@pytest.mark.slow
def test_cli_serves_until_sigterm() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "loadtest.fake_upstream", "--port", "0", "--rpm", "7"]
    with subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True) as process:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert "listening on http://127.0.0.1:" in line
        assert "rpm=7" in line
        url = line.split("listening on ")[1].split()[0]
        assert httpx.get(url + "/v1/models", timeout=5).status_code == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0


def test_cli_flags_for_the_input_output_windows_and_cache_counts() -> None:
    argv = ["--itpm", "500", "--otpm", "100", "--cache-read-tokens", "7"]
    argv += ["--cache-write-tokens", "3"]
    config = config_from_args(build_parser().parse_args(argv))
    assert (config.itpm, config.otpm) == (500, 100)
    assert (config.cache_read_tokens, config.cache_write_tokens) == (7, 3)
    assert "itpm=500" in config.describe() and "otpm=100" in config.describe()
    for bad in ({"itpm": -1}, {"cache_read_tokens": -1}, {"cache_write_tokens": 1.5}):
        with pytest.raises(ValueError):
            FakeUpstreamConfig(**bad)  # type: ignore[arg-type]
    assert FakeUpstreamConfig().updated({"otpm": 10}).otpm == 10
