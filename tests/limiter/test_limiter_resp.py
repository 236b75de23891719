"""The limiter's pipelined Redis connection, against real redis-servers: batches come back
whole and in order, error replies are results, and a silent or lost server fails the
waiting batches and is reconnected to by the next one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from redis.exceptions import NoScriptError, ResponseError
from support.redis_server import RedisServer

from proxy.limiter.resp import PipelinedConnection, supports

TIMEOUT = 0.2


def _connection(url: str) -> PipelinedConnection:
    return PipelinedConnection(url, connect_timeout=1.0, timeout=TIMEOUT)


async def test_batches_come_back_whole_and_in_order(redis_url: str) -> None:
    connection = _connection(redis_url)
    try:
        batches = [[("INCRBY", "n", i), ("ECHO", f"batch {i}")] for i in range(1, 50)]
        replies = await asyncio.gather(*(connection.execute(b) for b in batches))
    finally:
        connection.close()
    assert [r[1] for r in replies] == [f"batch {i}" for i in range(1, 50)]
    assert replies[-1][0] == sum(range(1, 50))


async def test_error_replies_are_results_not_failures(redis_url: str) -> None:
    connection = _connection(redis_url)
    try:
        noscript, bad, ok = await connection.execute(
            [("EVALSHA", "0" * 40, 0), ("EVAL", "return error()", 0), ("PING",)]
        )
    finally:
        connection.close()
    assert isinstance(noscript, NoScriptError)
    assert isinstance(bad, ResponseError) and not isinstance(bad, NoScriptError)
    assert ok == "PONG"


async def test_a_silent_server_fails_the_batch_and_the_next_one_reconnects(
    disposable_redis: RedisServer,
) -> None:
    connection = _connection(disposable_redis.url)
    try:
        assert await connection.execute([("PING",)]) == ["PONG"]
        disposable_redis.client().client_pause(int(TIMEOUT * 3000))  # every client waits
        with pytest.raises(TimeoutError):
            await connection.execute([("PING",)])
        disposable_redis.client().client_unpause()
        assert await connection.execute([("PING",)]) == ["PONG"]
    finally:
        connection.close()


async def test_a_lost_server_fails_the_batch_and_a_restarted_one_is_used_again(
    disposable_redis: RedisServer,
) -> None:
    connection = _connection(disposable_redis.url)
    try:
        assert await connection.execute([("PING",)]) == ["PONG"]
        disposable_redis.kill()
        with pytest.raises(OSError):  # ConnectionError (lost) or refused on reconnect
            await connection.execute([("PING",)])
        disposable_redis.start()
        assert await connection.execute([("PING",)]) == ["PONG"]
    finally:
        connection.close()


async def test_password_and_database_from_the_url(disposable_redis: RedisServer) -> None:
    admin = disposable_redis.client()
    admin.config_set("requirepass", "s3cret")
    host_port = disposable_redis.url.removeprefix("redis://")
    connection = _connection(f"redis://:s3cret@{host_port}/3")
    wrong = _connection(f"redis://:wrong@{host_port}/0")
    try:
        await connection.execute([("SET", "where", "db3")])
        with pytest.raises(ConnectionError, match="handshake"):
            await wrong.execute([("PING",)])
    finally:
        connection.close()
        wrong.close()
    admin.execute_command("AUTH", "s3cret")
    assert admin.execute_command("SELECT", 3) and admin.get("where") == b"db3"


async def test_a_unix_socket(tmp_path: Path) -> None:
    socket = tmp_path / "redis.sock"
    server = RedisServer(tmp_path / "redis", None, "--unixsocket", str(socket)).start()
    connection = _connection(f"unix://{socket}")
    try:
        assert await connection.execute([("PING",)]) == ["PONG"]
    finally:
        connection.close()
        server.kill()


def test_tls_urls_are_left_to_redis_py() -> None:
    assert supports("redis://127.0.0.1:6379/0") and supports("unix:///tmp/redis.sock")
    assert not supports("rediss://127.0.0.1:6379/0")
