"""deploy/kubernetes/: every manifest is valid for the stated Kubernetes release, offline
and strict (an unknown or misspelt field fails), and the pod runs what the image
provides the way the proxy expects it: `serve --config` on the mounted ConfigMap, the
image's port and user, probes on the health endpoints, a grace period longer than the
preStop sleep plus the drain, requests no smaller than the measured figures, and a
config that `llm-proxy check-config` accepts with the pod's own environment."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml
from support.ports import free_port
from support.redis_server import RedisServer, redis_available
from support.waiting import wait_until

from proxy.config.settings import load_settings
from proxy.process.cli import GRACEFUL_SHUTDOWN_SECONDS

# The oldest Kubernetes release the manifests are written for (docs/production.md), and
# the newest whose schemas kubernetes-validate (>= 1.37, pyproject.toml) ships.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "deploy" / "kubernetes"
DOCKERFILE = (REPO / "Dockerfile").read_text()
BENCHMARKS = (REPO / "docs" / "benchmarks.md").read_text()


def _documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document is not None:
                found.append((f"{path.name}:{document['kind']}", document))
    return found


DOCUMENTS = _documents()
BY_KIND = {document["kind"]: document for _, document in DOCUMENTS}
DEPLOYMENT = BY_KIND["Deployment"]
POD = DEPLOYMENT["spec"]["template"]["spec"]
(CONTAINER,) = POD["containers"]


def _dockerfile(pattern: str) -> str:
    """The last match: the runtime stage is the Dockerfile's last."""
    found = re.findall(pattern, DOCKERFILE, re.MULTILINE)
    assert found, f"Dockerfile: no match for {pattern!r}"
    return str(found[-1])


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def _container_port(name_or_number: str | int) -> int:
    ports = CONTAINER["ports"]
    if isinstance(name_or_number, int):
        assert name_or_number in [p["containerPort"] for p in ports]
        return name_or_number
    (port,) = [p["containerPort"] for p in ports if p.get("name") == name_or_number]
    return int(port)


def _quantity_bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9}
    found = re.fullmatch(r"(\d+)([KMG]i?)?", quantity)
    assert found is not None, f"not a plain quantity: {quantity}"
    return int(found.group(1)) * units.get(found.group(2) or "", 1)


def _cores(quantity: str) -> float:
    return int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


# --- the schema -------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("document", [d for _, d in DOCUMENTS], ids=[n for n, _ in DOCUMENTS])
def test_every_document_is_valid_for_the_stated_kubernetes_releases_strictly(
    document: dict[str, Any], version: str
) -> None:
    kubernetes_validate.validate(document, version, strict=True)


def test_strict_validation_refuses_a_misspelt_field() -> None:
    probe = dict(CONTAINER["readinessProbe"])
    probe["httpGett"] = probe.pop("httpGet")
    broken = {**CONTAINER, "readinessProbe": probe}
    pod = {**POD, "containers": [broken]}
    document = {**DEPLOYMENT, "spec": {**DEPLOYMENT["spec"], "template": {"spec": pod}}}
    with pytest.raises(kubernetes_validate.ValidationError, match="httpGett"):
        kubernetes_validate.validate(document, KUBERNETES_VERSIONS[0], strict=True)


def test_the_objects_are_one_of_each_a_deployment_needs() -> None:
    kinds = sorted(name.split(":")[1] for name, _ in DOCUMENTS)
    assert kinds == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Secret", "Service"]


# --- what the image provides ------------------------------------------------------------


def test_the_pod_serves_the_mounted_configmap_not_the_embedded_demo() -> None:
    command = [*CONTAINER.get("command", []), *CONTAINER.get("args", [])]
    assert command[:3] == ["llm-proxy", "serve", "--config"], command
    config = PurePosixPath(command[3])
    (mount,) = [m for m in CONTAINER["volumeMounts"] if m["mountPath"] == str(config.parent)]
    # A subPath mount is never updated by the kubelet: the watcher would see no change.
    assert "subPath" not in mount
    (volume,) = [v for v in POD["volumes"] if v["name"] == mount["name"]]
    configmap = BY_KIND["ConfigMap"]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert config.name in configmap["data"]


def test_the_port_is_the_images_and_no_service_link_variable_overrides_it() -> None:
    exposed = int(_dockerfile(r"^EXPOSE (\d+)$"))
    assert int(_dockerfile(r"LLM_PROXY_PORT=(\d+)")) == exposed
    assert _container_port("http") == exposed
    assert int(_env(CONTAINER).get("LLM_PROXY_PORT", exposed)) == exposed
    # A Service named llm-proxy injects LLM_PROXY_PORT=tcp://... into pods with links on.
    assert POD["enableServiceLinks"] is False
    (service_port,) = BY_KIND["Service"]["spec"]["ports"]
    assert _container_port(service_port["targetPort"]) == exposed


def test_the_pod_runs_as_the_images_user_on_a_read_only_root() -> None:
    user, group = _dockerfile(r"^USER (\d+):\d+$"), _dockerfile(r"^USER \d+:(\d+)$")
    assert POD["securityContext"]["runAsUser"] == int(user)
    assert POD["securityContext"]["runAsGroup"] == int(group)
    assert CONTAINER["securityContext"]["readOnlyRootFilesystem"] is True
    # The image's WORKDIR (and where --workers N keeps its metrics files) stays writable.
    assert _dockerfile(r"^WORKDIR (\S+)$") in [m["mountPath"] for m in CONTAINER["volumeMounts"]]


