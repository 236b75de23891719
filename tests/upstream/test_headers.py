"""What crosses the proxy: never the client's credentials or hop-by-hop headers."""

from proxy.upstream.headers import request_headers, response_headers


def test_client_credentials_and_hop_by_hop_headers_are_stripped() -> None:
    client = [
        ("authorization", "Bearer client-key"),
        ("connection", "keep-alive"),
        ("transfer-encoding", "chunked"),
        ("host", "proxy"),
        ("cookie", "a=b"),
        ("content-type", "application/json"),
        ("openai-beta", "assistants=v2"),
        ("x-stainless-lang", "python"),
    ]
    headers = request_headers(client, ("authorization", "Bearer upstream-key"))
    assert headers["authorization"] == "Bearer upstream-key"
    assert "client-key" not in str(headers)
    for gone in ("connection", "transfer-encoding", "host", "cookie"):
        assert gone not in headers
    assert headers["content-type"] == "application/json"
    assert headers["openai-beta"] == "assistants=v2"


def test_no_upstream_key_means_no_authorization() -> None:
    assert "authorization" not in request_headers([("authorization", "Bearer c")], None)


def test_azure_gets_its_key_as_api_key_and_never_the_clients() -> None:
    client = [
        ("authorization", "Bearer client-key"),
        ("api-key", "client-azure-key"),
        ("API-Key", "client-azure-key-2"),
        ("content-type", "application/json"),
    ]
    headers = request_headers(client, ("api-key", "azure-key"))
    assert headers["api-key"] == "azure-key"
    assert "authorization" not in headers
    assert "client" not in str(headers)


def test_an_openai_deployment_never_passes_a_client_api_key_on() -> None:
    headers = request_headers([("api-key", "client-azure-key")], ("authorization", "Bearer k"))
    assert "api-key" not in headers


def test_upstream_rate_limit_headers_do_not_reach_the_client() -> None:
    upstream = [
        ("content-type", "application/json"),
        ("x-ratelimit-remaining-requests", "3"),
        ("openai-processing-ms", "12"),
        ("set-cookie", "x"),
    ]
    assert response_headers(upstream) == {
        "content-type": "application/json",
        "openai-processing-ms": "12",
    }


def test_headers_the_clients_connection_header_names_are_hop_by_hop_too() -> None:
    client = [
        ("connection", "Upgrade, HTTP2-Settings, X-Hop"),
        ("upgrade", "h2c"),
        ("http2-settings", "AAMAAABkAARAAAAAAAIAAAAA"),
        ("x-hop", "1"),
        ("x-end-to-end", "2"),
    ]
    headers = request_headers(client, ("authorization", "Bearer k"))
    for gone in ("connection", "upgrade", "http2-settings", "x-hop"):
        assert gone not in headers
    assert headers["x-end-to-end"] == "2"


def test_the_client_never_chooses_the_organization_or_project_billed() -> None:
    client = [("OpenAI-Organization", "org-client"), ("openai-project", "proj-client")]
    assert request_headers(client, ("authorization", "Bearer k")).keys() == {
        "accept-encoding",
        "authorization",
    }
    configured = (("OpenAI-Organization", "org-deployment"), ("OpenAI-Project", "proj-d"))
    headers = request_headers(client, ("authorization", "Bearer k"), configured)
    assert headers["openai-organization"] == "org-deployment"
    assert headers["openai-project"] == "proj-d"
