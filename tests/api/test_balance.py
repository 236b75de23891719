"""Connections shared out evenly among workers: the rule, the shared table, and two
listeners on one socket taking turns (in one loop here; ``serve --workers 2`` in
tests/e2e/test_workers.py)."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.tls import CertificateAuthority, openssl_available

from proxy.api import balance
from proxy.api.balance import BalancedListener, ConnectionTable, may_accept
from proxy.worker_env import CONNECTIONS_ENV


def test_a_worker_takes_a_connection_only_while_no_other_holds_much_fewer() -> None:
    assert balance.SLACK == 1
    assert may_accept(3, [3, 5])  # a tie
    assert may_accept(4, [3, 9])  # one ahead of the least loaded: still
    assert not may_accept(5, [3, 9])  # two ahead: no
    assert may_accept(7, [])  # alone


@given(st.lists(st.integers(0, 100), min_size=1, max_size=8))
def test_the_least_loaded_worker_always_takes_the_next_connection(counts: list[int]) -> None:
    takers = [i for i, mine in enumerate(counts) if may_accept(mine, counts[:i] + counts[i + 1 :])]
    assert counts.index(min(counts)) in takers
    assert all(counts[i] <= min(counts) + balance.SLACK for i in takers)


@pytest.fixture
def table_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.delenv(CONNECTIONS_ENV, raising=False)
    path = balance.create_table(workers=2)
    assert os.environ[CONNECTIONS_ENV] == path
    yield path
    balance.remove_table(path)
    assert not os.path.exists(path)
    assert CONNECTIONS_ENV not in os.environ


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(done.stdout)


def test_each_worker_sees_the_others_open_connections(table_path: str) -> None:
    a = ConnectionTable(table_path, pid=os.getpid())
    b = ConnectionTable(table_path, pid=os.getppid())
    a.opened()
    a.opened()
    a.opened()
    b.opened()

    assert b.others() == [(os.getpid(), 3)]
    assert a.others() == [(os.getppid(), 1)]
    assert b.may_accept() and not a.may_accept()  # two ahead
    a.closed()
    assert a.may_accept()
    b.release()
    assert a.others() == []  # gone: no longer waited for
    a.release()


def test_a_dead_workers_slot_is_taken_by_its_replacement_and_forgotten_by_the_others(
    table_path: str,
) -> None:
    live = ConnectionTable(table_path, pid=os.getpid())
    dead = ConnectionTable(table_path, pid=_dead_pid())  # died holding no connection
    live.opened()
    live.opened()
    assert not live.may_accept()  # the dead one's 0 holds it back...
    live.forget_dead()
    assert live.may_accept()  # ...until it is forgotten

    replacement = ConnectionTable(table_path, pid=os.getppid())
    assert live.others() == [(os.getppid(), 0)]
    for table in (dead, live, replacement):
        table.release()


def test_a_full_table_leaves_the_worker_unbalanced(
    table_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 8 slots for 2 workers, every one held by a live process (this one's parent).
    held = [ConnectionTable(table_path, pid=os.getppid()) for _ in range(7)]
    mine = ConnectionTable(table_path, pid=os.getpid())  # the 8th
    with pytest.raises(LookupError):
        ConnectionTable(table_path, pid=1)
    assert ConnectionTable.from_env() is None  # logged; served unbalanced
    for table in [*held, mine]:
        table.release()


class _Recorder(asyncio.Protocol):
    """A server protocol that remembers which listener it belongs to."""

    def __init__(self, served: list[str], name: str) -> None:
        self.served, self.name = served, name
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.served.append(self.name)

    def connection_lost(self, exc: Exception | None) -> None:
        self.served.append(f"{self.name} lost")


async def _wait_for(check: object, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():  # type: ignore[operator]
        assert loop.time() < deadline, "not reached in time"
        await asyncio.sleep(0.005)


async def _open(port: int, count: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    return [await asyncio.open_connection("127.0.0.1", port) for _ in range(count)]


def _listening() -> tuple[socket.socket, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock, sock.getsockname()[1]


async def test_two_listeners_on_one_socket_share_its_connections_evenly(table_path: str) -> None:
    loop = asyncio.get_running_loop()
    sock, port = _listening()
    served: list[str] = []
    tables = {"a": ConnectionTable(table_path, pid=os.getpid()),
              "b": ConnectionTable(table_path, pid=os.getppid())}  # fmt: skip
    # Each worker holds its own descriptor of the one listening socket.
    socks = {"a": sock, "b": socket.fromfd(sock.fileno(), sock.family, sock.type)}
    listeners = [
        BalancedListener(loop, socks[name], lambda n=name: _Recorder(served, n), table)  # type: ignore[misc]
        for name, table in tables.items()
    ]
    clients = await _open(port, 20)
    await _wait_for(lambda: len(served) == 20)

    assert served.count("a") + served.count("b") == 20
    assert abs(served.count("a") - served.count("b")) <= 2 * balance.SLACK
    assert tables["a"].open == served.count("a") and tables["b"].open == served.count("b")

    # Closed connections are given back: the one with fewer takes the next ones.
    for _, writer in clients[:6]:
        writer.close()
    await _wait_for(lambda: sum(s.endswith("lost") for s in served) == 6)
    assert tables["a"].open + tables["b"].open == 14
    more = await _open(port, 6)
    await _wait_for(lambda: tables["a"].open + tables["b"].open == 20)
    assert abs(tables["a"].open - tables["b"].open) <= 2 * balance.SLACK

    for listener in listeners:
        listener.close()
        await listener.wait_closed()
        assert not listener.is_serving()
    for _, writer in clients[6:] + more:
        writer.close()
    for each in socks.values():
        each.close()


async def test_a_connection_left_waiting_by_a_stalled_worker_is_taken_by_another(
    table_path: str,
) -> None:
    loop = asyncio.get_running_loop()
    sock, port = _listening()
    served: list[str] = []
    # The other worker holds fewer connections but never accepts (its loop is stuck).
    stalled = ConnectionTable(table_path, pid=os.getppid())
    table = ConnectionTable(table_path, pid=os.getpid())
    table.opened()
    table.opened()  # two more than the stalled worker
    listener = BalancedListener(loop, sock, lambda: _Recorder(served, "a"), table)

    clients = await _open(port, 3)
    await _wait_for(lambda: len(served) == 3)  # after PATIENCE, all that waited

    assert table.open == 5
    listener.close()
    stalled.release()
    for _, writer in clients:
        writer.close()
    sock.close()


def test_the_balanced_loop_serves_a_given_socket_with_a_listener(
    table_path: str,
) -> None:
    loop = balance.new_event_loop()
    sock, _ = _listening()
    try:
        server = loop.run_until_complete(loop.create_server(asyncio.Protocol, sock=sock))
        assert isinstance(server, BalancedListener)
        server.close()
        # Without a socket (or a table) it is the event loop's own server.
        plain = loop.run_until_complete(loop.create_server(asyncio.Protocol, "127.0.0.1", 0))
        assert not isinstance(plain, BalancedListener)
        plain.close()
    finally:
        sock.close()
        loop.close()


@pytest.mark.skipif(not openssl_available(), reason="openssl is not installed")
async def test_over_tls_a_served_connection_counts_and_a_failed_handshake_gives_its_place_back(
    table_path: str, tmp_path: Path
) -> None:
    authority = CertificateAuthority.make(tmp_path)
    loop = asyncio.get_running_loop()
    sock, port = _listening()
    served: list[str] = []
    table = ConnectionTable(table_path, pid=os.getpid())
    listener = BalancedListener(
        loop, sock, lambda: _Recorder(served, "a"), table,
        ssl=authority.server_context(), ssl_handshake_timeout=5.0,
    )  # fmt: skip
    trusted = ssl.create_default_context(cafile=str(authority.ca))
    _, secure = await asyncio.open_connection("127.0.0.1", port, ssl=trusted)
    await _wait_for(lambda: served == ["a"])
    assert table.open == 1

    # A client that speaks plain text to it: the handshake fails, nothing is served.
    reader, plain = await asyncio.open_connection("127.0.0.1", port)
    plain.write(b"GET / HTTP/1.1\r\n\r\n")
    await reader.read()  # closed by the server
    await _wait_for(lambda: table.open == 1)
    assert served == ["a"]

    secure.close()
    await _wait_for(lambda: table.open == 0)
    listener.close()
    plain.close()
    sock.close()
