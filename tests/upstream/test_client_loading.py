"""upstream/client.py loads aiohttp only for a request that needs it (an egress proxy, a
HEAD): a worker whose upstreams are all reached directly starts without it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from yarl import URL

from proxy.upstream.client import _env_proxy, create_transport

_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


def _without_proxies() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.lower() not in _PROXY_VARIABLES}


def test_the_app_and_a_direct_upstream_target_load_no_aiohttp() -> None:
    code = (
        "import sys\n"
        "import proxy.process.app\n"
        "from yarl import URL\n"
        "from proxy.upstream.client import _Target\n"
        "target = _Target('https://api.openai.com/v1/chat/completions')\n"
        "assert target.lean and target.env_proxy is None\n"
        "print(sorted(m for m in ('aiohttp', 'httpx_aiohttp') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=_without_proxies(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.fixture
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in os.environ:
        if name.lower() in _PROXY_VARIABLES:
            monkeypatch.delenv(name)
    return monkeypatch


def test_the_environments_proxy_is_read_as_aiohttp_reads_it(
    no_proxies: pytest.MonkeyPatch,
) -> None:
    from aiohttp.helpers import get_env_proxy_for_url

    url = URL("http://upstream.example/v1")
    assert _env_proxy(url) == (None, None)
    no_proxies.setenv("HTTP_PROXY", "http://user:secret@egress.example:3128")
    proxy, auth = _env_proxy(url)
    assert (proxy, auth) == get_env_proxy_for_url(url)
    assert proxy == URL("http://egress.example:3128") and auth is not None
    assert _env_proxy(URL("https://upstream.example/v1")) == (None, None)  # no HTTPS_PROXY
    no_proxies.setenv("NO_PROXY", "upstream.example")
    assert _env_proxy(url) == (None, None)


async def test_start_up_makes_the_session_only_for_a_deployment_that_will_need_it(
    no_proxies: pytest.MonkeyPatch,
) -> None:
    direct = create_transport()
    direct.prepare([("http://127.0.0.1:9/v1", False), ("https://api.openai.com/v1", False)])
    assert direct._session is None
    await direct.aclose()
    own_proxy = create_transport()
    own_proxy.prepare([("http://127.0.0.1:9/v1", False), ("http://127.0.0.1:9/v1", True)])
    assert own_proxy._session is not None
    await own_proxy.aclose()
    no_proxies.setenv("HTTP_PROXY", "http://egress.example:3128")
    environment_proxy = create_transport()
    environment_proxy.prepare([("http://upstream.example/v1", False)])
    assert environment_proxy._session is not None
    await environment_proxy.aclose()
