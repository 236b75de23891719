"""docker-compose.yml, read as a plan of local processes on 127.0.0.1.

The compose file is the one description of the stack. ``local_plan()`` turns each of its
services into the command that runs the same thing as a plain process: the same program
with the same arguments, except that container addresses (``upstream-1:8001``) become
loopback ports, container paths (``/etc/llm-proxy/config.yaml``) become the mounted host
files, and a few flags only a local process needs are added (``--bind``, ``--dir``...).
A service the runner cannot run here is kept in the plan with the reason (``skip``), so a
service added to the compose file without a local counterpart is an error, not a silent
gap (tests/loadtest/test_stack_topology.py).

What runs in place of what:

* ``redis-server`` (redis image)           -> ``redis-server`` from PATH
* ``python -m proxy.fake_upstream`` / ``llm-proxy fake-upstream`` -> the same, this venv
* ``llm-proxy serve``                       -> ``python -m proxy serve``, this venv
* nginx (``lb``)                            -> ``python -m loadtest.tcp_lb`` over the
  servers of the nginx config's ``upstream`` block (no nginx needed)
* prom/prometheus                           -> ``prometheus`` from PATH, else skipped
* grafana                                   -> skipped (no Debian package; compose runs it)
* locustio/locust ``--master`` / ``--worker`` -> ``python -m locust`` with the same args
"""

from __future__ import annotations

import os
import random
import re
import shutil
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO / "docker-compose.yml"
LOOPBACK = "127.0.0.1"
DEFAULT_INTERNAL_BASE = 18100  # first port of the services compose does not publish

KINDS = (
    "redis",
    "fake-upstream",
    "proxy",
    "lb",
    "prometheus",
    "grafana",
    "locust-master",
    "locust-worker",
)


class TopologyError(ValueError):
    """The compose file holds something the local runner cannot map."""


@dataclass(frozen=True)
class ComposeService:
    """One service of the compose file, with ``${VAR:-default}`` already substituted."""

    name: str
    image: str | None
    build: bool
    command: tuple[str, ...]
    environment: Mapping[str, str]
    volumes: tuple[tuple[str, str], ...]  # (host path, container path)
    expose: tuple[int, ...]
    ports: tuple[tuple[int, int], ...]  # (published on the host, container port)
    depends_on: tuple[str, ...]
    healthcheck: bool
    replicas: int = 1

    def host_path(self, container_path: str) -> Path | None:
        """The host file or directory mounted at ``container_path`` (or containing it)."""
        for host, target in self.volumes:
            if container_path == target:
                return Path(host)
            if container_path.startswith(target.rstrip("/") + "/"):
                return Path(host) / container_path[len(target.rstrip("/")) + 1 :]
        return None


@dataclass
class LocalService:
    """How the local runner runs one compose service (``replicas`` identical processes)."""

    name: str
    kind: str
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    ports: dict[int, int] = field(default_factory=dict)  # container port -> local port
    ready_path: str | None = None  # HTTP GET that answers 200 once ready
    depends_on: tuple[str, ...] = ()
    replicas: int = 1
    skip: str | None = None  # why it does not run locally
    files: dict[Path, str] = field(default_factory=dict)  # generated files: path -> text

    @property
    def port(self) -> int | None:
        return next(iter(self.ports.values()), None)

    @property
    def url(self) -> str | None:
        if self.port is None:
            return None
        scheme = "redis" if self.kind == "redis" else "http"
        return f"{scheme}://{LOOPBACK}:{self.port}"


# --- reading the compose file -------------------------------------------------------------

_VAR = re.compile(
    r"\$(?:\$|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>[^}]*))?\})"
)


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """Compose's variable substitution: ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``,
    ``$$`` for a literal ``$``."""

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        if name is None:
            return "$"
        current = env.get(name)
        op = match.group("op")
        if op == ":-" and not current:
            return match.group("default") or ""
        if op == "-" and current is None:
            return match.group("default") or ""
        return current or ""

    return _VAR.sub(replace, value)


def _interpolate_tree(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_interpolate_tree(item, env) for item in node]
    if isinstance(node, dict):
        return {key: _interpolate_tree(value, env) for key, value in node.items()}
    return node


def load_compose(
    path: Path = COMPOSE_FILE, env: Mapping[str, str] | None = None
) -> dict[str, ComposeService]:
    """The compose file's services, in file order, variables substituted from ``env``."""
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, dict) or not isinstance(raw.get("services"), dict):
        raise TopologyError(f"{path}: no services")
    data = _interpolate_tree(raw, os.environ if env is None else env)
    services: dict[str, ComposeService] = {}
    for name, spec in data["services"].items():
        services[name] = _service(path.parent, name, spec or {})
    return services


