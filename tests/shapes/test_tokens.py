"""Token estimates reserve prompt plus the most the completion may use."""

from proxy.costs import INPUT_TOKENS, OUTPUT_TOKENS, REQUESTS, TOKENS
from proxy.shapes.chat import CHAT
from proxy.shapes.embeddings import EMBEDDINGS
from proxy.shapes.tokens import completion_tokens, prompt_tokens


def test_chat_prompt_grows_with_text() -> None:
    short = {"messages": [{"role": "user", "content": "hi"}]}
    long = {"messages": [{"role": "user", "content": "x" * 4000}]}
    assert 0 < prompt_tokens(short) < prompt_tokens(long)
    assert prompt_tokens(long) >= 1000


def test_content_parts_and_token_ids() -> None:
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "y" * 400}]}]}
    assert prompt_tokens(parts) >= 100
    assert prompt_tokens({"prompt": [1, 2, 3, 4]}) == 4
    assert prompt_tokens({"input": ["aaaa", "bbbb"]}) == 4


def test_completion_uses_max_tokens_times_n_else_default() -> None:
    assert completion_tokens({"max_tokens": 50}, 256) == 50
    assert completion_tokens({"max_completion_tokens": 20, "n": 3}, 256) == 60
    assert completion_tokens({}, 256) == 256
    assert completion_tokens({"max_tokens": "lots"}, 256) == 256


def test_n_choices_multiply_the_default_too() -> None:
    """Without a cap of its own, each of n choices may use the default."""
    assert completion_tokens({"n": 4}, 256) == 1024
    assert completion_tokens({"n": True}, 256) == 256  # not a count


def test_embeddings_reserve_no_completion() -> None:
    assert EMBEDDINGS.estimate({"input": "abcd"}, 256)[TOKENS] == 2
    assert CHAT.estimate({"messages": [], "max_tokens": 10}, 256)[TOKENS] == 13


def test_an_estimate_is_a_cost_in_every_kind_a_shape_estimates() -> None:
    cost = CHAT.estimate({"messages": [], "max_tokens": 10}, 256)
    assert cost == {REQUESTS: 1.0, TOKENS: 13.0, INPUT_TOKENS: 3.0, OUTPUT_TOKENS: 10.0}
    assert EMBEDDINGS.estimate({"input": "abcd"}, 256)[OUTPUT_TOKENS] == 0
