"""The benchmark's report: overhead against the direct run, the targets' verdicts, the
table and the Markdown page, and the before-and-after comparison. No wrk, no servers."""

from __future__ import annotations

from loadtest.bench.model import (
    HEADLINE,
    LARGE_BURST_REDIS,
    PEER,
    TARGETS,
    Alternation,
    BenchReport,
    Environment,
    Round,
    Run,
    TargetResult,
    Turn,
)
from loadtest.bench.report import (
    keep_addenda,
    overhead,
    render_markdown,
    render_peer_summary,
    render_table,
    verdicts,
)

ONE_KEY = "one key, one deployment at 6,000,000 rpm"  # the row that was the headline


def _run(connections: int, rps: float, p50: float) -> Run:
    return Run(connections, int(rps * 10), 10.0, p50, p50 * 2, p50 * 5, 0, 0)


def _report() -> BenchReport:
    direct, _nolimit, memory1, memory2, redis1, redis2, _headline = TARGETS
    results = [
        TargetResult(direct, {1: _run(1, 4000, 0.25), 64: _run(64, 12000, 5.0)}),
        TargetResult(memory1, {1: _run(1, 1500, 0.9), 64: _run(64, 1800, 30)}, 0.8, [70.0]),
        TargetResult(
            memory2, {1: _run(1, 1500, 0.9), 64: _run(64, 3000, 20)}, 1.4, [70.0, 71.0], 66.0
        ),
        TargetResult(redis1, {1: _run(1, 900, 1.6), 64: _run(64, 1200, 50)}, 0.9, [72.0]),
        TargetResult(
            redis2, {1: _run(1, 900, 1.7), 64: _run(64, 2100, 30)}, 2.5, [72.0, 73.0], 66.0
        ),
    ]
    env = Environment(
        cpu="Test CPU",
        cores=2,
        memory_gb=8.0,
        system="Linux 6",
        python="3.11.7",
        packages={"llm-proxy": "0.1.0"},
        tools={"wrk": "wrk 4.1.0"},
        commit="abc1234",
        foreign_cores=0.05,
    )
    return BenchReport(results, env, "make bench", 10.0, chart="benchmarks.png")


def test_overhead_is_relative_to_the_direct_run() -> None:
    report = _report()
    ratio, added = overhead(report, report.results[2])
    assert ratio == 3000 / 12000
    assert added is not None and abs(added - 0.65) < 1e-9
    assert overhead(report, report.results[0]) == (None, None)


def test_a_paired_measurement_of_the_added_latency_takes_precedence() -> None:
    report = _report()
    report.results[3].added_ms = 0.8  # measured against adjacent direct slices
    assert overhead(report, report.results[3])[1] == 0.8


def test_verdicts_compare_with_the_targets_honestly() -> None:
    by_name = {v.name.split(" (")[0]: v for v in verdicts(_report())}
    assert by_name["throughput"].met is True  # 2,100 >= 2,000
    added = [v for v in verdicts(_report()) if v.name.startswith("added median")]
    assert [v.met for v in added] == [True, False]  # memory +0.65 ms, Redis +1.35 ms
    assert by_name["idle memory per worker"].met is True
    assert by_name["start to ready"].met is False  # 2.5 s
    assert by_name["start to ready"].measured == "2.50 s"


def test_markdown_has_every_figure_machine_and_command() -> None:
    text = render_markdown(_report())
    assert text.startswith("# Benchmarks")
    assert "| proxy, Redis, 2 workers, burst 100000 | 64 | 2,100 |" in text
    assert "| direct to the fake upstream | 1 | 4,000 | 0.25 |" in text
    assert (
        "| proxy, memory, 2 workers, burst 100000 | 0.25x | +0.65 ms | 70 MB, 71 MB | 66 MB"
        " | 1.40 s |"
    ) in text
    assert "| start to ready (slowest) | <= 2 s | 2.50 s | **no** |" in text
    assert "Test CPU, 2 cores" in text and "llm-proxy 0.1.0" in text and "abc1234" in text
    assert "```sh\nmake bench\n```" in text
    assert "used 0.05 cores" in text
    assert "![" in text and "(benchmarks.png)" in text