def _service(root: Path, name: str, spec: dict[str, Any]) -> ComposeService:
    command = spec.get("command", [])
    if isinstance(command, str):
        raise TopologyError(f"{name}: write `command` as a list (exec form), not a string")
    environment = spec.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    volumes: list[tuple[str, str]] = []
    for volume in spec.get("volumes", []):
        host, target = str(volume).split(":")[:2]
        volumes.append((str((root / host).resolve()) if host.startswith(".") else host, target))
    ports: list[tuple[int, int]] = []
    for port in spec.get("ports", []):
        published, target = str(port).rsplit(":", 1)[-2:] if ":" in str(port) else (port, port)
        ports.append((int(published), int(target)))
    depends = spec.get("depends_on") or []
    return ComposeService(
        name=name,
        image=spec.get("image"),
        build="build" in spec,
        command=tuple(str(arg) for arg in command),
        environment={str(k): "" if v is None else str(v) for k, v in environment.items()},
        volumes=tuple(volumes),
        expose=tuple(int(p) for p in spec.get("expose", [])),
        ports=tuple(ports),
        depends_on=tuple(depends),
        healthcheck="healthcheck" in spec,
        replicas=int((spec.get("deploy") or {}).get("replicas", 1)),
    )


def kind_of(service: ComposeService) -> str:
    """Which of ``KINDS`` a compose service is, from its command and image."""
    cmd = list(service.command)
    image = service.image or ""
    if cmd[:1] == ["redis-server"]:
        return "redis"
    if cmd[:3] == ["python", "-m", "proxy.fake_upstream"] or cmd[:2] == [
        "llm-proxy",
        "fake-upstream",
    ]:
        return "fake-upstream"
    if cmd[:2] == ["llm-proxy", "serve"]:
        return "proxy"
    if image.startswith("nginx"):
        return "lb"
    if image.startswith("prom/prometheus"):
        return "prometheus"
    if image.startswith("grafana/"):
        return "grafana"
    if image.startswith("locustio/locust"):
        return "locust-master" if "--master" in cmd else "locust-worker"
    raise TopologyError(f"service {service.name!r}: no local counterpart for {image} {cmd}")


# --- the local plan -------------------------------------------------------------------------


# Below Linux's ephemeral range (32768+), which outgoing connections draw from: a port
# picked there can be taken by a client socket before the service binds it.
_FREE_RANGE = (20000, 32000)


def free_port() -> int:
    """An unused loopback port, picked at random below the ephemeral range."""
    for _ in range(200):
        port = random.randrange(*_FREE_RANGE)
        with socket.socket() as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                continue
            return port
    raise TopologyError("no free port found")


def container_ports(service: ComposeService) -> list[int]:
    ports = list(service.expose)
    ports += [target for _, target in service.ports if target not in ports]
    return ports


def assign_ports(
    services: Mapping[str, ComposeService],
    *,
    free: bool = False,
    internal_base: int = DEFAULT_INTERNAL_BASE,
) -> dict[str, dict[int, int]]:
    """Local ports: published ports stay as compose publishes them (8080, 9090, 8089...),
    the others count up from ``internal_base``; ``free`` picks unused ports for all."""
    next_port = internal_base
    assigned: dict[str, dict[int, int]] = {}
    for name, service in services.items():
        published = {target: host for host, target in service.ports}
        assigned[name] = {}
        for target in container_ports(service):
            if free:
                assigned[name][target] = free_port()
            elif target in published:
                assigned[name][target] = published[target]
            else:
                assigned[name][target] = next_port
                next_port += 1
    return assigned


def address_map(ports: Mapping[str, Mapping[int, int]]) -> dict[str, str]:
    """``"upstream-1:8001" -> "127.0.0.1:18101"`` for every service and container port."""
    return {
        f"{name}:{target}": f"{LOOPBACK}:{local}"
        for name, mapping in ports.items()
        for target, local in mapping.items()
    }


def localize(text: str, addresses: Mapping[str, str]) -> str:
    """Rewrite container addresses in ``text`` to loopback ones."""
    for container, local in sorted(addresses.items(), key=lambda item: -len(item[0])):
        text = re.sub(rf"(?<![\w.-]){re.escape(container)}(?!\d)", local, text)
    return text


