"""How traces are set up (``telemetry:``, the ``OTEL_*`` variables), in real processes:

* off (the default): the proxy imports no OpenTelemetry module, serving requests;
* OTLP over gRPC (``OTEL_EXPORTER_OTLP_PROTOCOL=grpc``) to a real gRPC receiver;
* ``--workers 2``: each worker its own provider, and every span flushed at shutdown;
* the sampler variables (``OTEL_TRACES_SAMPLER``, ``OTEL_TRACES_SAMPLER_ARG``) decide,
  a client's sampled flag followed by the parent-based ones, and the upstream hears it;
* a start that cannot export traces says why, one line: a protocol the exporter does
  not speak, the OpenTelemetry packages missing (naming the extra to install).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from support.otlp import SERVER, OtlpGrpcReceiver, OtlpHttpReceiver
from support.ports import free_port
from support.proxy_server import ProxyInThread, ProxyProcess, settings_from
from support.raw_upstream import Conversation, answer
from support.scripted_upstream import ScriptedUpstream
from support.waiting import wait_until

from loadtest.bench.servers import connections_by_worker
from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

ROOT = Path(__file__).resolve().parents[2]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0)) as handle:
        yield handle


def _config(upstream: FakeUpstreamHandle, traces: bool = True) -> dict[str, Any]:
    return {
        "models": [{"name": "m", "deployments": [{"id": "d", "base_url": upstream.base_url}]}],
        "telemetry": {"traces": traces},
    }


def _env(url: str, protocol: str = "http/protobuf", delay_ms: int = 50) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_BSP_SCHEDULE_DELAY": str(delay_ms),
    }


# The third-party packages the proxy uses may import OpenTelemetry themselves (FastAPI's
# own instrumentation imports its API; redis-py imports the SDK's metrics when it is
# installed): what they import before the proxy is imported is not the proxy's doing.
_SERVE_ONE = """
import json, sys
import fastapi, redis, redis.asyncio, starlette.applications, uvicorn
before = {m for m in sys.modules if m.split(".")[0] == "opentelemetry"}
import httpx
from support.proxy_server import ProxyInThread, settings_from
config = json.loads(sys.argv[1])
with ProxyInThread(settings_from(config)) as proxy:
    for stream in (False, True):
        body = {**json.loads(sys.argv[2]), "stream": stream}
        answer = httpx.post(proxy.base_url + "/chat/completions", json=body, timeout=10)
        assert answer.status_code == 200, answer.text
