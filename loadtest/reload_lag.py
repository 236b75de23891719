"""How long a config reload holds the event loop, in process, with N client keys.

    python -m loadtest.reload_lag --keys 100000 --reloads 3

The proxy's app (in-memory limiter, no upstream needed) is started in this process from
a config of N keys; the file is changed (one key's rpm) and reloaded ``--reloads`` times
through the ``Reloader`` a SIGHUP uses, while a probe task sleeps 1 ms in a loop and
records how late it wakes. The first reload keeps the start-up keys alive (the app holds
the settings it was created with); the later ones free the keys of the reload before
theirs, so they measure that too. Prints one JSON object: per reload, its time (and
with the old pipeline retired and its keys freed), the probe's worst lateness in each
phase: reading to the swap, and retiring and freeing, this process's CPU time during
the worst, and the longest lateness this process's own threads can account for (the
least of a wake-up's lateness and the CPU used meanwhile: ``LagProbe``); and the same
for the control (``_busy``).
Not a CI test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from loadtest.keys_scale import ADMIN_KEY, _config

_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class LagProbe:
    """Sleeps ``tick`` in a loop, noting how late it woke each time (``worst``: in a
    period, by when it meant to wake: a stall at the end of one phase is that phase's),
    and the CPU time this process used meanwhile (all its threads): a stall during which
    it used about as much CPU was a thread of its own holding the GIL; one during which
    it used far less was the process waiting for a CPU (the machine's other load)."""

    def __init__(self, tick: float = 0.001) -> None:
        self.tick = tick
        self.ticks: list[tuple[float, float, float]] = []  # (planned wake-up, late, CPU)
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            planned = time.perf_counter() + self.tick
            cpu = time.process_time()
            await asyncio.sleep(self.tick)
            used = time.process_time() - cpu
            self.ticks.append((planned, time.perf_counter() - planned, used))

    def start(self) -> None:
        self.ticks = []
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """After a pause: the last late wake-up is noted before the probe stops."""
        await asyncio.sleep(0.1)
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def worst(self, since: float = 0.0, until: float = math.inf) -> float:
        return self.worst_tick(since, until)[1]

    def worst_own(self) -> float:
        """The longest any thread of this process can have kept the loop waiting: over
        the wake-ups, the least of the lateness and the CPU time used meanwhile."""
        return max((min(late, cpu) for _, late, cpu in self.ticks), default=0.0)

    def worst_tick(self, since: float = 0.0, until: float = math.inf) -> tuple[float, float, float]:
        ticks = [tick for tick in self.ticks if since <= tick[0] < until]
        return max(ticks, key=lambda tick: tick[1], default=(0.0, 0.0, 0.0))


def _busy(seconds: float) -> None:
    """The control: a thread running plain Python bytecode, no long C call, as long as a
    reload. The probe's lateness meanwhile is what the GIL's hand-over (5 ms) and this
    machine's other load cost anyway: the floor a reload's thread cannot go under."""
    end = time.perf_counter() + seconds
    total = 0
    while time.perf_counter() < end:
        total += sum(range(100))


async def _measure(keys: int, reloads: int) -> dict[str, Any]:
    from proxy.config.settings import load_settings
    from proxy.process.app import create_app

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "proxy.yaml"
        config = _config(keys, "http://127.0.0.1:9/v1", "", "config")
        del config["redis"]
        config["admin"] = {"keys": [ADMIN_KEY]}
        path.write_text(yaml.dump(config, Dumper=_DUMPER))
        begin = time.perf_counter()
        settings = load_settings(path)
        loaded_s = time.perf_counter() - begin
        gc.freeze()
        router = create_app(settings, config_path=str(path))
        app: Any = router.app
        results: list[dict[str, float]] = []
        async with app.router.lifespan_context(app):
            reloader = app.state.reloader
            probe = LagProbe()
            probe.start()
            await asyncio.to_thread(_busy, 5.0)
            await probe.stop()
            control_lag = probe.worst()
            control_cpu = probe.worst_tick()[2]
            control_own = probe.worst_own()
            for i in range(reloads):
                config["keys"][0]["rpm"] = 99_000 - i
                text = yaml.dump(config, Dumper=_DUMPER)
                await asyncio.to_thread(path.write_text, text)
                probe.start()
                begin = time.perf_counter()
                result = await reloader.reload()
                reloaded = time.perf_counter()
                # The old pipeline retired, its keys released (``releasing``: since the
                # release off the loop; 0 on the code before it).
                while reloader.retiring or getattr(reloader, "releasing", 0):  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
                took = time.perf_counter() - begin
                await asyncio.sleep(0.2)
                await probe.stop()
                assert result.ok, result.problems
                results.append(
                    {
                        "reload_s": round(reloaded - begin, 3),
                        "with_release_s": round(took, 3),
                        "worst_loop_lag_ms": round(1000 * probe.worst(), 1),
                        "worst_lag_reading_and_swapping_ms": round(
                            1000 * probe.worst(until=reloaded), 1
                        ),
                        "worst_lag_retiring_and_freeing_ms": round(
                            1000 * probe.worst(since=reloaded), 1
                        ),
                        # This process's CPU time during its worst stall (see LagProbe).
                        "cpu_during_worst_lag_ms": round(1000 * probe.worst_tick()[2], 1),
                        "worst_lag_with_this_process_on_cpu_ms": round(1000 * probe.worst_own(), 1),
                    }
                )
        return {
            "keys": keys,
            "load_settings_s": round(loaded_s, 2),
            "control_worst_loop_lag_ms": round(1000 * control_lag, 1),
            "cpu_during_control_worst_lag_ms": round(1000 * control_cpu, 1),
            "control_worst_lag_with_this_process_on_cpu_ms": round(1000 * control_own, 1),
            "reloads": results,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--reloads", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(_measure(args.keys, args.reloads))))


if __name__ == "__main__":
    main()