def test_the_probes_ask_the_proxys_health_endpoints_on_its_port() -> None:
    probes = {
        kind: CONTAINER[f"{kind}Probe"]["httpGet"] for kind in ("startup", "liveness", "readiness")
    }
    assert probes["startup"]["path"] == "/health/live"
    assert probes["liveness"]["path"] == "/health/live"
    assert probes["readiness"]["path"] == "/health/ready"
    for probe in probes.values():
        assert _container_port(probe["port"]) == _container_port("http")


def test_the_grace_period_covers_the_prestop_sleep_and_the_drain() -> None:
    sleep, seconds = CONTAINER["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep == "sleep" and int(seconds) > 0
    # The hook runs in the container: the runtime's Debian-based Python image has sleep.
    assert re.fullmatch(r"python:[\d.]+-slim", _dockerfile(r"^ARG PYTHON_IMAGE=(\S+)$"))
    # Kubernetes counts the preStop hook inside the grace period; SIGTERM comes after it.
    assert POD["terminationGracePeriodSeconds"] > int(seconds) + GRACEFUL_SHUTDOWN_SECONDS


def test_the_requests_cover_the_measured_idle_memory_and_a_core_per_worker() -> None:
    measured = re.search(r"\| idle memory per worker \(largest\) \|[^|]*\| (\d+) MB \|", BENCHMARKS)
    assert measured is not None, "docs/benchmarks.md: no idle memory row"
    workers = int(_env(CONTAINER)["LLM_PROXY_WORKERS"])
    requests, limits = CONTAINER["resources"]["requests"], CONTAINER["resources"]["limits"]
    assert _quantity_bytes(requests["memory"]) > workers * int(measured.group(1)) * 10**6
    assert _quantity_bytes(limits["memory"]) >= _quantity_bytes(requests["memory"])
    assert _cores(requests["cpu"]) >= workers


def test_the_service_and_the_disruption_budget_select_the_deployments_pods() -> None:
    labels = DEPLOYMENT["spec"]["template"]["metadata"]["labels"]
    selectors = [
        DEPLOYMENT["spec"]["selector"]["matchLabels"],
        BY_KIND["Service"]["spec"]["selector"],
        BY_KIND["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
    ]
    for selector in selectors:
        assert selector.items() <= labels.items()
    # One replica may be evicted at a time, and a replica always remains.
    assert BY_KIND["PodDisruptionBudget"]["spec"]["maxUnavailable"] < DEPLOYMENT["spec"]["replicas"]


# --- the config in the ConfigMap --------------------------------------------------------


def _pod_environment() -> dict[str, str]:
    """What the container's processes see: the Secret through envFrom, then its env."""
    environment: dict[str, str] = {}
    for source in CONTAINER.get("envFrom", []):
        secret = BY_KIND["Secret"]
        assert source["secretRef"]["name"] == secret["metadata"]["name"]
        environment.update(secret["stringData"])
    environment.update(_env(CONTAINER))
    return environment


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(BY_KIND["ConfigMap"]["data"]["config.yaml"])
    return path


@pytest.mark.slow
def test_the_config_passes_check_config_with_the_pods_environment(config_file: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "check-config", str(config_file)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", **_pod_environment()},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"{config_file}: OK" in done.stdout
    assert "warning" not in done.stderr


def test_the_config_shares_budgets_through_redis_and_reloads_itself(config_file: Path) -> None:
    settings = load_settings(config_file, env=_pod_environment())
    # More than one replica: without Redis each would allow every limit in full.
    assert DEPLOYMENT["spec"]["replicas"] > 1 and settings.redis.url
    assert settings.server.watch_config > 0
    # A request waiting for its turn is answered within the drain.
    assert settings.routing.max_wait < GRACEFUL_SHUTDOWN_SECONDS


def _probe_paths() -> list[str]:
    return [
        CONTAINER[f"{kind}Probe"]["httpGet"]["path"]
        for kind in ("startup", "liveness", "readiness")
    ]


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.skipif(not redis_available(), reason="redis-server is not installed")
def test_the_pods_command_serves_the_configmap_and_passes_its_probes(tmp_path: Path) -> None:
    """The container's command as the Deployment gives it (the project's `llm-proxy`
    script, run here as `python -m proxy` so that this tree's code is the one tested), its
    environment, the config where the ConfigMap puts it; only Redis (this session's) and
    the port (a free one) differ. Its probes answer 200; SIGTERM ends it cleanly."""
    command = [*CONTAINER.get("command", []), *CONTAINER["args"]]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[command[0]] == "proxy.process.cli:main"
    config = tmp_path / PurePosixPath(command[3]).relative_to("/")
    config.parent.mkdir(parents=True)
    config.write_text(BY_KIND["ConfigMap"]["data"][config.name])
    port = free_port()
    with RedisServer(tmp_path / "redis") as redis:
        environment = {
            "PATH": os.environ["PATH"],
            **_pod_environment(),
            "REDIS_URL": redis.url,
            "LLM_PROXY_HOST": "127.0.0.1",
            "LLM_PROXY_PORT": str(port),
        }
        log = (tmp_path / "proxy.log").open("wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "proxy", *command[1:3], str(config), *command[4:]],
            cwd=REPO,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            for path in _probe_paths():
                url = f"http://127.0.0.1:{port}{path}"
                wait_until(lambda url=url: _answers(url), 20.0, f"GET {path} answering 200")
        finally:
            process.send_signal(signal.SIGTERM)
            returncode = process.wait(timeout=POD["terminationGracePeriodSeconds"])
            log.close()
        logs = (tmp_path / "proxy.log").read_text()
        # uvicorn shuts down, then ends by the signal it caught (143 in the pod's status).
        assert returncode == -signal.SIGTERM and "Application shutdown complete." in logs, logs