def nginx_upstream_servers(conf: str) -> list[str]:
    """``host:port`` of every ``server`` line of the nginx config's ``upstream`` blocks."""
    servers: list[str] = []
    for block in re.findall(r"upstream\s+\S+\s*\{(.*?)\}", conf, flags=re.S):
        servers += re.findall(r"^\s*server\s+([^\s;]+)", block, flags=re.M)
    return servers


def nginx_listen_port(conf: str) -> int:
    match = re.search(r"^\s*listen\s+(?:[\d.]+:)?(\d+)", conf, flags=re.M)
    if match is None:
        raise TopologyError("nginx config: no `listen` port")
    return int(match.group(1))


def _flag(args: list[str], flag: str) -> str | None:
    """Value of ``--flag value`` or ``--flag=value`` in ``args``."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _replace_flag(args: list[str], flag: str, value: str) -> list[str]:
    """``args`` with ``flag``'s value replaced (appended when absent)."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg == flag and i + 1 < len(out):
            out[i + 1] = value
            return out
        if arg.startswith(flag + "="):
            out[i] = f"{flag}={value}"
            return out
    return [*out, flag, value]


def _one_port(service: ComposeService, ports: Mapping[int, int]) -> tuple[int, int]:
    if not ports:
        raise TopologyError(f"{service.name}: no `expose`d port")
    target, local = next(iter(ports.items()))
    return target, local


def local_plan(
    services: Mapping[str, ComposeService],
    workdir: Path,
    *,
    free_ports: bool = False,
    internal_base: int = DEFAULT_INTERNAL_BASE,
    python: str = sys.executable,
    prometheus: str | None = None,
) -> dict[str, LocalService]:
    """Every compose service as a local process (or a skip with its reason), in file order.

    ``prometheus`` is the binary to use; None looks it up on PATH (``$PROMETHEUS_BIN`` first).
    """
    ports = assign_ports(services, free=free_ports, internal_base=internal_base)
    addresses = address_map(ports)
    if prometheus is None:
        prometheus = os.environ.get("PROMETHEUS_BIN") or shutil.which("prometheus")
    ctx = _Context(services, ports, addresses, workdir, python, prometheus)
    plan: dict[str, LocalService] = {}
    for name, service in services.items():
        kind = kind_of(service)
        local = LocalService(
            name=name,
            kind=kind,
            ports=dict(ports[name]),
            depends_on=service.depends_on,
            replicas=service.replicas,
            env={k: localize(v, addresses) for k, v in service.environment.items()},
        )
        _BUILDERS[kind](local, service, ctx)
        plan[name] = local
    return plan


@dataclass(frozen=True)
class _Context:
    services: Mapping[str, ComposeService]
    ports: Mapping[str, Mapping[int, int]]
    addresses: Mapping[str, str]
    workdir: Path
    python: str
    prometheus: str | None

    def localized_copy(self, local: LocalService, host: Path) -> Path:
        """A copy of a mounted config file with loopback addresses, for ``local`` to read."""
        copy = self.workdir / "config" / f"{local.name}-{host.name}"
        local.files[copy] = localize(host.read_text(), self.addresses)
        return copy


def _mounted(service: ComposeService, container_path: str) -> Path:
    host = service.host_path(container_path)
    if host is None:
        raise TopologyError(f"{service.name}: {container_path} is not a mounted file")
    return host


def _redis(local: LocalService, service: ComposeService, ctx: _Context) -> None:
    _, port = _one_port(service, local.ports)
    data = ctx.workdir / local.name
    local.argv = [
        *service.command,
        "--port", str(port),
        "--bind", LOOPBACK,
        "--dir", str(data),
    ]  # fmt: skip
    local.ready_path = None  # probed with PING


def _fake_upstream(local: LocalService, service: ComposeService, ctx: _Context) -> None:
    cmd = list(service.command)
    args = cmd[3:] if cmd[0] == "python" else cmd[2:]
    port = local.ports.get(int(_flag(args, "--port") or 8001))
    if port is None:
        raise TopologyError(f"{service.name}: --port is not in `expose`")
    args = _replace_flag(_replace_flag(args, "--host", LOOPBACK), "--port", str(port))
    local.argv = [ctx.python, "-m", "proxy.fake_upstream", *args]
    local.ready_path = "/stats"


def _proxy(local: LocalService, service: ComposeService, ctx: _Context) -> None:
    args = list(service.command[2:])
    config = _flag(args, "--config")
    if config is None:
        raise TopologyError(f"{service.name}: llm-proxy serve without --config")
    copy = ctx.localized_copy(local, _mounted(service, config))
    port = local.ports.get(int(_flag(args, "--port") or 8000))
    if port is None:
        raise TopologyError(f"{service.name}: --port is not in `expose`")
    args = _replace_flag(args, "--config", str(copy))
    args = _replace_flag(_replace_flag(args, "--host", LOOPBACK), "--port", str(port))
    local.argv = [ctx.python, "-m", "proxy", "serve", *args]
    local.ready_path = "/health/ready"


