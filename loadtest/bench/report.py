"""The benchmark's findings as a table, the targets' verdicts and docs/benchmarks.md."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from loadtest.bench.configs import DEFAULT_RPM, configuration_table
from loadtest.bench.model import (
    HEADLINE,
    LARGE_BURST,
    PAIRS,
    PEER,
    SLICES,
    TARGET_ADDED_MS,
    TARGET_PEER_ADDED_MS,
    TARGET_PEER_EVERY_ROUND,
    TARGET_PEER_RATIO,
    TARGET_READY_S,
    TARGET_RPS,
    TARGET_RSS_MB,
    Alternation,
    BenchReport,
    TargetResult,
)
from loadtest.bench.report_real import render_real


def fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def overhead(report: BenchReport, result: TargetResult) -> tuple[float | None, float | None]:
    """(throughput ratio to direct at 64 connections, added median ms at 1 connection)."""
    direct = report.direct()
    if direct is None or result.target.backend is None:
        return None, None
    ratio = added = None
    if 64 in direct.runs and 64 in result.runs and direct.runs[64].rps:
        ratio = result.runs[64].rps / direct.runs[64].rps
    if result.added_ms is not None:
        added = result.added_ms
    elif 1 in direct.runs and 1 in result.runs:
        added = result.runs[1].p50_ms - direct.runs[1].p50_ms
    return ratio, added


def render_table(report: BenchReport) -> str:
    """The plain-text table printed at the end of a run."""
    w = max([30, *(len(r.target.label) + 2 for r in report.results)])
    header = (
        f"{'target':<{w}}{'conn':>5}{'req/s':>9}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}"
        f"{'errors':>8}{'non-2xx':>9}"
    )
    lines = [header, "-" * len(header)]
    for result in report.results:
        for connections, run in sorted(result.runs.items()):
            lines.append(
                f"{result.target.label:<{w}}{connections:>5}{run.rps:>9.0f}{run.p50_ms:>9.2f}"
                f"{run.p90_ms:>9.2f}{run.p99_ms:>9.2f}{run.errors:>8}{run.non_2xx:>9}"
            )
    lines.append("")
    lines.append(
        f"{'target':<{w}}{'rps ratio':>10}{'+p50 ms':>9}{'ready s':>9}{'RSS/worker MB':>15}"
    )
    for result in report.results:
        if result.target.backend is None:
            continue
        ratio, added = overhead(report, result)
        rss = max(result.worker_rss_mb) if result.worker_rss_mb else None
        lines.append(
            f"{result.target.label:<{w}}{fmt(ratio, '.2f'):>10}{fmt(added, '+.2f'):>9}"
            f"{fmt(result.ready_s, '.2f'):>9}{fmt(rss, '.0f'):>15}"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class Verdict:
    name: str
    target: str
    measured: str
    met: bool | None  # None: not measured


def verdicts(report: BenchReport) -> list[Verdict]:
    """The issue's targets against the measured figures."""
    out = []
    for config in (HEADLINE.config, LARGE_BURST):  # the one-key config first
        redis2 = report.find("redis", 2, config)
        run = redis2.runs.get(64) if redis2 else None
        label = HEADLINE.label if config == HEADLINE.config else "Redis, 2 workers, burst 100000"
        out.append(
            Verdict(
                f"throughput ({label.removeprefix('proxy, ')}, 64 connections, auth + metrics)",
                f">= {TARGET_RPS:,.0f} req/s",
                fmt(run.rps if run else None, ",.0f", " req/s"),
                None if run is None else run.rps >= TARGET_RPS,
            )
        )
    for backend, label in (("memory", "memory"), ("redis", "Redis")):
        result = report.find(backend, 1)
        added = overhead(report, result)[1] if result else None
        out.append(
            Verdict(
                f"added median latency at 1 connection ({label}, 1 worker, burst 100000)",
                f"<= +{TARGET_ADDED_MS:g} ms",
                fmt(added, "+.2f", " ms"),
                None if added is None else added <= TARGET_ADDED_MS,
            )
        )
    rss = [mb for r in report.proxies() for mb in r.worker_rss_mb]
    out.append(
        Verdict(
            "idle memory per worker (largest)",
            f"< {TARGET_RSS_MB:g} MB",
            fmt(max(rss) if rss else None, ".0f", " MB"),
            None if not rss else max(rss) < TARGET_RSS_MB,
        )
    )
    ready = [r.ready_s for r in report.proxies() if r.ready_s is not None]
    out.append(
        Verdict(
            "start to ready (slowest)",
            f"<= {TARGET_READY_S:g} s",
            fmt(max(ready) if ready else None, ".2f", " s"),
            None if not ready else max(ready) <= TARGET_READY_S,
        )
    )
    compared: list[Alternation | None] = [*report.peers] or [None]
    for peer in compared:
        out += _peer_verdicts(peer)
    return out


