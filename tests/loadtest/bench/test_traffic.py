"""The real-traffic bench's pure parts: its shapes and configs, the saturated row's plan
and fair share, the rounds' bookkeeping, the run's plan and the report's sections."""

from __future__ import annotations

import hashlib

from loadtest.bench import plan, saturation, traffic
from loadtest.bench.model import DEFAULT_TARGETS, PEER, Run
from loadtest.bench.real import BEFORE, DIRECT, PROXY, ROWS, RowResult, row_plan
from loadtest.bench.report_real import render_real, spread
from loadtest.bench.rounds import Rounds, Sample, plan_order
from loadtest.bench.saturation import SaturationResult, SaturationRound
from proxy.config.settings import parse_settings


def test_keys_are_deterministic_listed_by_sha256_and_some_tiers_are_low() -> None:
    entries = [traffic.key_entry(i, traffic.REAL) for i in range(1_000)]
    assert traffic.key_secret(123) == "sk-bench-000123"
    digest = hashlib.sha256(b"sk-bench-000123").hexdigest()
    assert entries[123]["key_sha256"] == digest and "key" not in entries[123]
    tiers = [traffic.tier_of(i).name for i in range(1_000)]
    assert tiers.count("rpm-bound") == 100 and tiers.count("tpm-bound") == 50
    assert {e["name"] for e in entries} == {f"key-{i:06d}" for i in range(1_000)}


def test_the_real_config_is_valid_and_has_30_deployments_on_three_providers_shapes() -> None:
    config = traffic.proxy_config(
        traffic.REAL, {g.model: ["http://127.0.0.1:1"] for g in traffic.GROUPS}, "redis://x/0"
    )
    settings = parse_settings(config)
    assert len(settings.models) == 3
    deployments = [d for m in config["models"] for d in m["deployments"]]  # type: ignore[attr-defined]
    assert len(deployments) == 30 and len({d["id"] for d in deployments}) == 30
    anthropic = [d for d in deployments if d.get("provider") == "anthropic"]
    assert len(anthropic) == 10 and anthropic[0]["base_url"] == "http://127.0.0.1:1"
    assert {"input_tokens": 2_000_000, "per": "1m"} in anthropic[0]["limits"]
    assert sorted({d["rpm"] for d in deployments}) == [10_000, 20_000, 30_000]
    assert "1,000 keys, 30 deployments at 10,000-30,000 rpm" in traffic.REAL.describe()


def test_strict_upstreams_are_one_per_deployment_and_the_saturated_keys_have_weights() -> None:
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"]
    config = traffic.proxy_config(saturation.SHAPE, {"gpt-4o": urls}, "redis://x/0")
    parse_settings(config)
    bases = [d["base_url"] for d in config["models"][0]["deployments"]]  # type: ignore[index]
    assert bases == [f"{u}/v1" for u in urls]
    key = config["keys"][0]  # type: ignore[index]
    assert (key["weight"], key["max_wait"]) == (1, "1s")


def test_wrk_is_told_the_groups_shares_and_the_replicas_ports() -> None:
    env = traffic.wrk_env(traffic.REAL, [8001, 8002])
    assert env["BENCH_GROUPS"] == (
        "chat:gpt-4o-mini:55,messages:claude-sonnet:30,responses:gpt-4o:15"
    )
    assert (env["BENCH_KEYS"], env["BENCH_PORTS"], env["BENCH_STREAM_PERCENT"]) == (
        "1000",
        "8001,8002",
        "20",
    )


def test_the_saturated_threads_would_send_the_demand_heavy_keys_twice_the_light() -> None:
    keys, delays = saturation.thread_plan()
    assert keys == [k for k in range(8) for _ in range(2)]  # a thread per key and replica
    per_thread = saturation.CONNECTIONS // len(keys)
    rate = sum(per_thread / (d / 1000) for d in delays)
    assert abs(rate - saturation.DEMAND * saturation.LIMIT_RPS) < 1e-6
    assert delays[0] * 2 == delays[-1]


def test_fair_share_is_the_least_over_the_most() -> None:
    assert saturation.fair_share({0: 50, 1: 40, 2: 25}) == 0.5
    assert saturation.fair_share({}) is None and saturation.fair_share({0: 0}) is None


def _run(rps: float, p50: float, p99: float, non_2xx: int = 0) -> Run:
    return Run(64, int(rps * 5), 5.0, p50, p50 * 1.5, p99, 0, non_2xx)


