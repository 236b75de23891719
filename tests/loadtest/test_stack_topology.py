"""docker-compose.yml is valid, every file and port it refers to exists, and the local
runner (loadtest.stack) runs every service of it with the same command. Fast: no servers."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from support.ports import free_port
from support.waiting import wait_until

from loadtest.topology import (
    COMPOSE_FILE,
    REPO,
    ComposeService,
    TopologyError,
    container_ports,
    interpolate,
    kind_of,
    load_compose,
    local_plan,
    localize,
    nginx_listen_port,
    nginx_upstream_servers,
    start_order,
)
from proxy.config.settings import load_settings
from proxy.process.demo import DEMO_KEY, DEMO_MODEL

ENV: dict[str, str] = {}  # compose defaults only: what `docker compose up` sees bare


@pytest.fixture(scope="module")
def services() -> dict[str, ComposeService]:
    return load_compose(COMPOSE_FILE, ENV)


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return data


# --- the compose file on its own --------------------------------------------------------------


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_docker_compose_config_accepts_the_file() -> None:
    # `docker-compose config` (Debian's docker-compose 1.29) validates without an engine.
    done = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE_FILE), "config", "-q"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_every_service_has_an_image_and_a_list_command(raw: dict[str, Any]) -> None:
    for name, spec in raw["services"].items():
        assert "image" in spec or "build" in spec, name
        assert not isinstance(spec.get("command"), str), f"{name}: use the exec (list) form"


def test_dependencies_exist_and_healthy_ones_have_healthchecks(
    services: dict[str, ComposeService], raw: dict[str, Any]
) -> None:
    for name, spec in raw["services"].items():
        for dep, condition in (spec.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            if condition.get("condition") == "service_healthy":
                assert services[dep].healthcheck, f"{name} waits for {dep}'s health: none"
    assert start_order(local_plan(services, Path("/tmp/x"), prometheus="prometheus"))


def test_mounted_files_and_build_context_exist(services: dict[str, ComposeService]) -> None:
    for service in services.values():
        for host, _ in service.volumes:
            assert Path(host).exists(), f"{service.name}: {host} does not exist"
        if service.build:
            assert (REPO / "Dockerfile").is_file()


def test_command_ports_are_exposed(services: dict[str, ComposeService]) -> None:
    for service in services.values():
        args = list(service.command)
        for flag in ("--port", "--web-port"):
            if flag in args:
                port = int(args[args.index(flag) + 1])
                assert port in container_ports(service), f"{service.name}: {flag} {port}"


def _address_ok(services: dict[str, ComposeService], address: str) -> bool:
    host, _, port = address.partition(":")
    return host in services and int(port) in container_ports(services[host])


def test_nginx_balances_over_every_proxy_replica(services: dict[str, ComposeService]) -> None:
    lb = next(s for s in services.values() if kind_of(s) == "lb")
    conf = (lb.host_path("/etc/nginx/nginx.conf") or Path()).read_text()
    servers = nginx_upstream_servers(conf)
    proxies = {s.name for s in services.values() if kind_of(s) == "proxy"}
    assert {s.split(":")[0] for s in servers} == proxies
    assert all(_address_ok(services, s) for s in servers), servers
    assert nginx_listen_port(conf) in container_ports(lb)
    assert "proxy_buffering off" in conf  # streams must not be buffered


def test_prometheus_scrapes_every_proxy_replica(services: dict[str, ComposeService]) -> None:
    prom = next(s for s in services.values() if kind_of(s) == "prometheus")
    config = yaml.safe_load(
        (prom.host_path("/etc/prometheus/prometheus.yml") or Path()).read_text()
    )
    targets = [
        t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]
    ]
    proxies = {s.name for s in services.values() if kind_of(s) == "proxy"}
    assert {t.split(":")[0] for t in targets} == proxies
    assert all(_address_ok(services, t) for t in targets), targets


def test_grafana_provisioning_matches_the_mounts(services: dict[str, ComposeService]) -> None:
    grafana = next(s for s in services.values() if kind_of(s) == "grafana")
    provisioning = grafana.host_path("/etc/grafana/provisioning")
    assert provisioning is not None and provisioning.is_dir()
    for path in (provisioning / "dashboards").glob("*.y*ml"):
        for provider in yaml.safe_load(path.read_text())["providers"]:
            mounted = grafana.host_path(provider["options"]["path"])
            assert mounted is not None and any(mounted.glob("*.json")), provider
    for path in (provisioning / "datasources").glob("*.y*ml"):
        for source in yaml.safe_load(path.read_text())["datasources"]:
            address = re.sub(r"^https?://", "", source["url"]).rstrip("/")
            assert _address_ok(services, address), source["url"]
    assert grafana.environment["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    home = grafana.environment.get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    assert home is None or (grafana.host_path(home) or Path()).is_file()


def test_proxy_config_is_valid_and_points_at_the_stack(services: dict[str, ComposeService]) -> None:
    for service in services.values():
        if kind_of(service) != "proxy":
            continue
        config = service.host_path("/etc/llm-proxy/config.yaml")
        assert config is not None
        settings = load_settings(str(config), env=dict(service.environment))
        urls = [d.base_url for m in settings.models for d in m.deployments]
        upstreams = [s for s in services.values() if kind_of(s) == "fake-upstream"]
        assert len(urls) == len(upstreams) == 2
        for url in urls:
            assert _address_ok(services, re.sub(r"^http://|/v1$", "", url)), url
        assert settings.redis.url is not None
        assert _address_ok(services, re.sub(r"^redis://|/\d+$", "", settings.redis.url))
        assert settings.keys, "the stack's proxies authenticate Locust's keys"
        keys = services["locust-master"].environment["LOCUST_API_KEYS"].split(",")
        assert len(keys) == len(settings.keys)
        # Each deployment's budget is the fake upstream's own limit.
        for deployment, upstream in zip(settings.models[0].deployments, upstreams, strict=True):
            args = list(upstream.command)
            assert deployment.rpm == int(args[args.index("--rpm") + 1])


def test_stack_rpm_changes_both_sides() -> None:
    services = load_compose(COMPOSE_FILE, {"STACK_RPM": "1200"})
    for service in services.values():
        if kind_of(service) == "fake-upstream":
            assert "1200" in service.command
        if kind_of(service) == "proxy":
            assert service.environment["STACK_RPM"] == "1200"


# --- the local runner runs what compose runs ---------------------------------------------------

# Flags whose values the runner rewrites (addresses, ports, paths) or adds.
REWRITTEN = {
    "--host", "--port", "--config", "-f", "-H", "--master-host", "--master-port", "--web-port",
    "--web-host", "--master-bind-host", "--master-bind-port", "--bind", "--dir",
}  # fmt: skip
PROGRAMS = {
    ("python", "-m", "proxy.fake_upstream"): ["-m", "proxy.fake_upstream"],
    ("llm-proxy", "fake-upstream"): ["-m", "proxy.fake_upstream"],
    ("llm-proxy", "serve"): ["-m", "proxy", "serve"],
    ("redis-server",): ["redis-server"],
}


def _kept(args: list[str]) -> list[str]:
    """``args`` without rewritten flags and their values, nor ``--flag=value`` paths."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in REWRITTEN:
            skip = True
        elif "=" in arg and arg.split("=")[0] in {
            "--config.file",
            "--storage.tsdb.path",
            "--web.listen-address",
        }:
            out.append(arg.split("=")[0])
        else:
            out.append(arg)
    return out


