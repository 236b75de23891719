"""`make bench`: the proxy's throughput, latency and overhead on this machine, with wrk.

    python -m loadtest.bench                         # ~3 minutes; writes docs/benchmarks.md
    python -m loadtest.bench --duration 5 --output /tmp/bench.md
    python -m loadtest.bench --baseline 70e910d      # before and after, in one run

One run measures, at 1 and at 64 connections, non-streamed chat completions:

* directly against the fake upstream (the baseline: no proxy);
* through the proxy with the in-memory limiter, 1 and 2 workers;
* through the proxy with the Redis limiter (its own redis-server), 1 and 2 workers;

always with a client key (auth) and metrics on, and with limits so high they never make a
request wait, so what is measured is the proxy's own cost. At 1 connection the proxy is
measured in slices that alternate with direct ones (``paired_run``): the added latency is
the median of the pairs' differences, robust to the machine speeding up or slowing down.
It also measures each proxy's time from start to a 200 on /health/ready and the resident
memory (RSS) of each worker when idle. It prints a table and writes a Markdown report
with a PNG chart (matplotlib). With ``--baseline REV`` every proxy target is also
measured as of that git revision, right before the work tree's, and the report compares
them ("before and after" in one run, on the same machine state).

The package, by job: ``model`` (targets, runs, results), ``wrk`` (running wrk),
``servers`` (the processes: fake upstream, Redis, proxies, baseline checkouts),
``machine`` (hardware, versions, foreign load), ``report`` (table, verdicts, Markdown),
``chart`` (matplotlib), ``__main__`` (the command).

Everything runs on 127.0.0.1, every process is started here and stopped at the end, and
every wrk run is bounded by ``--duration``.
"""