def _lb(local: LocalService, service: ComposeService, ctx: _Context) -> None:
    conf = _mounted(service, "/etc/nginx/nginx.conf").read_text()
    listen = nginx_listen_port(conf)
    port = local.ports.get(listen)
    if port is None:
        raise TopologyError(f"{service.name}: nginx listens on {listen}, not in `expose`")
    backends = [localize(server, ctx.addresses) for server in nginx_upstream_servers(conf)]
    local.argv = [ctx.python, "-m", "loadtest.tcp_lb", "--listen", f"{LOOPBACK}:{port}"]
    for backend in backends:
        local.argv += ["--backend", backend]
    local.ready_path = "/health/ready"


def _prometheus(local: LocalService, service: ComposeService, ctx: _Context) -> None:
    if ctx.prometheus is None:
        local.skip = "no `prometheus` binary on PATH (apt-get install prometheus)"
        return
    args = list(service.command)
    config = _flag(args, "--config.file")
    if config is None:
        raise TopologyError(f"{service.name}: no --config.file")
    copy = ctx.localized_copy(local, _mounted(service, config))
    _, port = _one_port(service, local.ports)
    args = _replace_flag(args, "--config.file", str(copy))
    args = _replace_flag(args, "--storage.tsdb.path", str(ctx.workdir / f"{local.name}-data"))
    args = _replace_flag(args, "--web.listen-address", f"{LOOPBACK}:{port}")
    local.argv = [ctx.prometheus, *args]
    local.ready_path = "/-/ready"


def _grafana(local: LocalService, service: ComposeService, ctx: _Context) -> None:
    local.skip = "Grafana has no Debian package; `docker compose up` runs it"


def _locust(local: LocalService, service: ComposeService, ctx: _Context) -> None:
    args = list(service.command)
    locustfile = _flag(args, "-f")
    if locustfile is None:
        raise TopologyError(f"{service.name}: locust without -f")
    args = _replace_flag(args, "-f", str(_mounted(service, locustfile)))
    host = _flag(args, "-H")
    if host is not None:
        args = _replace_flag(args, "-H", localize(host, ctx.addresses))
    if local.kind == "locust-master":
        web, workers = _locust_master_ports(service)
        args = _replace_flag(args, "--web-port", str(local.ports[web]))
        args = _replace_flag(args, "--web-host", LOOPBACK)
        args = _replace_flag(args, "--master-bind-host", LOOPBACK)
        args = _replace_flag(args, "--master-bind-port", str(local.ports[workers]))
        local.ready_path = "/"
    else:
        master = _flag(args, "--master-host")
        if master is None or master not in ctx.services:
            raise TopologyError(f"{service.name}: --master-host is not a compose service")
        _, workers = _locust_master_ports(ctx.services[master])
        args = _replace_flag(args, "--master-host", LOOPBACK)
        args = _replace_flag(args, "--master-port", str(ctx.ports[master][workers]))
    local.argv = [ctx.python, "-m", "locust", *args]


def _locust_master_ports(service: ComposeService) -> tuple[int, int]:
    """(web UI port, port the workers connect to) of a locust master service."""
    web = int(_flag(list(service.command), "--web-port") or 8089)
    workers = int(_flag(list(service.command), "--master-bind-port") or 5557)
    missing = {web, workers} - set(container_ports(service))
    if missing:
        raise TopologyError(f"{service.name}: ports {sorted(missing)} not in `expose`")
    return web, workers


_BUILDERS = {
    "redis": _redis,
    "fake-upstream": _fake_upstream,
    "proxy": _proxy,
    "lb": _lb,
    "prometheus": _prometheus,
    "grafana": _grafana,
    "locust-master": _locust,
    "locust-worker": _locust,
}


def start_order(plan: Mapping[str, LocalService]) -> list[list[str]]:
    """Services grouped in start-up waves: each wave depends only on earlier ones."""
    remaining = dict(plan)
    waves: list[list[str]] = []
    done: set[str] = set()
    while remaining:
        wave = [n for n, s in remaining.items() if all(d in done for d in s.depends_on)]
        if not wave:
            raise TopologyError(f"depends_on cycle among {sorted(remaining)}")
        waves.append(wave)
        done.update(wave)
        for name in wave:
            del remaining[name]
    return waves
