"""The peer gateway (TensorZero): what it is given, so that it does the proxy's job against
the bench's fake upstream and Redis and talks to nothing but 127.0.0.1; and, where the
package is installed, that it does."""

from __future__ import annotations

import ipaddress
import tomllib
from pathlib import Path

import openai
import pytest
import redis

from loadtest.bench import peer
from loadtest.bench.model import COMPARED, HEADLINE, LARGE_BURST_REDIS, PEER, TARGETS
from loadtest.bench.servers import (
    PeerUnavailable,
    Processes,
    foreign_remotes,
    is_loopback,
    remote_addresses,
    servers,
    start_peer,
)

UPSTREAM = "http://127.0.0.1:41234"


def _config(rule: str = peer.DEFAULT_RULE) -> dict[str, object]:
    return tomllib.loads(peer.tensorzero_config(UPSTREAM, rule))


def test_its_one_model_is_an_openai_compatible_provider_at_the_fake_upstream() -> None:
    models = _config()["models"]
    assert isinstance(models, dict) and list(models) == ["gpt-4o-mini"]
    assert models["gpt-4o-mini"]["routing"] == ["fake"]
    assert models["gpt-4o-mini"]["providers"]["fake"] == {
        "type": "openai",
        "api_base": f"{UPSTREAM}/v1/",
        "model_name": "gpt-4o-mini",
        "api_key_location": f"env::{peer.UPSTREAM_KEY_VARIABLE}",
    }
    assert PEER.model == "tensorzero::model_name::gpt-4o-mini"
    assert PEER.path == "/openai/v1/chat/completions"


def test_one_rate_limit_rule_applies_to_every_request_and_never_trips() -> None:
    limiting = _config()["rate_limiting"]
    assert isinstance(limiting, dict) and limiting["enabled"] is True
    (rule,) = limiting["rules"]
    assert rule["always"] is True  # no scope, no priority: every request
    assert rule["model_inferences_per_minute"] >= 1_000_000_000
    assert rule["tokens_per_minute"] >= 1_000_000_000
    assert PEER.config == peer.DEFAULT_RULE == "requests+tokens"  # as our key: rpm and tpm


def test_its_rule_may_limit_requests_only() -> None:
    limiting = _config("requests")["rate_limiting"]
    assert isinstance(limiting, dict)
    (rule,) = limiting["rules"]
    assert rule == {"always": True, "model_inferences_per_minute": peer.NEVER_TRIPS}


def test_it_reports_no_usage_and_needs_no_clickhouse_or_postgres() -> None:
    config = _config()
    assert config["gateway"] == {
        "disable_pseudonymous_usage_analytics": True,
        "observability": {"enabled": False},
    }
    assert set(config) == {"gateway", "models", "rate_limiting"}
    text = peer.tensorzero_config(UPSTREAM)
    assert "http" not in text.replace(UPSTREAM, "")  # no other address


def test_its_environment_keeps_it_on_loopback_and_holds_the_upstream_key() -> None:
    base = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "https_proxy": "http://proxy.example:3128",
        "ALL_PROXY": "socks5://proxy.example",
        "TENSORZERO_HOWDY_URL": "https://howdy.example",
        "TENSORZERO_CLICKHOUSE_URL": "http://clickhouse.example",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://otel.example",
        "OPENAI_API_KEY": "sk-real",
        "RUST_LOG": "trace",
    }
    env = peer.gateway_env(base)
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "TENSORZERO_DISABLE_PSEUDONYMOUS_USAGE_ANALYTICS": "1",
        "NO_COLOR": "1",
        peer.UPSTREAM_KEY_VARIABLE: peer.UPSTREAM_KEY,
    }


def test_its_limiter_uses_its_own_database_of_the_benchs_redis() -> None:
    assert peer.valkey_url("redis://127.0.0.1:6390/0") == "redis://127.0.0.1:6390/2"


def test_the_peer_is_a_target_of_its_own_not_one_of_the_proxys() -> None:
    assert PEER.slug == "tensorzero" and PEER.peer and not PEER.proxy
    assert PEER not in TARGETS
    assert all(t.proxy for t in TARGETS if t.backend is not None)
    assert COMPARED == (HEADLINE, LARGE_BURST_REDIS)  # the headline first
    assert LARGE_BURST_REDIS.label == "proxy, Redis, 2 workers, burst 100000"
    baseline = HEADLINE.at("abc1234")
    assert (baseline.path, baseline.model) == (HEADLINE.path, HEADLINE.model)
    assert baseline.slug == "redis-2w-default-baseline"


def test_remote_addresses_are_read_from_procs_socket_tables() -> None:
    table = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt"
        "   uid  timeout inode\n"
        "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000"
        "     0        0 111 1 0 100 0 0 10 0\n"
        "   1: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000"
        "     0        0 222 1 0 20 4 30 10 -1\n"
        "   2: 0A00000A:9C41 22D8B85D:01BB 02 00000000:00000000 00:00000000 00000000"
        "     0        0 333 1 0 20 4 30 10 -1\n"
    )
    assert remote_addresses(table) == {222: "127.0.0.1", 333: "93.184.216.34"}
    v6 = (
        "  sl  local_address                         remote_address ...\n"
        "   0: 0000000000000000FFFF00000100007F:9C40 0000000000000000FFFF00000100007F:1F90"
        " 01 00000000:00000000 00:00000000 00000000     0        0 444 1 0 20 4 30 10 -1\n"
    )
    assert remote_addresses(v6) == {444: str(ipaddress.ip_address("::ffff:127.0.0.1"))}
    assert (
        is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback(remote_addresses(v6)[444])
    )
    assert not is_loopback("93.184.216.34")


def test_without_the_package_the_peer_is_unavailable_with_a_clean_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "tensorzero.py").write_text('raise ImportError("not here")\n')
    monkeypatch.setenv("PYTHONPATH", str(shim))
    procs = Processes(tmp_path)
    try:
        with pytest.raises(PeerUnavailable, match="tensorzero is not installed"):
            start_peer(procs, UPSTREAM, "redis://127.0.0.1:1/0")
    finally:
        procs.stop_all()
    assert procs.started == []


@pytest.mark.slow
def test_the_peer_answers_through_its_redis_limiter_and_talks_to_loopback_only(
    tmp_path: Path,
) -> None:
    pytest.importorskip("tensorzero", reason="the peer gateway is installed by `make bench`")
    with servers(tmp_path) as (procs, upstream_url, redis_url):
        process, url, _ = start_peer(procs, upstream_url, redis_url)
        client = openai.OpenAI(base_url=f"{url}/openai/v1", api_key="sk-bench-client")
        answer = client.chat.completions.create(
            model=PEER.model,
            max_tokens=16,
            messages=[{"role": "user", "content": "Benchmark: say something short."}],
        )
        assert answer.choices[0].message.content
        with redis.Redis.from_url(peer.valkey_url(redis_url)) as db:
            assert any(k.startswith(b"tensorzero_ratelimit") for k in db.scan_iter())
        assert foreign_remotes(process.pid) == []
