"""Real upstreams in real networks, on loopback: HTTPS with a private CA (per deployment),
mTLS, a lab upstream without verification, an egress proxy (from the environment or the
deployment's own), extra headers, and failure causes that say what broke. HTTPS straight
to the upstream takes the lean transport, through an egress proxy the general one
(``served`` records which)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support.forward_proxy import ForwardProxy
from support.proxy_server import ProxyInThread, free_port, settings_from
from support.tls import CertificateAuthority, openssl_available

from proxy.config.settings import config_warnings
from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread
from proxy.upstream.client import UpstreamTransport
from proxy.upstream.lean import LeanTransport

pytestmark = pytest.mark.skipif(not openssl_available(), reason="openssl is not installed")

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return CertificateAuthority.make(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def tls_upstream(ca: CertificateAuthority) -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0), ssl_context=ca.server_context()) as handle:
        yield handle


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Which transport sent each upstream request ("lean" or "general"), in order."""
    calls: list[str] = []
    forward, general = LeanTransport.forward, UpstreamTransport._general

    async def via_lean(self: LeanTransport, *args: Any) -> httpx.Response:
        calls.append("lean")
        return await forward(self, *args)

    async def via_general(self: UpstreamTransport, *args: Any) -> httpx.Response:
        calls.append("general")
        return await general(self, *args)

    monkeypatch.setattr(LeanTransport, "forward", via_lean)
    monkeypatch.setattr(UpstreamTransport, "_general", via_general)
    return calls


def _config(upstream_url: str, **deployment: Any) -> dict[str, Any]:
    d = {"id": "d", "base_url": f"{upstream_url}/v1", "timeout": "5s", **deployment}
    return {"models": [{"name": "m", "deployments": [d]}], "routing": {"retries": 0}}


def _chat(proxy: ProxyInThread, stream: bool = False) -> httpx.Response:
    return httpx.post(
        f"{proxy.base_url}/chat/completions", json={**CHAT, "stream": stream}, timeout=15
    )


@pytest.mark.slow
def test_a_private_ca_is_trusted_per_deployment(
    ca: CertificateAuthority, tls_upstream: FakeUpstreamHandle, served: list[str]
) -> None:
    trusted = _config(tls_upstream.url, tls={"ca_file": str(ca.ca)})
    with ProxyInThread(settings_from(trusted)) as proxy:
        client = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)
        assert client.chat.completions.create(**CHAT).choices[0].message.content  # type: ignore[call-overload]
        assert _chat(proxy, stream=True).status_code == 200
    with ProxyInThread(settings_from(_config(tls_upstream.url))) as proxy:
        refused = _chat(proxy)
    assert refused.status_code == 502
    assert "certificate" in refused.json()["error"]["message"]
    assert served == ["lean"] * 3


def test_mtls_sends_the_client_certificate(ca: CertificateAuthority, served: list[str]) -> None:
    context = ca.server_context(require_client_cert=True)
    with run_in_thread(FakeUpstreamConfig(port=0), ssl_context=context) as upstream:
        tls = {
            "ca_file": str(ca.ca),
            "cert_file": str(ca.client_cert),
            "key_file": str(ca.client_key),
        }
        with ProxyInThread(settings_from(_config(upstream.url, tls=tls))) as proxy:
            assert _chat(proxy).status_code == 200
        without = {"ca_file": str(ca.ca)}
        with ProxyInThread(settings_from(_config(upstream.url, tls=without))) as proxy:
            assert _chat(proxy).status_code == 502
    assert served == ["lean"] * 2


def test_verify_false_reaches_a_lab_upstream_and_warns(
    tls_upstream: FakeUpstreamHandle, served: list[str]
) -> None:
    settings = settings_from(_config(tls_upstream.url, tls={"verify": False}))
    assert any("tls.verify" in w for w in config_warnings(settings))
    with ProxyInThread(settings) as proxy:
        assert _chat(proxy).status_code == 200
    assert served == ["lean"]


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_https_proxy_from_the_environment_tunnels_and_no_proxy_bypasses_it(
    ca: CertificateAuthority,
    tls_upstream: FakeUpstreamHandle,
    monkeypatch: pytest.MonkeyPatch,
    stream: bool,
    served: list[str],
) -> None:
    config = _config(tls_upstream.url, tls={"ca_file": str(ca.ca)})
    with ForwardProxy() as egress:
        monkeypatch.setenv("HTTPS_PROXY", egress.url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        with ProxyInThread(settings_from(config)) as proxy:
            answer = _chat(proxy, stream)
        assert answer.status_code == 200 and egress.tunnels == [f"127.0.0.1:{tls_upstream.port}"]
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        with ProxyInThread(settings_from(config)) as proxy:
            assert _chat(proxy, stream).status_code == 200
        assert len(egress.tunnels) == 1  # bypassed
    assert served == ["general", "lean"]


def test_a_deployments_proxy_url_wins_and_a_wrong_one_says_so(
    ca: CertificateAuthority,
    tls_upstream: FakeUpstreamHandle,
    monkeypatch: pytest.MonkeyPatch,
    served: list[str],
) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # the environment says: no proxy
    tls = {"ca_file": str(ca.ca)}
    with ForwardProxy() as egress:
        config = _config(tls_upstream.url, tls=tls, proxy_url=egress.url)
        with ProxyInThread(settings_from(config)) as proxy:
            assert _chat(proxy).status_code == 200
        assert len(egress.tunnels) == 1
    wrong = _config(tls_upstream.url, tls=tls, proxy_url=f"http://127.0.0.1:{free_port()}")
    with ProxyInThread(settings_from(wrong)) as proxy:
        refused = _chat(proxy)
    assert refused.status_code == 502 and "proxy" in refused.json()["error"]["message"]
    assert served == ["general"] * 2


@pytest.mark.usefixtures("serving_path")
def test_extra_headers_reach_the_upstream_and_no_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with run_in_thread(FakeUpstreamConfig(port=0)) as upstream:
        headers = {"OpenAI-Project": "proj-secret-42", "X-Gateway": "g"}
        with (
            caplog.at_level(logging.DEBUG),
            ProxyInThread(settings_from(_config(upstream.url, headers=headers))) as proxy,
        ):
            assert _chat(proxy).status_code == 200
        seen = upstream.stats()["last_request"]["headers"]
    lowered = {k.lower(): v for k, v in seen.items()}
    assert lowered["openai-project"] == "proj-secret-42" and lowered["x-gateway"] == "g"
    assert "proj-secret-42" not in caplog.text


def test_a_deployment_may_not_set_the_credential_header() -> None:
    from support.proxy_server import settings_from as parse

    with pytest.raises(Exception, match="may not set Authorization"):
        parse(_config("http://127.0.0.1:1", headers={"Authorization": "Bearer x"}))


@pytest.mark.usefixtures("serving_path")
@pytest.mark.parametrize(
    ("base_url", "cause"),
    [
        ("http://no-such-host.invalid", "could not be resolved"),
        ("http://127.0.0.1:{port}", "refused"),
    ],
)
def test_failure_causes_say_what_broke(base_url: str, cause: str, tmp_path: Path) -> None:
    url = base_url.format(port=free_port())
    with ProxyInThread(settings_from(_config(url))) as proxy:
        refused = _chat(proxy)
    assert refused.status_code == 502
    message = refused.json()["error"]["message"]
    assert cause in message and "127.0.0.1" not in message and "invalid" not in message
