"""The limiter's pipelined Redis connection, against real redis-servers: batches come back
whole and in order, error replies are results, and a silent or lost server fails the
waiting batches and is reconnected to by the next one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from redis.exceptions import NoScriptError, ResponseError
from support.redis_server import RedisServer

from proxy.limiter.redis.resp import PipelinedConnection, supports

TIMEOUT = 0.2


Connect = Callable[[str], PipelinedConnection]


@pytest.fixture
async def connect() -> AsyncIterator[Connect]:
    """Opens connections for a test and closes them all after it."""
    opened: list[PipelinedConnection] = []

    def open_one(url: str) -> PipelinedConnection:
        opened.append(PipelinedConnection(url, connect_timeout=1.0, timeout=TIMEOUT))
        return opened[-1]

    yield open_one
    for connection in opened:
        connection.close()


async def test_batches_come_back_whole_and_in_order(redis_url: str, connect: Connect) -> None:
    connection = connect(redis_url)
    batches = [[("INCRBY", "n", i), ("ECHO", f"batch {i}")] for i in range(1, 50)]
    replies = await asyncio.gather(*(connection.execute(b) for b in batches))
    assert [r[1] for r in replies] == [f"batch {i}" for i in range(1, 50)]
    assert replies[-1][0] == sum(range(1, 50))


async def test_error_replies_are_results_not_failures(redis_url: str, connect: Connect) -> None:
    connection = connect(redis_url)
    noscript, bad, ok = await connection.execute(
        [("EVALSHA", "0" * 40, 0), ("EVAL", "return error()", 0), ("PING",)]
    )
    assert isinstance(noscript, NoScriptError)
    assert isinstance(bad, ResponseError) and not isinstance(bad, NoScriptError)
    assert ok == "PONG"


async def test_a_silent_server_fails_the_batch_and_the_next_one_reconnects(
    disposable_redis: RedisServer, connect: Connect
) -> None:
    connection = connect(disposable_redis.url)
    assert await connection.execute([("PING",)]) == ["PONG"]
    disposable_redis.client().client_pause(int(TIMEOUT * 3000))  # every client waits
    with pytest.raises(TimeoutError):
        await connection.execute([("PING",)])
    disposable_redis.client().client_unpause()
    assert await connection.execute([("PING",)]) == ["PONG"]


async def test_a_lost_server_fails_the_batch_and_a_restarted_one_is_used_again(
    disposable_redis: RedisServer, connect: Connect
) -> None:
    connection = connect(disposable_redis.url)
    assert await connection.execute([("PING",)]) == ["PONG"]
    disposable_redis.kill()
    with pytest.raises(OSError):  # ConnectionError (lost) or refused on reconnect
        await connection.execute([("PING",)])
    disposable_redis.start()
    assert await connection.execute([("PING",)]) == ["PONG"]


async def test_password_and_database_from_the_url(
    disposable_redis: RedisServer, connect: Connect
) -> None:
    admin = disposable_redis.client()
    admin.config_set("requirepass", "s3cret")
    host_port = disposable_redis.url.removeprefix("redis://")
    connection = connect(f"redis://:s3cret@{host_port}/3")
    wrong = connect(f"redis://:wrong@{host_port}/0")
    await connection.execute([("SET", "where", "db3")])
    with pytest.raises(ConnectionError, match="handshake"):
        await wrong.execute([("PING",)])
    admin.execute_command("AUTH", "s3cret")
    assert admin.execute_command("SELECT", 3) and admin.get("where") == b"db3"


async def test_a_unix_socket(tmp_path: Path, connect: Connect) -> None:
    socket = tmp_path / "redis.sock"
    server = RedisServer(tmp_path / "redis", None, "--unixsocket", str(socket)).start()
    try:
        assert await connect(f"unix://{socket}").execute([("PING",)]) == ["PONG"]
    finally:
        server.kill()


def test_tls_urls_are_left_to_redis_py() -> None:
    assert supports("redis://127.0.0.1:6379/0") and supports("unix:///tmp/redis.sock")
    assert not supports("rediss://127.0.0.1:6379/0")