def test_table_lists_every_run() -> None:
    table = render_table(_report())
    assert table.count("\n") >= 10
    assert "proxy, Redis, 2 workers, burst 100000" in table and "2100" in table


def test_before_and_after_gives_each_figure_as_the_median_of_alternated_rounds() -> None:
    report = _report()
    memory1 = report.results[1].target
    assert memory1.at("70e910d").slug == "memory-1w-baseline"
    rounds = [
        Round(Turn(2000, 500, 0.80), Turn(1800, 550, 0.90)),  # 0.90x, 1.10x, +0.10
        Round(Turn(1000, 600, 0.90), Turn(1100, 540, 0.85)),  # 1.10x, 0.90x, -0.05
        Round(Turn(1500, 500, 1.00), Turn(1500, 500, 1.02)),  # 1.00x, 1.00x, +0.02
    ]
    report.alternations.append(Alternation(memory1, "70e910d", rounds))
    assert report.baseline == "70e910d"
    text = render_markdown(report)
    assert "## Before and after: 70e910d vs this commit" in text
    assert "for 3 rounds" in text
    assert (
        "| proxy, memory, 1 worker, burst 100000 | 1,500 | 1,500 | 1.00x (0.90 to 1.10)"
        " | 500 us | 540 us | 1.00x (0.90 to 1.10) | +0.02 ms (-0.05 to +0.10) |"
    ) in text
    assert "Before and after" not in render_markdown(_report())


def _with_peer() -> BenchReport:
    """The peer measured (its own rows too) and compared in three rounds with each compared
    config: the default (the headline) first, then the large-burst one."""
    report = _report()
    report.environment.packages["tensorzero"] = "2026.6.0"
    report.results.append(
        TargetResult(PEER, {1: _run(1, 3000, 0.45), 64: _run(64, 9000, 7)}, 9.0, [150.0])
    )
    report.peers = [
        Alternation(
            HEADLINE,
            PEER.label,
            [  # before: the peer; now: ours.  ratio, added (peer, ours)
                Round(Turn(9000, 150, 0.45, 0.20, 20), Turn(4500, 500, 0.80, 0.55, 90)),  # 0.50x
                Round(Turn(10000, 140, 0.42, 0.16, 18), Turn(4000, 520, 0.78, 0.52, 95)),  # 0.40x
                Round(Turn(9000, 145, 0.47, 0.22, 22), Turn(4050, 510, 0.82, 0.60, 92)),  # 0.45x
            ],
        ),
        Alternation(
            LARGE_BURST_REDIS,
            PEER.label,
            [
                Round(Turn(9000, 150, 0.45, 0.20, 20), Turn(6000, 400, 0.60, 0.35, 50)),  # 0.67x
                Round(Turn(10000, 140, 0.42, 0.16, 18), Turn(6100, 390, 0.58, 0.32, 48)),  # 0.61x
                Round(Turn(9500, 145, 0.47, 0.22, 22), Turn(5700, 410, 0.62, 0.38, 52)),  # 0.60x
            ],
        ),
    ]
    return report


