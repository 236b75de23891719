"""loadtest.bench's pure parts: parsing wrk's figures, the table, the Markdown report, the
targets' verdicts and the fallback PNG writer. No wrk and no servers."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from loadtest.bench import (
    LUA_SCRIPT,
    TARGETS,
    BenchReport,
    Environment,
    Run,
    TargetResult,
    overhead,
    parse_wrk,
    render_markdown,
    render_table,
    verdicts,
    write_png,
    wrk_command,
)

WRK_OUTPUT = """Running 10s test @ http://127.0.0.1:1/v1/chat/completions
  1 threads and 64 connections
Requests/sec:  12593.19
{"requests":125931,"duration_us":10000000,"bytes":1,"connect_errors":0,"read_errors":2,\
"write_errors":0,"timeouts":1,"non_2xx":5,"p50_us":4900,"p90_us":7290,"p99_us":38660,\
"mean_us":5.0,"max_us":90000}
"""


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


def test_parse_wrk_reads_the_json_line() -> None:
    run = parse_wrk(WRK_OUTPUT, 64)
    assert run.requests == 125931 and run.seconds == 10.0
    assert run.rps == 12593.1
    assert (run.p50_ms, run.p90_ms, run.p99_ms) == (4.9, 7.29, 38.66)
    assert run.errors == 3 and run.non_2xx == 5


def test_wrk_command_uses_the_lua_script() -> None:
    argv = wrk_command("http://127.0.0.1:9", 64, 10)
    assert argv[0] == "wrk" and "-c64" in argv and "-d10s" in argv
    assert str(LUA_SCRIPT) in argv and argv[-1] == "http://127.0.0.1:9/v1/chat/completions"
    assert LUA_SCRIPT.is_file()


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


def test_fallback_png_is_a_valid_image(tmp_path: Path) -> None:
    path = tmp_path / "chart.png"
    write_png(path, [[12000, 1800, 3000], [0.25, 0.9, 1.6]], height=120)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks = {}
    offset = 8
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        body = data[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert crc == zlib.crc32(kind + body)
        chunks[kind] = body
        offset += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (height, depth, color) == (120, 8, 2)
    assert len(zlib.decompress(chunks[b"IDAT"])) == height * (1 + 3 * width)
    assert b"IEND" in chunks
