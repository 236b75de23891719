"""The benchmark's report: overhead against the direct run, the targets' verdicts, the
table and the Markdown page, and the before-and-after comparison. No wrk, no servers."""

from __future__ import annotations

from loadtest.bench.model import (
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
    overhead,
    render_markdown,
    render_table,
    verdicts,
)


def _run(connections: int, rps: float, p50: float) -> Run:
    return Run(connections, int(rps * 10), 10.0, p50, p50 * 2, p50 * 5, 0, 0)


def _report() -> BenchReport:
    direct, _nolimit, memory1, memory2, redis1, redis2 = TARGETS
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
    assert "| proxy, Redis, 2 workers | 64 | 2,100 |" in text
    assert "| direct to the fake upstream | 1 | 4,000 | 0.25 |" in text
    assert "| proxy, memory, 2 workers | 0.25x | +0.65 ms | 70 MB, 71 MB | 66 MB | 1.40 s |" in text
    assert "| start to ready (slowest) | <= 2 s | 2.50 s | **no** |" in text
    assert "Test CPU, 2 cores" in text and "llm-proxy 0.1.0" in text and "abc1234" in text
    assert "```sh\nmake bench\n```" in text
    assert "used 0.05 cores" in text
    assert "![" in text and "(benchmarks.png)" in text


def test_table_lists_every_run() -> None:
    table = render_table(_report())
    assert table.count("\n") >= 10
    assert "proxy, Redis, 2 workers" in table and "2100" in table


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
        "| proxy, memory, 1 worker | 1,500 | 1,500 | 1.00x (0.90 to 1.10)"
        " | 500 us | 540 us | 1.00x (0.90 to 1.10) | +0.02 ms (-0.05 to +0.10) |"
    ) in text
    assert "Before and after" not in render_markdown(_report())