def test_the_peer_section_gives_each_configs_ratio_of_alternated_rounds_and_added_latency() -> None:
    text = render_markdown(_with_peer())
    assert "## Peer: TensorZero's gateway" in text
    assert "TensorZero 2026.6.0 from PyPI" in text and "for 3 rounds" in text
    assert "`/openai/v1/chat/completions` (model `tensorzero::model_name::gpt-4o-mini`)" in text
    assert "one rate-limit rule (`requests+tokens`" in text
    headline = text.index(
        f"### proxy, Redis, 2 workers, {ONE_KEY} (the default config's rules, one key and"
    )
    large_burst = text.index(
        "### proxy, Redis, 2 workers, burst 100000 (the bench's large-burst config)"
    )
    assert headline < large_burst  # the one-key config first
    assert (
        f"| proxy, Redis, 2 workers, {ONE_KEY} | 4,050 (4,000 to 4,500)"
        " | 510 us (500 to 520) | 92 us (90 to 95) | +0.55 ms (+0.52 to +0.60) |"
    ) in text[headline:large_burst]
    assert f"{ONE_KEY}: 0.45x (0.40 to 0.50)**" in text[headline:large_burst]
    assert (
        "| TensorZero gateway (Rust), Redis rate limit | 9,500 (9,000 to 10,000)"
        " | 145 us (140 to 150) | 20 us (18 to 22) | +0.20 ms (+0.16 to +0.22) |"
    ) in text[large_burst:]
    assert (
        "| proxy, Redis, 2 workers, burst 100000 | 6,000 (5,700 to 6,100) | 400 us (390 to 410)"
        " | 50 us (48 to 52) | +0.35 ms (+0.32 to +0.38) |"
    ) in text[large_burst:]
    assert "burst 100000: 0.61x (0.60 to 0.67)**" in text[large_burst:]
    # The page's machine and command still close it.
    assert text.index("## Peer") < text.index("## Machine and versions") < text.index("## Command")
    assert "| TensorZero gateway (Rust), Redis rate limit | 64 | 9,000 |" in text


def test_the_page_names_the_one_key_config_and_the_benchs_own_config() -> None:
    text = render_markdown(_report())
    assert "## Configurations" in text and f"| rule | ours: {ONE_KEY} |" in text
    # The default config's pacing beside the fastest gateway (memory, 2 workers: 3,000 req/s).
    assert "allows 100,000 req/s, 33x the most any gateway served in this run (3,000" in text
    assert "**The headline is real traffic**" in text
    assert (
        "**one client key and one deployment whose limit is 6,000,000 requests a minute**" in text
    )
    assert f'("proxy, Redis, 2 workers, {ONE_KEY}": the default config' in text
    assert "The rows named `burst 100000` (`--all-rows`) are the bench's large-burst config" in text


def test_the_peer_comparisons_are_printed_and_checked_against_the_issues_goals() -> None:
    report = _with_peer()
    summary = "\n".join(render_peer_summary(report))
    assert summary.index(f"{ONE_KEY} (the default config's rules") < summary.index(
        "burst 100000 (the bench's large-burst config)"
    )
    assert "ours / peer: 0.45x (0.40 to 0.50)" in summary
    assert "ours / peer: 0.61x (0.60 to 0.67)" in summary
    assert "peer +0.20 ms (+0.16 to +0.22), ours +0.35 ms (+0.32 to +0.38)" in summary
    assert "(rule requests+tokens)" in summary
    found = {v.name: v for v in verdicts(report)}
    headline = f"(proxy, Redis, 2 workers, {ONE_KEY}, "
    large_burst = "(proxy, Redis, 2 workers, burst 100000, "
    ratio = found[f"throughput over the peer's {headline}64 connections, in turns)"]
    assert (ratio.measured, ratio.met) == ("0.45x", False)  # goal 0.90x
    ratio = found[f"throughput over the peer's {large_burst}64 connections, in turns)"]
    assert (ratio.measured, ratio.met) == ("0.61x", False)
    added = found[f"latency added beside the peer's {headline}1 connection, in turns)"]
    assert (added.measured, added.met) == ("+0.55 ms", False)  # goal +0.25 ms
    added = found[f"latency added beside the peer's {large_burst}1 connection, in turns)"]
    assert added.measured == "+0.35 ms"
    by_name = {v.name.split(" (")[0]: v for v in verdicts(report)}
    # The peer's own memory and start-up are not the proxy's goals.
    assert by_name["idle memory per worker"].measured == "73 MB"
    assert by_name["start to ready"].measured == "2.50 s"
    assert "TensorZero gateway (Rust), Redis rate limit" in render_table(report)


