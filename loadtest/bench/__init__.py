"""`make bench`: the proxy's throughput, latency and overhead on this machine, with wrk.

    python -m loadtest.bench                         # ~9 minutes; writes docs/benchmarks.md
    python -m loadtest.bench --duration 5 --output /tmp/bench.md
    python -m loadtest.bench --baseline 70e910d      # before and after, in one run

One run measures, at 1 and at 64 connections, non-streamed chat completions:

* directly against the fake upstream (the baseline: no proxy);
* through the proxy with the in-memory limiter, 1 and 2 workers;
* through the proxy with the Redis limiter (its own redis-server), 1 and 2 workers;
* the headline: the proxy with Redis, 2 workers, in the *default config* (``configs.py``:
  the deployment's ``burst`` unset, 1, exact pacing; its rpm over 10x what the machine
  serves, so no request waits), what users run; the rows above run the bench's own
  *large-burst* config (``burst: 100000``: leases answer almost every request) and say so;
* through the peer, TensorZero's Rust gateway (``pip install tensorzero``, done by `make
  bench`), with a Redis rate-limit rule that never trips (``peer``; ``--no-peer`` skips it);

always with a client key (auth) and metrics on, and with limits so high they never make a
request wait, so what is measured is the proxy's own cost. At 1 connection the proxy is
measured in slices that alternate with direct ones (``paired_run``): the added latency is
the median of the pairs' differences, robust to the machine speeding up or slowing down.
It also measures each proxy's time from start to a 200 on /health/ready and the resident
memory (RSS) of each worker when idle. It prints a table and writes a Markdown report
with a PNG chart (matplotlib). With ``--baseline REV`` every proxy target is also
measured as of that git revision, right before the work tree's, and the report compares
them ("before and after" in one run, on the same machine state).

The peer and each of "proxy, Redis, 2 workers" in the default config (the headline) and
in the large-burst one are then measured in turns, both running
(``alternate.compare_with_peer``, ``--rounds`` rounds): the ratio of their req/s at 64
connections and the added latency of each at 1 connection, with their range over the
rounds (the "Peer" section; the default config's target and comparison add about 2.5
minutes to a run). The peer's rule limits requests and tokens, as our key does
(``--peer-rule requests``: requests only); the report states both sides' configs rule by
rule ("Configurations"). If the peer cannot be installed or started, the report says
why and the rest of the bench runs.

The package, by job: ``model`` (targets, runs, results), ``configs`` (the proxy's
configs, stated beside the peer's), ``wrk`` (running wrk),
``servers`` (the processes: fake upstream, Redis, proxies, the peer, baseline checkouts),
``peer`` (the peer's config and environment), ``peer_gateway`` (the peer's process),
``alternate`` (two servers measured in turns),
``machine`` (hardware, versions, foreign load), ``report`` (table, verdicts, Markdown),
``chart`` (matplotlib), ``__main__`` (the command).

Everything runs on 127.0.0.1, every process is started here and stopped at the end, and
every wrk run is bounded by ``--duration``.
"""
