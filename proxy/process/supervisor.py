"""The parent of ``serve --workers N``: uvicorn's supervisor, but SIGHUP reloads.

uvicorn's ``Multiprocess`` restarts every worker on SIGHUP, which would lose in-memory
budgets and waiting requests' turns. Here SIGHUP is passed on to each worker, which
reloads its config in place (``reloading.py``); ``POST /admin/reload`` in one worker
signals this process, so all of them reload. Everything else (SIGTERM, SIGINT, SIGTTIN,
SIGTTOU, restarting a dead worker) is uvicorn's own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal

from uvicorn import Config
from uvicorn.supervisors.multiprocess import Multiprocess

__all__ = ["Supervisor", "block_sighup", "run_supervised"]

logger = logging.getLogger("uvicorn.error")


class Supervisor(Multiprocess):
    """SIGHUP stays blocked in this process and is picked up where uvicorn looks at its
    signals (twice a second). Its workers inherit the blocked signal: one that is still
    starting keeps it pending, not fatal, until it can reload
    (``reloading.hold_sighup``)."""

    def handle_signals(self) -> None:
        if signal.SIGHUP in signal.sigpending():
            signal.sigwait([signal.SIGHUP])  # pending: returns at once
            self.signal_queue.append(signal.SIGHUP)
        super().handle_signals()

    def handle_hup(self) -> None:
        logger.info("Received SIGHUP, reloading the config in every worker.")
        for process in self.processes:
            if process.pid is not None and process.process.is_alive():
                # Gone between the check and the signal: it is restarted with the new file.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGHUP)


def block_sighup() -> None:
    """From here on a SIGHUP waits for the supervisor (call as early as possible)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})


def run_supervised(config: Config) -> None:
    """What ``uvicorn.run`` does for ``workers > 1``, with :class:`Supervisor`."""
    block_sighup()
    sock = config.bind_socket()
    try:
        Supervisor(config, sockets=[sock]).run()
    except KeyboardInterrupt:
        pass
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
        sock.close()