def _rounds() -> Rounds:
    return Rounds(
        [
            {
                (PROXY, 64): Sample(_run(2000, 30, 90, 100), cpu_s=4.0, redis_cpu_s=1.0),
                (BEFORE, 64): Sample(_run(1600, 40, 120), cpu_s=4.0),
                (DIRECT, 1): Sample(_run(5000, 0.2, 1.0)),
                (PROXY, 1): Sample(_run(600, 1.2, 5.0), cpu_s=1.0),
            },
            {
                (PROXY, 64): Sample(_run(2200, 28, 80), cpu_s=4.4),
                (BEFORE, 64): Sample(_run(2000, 35, 100), cpu_s=4.0),
                (DIRECT, 1): Sample(_run(5000, 0.3, 1.0)),
                (PROXY, 1): Sample(_run(600, 1.5, 6.0), cpu_s=1.0),
            },
        ]
    )


def test_rounds_alternate_their_order_and_compare_sides_round_by_round() -> None:
    slots = [(PROXY, 64), (DIRECT, 1)]
    assert plan_order(slots, 0) == slots and plan_order(slots, 1) == slots[::-1]
    rounds = _rounds()
    assert rounds.values(PROXY, 64, lambda s: s.cpu_us) == [400.0, 400.0]
    assert rounds.ratios(PROXY, BEFORE, 64, lambda s: s.run.rps) == [1.25, 1.1]
    assert rounds.differences(PROXY, DIRECT, 1, lambda s: s.run.p50_ms) == [1.0, 1.2]


def test_a_baselines_slices_come_right_before_the_work_trees() -> None:
    assert row_plan(ROWS[0], baseline=True) == [
        (BEFORE, 64), (PROXY, 64), (BEFORE, 256), (PROXY, 256), (DIRECT, 1),
        (BEFORE, 1), (PROXY, 1),
    ]  # fmt: skip
    assert row_plan(ROWS[0], baseline=False) == list(ROWS[0].plan)


def test_make_benchs_default_plan_fits_in_15_minutes() -> None:
    rounds, duration, warmup = 5, 10.0, 2.0  # the defaults
    steps = [
        *plan.real_steps(list(ROWS), rounds, duration, warmup, False),
        *plan.saturation_steps(rounds, duration),
        *plan.target_steps([*DEFAULT_TARGETS, PEER], duration, warmup),
        *plan.compare_steps(1, 0, rounds, duration),
    ]
    total = sum(seconds for _, seconds in steps)
    assert total <= 15 * 60 - 60  # a minute left for what the estimate does not count
    assert plan.render(steps)[-1].startswith(f"  in all: about {total:.0f} s")


def test_the_real_traffic_section_gives_each_figure_with_its_range_and_command() -> None:
    result = RowResult(ROWS[0], _rounds(), [1.1, 1.2], [78.0, 79.0], [88.0, 89.0], "e0ffaca")
    saturated = SaturationResult(
        [
            SaturationRound(_run(50, 600, 990), 10.0, 283, 0, 200, 80, 0, {0: 30, 4: 24}),
            SaturationRound(_run(48, 620, 980), 10.0, 280, 0, 190, 85, 0, {0: 28, 4: 26}),
        ]
    )
    text = "\n".join(render_real([result], saturated, 2, 10.0))
    assert "## Real traffic (the headline)" in text
    assert (
        "`python -m loadtest.bench --only real --rounds 2 --duration 10 --baseline e0ffaca`" in text
    )
    assert "| req/s at 64 connections | 2,100 (2,000 to 2,200) | 1,800 (1,600 to 2,000)" in text
    assert "| 1.18x (1.10 to 1.25) |" in text
    assert "| added p50 at 1 connection (vs. direct) | +1.10 ms (+1.00 to +1.20) |" in text
    assert "| non-2xx at 64 connections (the keys' own 429s) | 0.5% (0.0 to 1.0) |" in text
    assert "| upstream 429s (all rounds: 0) |" in text
    assert "| share of the limit used (upstream's served) | 93.8% (93.3 to 94.3) |" in text
    assert "LiteLLM and Portkey are not installed" in text
    assert spread([], ".1f") == "n/a" and spread([2.0], ".1f", " s") == "2.0 s"


def test_a_rows_command_says_how_its_other_side_was_measured() -> None:
    from loadtest.bench.report_real import command

    assert command("real", 5, 10) == "python -m loadtest.bench --only real --rounds 5 --duration 10"
    assert command("real", 3, 4, "e0ffaca").endswith("--duration 4 --baseline e0ffaca")
    assert command("real", 3, 4, "without-lean").endswith("--duration 4 --without lean")