def test_issue_33s_goals_are_checked_round_by_round_not_on_the_median() -> None:
    """Every round must pass, so one bad round fails a config whose median passes."""
    report = _with_peer()
    # The large-burst comparison: ours ahead in two rounds of three, and below the peer's
    # added latency in all but the last.
    report.peers[1].rounds = [
        Round(Turn(5000, 150, 0.45, 0.30, 20), Turn(6000, 140, 0.30, 0.20, 2)),  # 1.20x
        Round(Turn(5000, 150, 0.45, 0.30, 20), Turn(5500, 140, 0.30, 0.25, 2)),  # 1.10x
        Round(Turn(5000, 150, 0.45, 0.30, 20), Turn(4800, 140, 0.30, 0.32, 2)),  # 0.96x
    ]
    found = {v.name: v for v in verdicts(report)}
    config = "(proxy, Redis, 2 workers, burst 100000, "
    ratio = found[f"throughput over the peer's in every round {config}64 connections)"]
    assert (ratio.measured, ratio.met) == ("0.96x", False)  # the median, 1.10x, would pass
    added = found[f"latency added, ours less the peer's, in every round {config}1 connection)"]
    assert (added.measured, added.met) == ("+0.02 ms", False)


def test_the_throughput_goal_is_checked_on_the_headline_and_on_the_large_burst_rows() -> None:
    report = _report()
    report.results.append(
        TargetResult(HEADLINE, {1: _run(1, 800, 1.9), 64: _run(64, 1900, 33)}, 0.8, [72.0, 73.0])
    )
    throughput = [v for v in verdicts(report) if v.name.startswith("throughput (")]
    assert [(v.name.split(", 64")[0], v.measured, v.met) for v in throughput] == [
        (f"throughput (Redis, 2 workers, {ONE_KEY}", "1,900 req/s", False),
        ("throughput (Redis, 2 workers, burst 100000", "2,100 req/s", True),
    ]


def test_a_peer_that_could_not_run_is_said_so_and_skipping_it_leaves_no_section() -> None:
    report = _report()
    assert "## Peer" not in render_markdown(report) and render_peer_summary(report) == []
    report.peer_error = "tensorzero is not installed (`make bench` installs it)"
    text = render_markdown(report)
    assert "## Peer: TensorZero's gateway\n\nNot measured in this run: tensorzero is not" in text
    assert render_peer_summary(report) == [f"peer: not measured ({report.peer_error})"]
    assert all(v.met is None for v in verdicts(report) if "peer" in v.name)


def test_a_rerun_keeps_the_sections_it_does_not_write_and_replaces_its_own() -> None:
    """Addenda (issue 31's client keys at scale, start-up passes) survive `make bench`;
    the bench's own sections, a before-and-after of an older run included, do not."""
    page = render_markdown(_report())
    previous = (
        "# Benchmarks\n\nold intro\n\n## Targets\n\nold targets\n\n"
        "## Before and after: 4340b93 vs this commit\n\nold comparison\n\n"
        "## Client keys at scale (issue 31)\n\nkeys\n\n### A second pass\n\nmore\n\n"
        "## Machine and versions\n\nold machine\n\n## Command\n\nold command\n"
    )
    kept = keep_addenda(previous, page)
    assert "## Client keys at scale (issue 31)\n\nkeys\n\n### A second pass\n\nmore\n" in kept
    assert kept.index("## Client keys at scale") < kept.index("## Machine and versions")
    for old in ("old intro", "old targets", "old comparison", "old machine", "old command"):
        assert old not in kept
    assert kept.count("## Machine and versions") == 1
    assert keep_addenda(kept, page) == kept  # a second rerun keeps them once
    assert keep_addenda("", page) == page
