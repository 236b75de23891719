"""Each provider's rule for counting tokens toward its limits (``Provider.counting``),
the rule its deployments' windows follow at admission and after the answer: a request
with a prompt of 1,000 tokens (900 of them cached) and a cap of 200, answered with 10."""

from __future__ import annotations

import inspect

import pytest

from proxy.costs import TokenUsage, estimate_cost
from proxy.providers import PROVIDERS, provider_of

ESTIMATE = estimate_cost(1_000, 200)  # the whole prompt, and max_tokens
EXPECTED_READ = 900  # what the deployment's cache is known to hold of it


def _tokens(cost: dict[str, float]) -> tuple[float, float, float]:
    return cost["input_tokens"], cost["output_tokens"], cost["tokens"]


def test_openai_counts_cached_prompt_tokens_and_keeps_the_admissions_estimate() -> None:
    """Cached prompt tokens are part of ``prompt_tokens`` and count toward the TPM; the
    prompt and the cap counted at admission are not given back."""
    openai = provider_of("openai").counting
    assert openai.admitted(ESTIMATE, EXPECTED_READ) == ESTIMATE
    answered = TokenUsage(input_tokens=1_000, cached_input=900, output_tokens=10)
    assert _tokens(openai.counted(ESTIMATE, answered)) == (1_000, 200, 1_200)
    longer = TokenUsage(input_tokens=1_300, cached_input=900, output_tokens=10)
    assert _tokens(openai.counted(ESTIMATE, longer)) == (1_300, 200, 1_500)


def test_azure_counts_max_tokens_at_admission_and_never_gives_it_back() -> None:
    """Azure's estimate (prompt text, max_tokens) is its running count: a cap of 200
    counts 200 whatever the answer used; a cached prompt counts whole."""
    azure = provider_of("azure").counting
    assert azure.admitted(ESTIMATE, EXPECTED_READ) == ESTIMATE
    answered = TokenUsage(input_tokens=1_000, cached_input=900, output_tokens=10)
    assert _tokens(azure.counted(ESTIMATE, answered)) == (1_000, 200, 1_200)


def test_anthropic_leaves_cache_reads_out_and_adjusts_to_the_answer() -> None:
    """ITPM counts uncached input and cache writes, not cache reads; OTPM is estimated
    from max_tokens and adjusted at the end: the answer's 60 uncached, 40 written, 900
    read and 10 written out count 100 in and 10 out."""
    anthropic = provider_of("anthropic").counting
    admitted = anthropic.admitted(ESTIMATE, EXPECTED_READ)
    assert _tokens(dict(admitted)) == (100, 200, 300)
    assert admitted["requests"] == 1.0
    answered = TokenUsage(input_tokens=100, output_tokens=10, cache_read=900, cache_write=40)
    assert _tokens(anthropic.counted(admitted, answered)) == (100, 10, 110)
    missed = TokenUsage(input_tokens=1_000, output_tokens=10, cache_write=900)  # evicted
    assert _tokens(anthropic.counted(admitted, missed)) == (1_000, 10, 1_010)


def test_bedrock_counts_input_and_output_together_adjusted_without_cache_reads() -> None:
    """One tokens-per-minute quota: input and max_tokens taken at the start, adjusted to
    the output used at the end; cache reads do not count."""
    bedrock = provider_of("bedrock").counting
    admitted = bedrock.admitted(ESTIMATE, EXPECTED_READ)
    answered = TokenUsage(input_tokens=100, output_tokens=10, cache_read=900, cache_write=40)
    assert _tokens(bedrock.counted(admitted, answered)) == (100, 10, 110)


@pytest.mark.parametrize("name", sorted(PROVIDERS))
def test_each_provider_says_where_its_rule_comes_from(name: str) -> None:
    """Its module states the rule beside the documentation it follows."""
    source = inspect.getsource(inspect.getmodule(PROVIDERS[name]))  # type: ignore[arg-type]
    rule = source[source.index("# How ") : source.index("_COUNTING = Counting(")]
    assert "https://" in rule, name
