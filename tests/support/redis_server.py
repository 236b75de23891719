"""Real ``redis-server`` processes for tests: no mocks, no shared state with any other Redis.

Every server listens on 127.0.0.1 on a free port picked at start, persists nothing
(``--save "" --appendonly no``) and works in its own directory.

* ``RedisServer``: one server; ``stop()``/``kill()`` then ``start()`` again brings it back
  on the same port (for fail-over tests).
* ``RedisClusterServers``: ``masters`` cluster-enabled servers joined with
  ``redis-cli --cluster create ... --cluster-replicas 0``, ready once every node reports
  ``cluster_state:ok``.
* ``TlsRedisServer``: TLS on its own port (a test CA's certificate) and an ACL user with
  only what the proxy needs (``proxy.limiter.redis.acl``); the plain port stays for the tests.
* ``SentinelGroup``: a primary, one replica and three sentinels (``redis-server
  --sentinel``) watching it, quorum 2, a primary down after ``DOWN_AFTER_MS``.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import redis

from proxy.limiter.redis.acl import setuser_line
from support.ports import free_port
from support.tls import CertificateAuthority

HOST = "127.0.0.1"
START_TIMEOUT = 10.0


def redis_available() -> bool:
    return shutil.which("redis-server") is not None and shutil.which("redis-cli") is not None


class RedisServer:
    """One redis-server child process on 127.0.0.1."""

    def __init__(self, workdir: Path, port: int | None = None, *extra_args: str) -> None:
        self.workdir = workdir
        self.port = port if port is not None else free_port()
        self._extra_args = extra_args
        self._process: subprocess.Popen[bytes] | None = None
        self.password: str | None = None  # the default user's, if it has one
        self.tls_port: int | None = None  # where it also speaks TLS, if it does
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> RedisServer:
        if self.running:
            return self
        self._process = subprocess.Popen(
            self._command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self._wait_until_up()
        return self

    def _command(self) -> list[str]:
        return [
            "redis-server",
            "--port", str(self.port),
            "--bind", HOST,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.workdir),
            "--logfile", str(self.workdir / "redis.log"),
            *self._extra_args,
        ]  # fmt: skip

    def stop(self) -> None:
        """A graceful shutdown (SIGTERM), waited for."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        """A crash (SIGKILL), waited for."""
        self._end(signal.SIGKILL)

    def freeze(self) -> None:
        """A hung server (SIGSTOP): connections stay open, nothing answers."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """Undo ``freeze`` (SIGCONT)."""
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)

    def client(self) -> redis.Redis:
        return redis.Redis(host=HOST, port=self.port, password=self.password, socket_timeout=2.0)

    def flush(self) -> None:
        with self.client() as c:
            c.flushall()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill()

    def _end(self, sig: signal.Signals) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process is not None and process.stderr is not None:
            process.stderr.close()

    def _wait_until_up(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"redis-server on port {self.port} exited: {self._log()}")
            try:
                with self.client() as c:
                    if c.ping():
                        return
            except redis.RedisError:
                time.sleep(0.01)
        self.kill()
        raise RuntimeError(f"redis-server on port {self.port} did not start: {self._log()}")

    def _log(self) -> str:
        log = self.workdir / "redis.log"
        return log.read_text()[-2000:] if log.exists() else ""


def _cluster_args() -> list[str]:
    bus_port = str(free_port())  # explicit: port + 10000 may be taken
    timeout = "5000"
    return [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        timeout,
        "--cluster-port",
        bus_port,
    ]


class RedisClusterServers:
    """A Redis Cluster of ``masters`` masters and no replicas, every slot covered."""

    def __init__(self, workdir: Path, masters: int = 3) -> None:
        self.nodes = [
            RedisServer(workdir / f"node{i}", None, *_cluster_args()) for i in range(masters)
        ]

    @property
    def url(self) -> str:
        """Any node's URL; a cluster client discovers the others from it."""
        return self.nodes[0].url

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    def start(self) -> RedisClusterServers:
        try:
            for node in self.nodes:
                node.start()
            nodes = [f"{HOST}:{n.port}" for n in self.nodes]
            create = ["redis-cli", "--cluster", "create", *nodes, "--cluster-replicas", "0"]
            subprocess.run([*create, "--cluster-yes"], check=True, capture_output=True, timeout=30)
            self._wait_until_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def flush(self) -> None:
        for node in self.nodes:
            node.flush()

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()

    def _wait_until_ok(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if all(self._node_ok(n) for n in self.nodes):
                return
            time.sleep(0.05)
        raise RuntimeError("redis cluster did not reach cluster_state:ok")

    @staticmethod
    def _node_ok(node: RedisServer) -> bool:
        with node.client() as c:
            info = c.execute_command("CLUSTER", "INFO")
        text = info.decode() if isinstance(info, bytes) else str(info)
        return "cluster_state:ok" in text


SENTINEL_MASTER = "mymaster"
DOWN_AFTER_MS = 1000  # a primary that does not answer this long is down


class SentinelServer(RedisServer):
    """``redis-server sentinel.conf --sentinel`` watching ``primary`` (quorum 2)."""

    def __init__(
        self,
        workdir: Path,
        primary: RedisServer,
        password: str | None = None,
        tls: CertificateAuthority | None = None,
    ) -> None:
        super().__init__(workdir)
        self._primary = primary
        self.password = password  # requirepass: clients and the other sentinels need it
        self._tls = tls
        self.tls_port = free_port() if tls else None

    def _command(self) -> list[str]:
        conf = self.workdir / "sentinel.conf"  # the sentinel rewrites it: its own copy
        conf.write_text(
            f"port {self.port}\n"
            f"bind {HOST}\n"
            f"dir {self.workdir}\n"
            f"logfile {self.workdir / 'redis.log'}\n"
            f"sentinel monitor {SENTINEL_MASTER} {HOST} {_served_port(self._primary)} 2\n"
            f"sentinel down-after-milliseconds {SENTINEL_MASTER} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SENTINEL_MASTER} 10000\n"
            f"sentinel parallel-syncs {SENTINEL_MASTER} 1\n"
            + (f"requirepass {self.password}\n" if self.password else "")
        )
        tls = _tls_args(self._tls, self.tls_port) if self._tls and self.tls_port else []
        return ["redis-server", str(conf), "--sentinel", *tls]


def _tls_args(ca: CertificateAuthority, port: int) -> list[str]:
    """A TLS port beside the plain one; replication (and Sentinel's links) over TLS."""
    return [
        "--tls-port", str(port),
        "--tls-cert-file", str(ca.server_cert),
        "--tls-key-file", str(ca.server_key),
        "--tls-ca-cert-file", str(ca.ca),
        "--tls-auth-clients", "no",
        "--tls-replication", "yes",
    ]  # fmt: skip


def _served_port(server: RedisServer) -> int:
    """The port clients of the group are told about: TLS if the server has it."""
    return server.tls_port or server.port


class SentinelGroup:
    """A Sentinel-managed primary with one replica and three sentinels, on loopback.
    ``user``: an ACL user (name, password) on the primary and the replica, beside the
    default user the tests and the sentinels use; ``sentinel_password``: the sentinels'
    requirepass."""

    def __init__(
        self,
        workdir: Path,
        *,
        user: tuple[str, str] | None = None,
        sentinel_password: str | None = None,
        tls: CertificateAuthority | None = None,
    ) -> None:
        acl = ["--user", user[0], "on", f">{user[1]}", "~*", "+@all"] if user else []
        primary_tls, replica_tls = (free_port(), free_port()) if tls else (0, 0)
        # A primary (either server, after a failover) starts a replica's full sync at once:
        # by default (diskless sync) it first waits 5 s for more replicas to sync with, and
        # none ever comes here. The same sync, without the idle wait.
        sync = ["--repl-diskless-sync-delay", "0"]
        self.primary = RedisServer(
            workdir / "primary", None, *sync, *acl, *(_tls_args(tls, primary_tls) if tls else [])
        )
        self.replica = RedisServer(
            workdir / "replica",
            None,
            "--replicaof", HOST, str(primary_tls or self.primary.port),
            *sync,
            *acl,
            *(_tls_args(tls, replica_tls) if tls else []),
        )  # fmt: skip
        if tls:
            self.primary.tls_port, self.replica.tls_port = primary_tls, replica_tls
        self.sentinels = [
            SentinelServer(workdir / f"sentinel{i}", self.primary, sentinel_password, tls)
            for i in range(3)
        ]

    @property
    def nodes(self) -> list[str]:
        """The sentinels as ``host:port``, as ``redis.sentinel.nodes`` takes them."""
        return [f"{HOST}:{_served_port(s)}" for s in self.sentinels]

    def start(self) -> SentinelGroup:
        try:
            self.primary.start()
            self.replica.start()
            self._wait(lambda: self._replica_in_sync(), "the replica to sync")
            for sentinel in self.sentinels:
                sentinel.start()
            self._wait(self._sentinels_agree, "the sentinels to see the replica and each other")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in (*self.sentinels, self.replica, self.primary):
            server.kill()

    def master_port(self) -> int | None:
        """The primary's port as the first sentinel names it now (None if it cannot)."""
        try:
            with self.sentinels[0].client() as c:
                _, port = c.sentinel_get_master_addr_by_name(SENTINEL_MASTER)
        except (redis.RedisError, TypeError):
            return None
        return self.server_on(int(port)).port

    def server_on(self, port: int) -> RedisServer:
        return next(s for s in (self.primary, self.replica) if port in (s.port, _served_port(s)))

    def _replica_in_sync(self) -> bool:
        with self.replica.client() as c:
            info = c.info("replication")
        return info.get("master_link_status") == "up"

    def _sentinels_agree(self) -> bool:
        for sentinel in self.sentinels:
            with sentinel.client() as c:
                state = c.sentinel_master(SENTINEL_MASTER)
            if int(state["num-slaves"]) < 1 or int(state["num-other-sentinels"]) < 2:
                return False
        return True

    @staticmethod
    def _wait(ready: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"timed out waiting for {what}")


TLS_USER, TLS_PASSWORD = "llmproxy", "proxy-secret"  # the ACL user of the tls_redis fixture


class TlsRedisServer(RedisServer):
    """A redis-server that also listens with TLS on ``tls_port`` (``ca``'s server
    certificate; no client certificate asked) and has the ACL user ``user`` with only
    the proxy's commands and keys. The plain port (default user) is the tests' own."""

    def __init__(
        self, workdir: Path, ca: CertificateAuthority, user: str, password: str, *extra: str
    ) -> None:
        tls_port = free_port()
        rules = setuser_line(user, password).removeprefix("ACL SETUSER ").split()
        super().__init__(
            workdir,
            None,
            "--tls-port", str(tls_port),
            "--tls-cert-file", str(ca.server_cert),
            "--tls-key-file", str(ca.server_key),
            "--tls-ca-cert-file", str(ca.ca),
            "--tls-auth-clients", "no",
            "--user", *rules,
            *extra,
        )  # fmt: skip
        self.ca = ca
        self.tls_port = tls_port

    def tls_url(self, user: str, password: str, ca_file: Path) -> str:
        return f"rediss://{user}:{password}@{HOST}:{self.tls_port}?ssl_ca_certs={ca_file}"
