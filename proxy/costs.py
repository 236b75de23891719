"""What a request costs, as data: an amount per limit kind (pure).

A limit kind is a name. A window of kind ``k`` charges a request ``cost.get(k, 0)``, so a
new kind is a config row (a window of it) plus what a request costs in it (the API shape's
estimate, then its real usage): nothing in the limiter's backends or scripts names kinds.

``TokenUsage`` is what an upstream answer says a request used, in the counts the API
shapes read; ``usage_cost`` turns it into the cost the windows are settled to.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from proxy.values import value

Cost = Mapping[str, float]  # kind -> amount; a kind absent costs 0

REQUESTS = "requests"
TOKENS = "tokens"  # input and output together
INPUT_TOKENS = "input_tokens"
OUTPUT_TOKENS = "output_tokens"
USD = "usd"

KINDS: tuple[str, ...] = (REQUESTS, TOKENS, INPUT_TOKENS, OUTPUT_TOKENS, USD)


@value
class TokenUsage:
    """Tokens an upstream reports for one request.

    ``input_tokens`` is every input token the upstream counts toward its input-token
    limits (for Anthropic: ``input_tokens`` plus ``cache_creation_input_tokens``; its cache
    reads do not count toward its limits, docs/limiter.md). The cache fields break the
    input down for prices: ``cached_input`` (OpenAI: prompt tokens served from its cache,
    part of ``input_tokens``), ``cache_read`` (Anthropic: not part of ``input_tokens``),
    ``cache_write`` (Anthropic: part of ``input_tokens``)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input: int = 0
    cache_read: int = 0
    cache_write: int = 0

    @property
    def total(self) -> int:
        """What a ``tokens`` window counts: everything the upstream read and wrote."""
        return self.input_tokens + self.cache_read + self.output_tokens


def count(value: object) -> int | None:
    """A count a client sends (an output cap): an int, not negative (anything else is
    not a count it means, and is read as none)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


MAX_COUNT = 100_000_000  # tokens one count of an answer's usage may say: more is clamped
_BEYOND_64_BITS = float(2**64)  # orjson reads a larger integer as a float


class NoCount(ValueError):
    """A usage count the upstream wrote that is no count: its usage cannot be read."""


def usage_count(value: object) -> int | None:
    """A count of an answer's usage: None where it states none (absent, null); an integer
    not negative, bounded by ``MAX_COUNT`` (a larger one, an integer beyond 64 bits read
    as a float included, is that bound: no request uses more). Anything else (negative,
    a fraction, a string, a boolean) raises ``NoCount``: the usage is unreadable, and the
    request is charged its estimate, never 0 for the count it garbled."""
    if type(value) is int:
        if value >= 0:
            return min(value, MAX_COUNT)
    elif value is None:
        return None
    elif type(value) is float and value >= _BEYOND_64_BITS:
        return MAX_COUNT
    raise NoCount(f"not a token count: {value!r}"[:100])


@value
class Counting:
    """How one provider's rate limits count a request's tokens: the rule its deployments'
    windows follow at admission (``admitted``) and once the answer is known
    (``counted``). Each provider's module says its own, citing its documentation
    (``proxy/providers/``); docs/limiter.md has them side by side.

    ``cache_reads``: input read from a prompt cache counts as input (OpenAI's and Azure's
    cached prompt tokens are part of the prompt they count; Anthropic does not count its
    cache reads for current models). ``adjusted``: the charge made at admission is
    adjusted to what the answer reports, down as well as up (Anthropic: its input count
    is the request's real uncached input, and its output limit is "adjusted at the end of
    the request"); otherwise it is kept and only charged more when the answer reports
    more (a limit that counts its estimate when the request arrives, prompt plus the
    output cap, and never gives back what the request did not use).

    A deployment's windows only: a client key's windows and budgets are the proxy's own
    and count as ``usage_cost`` says whatever the provider."""

    cache_reads: bool = True
    adjusted: bool = False

    def admitted(self, cost: Cost, cache_read: float) -> Cost:
        """``cost`` (a request's estimate, its whole input included) as these windows
        count it when ``cache_read`` of its input tokens are expected to be read from
        the provider's prompt cache."""
        if self.cache_reads or cache_read <= 0.0:
            return cost
        return without_cache_read(cost, cache_read)

    def counted(self, estimate: Cost, usage: TokenUsage) -> dict[str, float]:
        """What these windows count of a request charged ``estimate`` at admission whose
        answer reported ``usage``: its token kinds from the usage, any other kind as
        estimated (a usage says nothing of it)."""
        given = float(usage.input_tokens + (usage.cache_read if self.cache_reads else 0))
        made = float(usage.output_tokens)
        total = given + made
        if not self.adjusted:  # the admission's count stands: more only if it used more
            given = max(given, estimate.get(INPUT_TOKENS, 0.0))
            made = max(made, estimate.get(OUTPUT_TOKENS, 0.0))
            total = max(given + made, estimate.get(TOKENS, 0.0))
        return {**estimate, TOKENS: total, INPUT_TOKENS: given, OUTPUT_TOKENS: made}


def without_cache_read(cost: Cost, cache_read: float) -> dict[str, float]:
    """``cost`` less ``cache_read`` input tokens (at most its input), in its input and
    its total: what a limit that does not count cache reads charges."""
    read = min(cache_read, cost.get(INPUT_TOKENS, 0.0))
    out = dict(cost)
    out[INPUT_TOKENS] = cost.get(INPUT_TOKENS, 0.0) - read
    out[TOKENS] = cost.get(TOKENS, 0.0) - read
    return out


def usage_cost(usage: TokenUsage) -> dict[str, float]:
    """The cost one request's real usage settles its token windows to (``usd`` is added
    by pricing, where the deployment has a price)."""
    return {
        TOKENS: float(usage.total),
        INPUT_TOKENS: float(usage.input_tokens),
        OUTPUT_TOKENS: float(usage.output_tokens),
    }


class _Nothing(Mapping[str, float]):
    """The empty cost, immutable and hashable (a value class's default)."""

    __slots__ = ()

    def __getitem__(self, kind: str) -> float:
        raise KeyError(kind)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "NOTHING"


NOTHING: Cost = _Nothing()


def estimate_cost(input_tokens: float, output_tokens: float = 0.0) -> dict[str, float]:
    """One request's estimate before it is sent: one request, and at most
    ``input_tokens`` read and ``output_tokens`` written (the completion's cap)."""
    return {
        REQUESTS: 1.0,
        TOKENS: input_tokens + output_tokens,
        INPUT_TOKENS: input_tokens,
        OUTPUT_TOKENS: output_tokens,
    }


def negated(cost: Cost) -> dict[str, float]:
    """``cost`` given back (a turn nobody used, a request the upstream did not admit)."""
    return {kind: -amount for kind, amount in cost.items()}
