"""`make bench`: the proxy's throughput, latency and overhead on this machine, with wrk.

    python -m loadtest.bench                         # ~10 minutes (the plan it prints
                                                     # says how long); docs/benchmarks.md
    python -m loadtest.bench --duration 2 --warmup 0.5 --rounds 1 --output /tmp/bench.md
    python -m loadtest.bench --only real --baseline e0ffaca   # before and after, in turns
    python -m loadtest.bench --all-rows              # also the older one-key rows (+6 min)

**The headline is real traffic** (``real.py``, ``traffic.py``, ``saturation.py``): 2
replicas of the proxy (1 worker each) on one Redis, in front of the built-in fake
upstream, wrk (``loadtest/bench_traffic.lua``, a thread per replica) drawing each
request's client key, model group and streaming from a seeded PRNG:

* ``real``: 1,000 keys (``key_sha256`` in the config, per-key rpm and tpm, 1 in 10 and 1
  in 20 low enough to be reached), 30 deployments at 10,000-30,000 rpm in 3 groups on
  three API shapes (OpenAI chat, Anthropic Messages, OpenAI Responses), 20% streamed, the
  upstream answering at once: req/s, CPU per request (the replicas', Redis's) and
  p50/p99 at 64 and 256 connections, added p50/p99 at 1 connection against the same
  traffic sent directly;
* ``real-latency``: the same, the upstream at a model's latency (300 ms, streams of 30
  chunks 10 ms apart): added p50/p99 at 64 and 256 connections;
* ``100k-keys``: 100,000 keys: start to ready, RSS, req/s at 64 and 256 connections;
* ``saturated``: 8 keys of equal weight at 1.5-2x what 3 strict upstreams allow (a 429
  beyond 600 a minute or 10 a second each): share of the limit used, upstream 429s,
  client latency, fair share between the keys.

Each is measured in ``--rounds`` rounds (``rounds.py``), every figure reported with its
range over them and with the command that measures its row alone; ``--baseline REV``
measures that revision's replicas in the same rounds. The peer cannot express these
configurations (no pacing, no waiting, no per-key limits without Postgres): the report
says so.

Then the older, narrower rows (``--all-rows`` for all of them), at 1 and at 64
connections, non-streamed chat completions of one client key:

* directly against the fake upstream (the baseline: no proxy);
* with ``--all-rows``: the proxy with the in-memory limiter and with the Redis limiter
  (its own redis-server), 1 and 2 workers, in the bench's *large-burst* config
  (``burst: 100000``: leases answer almost every request), and without limits;
* the proxy with Redis, 2 workers, one key and one deployment at 6,000,000 rpm (the
  *default config*'s rules, ``configs.py``: ``burst`` unset, 1, exact pacing; its rpm
  over 10x what the machine serves, so no request waits): the headline before the real
  traffic, named for what it is;
* through the peer, TensorZero's Rust gateway (``pip install tensorzero``, done by `make
  bench`), with a Redis rate-limit rule that never trips (``peer``; ``--no-peer`` skips it);

always with a client key (auth) and metrics on. At 1 connection the proxy is measured in
slices that alternate with direct ones (``paired_run``): the added latency is the median
of the pairs' differences. It also measures each proxy's time from start to a 200 on
/health/ready and the resident memory (RSS) of each worker when idle. With ``--baseline
REV`` every one-key proxy row is also measured as of that revision, in turns.

The peer and the one-key config (with ``--all-rows``, the large-burst one too) are then
measured in turns, both running (``alternate.compare_with_peer``, ``--rounds`` rounds): the
ratio of their req/s at 64 connections and the added latency of each at 1 connection,
with their range over the rounds (the "Peer" section). The peer's rule limits requests
and tokens, as our key does (``--peer-rule requests``: requests only); the report states
both sides' configs rule by rule ("Configurations"). If the peer cannot be installed or
started, the report says why and the rest of the bench runs.

The package, by job: ``model`` (targets, runs, results), ``configs`` (the proxy's
one-key configs, stated beside the peer's), ``traffic`` (the real-traffic shapes and
their configs), ``real`` (its rows), ``saturation`` (the saturated row), ``rounds``
(sides measured in rounds), ``replicas`` (replicas on one Redis), ``upstreams`` (the fake
upstreams' options, strict ones, counters), ``plan`` (what a run does, how long),
``report_real`` (the real-traffic sections), ``wrk`` (running wrk),
``servers`` (the processes: fake upstream, Redis, proxies, the peer, baseline checkouts),
``peer`` (the peer's config and environment), ``peer_gateway`` (the peer's process),
``alternate`` (two servers measured in turns),
``machine`` (hardware, versions, foreign load), ``report`` (table, verdicts, Markdown),
``chart`` (matplotlib), ``__main__`` (the command).

Everything runs on 127.0.0.1, every process is started here and stopped at the end, and
every wrk run is bounded by ``--duration``.
"""
