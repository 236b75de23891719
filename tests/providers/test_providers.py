"""A provider says where a deployment serves each shape, with which key header, and which
of its answers mean the deployment's own config is wrong."""

from proxy.config.settings import Deployment
from proxy.providers import provider_of

AZURE = Deployment.model_validate(
    {
        "id": "az",
        "provider": "azure",
        "base_url": "https://r.openai.azure.com",
        "deployment": "gpt-4o-prod",
        "api_version": "2024-10-21",
        "api_key": "azure-secret",
    }
)
OPENAI = Deployment.model_validate({"id": "oa", "base_url": "https://api.openai.com/v1"})


def test_urls_per_shape() -> None:
    assert provider_of("openai").url(OPENAI, "embeddings") == "https://api.openai.com/v1/embeddings"
    assert provider_of("azure").url(AZURE, "chat/completions") == (
        "https://r.openai.azure.com/openai/deployments/gpt-4o-prod/chat/completions"
        "?api-version=2024-10-21"
    )


def test_the_key_header_and_none_without_a_key() -> None:
    assert provider_of("azure").credential(AZURE) == ("api-key", "azure-secret")
    assert provider_of("openai").credential(OPENAI) is None


def test_only_azure_says_its_config_is_wrong() -> None:
    azure = provider_of("azure")
    assert azure.misconfigured(404, b"{}", 30.0) is not None
    assert azure.misconfigured(400, b'{"error": "API version not supported"}', 30.0) is not None
    assert azure.misconfigured(400, b'{"error": "bad messages"}', 30.0) is None
    assert provider_of("openai").misconfigured(404, b"{}", 30.0) is None


ANTHROPIC = Deployment.model_validate(
    {
        "id": "an",
        "provider": "anthropic",
        "base_url": "https://api.anthropic.com/",
        "api_key": "sk-ant-secret",
    }
)


def test_anthropic_serves_messages_and_token_counts_under_v1_with_x_api_key() -> None:
    anthropic = provider_of("anthropic")
    assert anthropic.shapes == {"messages", "messages/count_tokens"}
    assert anthropic.url(ANTHROPIC, "messages") == "https://api.anthropic.com/v1/messages"
    assert anthropic.url(ANTHROPIC, "messages/count_tokens") == (
        "https://api.anthropic.com/v1/messages/count_tokens"
    )
    assert anthropic.credential(ANTHROPIC) == ("x-api-key", "sk-ant-secret")
    assert anthropic.default_headers == (("anthropic-version", "2023-06-01"),)


def test_anthropics_not_found_says_the_deployments_model_or_url_is_wrong() -> None:
    anthropic = provider_of("anthropic")
    not_found = b'{"type":"error","error":{"type":"not_found_error","message":"model: x"}}'
    assert anthropic.misconfigured(404, not_found, 30.0) is not None
    assert anthropic.misconfigured(400, b'{"type":"error"}', 30.0) is None
    assert anthropic.misconfigured(404, b"<html>", 30.0) is None  # left to outcomes.unshaped
    # The model was the client's own name (a pattern group's): the client's answer.
    assert anthropic.misconfigured(404, not_found, 30.0, asked=True) is None
    assert provider_of("azure").misconfigured(404, b"{}", 30.0, asked=True) is not None  # its path
