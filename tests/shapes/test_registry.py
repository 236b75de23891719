"""Every API shape is reached at its paths, and the registry names each once."""

from proxy import shapes
from proxy.config.settings import PROVIDER_NAMES
from proxy.providers import PROVIDERS


def test_each_client_path_leads_to_one_shape() -> None:
    assert {path: shape.name for path, shape in shapes.BY_PATH.items()} == {
        "/v1/chat/completions": "chat/completions",
        "/v1/completions": "completions",
        "/v1/embeddings": "embeddings",
        "/v1/messages": "messages",
        "/v1/messages/count_tokens": "messages/count_tokens",
        "/v1/responses": "responses",
    }
    assert len(shapes.BY_NAME) == len(shapes.SHAPES)  # one name each: a metric label


def test_every_shape_is_spoken_by_some_provider() -> None:
    spoken = set().union(*(p.shapes for p in PROVIDERS.values()))
    assert {s.name for s in shapes.SHAPES} <= spoken


def test_the_config_names_exactly_the_registered_providers() -> None:
    assert set(PROVIDER_NAMES) == set(PROVIDERS)