def test_every_compose_service_has_a_local_counterpart(
    services: dict[str, ComposeService], tmp_path: Path
) -> None:
    plan = local_plan(services, tmp_path, prometheus="/usr/bin/prometheus")
    assert list(plan) == list(services)
    skipped = {name: s.skip for name, s in plan.items() if s.skip}
    assert set(skipped) == {"grafana"}, skipped  # the only service with no local binary
    for name, local in plan.items():
        service = services[name]
        assert local.replicas == service.replicas
        assert local.depends_on == service.depends_on
        if local.skip:
            continue
        assert local.argv, name
        for compose_prefix, local_prefix in PROGRAMS.items():
            if tuple(service.command[: len(compose_prefix)]) == compose_prefix:
                argv = local.argv[1:] if local_prefix[0] == "-m" else local.argv
                assert argv[: len(local_prefix)] == local_prefix, (name, local.argv)
                compose_args = list(service.command[len(compose_prefix) :])
                local_args = argv[len(local_prefix) :]
                assert _kept(local_args)[: len(_kept(compose_args))] == _kept(compose_args)
                break
        else:
            if local.kind.startswith("locust"):
                assert local.argv[1:3] == ["-m", "locust"]
                assert _kept(local.argv[3:])[: len(_kept(list(service.command)))] == _kept(
                    list(service.command)
                )
            elif local.kind == "prometheus":
                assert _kept(local.argv[1:]) == _kept(list(service.command))
            else:
                assert local.kind == "lb"
                assert local.argv[1:3] == ["-m", "loadtest.tcp_lb"]
        # Every address handed to a local process is a loopback one.
        text = " ".join(local.argv) + " " + " ".join(local.env.values())
        for other in services:
            assert not re.search(rf"(?<![\w.-]){re.escape(other)}:\d", text), (name, text)
        for content in local.files.values():
            for other in services:
                assert not re.search(rf"(?<![\w.-/]){re.escape(other)}:\d", content), other