after = {m for m in sys.modules if m.split(".")[0] == "opentelemetry"}
tracing = "proxy.observability.tracing" in sys.modules
print(json.dumps({"imported": sorted(after - before), "tracing": tracing}))
"""


@pytest.mark.parametrize("traces", [False, True], ids=["off", "on"])
def test_with_traces_off_the_proxy_imports_no_opentelemetry(
    upstream: FakeUpstreamHandle, traces: bool
) -> None:
    with OtlpHttpReceiver() as receiver:
        env = {**os.environ, **_env(receiver.url), "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}
        run = subprocess.run(
            [
                sys.executable,
                "-c",
                _SERVE_ONE,
                json.dumps(_config(upstream, traces)),
                json.dumps(CHAT),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    if traces:  # the same check sees them when they are imported
        assert seen["tracing"] is True
        assert "opentelemetry.sdk.trace" in seen["imported"]
    else:
        assert seen == {"imported": [], "tracing": False}


def test_traces_go_over_grpc_when_the_protocol_says_so(
    upstream: FakeUpstreamHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    with OtlpGrpcReceiver() as receiver:
        for name, value in _env(receiver.url, "grpc").items():
            monkeypatch.setenv(name, value)
        with ProxyInThread(settings_from(_config(upstream))) as proxy:
            answer = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, timeout=10)
            assert answer.status_code == 200
            spans = receiver.spans.request(answer.headers["x-request-id"], spans_at_least=4)
    root = next(s for s in spans if s.kind == SERVER)
    assert root.name == "chat m"
    assert root.attributes["gen_ai.usage.output_tokens"] > 0


def test_each_worker_exports_its_own_spans_and_flushes_them_at_shutdown(
    upstream: FakeUpstreamHandle, tmp_path: Path
) -> None:
    """Batches are sent only every 10 minutes here: what arrives, arrives at shutdown.
    Connections are opened one at a time, each kept, until both workers hold one (the
    kernel hands them out), then each asks once more."""
    with OtlpHttpReceiver() as receiver:
        env = {**_env(receiver.url, delay_ms=600_000), "OTEL_SERVICE_NAME": "proxy-under-test"}
        proxy = ProxyProcess(_config(upstream), tmp_path, workers=2, env=env).start()
        try:
            started = "Application startup complete."
            wait_until(lambda: proxy.logs().count(started) == 2, 20.0, "both workers started")
            assert proxy.process is not None
            parent = proxy.process.pid
            clients: list[httpx.Client] = []
            ids = []

            def ask(client: httpx.Client) -> None:
                answer = client.post("/chat/completions", json=CHAT)
                assert answer.status_code == 200
                ids.append(answer.headers["x-request-id"])

            while min(connections_by_worker(parent, proxy.port).values(), default=0) == 0:
                assert len(clients) < 64, "every connection went to one worker"
                clients.append(httpx.Client(base_url=proxy.base_url, timeout=10))
                ask(clients[-1])
            for client in clients:
                ask(client)
            assert receiver.spans.all() == []  # nothing sent yet
            for client in clients:
                client.close()
        finally:
            proxy.stop()
        spans = receiver.spans.all()
    roots = {s.attributes["llm_proxy.request_id"]: s for s in spans if s.kind == SERVER}
    assert sorted(roots) == sorted(ids)
    instances = {s.resource["service.instance.id"] for s in spans}
    assert len(instances) == 2  # one provider per worker
    for root in roots.values():
        assert root.resource["service.name"] == "proxy-under-test"
        assert {
            s.resource["service.instance.id"] for s in spans if s.trace_id == root.trace_id
        } == {root.resource["service.instance.id"]}


def _serve(
    config: dict[str, Any], tmp_path: Path, env: dict[str, str], prelude: str = ""
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = ["serve", "--config", str(path), "--port", str(free_port())]
    code = f"{prelude}\nimport sys\nfrom proxy.process.cli import main\nsys.exit(main({argv!r}))"
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_protocol_the_exporter_does_not_speak_stops_the_start(
    upstream: FakeUpstreamHandle, tmp_path: Path
) -> None:
    run = _serve(_config(upstream), tmp_path, {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    assert run.returncode == 1
    assert "OTEL_EXPORTER_OTLP_PROTOCOL='http/json'" in run.stderr
    assert "http/protobuf or grpc" in run.stderr


def test_traces_without_the_opentelemetry_packages_name_the_extra(
    upstream: FakeUpstreamHandle, tmp_path: Path
) -> None:
    """As if ``pip install llm-proxy`` had left the ``otel`` extra out: its SDK cannot
    be imported."""
    blocked = "import sys; sys.modules['opentelemetry.sdk'] = None"
    run = _serve(_config(upstream), tmp_path, {}, prelude=blocked)
    assert run.returncode == 1, run.stderr[-2000:]
    assert "telemetry.traces: true needs" in run.stderr
    assert "pip install 'llm-proxy[otel]'" in run.stderr


async def _ok(conversation: Conversation) -> None:
    body = b'{"id":"c","object":"chat.completion","model":"m","choices":[]}'
    await conversation.send(answer(body, "content-type: application/json"))


# (OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG, the client's traceparent flags or no
# traceparent, whether the request is traced)
SAMPLERS = [
    ("always_off", None, "01", False),
    ("always_on", None, "00", True),
    ("traceidratio", "0", "01", False),  # the parent's decision not followed
    ("traceidratio", "1", None, True),
    ("parentbased_traceidratio", "0", "01", True),  # the parent's decision followed
    ("parentbased_traceidratio", "0", None, False),
    ("parentbased_traceidratio", "1", "00", False),
    ("parentbased_always_off", None, "01", True),
    ("parentbased_always_off", None, None, False),
    (None, None, "00", False),  # the default: parentbased_always_on
    (None, None, None, True),
]


@pytest.mark.parametrize(
    ("sampler", "argument", "flags", "traced"),
    SAMPLERS,
    ids=[f"{s or 'default'}-{a or ''}-{f or 'no parent'}" for s, a, f, _ in SAMPLERS],
)
def test_the_sampler_variables_decide_and_the_upstream_hears_the_decision(
    monkeypatch: pytest.MonkeyPatch,
    sampler: str | None,
    argument: str | None,
    flags: str | None,
    traced: bool,
) -> None:
    """``OTEL_TRACES_SAMPLER`` and ``OTEL_TRACES_SAMPLER_ARG`` decide which requests are
    exported (read once the proxy stopped and flushed its spans), a client's sampled
    flag followed only by a ``parentbased_`` sampler; either way the upstream gets the
    trace's context (the client's trace when it sent one), flagged as decided."""
    with OtlpHttpReceiver() as receiver, ScriptedUpstream(_ok) as upstream:
        for name, value in _env(receiver.url).items():
            monkeypatch.setenv(name, value)
        for name, set_to in (
            ("OTEL_TRACES_SAMPLER", sampler),
            ("OTEL_TRACES_SAMPLER_ARG", argument),
        ):
            if set_to is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, set_to)
        config = {
            "models": [{"name": "m", "deployments": [{"id": "d", "base_url": upstream.url}]}],
            "telemetry": {"traces": True},
        }
        client_trace = os.urandom(16).hex()
        headers = {}
        if flags is not None:
            headers["traceparent"] = f"00-{client_trace}-{os.urandom(8).hex()}-{flags}"
        with ProxyInThread(settings_from(config)) as proxy:
            sent = httpx.post(
                f"{proxy.base_url}/chat/completions", json=CHAT, headers=headers, timeout=10
            )
            assert sent.status_code == 200
        roots = [s for s in receiver.spans.all() if s.kind == SERVER]
        version, trace_id, span_id, sent_flags = (
            upstream.requests[-1].headers["traceparent"].split("-")
        )
    if traced:
        [root] = roots
        assert root.attributes["llm_proxy.request_id"] == sent.headers["x-request-id"]
        assert root.trace_id == trace_id
    else:
        assert roots == []
    assert version == "00"
    # Its sampled bit as decided (a new trace's id may also carry the "random" bit, 0x02).
    assert int(sent_flags, 16) & 1 == traced
    if flags is not None:
        assert trace_id == client_trace
    assert len(span_id) == 16 and span_id != "0" * 16