def _peer_verdicts(peer: Alternation | None) -> list[Verdict]:
    """The issue's goals against the peer, for one compared target (None: not measured)."""
    label = peer.target.label if peer else "proxy"
    ratios = peer.ratios("rps") if peer else []
    ratio = statistics.median(ratios) if ratios else None
    ours = peer.values("added_ms", "now") if peer else []
    added = statistics.median(ours) if ours else None
    return [
        Verdict(
            f"throughput over the peer's ({label}, 64 connections, in turns)",
            f">= {TARGET_PEER_RATIO:.2f}x",
            fmt(ratio, ".2f", "x"),
            None if ratio is None else ratio >= TARGET_PEER_RATIO,
        ),
        Verdict(
            f"latency added beside the peer's ({label}, 1 connection, in turns)",
            f"<= +{TARGET_PEER_ADDED_MS:g} ms",
            fmt(added, "+.2f", " ms"),
            None if added is None else added <= TARGET_PEER_ADDED_MS,
        ),
        *_every_round(peer, label),
    ]


def _every_round(peer: Alternation | None, label: str) -> list[Verdict]:
    """Issue 33's goals: each round, not their medians: ours over the peer's req/s, and
    our added median less the peer's (rounds that measured both)."""
    lowest = min(peer.ratios("rps")) if peer and peer.rounds else None
    gaps = [
        r.now.added_ms - r.before.added_ms
        for r in (peer.rounds if peer else [])
        if r.now.added_ms is not None and r.before.added_ms is not None
    ]
    worst = max(gaps) if gaps else None
    return [
        Verdict(
            f"throughput over the peer's in every round ({label}, 64 connections)",
            f">= {TARGET_PEER_EVERY_ROUND:.2f}x, lowest round",
            fmt(lowest, ".2f", "x"),
            None if lowest is None else lowest >= TARGET_PEER_EVERY_ROUND,
        ),
        Verdict(
            f"latency added, ours less the peer's, in every round ({label}, 1 connection)",
            "<= +0 ms, highest round",
            fmt(worst, "+.2f", " ms"),
            None if worst is None else worst <= 0.0,
        ),
    ]


def _spread(values: list[float], spec: str, unit: str = "") -> str:
    """``median (min to max)`` of per-round values."""
    if not values:
        return "n/a"
    med = statistics.median(values)
    return f"{med:{spec}}{unit} ({min(values):{spec}} to {max(values):{spec}})"


