"""loadtest/worker_split.py reads the connections each worker of a server holds: here a parent
process whose one child accepts three connections."""

from __future__ import annotations

import socket
import subprocess
import sys

from support.ports import free_port
from support.waiting import wait_until

from loadtest import worker_split

WORKER = """
import socket, sys
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
held = [server.accept()[0] for _ in range(3)]
sys.stdin.read()
"""
PARENT = """
import subprocess, sys
worker = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdin=sys.stdin)
worker.wait()
"""


def test_the_connections_each_worker_holds_are_read_from_proc() -> None:
    port = free_port()
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, WORKER, str(port)], stdin=subprocess.PIPE
    )
    clients: list[socket.socket] = []
    try:

        def connected() -> bool:
            try:
                clients.append(socket.create_connection(("127.0.0.1", port), timeout=1))
            except OSError:
                return False
            return True

        wait_until(connected, timeout=20, what="the worker listening")
        clients += [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        wait_until(lambda: _split(parent.pid, port) == [3], timeout=10, what="3 held")
    finally:
        for client in clients:
            client.close()
        assert parent.stdin is not None
        parent.stdin.close()
        parent.wait(timeout=10)


def _split(pid: int, port: int) -> list[int]:
    thread, held = worker_split.split_during(pid, port, after=0)
    thread.join()
    return held
