"""`python -m loadtest.bench.peer_gateway CONFIG VALKEY_URL`: TensorZero's gateway on a
free loopback port (it binds 127.0.0.1 itself) until SIGTERM. Prints ``READY <url>``
once it serves, where ``<url>`` is the base of its OpenAI-compatible routes; without the
``tensorzero`` package, says so and exits with UNAVAILABLE."""

from __future__ import annotations

import signal
import sys
from typing import Any

UNAVAILABLE = 3
READY = "READY"


def main(argv: list[str]) -> int:
    config_file, valkey_url = argv
    try:
        import tensorzero
    except ImportError as exc:
        print(f"tensorzero is not installed ({exc}): `make bench` installs it", flush=True)
        return UNAVAILABLE
    # Block the signals before the gateway's threads start, so that they inherit the mask
    # and the main thread alone receives them, in sigwait.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    # Blocking (async_setup=False): the gateway itself, never an awaitable.
    gateway: Any = tensorzero._start_http_gateway(
        config_file=config_file,
        clickhouse_url=None,
        postgres_url=None,
        valkey_url=valkey_url,
        async_setup=False,
    )
    print(f"{READY} {gateway.base_url}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    gateway.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