def render_alternations(report: BenchReport) -> list[str]:
    """The "before and after" section of the Markdown (empty without a baseline)."""
    if not report.alternations:
        return []
    rounds = len(report.alternations[0].rounds)
    md = [
        "",
        f"## Before and after: {report.baseline} vs this commit",
        "",
        f"Each proxy target as of `{report.baseline}` and as of this commit, both running at"
        f" once and measured in turns for {rounds} rounds (A B, B A, ..., each round in"
        f" {SLICES} slices a side that alternate; `alternate.py`):"
        " req/s and the proxy's CPU time per request at 64 connections, then the median"
        " latency at 1 connection. Each column is the median of the per-round ratios (now"
        " over before) or differences, with their range across rounds: the range is this"
        " machine's noise, which a change must exceed to count.",
        "",
        "| target | req/s before | req/s now | req/s ratio | CPU/request before"
        " | CPU/request now | CPU/request ratio | p50 @1 change |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a in report.alternations:
        md.append(
            f"| {a.target.label} | {a.median('rps', 'before'):,.0f}"
            f" | {a.median('rps', 'now'):,.0f} | {_spread(a.ratios('rps'), '.2f', 'x')}"
            f" | {a.median('cpu_us', 'before'):,.0f} us | {a.median('cpu_us', 'now'):,.0f} us"
            f" | {_spread(a.ratios('cpu_us'), '.2f', 'x')}"
            f" | {_spread(a.differences('p50_ms'), '+.2f', ' ms')} |"
        )
    return md


def _peer_version(report: BenchReport) -> str:
    version = report.environment.packages.get("tensorzero", "-")
    return "TensorZero" if version == "-" else f"TensorZero {version}"


def _role(peer: Alternation) -> str:
    """Which comparison this is: the default config's rules on one key and one deployment,
    or the bench's own large-burst config."""
    if peer.target == HEADLINE:
        return "the default config's rules, one key and one deployment"
    return "the bench's large-burst config"


def render_configurations(report: BenchReport) -> list[str]:
    """The "Configurations" section: ours and the peer's, rule by rule (configs.py)."""
    allowed = DEFAULT_RPM / 60
    gateways = [r for r in report.results if r.target.backend is not None]
    most = max((run.rps for r in gateways for run in r.runs.values()), default=0.0)
    margin = (
        f", {allowed / most:,.0f}x the most any gateway served in this run ({most:,.0f} req/s)"
        if most
        else ""
    )
    return [
        "",
        "## Configurations",
        "",
        "What each side of the peer comparison is given, generated from the configs this run"
        " wrote (`loadtest/bench/configs.py`, `loadtest/bench/peer.py`). Every limit is far"
        " above what this machine can serve: checked on every request, never binding. The"
        f" default config's deployment allows {allowed:,.0f} req/s{margin} (chosen at over"
        " 10x), so its exact pacing (burst 1) never makes a request wait more than a few"
        " microseconds for its turn. The other proxy rows (`burst 100000`) are the bench's"
        " own config, where leases answer almost every request without a Redis round trip.",
        "",
        *configuration_table(report.peer_rule),
    ]


def render_peer(report: BenchReport) -> list[str]:
    """The "Peer" section of the Markdown (empty with ``--no-peer``)."""
    if not report.peers and report.peer_error is None:
        return []
    md = ["", "## Peer: TensorZero's gateway", ""]
    if not report.peers:
        return [*md, f"Not measured in this run: {report.peer_error}"]
    rounds = len(report.peers[0].rounds)
    md += [
        f"{_peer_version(report)} from PyPI (its wheel embeds the Rust gateway), started by"
        " `loadtest/bench/peer.py` on 127.0.0.1 with its OpenAI-compatible route"
        f" `{PEER.path}` (model `{PEER.model}`) in front of the same fake upstream, and one"
        f' rate-limit rule (`{report.peer_rule}`: see "Configurations") that applies to'
        " every request and never trips, so that its Redis limiter is on the path (the same"
        " redis-server, its own database); no ClickHouse, no Postgres, its usage analytics"
        " off. It and each compared config of the proxy (Redis, 2 workers, auth and metrics"
        " on) run at once and are measured in turns for"
        f" {rounds} rounds (A B, B A, ..., each round in {SLICES} slices a side that"
        " alternate; `alternate.py`): req/s and CPU time per"
        " request at 64 connections, then at 1 connection a direct slice and one through the"
        " gateway, whose difference is the added median. Each figure is the median over the"
        " rounds with its range; the machine and the command are below.",
    ]
    for peer in report.peers:
        md += [
            "",
            f"### {peer.target.label} ({_role(peer)})",
            "",
            "| gateway | req/s at 64 connections | CPU/request | Redis CPU/request"
            " | added median at 1 connection |",
            "|---|---:|---:|---:|---:|",
        ]
        for label, side in ((PEER.label, "before"), (peer.target.label, "now")):
            md.append(
                f"| {label} | {_spread(peer.values('rps', side), ',.0f')}"
                f" | {_spread(peer.values('cpu_us', side), ',.0f', ' us')}"
                f" | {_spread(peer.values('redis_us', side), ',.0f', ' us')}"
                f" | {_spread(peer.values('added_ms', side), '+.2f', ' ms')} |"
            )
        md += [
            "",
            f"**The proxy's req/s over the peer's at 64 connections, {peer.target.label}:"
            f" {_spread(peer.ratios('rps'), '.2f', 'x')}** per round (goal:"
            f" {TARGET_PEER_RATIO:.2f}x or more, and +{TARGET_PEER_ADDED_MS:g} ms or less"
            " added).",
        ]
    return md


def render_peer_summary(report: BenchReport) -> list[str]:
    """The peer comparisons in a few printed lines."""
    if not report.peers:
        return [] if report.peer_error is None else [f"peer: not measured ({report.peer_error})"]
    lines = []
    for peer in report.peers:
        lines += [
            f"peer: {_peer_version(report)} (rule {report.peer_rule}) vs {peer.target.label}"
            f" ({_role(peer)}), {len(peer.rounds)} rounds in turns (median, range):",
            f"  req/s at 64 connections, ours / peer: {_spread(peer.ratios('rps'), '.2f', 'x')}",
            "  added p50 at 1 connection:"
            f" peer {_spread(peer.values('added_ms', 'before'), '+.2f', ' ms')},"
            f" ours {_spread(peer.values('added_ms', 'now'), '+.2f', ' ms')}",
        ]
    return lines


def render_markdown(report: BenchReport) -> str:
    """docs/benchmarks.md."""
    env = report.environment
    md = [
        "# Benchmarks",
        "",
        "Measured by `make bench` (`loadtest/bench/`); regenerate this page with it"
        " (`make bench-compare BASELINE=<rev>` adds the proxy as of another revision, side by"
        " side in the same run). The figures are one run on the machine below: they are only"
        " comparable with runs on the same machine.",
        "",
        '**The headline is real traffic** ("Real traffic", below): 2 replicas on one'
        " Redis, many client keys with limits some of them reach, several model groups of"
        " deployments at provider-tier limits on three API shapes, a share of requests"
        " streamed; the upstream answering at once (the proxy's own cost) or as a model"
        " does; and a saturated group of strict upstreams. The sections after it are the"
        " bench's older, narrower rows, kept for comparison with earlier runs and with the"
        " peer: non-streamed chat completions (`max_tokens` 16) sent by"
        " [wrk](https://github.com/wg/wrk) (one thread, `loadtest/bench_chat.lua`) for"
        f" {report.duration:g} s per row after a warm-up, at 1 and at 64 connections,"
        " directly to the built-in fake upstream (no latency, no limits) and through the"
        " proxy (Redis, 2 workers; `--all-rows` adds the in-memory limiter and 1 worker) with"
        " **one client key and one deployment whose limit is 6,000,000 requests a minute**"
        f' ("{HEADLINE.label}": the default config\'s rules, `burst` unset, but a'
        " configuration no team runs: nothing is ever near a limit), and through a peer"
        ' gateway, TensorZero\'s (see "Peer"). Every proxy request carries a client key'
        " (auth) and metrics are on. The rows named `burst 100000` (`--all-rows`) are the"
        " bench's large-burst config: a burst that lets leases answer almost every request"
        ' without a Redis round trip. Both are stated rule by rule in "Configurations".'
        " Everything — wrk, the fake upstream, Redis and the proxy — shares the same machine.",
        "",
        *render_real(report.real, report.saturation, report.rounds, report.duration),
        "",
        "## Targets (the one-key rows)",
        "",
        "| target | goal | measured | met |",
        "|---|---|---|---|",
    ]
    for v in verdicts(report):
        met = "n/a" if v.met is None else ("yes" if v.met else "**no**")
        md.append(f"| {v.name} | {v.target} | {v.measured} | {met} |")
    md += [
        "",
        "## Throughput and latency",
        "",
        "| target | connections | req/s | p50 ms | p90 ms | p99 ms | errors | non-2xx |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in report.results:
        for connections, run in sorted(result.runs.items()):
            md.append(
                f"| {result.target.label} | {connections} | {run.rps:,.0f} | {run.p50_ms:.2f}"
                f" | {run.p90_ms:.2f} | {run.p99_ms:.2f} | {run.errors} | {run.non_2xx} |"
            )
    md += [
        "",
        "## The proxy's overhead, memory and start-up",
        "",
        "Throughput ratio: the proxy's req/s at 64 connections over the direct run's. Added"
        " median: the proxy's p50 minus the direct run's p50, at 1 connection, measured in"
        f" {PAIRS} pairs of slices (a direct slice, then one through the proxy) and taken as"
        " the median of the pairs' differences, so the machine's drift during the run"
        " cancels out (the proxy's 1-connection row shows its median slice). RSS: resident"
        " memory of each worker process when idle, after start-up (with 2 workers, uvicorn's"
        " supervising parent is listed apart). Ready: from starting `llm-proxy serve` to the"
        " first 200 from `/health/ready` (for the peer: from starting the Python process that"
        " embeds it to its first chat completion; its RSS is that process's).",
        "",
        "| target | throughput ratio | added median | RSS per worker | supervisor RSS | ready |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for result in report.results:
        if result.target.backend is None:
            continue
        ratio, added = overhead(report, result)
        rss = ", ".join(f"{mb:.0f} MB" for mb in result.worker_rss_mb) or "n/a"
        md.append(
            f"| {result.target.label} | {fmt(ratio, '.2f', 'x')} | {fmt(added, '+.2f', ' ms')}"
            f" | {rss} | {fmt(result.supervisor_rss_mb, '.0f', ' MB')}"
            f" | {fmt(result.ready_s, '.2f', ' s')} |"
        )
    md += render_alternations(report)
    md += render_configurations(report)
    md += render_peer(report)
    if report.chart:
        md += ["", f"![req/s at 64 connections and p50 at 1 connection]({report.chart})"]
    md += [
        "",
        "## Machine and versions",
        "",
        f"- CPU: {env.cpu}, {env.cores} cores; memory {env.memory_gb:.1f} GiB; {env.system}",
        f"- Python {env.python}; "
        + ", ".join(f"{name} {version}" for name, version in env.packages.items()),
        "- " + "; ".join(f"{tool}: {version}" for tool, version in env.tools.items()),
        f"- code: commit {env.commit}",
        f"- other processes on the machine (not the bench's) used"
        f" {fmt(env.foreign_cores, '.2f')} cores on average during the run; above about 0.1,"
        " they took CPU from the measured servers and every figure is lower for it",
        "",
        "## Command",
        "",
        "```sh",
        report.command,
        "```",
        "",
    ]
    return "\n".join(md)


# The sections render_markdown writes (a title starting with one of these): any other
# section of the page is an addendum written by hand or by another tool, kept by a rerun.
GENERATED_SECTIONS = (
    "Real traffic",
    "Targets",
    "Throughput and latency",
    "The proxy's overhead",
    "Before and after",
    "Configurations",
    "Peer",
    "Machine and versions",
    "Command",
)


def keep_addenda(previous: str, page: str) -> str:
    """``page`` with the sections of ``previous`` that the bench does not write (its
    ``## `` sections, each with its subsections), in their order, before "Machine and
    versions": a rerun of `make bench` replaces its own figures and keeps the rest."""
    addenda = [
        section
        for section in _sections(previous)
        if not section[3:].startswith(GENERATED_SECTIONS)
        and section.partition("\n")[0] + "\n" not in page  # there already
    ]
    if not addenda:
        return page
    marker = "## Machine and versions\n"
    head, found, tail = page.partition(marker)
    if not found:
        return page.rstrip("\n") + "\n\n" + "".join(addenda)
    return head + "".join(addenda) + found + tail


def _sections(text: str) -> list[str]:
    """The ``## `` sections of a Markdown page, each up to the next (what comes before
    the first is left out)."""
    parts = ("\n" + text).split("\n## ")[1:]
    # Each part but the last lost the line end before the next title to the split.
    sections = ["## " + part + "\n" for part in parts[:-1]]
    if parts:
        last = "## " + parts[-1]
        sections.append(last if last.endswith("\n") else last + "\n")
    return sections
