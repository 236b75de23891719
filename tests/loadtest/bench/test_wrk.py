"""Running wrk: the command the bench builds and the figures it reads back."""

from __future__ import annotations

from loadtest.bench.wrk import LUA_SCRIPT, parse_wrk, wrk_command

WRK_OUTPUT = """Running 10s test @ http://127.0.0.1:1/v1/chat/completions
  1 threads and 64 connections
Requests/sec:  12593.19
{"requests":125931,"duration_us":10000000,"bytes":1,"connect_errors":0,"read_errors":2,\
"write_errors":0,"timeouts":1,"non_2xx":5,"p50_us":4900,"p90_us":7290,"p99_us":38660,\
"mean_us":5.0,"max_us":90000}
"""


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


def test_a_target_with_its_own_route_is_asked_there() -> None:
    argv = wrk_command("http://127.0.0.1:9", 1, 3, "/openai/v1/chat/completions")
    assert argv[-1] == "http://127.0.0.1:9/openai/v1/chat/completions" and "-c1" in argv
    assert 'os.getenv("BENCH_MODEL")' in LUA_SCRIPT.read_text()  # the model, likewise