def test_local_ports_are_distinct_and_published_ones_kept(
    services: dict[str, ComposeService], tmp_path: Path
) -> None:
    plan = local_plan(services, tmp_path, prometheus="prometheus")
    ports = [p for s in plan.values() for p in s.ports.values()]
    assert len(ports) == len(set(ports))
    for name, service in services.items():
        for published, target in service.ports:
            assert plan[name].ports[target] == published
    free = local_plan(services, tmp_path, free_ports=True, prometheus="prometheus")
    free_ports = [p for s in free.values() for p in s.ports.values()]
    assert len(free_ports) == len(set(free_ports))


def test_prometheus_is_skipped_without_its_binary(
    services: dict[str, ComposeService], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PROMETHEUS_BIN", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    plan = local_plan(services, tmp_path)
    assert plan["prometheus"].skip and "prometheus" in plan["prometheus"].skip


def test_an_unknown_service_is_an_error(tmp_path: Path) -> None:
    compose = tmp_path / "compose.yml"
    compose.write_text(
        json.dumps({"services": {"db": {"image": "postgres:16", "command": ["postgres"]}}})
    )
    with pytest.raises(TopologyError, match="no local counterpart"):
        local_plan(load_compose(compose, {}), tmp_path)


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("${A:-1}", {}, "1"),
        ("${A:-1}", {"A": ""}, "1"),
        ("${A-1}", {"A": ""}, ""),
        ("${A}", {"A": "x"}, "x"),
        ("$${A}", {"A": "x"}, "${A}"),
        ("a ${B:-} b", {}, "a  b"),
    ],
)
def test_interpolate_like_compose(text: str, env: dict[str, str], expected: str) -> None:
    assert interpolate(text, env) == expected


def test_localize_rewrites_whole_addresses_only() -> None:
    addresses = {"proxy-1:8000": "127.0.0.1:1", "proxy-10:8000": "127.0.0.1:2"}
    text = "proxy-1:8000 proxy-10:8000 proxy-1:80001 my-proxy-1:8000"
    assert localize(text, addresses) == "127.0.0.1:1 127.0.0.1:2 proxy-1:80001 my-proxy-1:8000"


# --- the image ----------------------------------------------------------------------------------


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_is_multi_stage_slim_non_root_with_healthcheck() -> None:
    instructions = _dockerfile_instructions()
    args = {r.split("=")[0]: r.split("=", 1)[1] for w, r in instructions if w == "ARG" and "=" in r}
    froms = [r for w, r in instructions if w == "FROM"]
    assert len(froms) >= 2 and all(f.split()[0] == "${PYTHON_IMAGE}" for f in froms)
    assert args["PYTHON_IMAGE"] == "python:3.12-slim"
    user = [r for w, r in instructions if w == "USER"][-1]
    assert user.split(":")[0] not in ("root", "0")
    health = next(r for w, r in instructions if w == "HEALTHCHECK")
    probe = json.loads(health[health.index("CMD") + 3 :])
    assert probe[:2] == ["python", "-c"] and "/health/live" in probe[2]
    compile(probe[2], "<healthcheck>", "exec")
    assert not any(w == "ENTRYPOINT" for w, _ in instructions)  # compose commands are argv


@pytest.mark.slow
def test_the_images_default_command_serves_the_embedded_demo() -> None:
    """`docker run -p 8000:8000 IMAGE` as `make demo`: its CMD, with the image's ENV, run
    as a process (no Docker engine here), answers the demo key's chat completion (not 502:
    its fake upstream runs inside). On free loopback ports instead of the image's."""
    instructions = _dockerfile_instructions()
    cmd = json.loads(next(r for w, r in reversed(instructions) if w == "CMD"))
    assert cmd[0] == "llm-proxy"  # the console script: `python -m proxy` here
    env = dict(os.environ)
    for word, rest in instructions:
        if word == "ENV":
            env.update(pair.split("=", 1) for pair in rest.split())
    assert env["LLM_PROXY_HOST"] == "0.0.0.0"  # reachable through -p
    port = free_port()
    env.update(
        LLM_PROXY_HOST="127.0.0.1",
        LLM_PROXY_PORT=str(port),
        LLM_PROXY_DEMO_UPSTREAM_PORT=str(free_port()),
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", *cmd[1:]],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(f"{url}/health/ready"), timeout=30, what="the demo")
        answer = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": DEMO_MODEL, "messages": [{"role": "user", "content": "Hi"}]},
            headers={"authorization": f"Bearer {DEMO_KEY}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
    finally:
        process.terminate()
        process.wait(timeout=15)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_dockerfile_copies_only_what_dockerignore_lets_in() -> None:
    allowed = [
        line[1:].rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    for word, rest in _dockerfile_instructions():
        if word != "COPY" or "--from" in rest:
            continue
        for source in rest.split()[:-1]:
            assert (REPO / source).exists(), source
            assert any(source == a or source.startswith(a + "/") for a in allowed), source


def test_makefile_has_the_stack_targets() -> None:
    text = (REPO / "Makefile").read_text()
    for target in ("stack", "stack-locust", "bench"):
        assert re.search(rf"^{target}:", text, flags=re.M), target
