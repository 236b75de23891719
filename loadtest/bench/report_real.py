"""The real-traffic sections of docs/benchmarks.md and their printed summary: each row's
figures as the median over the rounds with their range, its shape in a sentence and the
command that measures it alone. *pure*"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from loadtest.bench import saturation
from loadtest.bench.real import BEFORE, DIRECT, PROXY, REPLICAS, RowResult, slice_seconds
from loadtest.bench.rounds import Rounds, Sample
from loadtest.bench.saturation import SaturationResult


def spread(values: list[float], spec: str, unit: str = "") -> str:
    """``median (min to max)`` of per-round values; one value alone; n/a for none."""
    if not values:
        return "n/a"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:{spec}}{unit}"
    return f"{med:{spec}}{unit} ({min(values):{spec}} to {max(values):{spec}})"


def _rps(s: Sample) -> float:
    return s.run.rps


def _cpu(s: Sample) -> float:
    return s.cpu_us


def _redis(s: Sample) -> float:
    return s.redis_us


def _p50(s: Sample) -> float:
    return s.run.p50_ms


def _p99(s: Sample) -> float:
    return s.run.p99_ms


def _refused(s: Sample) -> float:
    return 100 * s.run.non_2xx / s.run.requests if s.run.requests else 0.0


@dataclass(frozen=True)
class Figure:
    """A row of a table: a side's per-round values, and per round now against the
    baseline (a ratio or a difference)."""

    name: str
    values: Callable[[Rounds, str], list[float]]
    versus: Callable[[Rounds], list[float]]
    spec: str
    unit: str
    versus_spec: str
    versus_unit: str


def _at(c: int, figure: Callable[[Sample], float]) -> Callable[[Rounds, str], list[float]]:
    return lambda rounds, side: rounds.values(side, c, figure)


def _added(c: int, figure: Callable[[Sample], float]) -> Callable[[Rounds, str], list[float]]:
    return lambda rounds, side: rounds.differences(side, DIRECT, c, figure)


def _ratio(c: int, figure: Callable[[Sample], float]) -> Callable[[Rounds], list[float]]:
    return lambda rounds: rounds.ratios(PROXY, BEFORE, c, figure)


def _minus(c: int, figure: Callable[[Sample], float]) -> Callable[[Rounds], list[float]]:
    return lambda rounds: rounds.differences(PROXY, BEFORE, c, figure)


def figures(rounds: Rounds) -> list[Figure]:
    """The figures a row's rounds measured, in the report's order."""
    measured = {slot for r in rounds.rounds for slot in r}
    found: list[Figure] = []
    for c in (64, 256):
        if (PROXY, c) not in measured:
            continue
        found += [
            Figure(f"req/s at {c} connections", _at(c, _rps), _ratio(c, _rps),
                   ",.0f", "", ".2f", "x"),
            Figure(f"CPU per request at {c} connections, all replicas", _at(c, _cpu),
                   _ratio(c, _cpu), ",.0f", " us", ".2f", "x"),
            Figure(f"Redis CPU per request at {c} connections", _at(c, _redis),
                   _ratio(c, _redis), ",.0f", " us", ".2f", "x"),
            Figure(f"p50 at {c} connections", _at(c, _p50), _minus(c, _p50),
                   ",.2f", " ms", "+.2f", " ms"),
            Figure(f"p99 at {c} connections", _at(c, _p99), _minus(c, _p99),
                   ",.2f", " ms", "+.2f", " ms"),
            Figure(f"non-2xx at {c} connections (the keys' own 429s)", _at(c, _refused),
                   _minus(c, _refused), ".1f", "%", "+.1f", " points"),
        ]  # fmt: skip
    for c in (1, 64, 256):
        if (PROXY, c) not in measured or (DIRECT, c) not in measured:
            continue
        many = "s" * (c > 1)
        found += [
            Figure(f"added p50 at {c} connection{many} (vs. direct)", _added(c, _p50),
                   _minus(c, _p50), "+.2f", " ms", "+.2f", " ms"),
            Figure(f"added p99 at {c} connection{many} (vs. direct)", _added(c, _p99),
                   _minus(c, _p99), "+.2f", " ms", "+.2f", " ms"),
        ]  # fmt: skip
    return found


def command(slug: str, rounds: int, duration: float, baseline: str | None = None) -> str:
    """The command that measures one row alone, as this run did."""
    found = f"python -m loadtest.bench --only {slug} --rounds {rounds} --duration {duration:g}"
    if baseline and baseline.startswith(WITHOUT):  # the same code, a fast path off
        return f"{found} --without {baseline.removeprefix(WITHOUT)}"
    return found + (f" --baseline {baseline}" if baseline else "")


# The other side of a run with --without NAME is named "without-NAME".
WITHOUT = "without-"


def render_row(result: RowResult, duration: float) -> list[str]:
    row = result.row
    rounds = len(result.rounds.rounds)
    seconds = slice_seconds(duration)
    before = result.baseline
    header = f"| figure | {REPLICAS} replicas, 1 worker each |"
    rule = "|---|---:|"
    if before:
        header += f" @ {before} | now against {before}, per round |"
        rule += "---:|---:|"
    upstream = ", ".join(f"`{k}: {v:g}`" for k, v in row.upstream.items())
    md = [
        "",
        f"### {row.label}: {row.shape.describe()}",
        "",
        f"`{command(row.slug, rounds, duration, before)}`: {rounds} rounds, slices of"
        f" {seconds[64]:g} s under load and {seconds[1]:g} s at 1 connection; the fake"
        f" upstream's {upstream}.",
        "",
        header,
        rule,
    ]
    for f in figures(result.rounds):
        line = f"| {f.name} | {spread(f.values(result.rounds, PROXY), f.spec, f.unit)} |"
        if before:
            line += (
                f" {spread(f.values(result.rounds, BEFORE), f.spec, f.unit)}"
                f" | {spread(f.versus(result.rounds), f.versus_spec, f.versus_unit)} |"
            )
        md.append(line)
    ready = ", ".join(f"{s:.2f} s" for s in result.ready_s)
    rss = ", ".join(f"{m:.0f}" for m in result.rss_mb)
    rss_after = ", ".join(f"{m:.0f}" for m in result.rss_after_mb)
    md.append(
        f"| start to ready, each replica | {ready} |"
        + (f" {', '.join(f'{s:.2f} s' for s in result.baseline_ready_s)} | |" if before else "")
    )
    md.append(
        f"| RSS per replica: idle after start; after the rounds | {rss} MB; {rss_after} MB |"
        + (" | |" if before else "")
    )
    return md


def render_saturation(result: SaturationResult, rounds: int, duration: float) -> list[str]:
    r = result.rounds
    pooled: dict[int, int] = {}
    for each in r:
        for key, n in each.per_key.items():
            pooled[key] = pooled.get(key, 0) + n
    pooled_fair = [] if (share := saturation.fair_share(pooled)) is None else [share]
    fair = [x.fair for x in r if x.fair is not None]
    heavy = [x.heavy_over_light for x in r if x.heavy_over_light is not None]
    return [
        "",
        f"### Saturated: {saturation.describe()}",
        "",
        f"`python -m loadtest.bench --only saturated --rounds {rounds} --duration {duration:g}`"
        f" ({len(r)} rounds of {saturation_seconds(duration):g} s; the upstream counts over"
        f" each round's span from {saturation.RAMP:g} s on)",
        "",
        "| figure | median (min to max) over the rounds |",
        "|---|---:|",
        f"| demand sent, over the group's limit | {spread([x.demand for x in r], '.2f', 'x')} |",
        "| share of the limit used (upstream's served) |"
        f" {spread([100 * x.used for x in r], '.1f', '%')} |",
        f"| upstream 429s (all rounds: {sum(x.upstream_429 for x in r)}) |"
        f" {spread([float(x.upstream_429) for x in r], '.0f')} |",
        f"| answers 200 / 429 / other, per round | {spread([float(x.ok) for x in r], ',.0f')} /"
        f" {spread([float(x.refused) for x in r], ',.0f')} /"
        f" {spread([float(x.other) for x in r], ',.0f')} |",
        f"| client latency p50, all answers | {spread([x.run.p50_ms for x in r], ',.0f', ' ms')} |",
        f"| client latency p90 | {spread([x.run.p90_ms for x in r], ',.0f', ' ms')} |",
        f"| client latency p99 | {spread([x.run.p99_ms for x in r], ',.0f', ' ms')} |",
        f"| fair share: least / most 200s among the {saturation.KEYS} keys of equal weight,"
        f" per round (1: even; first come, first served: 0.5) | {spread(fair, '.2f')} |",
        f"| the same over all rounds pooled | {spread(pooled_fair, '.2f')} |",
        f"| 200s of a heavy key over a light one's (even: 1; first come, first served: 2) |"
        f" {spread(heavy, '.2f')} |",
        "",
        "The proxy paces a deployment's windows of a minute or less for turns up to"
        " `routing.pacing_margin` late (`auto` by default: measured, 1-100 ms): at most"
        " `1 / (1 s + margin)` of the limit, 99% at best, can be used (docs/limiter.md,"
        ' "Late turns").',
    ]


def saturation_seconds(duration: float) -> float:
    return max(1.5 * duration, saturation.RAMP + 2)


PEER_LIMITS = (
    "TensorZero cannot express these configurations, so it is not measured on them (it is"
    " measured beside the one-key config, below): its gateway has no client keys without"
    " Postgres (per-key limits only through request tags, each tag value its own bucket);"
    " its model's providers are tried in order, as fallbacks, not spread over"
    " deployments; it does not pace a provider's limits nor make a request wait for a turn"
    " (a rule refuses at once), so in the saturated row it would forward every request"
    " under its rule and pass on the upstream's 429s; its client routes are OpenAI's chat"
    " completions (no Anthropic Messages or Responses route for clients). LiteLLM and"
    " Portkey are not installed on this machine: not measured."
)


def render_real(
    rows: list[RowResult],
    saturated: SaturationResult | None,
    rounds: int,
    duration: float,
) -> list[str]:
    """The "Real traffic" section (empty if none of it ran)."""
    if not rows and saturated is None:
        return []
    md = [
        "",
        "## Real traffic (the headline)",
        "",
        f"What a team runs: {REPLICAS} replicas of the proxy (`llm-proxy serve`, 1 worker"
        " each, on ports of their own) sharing one Redis, many client keys (`sk-bench-000123`,"
        " listed by `key_sha256`, each with `rpm` and `tpm` of its tier: 1 key in 10 at 30 a"
        " minute and 1 in 20 at 1,500 tokens a minute, which the traffic reaches, the rest at"
        " 3,000 and 1,000,000), several model groups of 10 deployments at provider-tier"
        " limits (OpenAI chat, Anthropic Messages through `provider: anthropic`, OpenAI"
        " Responses; `burst` unset: exact pacing). wrk (`loadtest/bench_traffic.lua`, one"
        " thread per replica) draws each request's key (uniformly), its model group (by the"
        " groups' shares) and whether it streams from a seeded PRNG: the same sequence every"
        " run. The same traffic sent straight to the fake upstream, in the same rounds, gives"
        " the added latency. Each figure is the median over the rounds, with their range; the"
        " slices of a round alternate their order round by round (`loadtest/bench/rounds.py`)."
        " CPU per request: the replicas' CPU time (or Redis's) over the requests answered,"
        " refusals included.",
    ]
    for result in rows:
        md += render_row(result, duration)
    if saturated is not None and saturated.rounds:
        md += render_saturation(saturated, rounds, duration)
    md += ["", PEER_LIMITS]
    return md


def render_real_summary(rows: list[RowResult], saturated: SaturationResult | None) -> list[str]:
    """A few printed lines."""
    lines = []
    for result in rows:
        rounds = result.rounds
        parts = [
            f"{c} conn {spread(rounds.values(PROXY, c, _rps), ',.0f')} req/s,"
            f" {spread(rounds.values(PROXY, c, _cpu), ',.0f', ' us')} CPU/request"
            for c in (64, 256)
            if rounds.values(PROXY, c, _rps)
        ]
        for c in (1, 64, 256):
            p50 = rounds.differences(PROXY, DIRECT, c, _p50)
            if p50:
                p99 = rounds.differences(PROXY, DIRECT, c, _p99)
                parts.append(
                    f"added at {c}: p50 {spread(p50, '+.2f', ' ms')},"
                    f" p99 {spread(p99, '+.2f', ' ms')}"
                )
        lines.append(f"{result.row.label}: " + "; ".join(parts))
    if saturated is not None and saturated.rounds:
        r = saturated.rounds
        lines.append(
            f"saturated: used {spread([100 * x.used for x in r], '.1f', '%')} of the limit,"
            f" upstream 429s {sum(x.upstream_429 for x in r)}, demand"
            f" {spread([x.demand for x in r], '.2f', 'x')}, fair share"
            f" {spread([x.fair for x in r if x.fair is not None], '.2f')}"
        )
    return lines
