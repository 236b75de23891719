"""What a budget reserves for a request, and what it settles to (pure).

A budget must never be exceeded by concurrency, so the reservation bounds the real
cost (quota.py says why that suffices):

* input: a BPE token covers at least one byte, so the request body's length in bytes
  bounds every input token it can cost (text, tools, the JSON around them, which also
  covers the few framing tokens per message), and a follow-up's earlier conversation,
  which the upstream reads again (the tokens it reported for the stored response:
  ``Ask.context``), priced at the dearest input price the request can meet (its group's
  deployments and fallbacks, cache prices included);
* output: the request's own cap (``max_completion_tokens`` / ``max_tokens``) for each
  of its ``n`` choices, as its API shape estimates it; a request with no cap is
  forwarded *with* the cap it was reserved for (``server.default_max_tokens``, in its
  shape's ``OutputCaps.sent``), so the bound holds. For a key or team whose budgets clamp
  (``budget_edge: clamp``) the bound is also written as a function of that cap
  (``Clamp``): the limiter may lower the cap to what they have left can pay
  (``limiter/core/edge.py``), and the request then goes with the lower one
  (``lower_cap``), which bounds it as its own did.

Settled, the correction is the real cost (the usage priced at the deployment that
answered) less the reservation; an answer without usage gives it all back, a stream
cut before its usage keeps it all (reading a stream and leaving is no way around a
budget), and so does a 200 whose usage cannot be read (a background response): the
spend report shows what was kept, as an estimate (``estimated_spend``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from proxy import costs
from proxy.costs import TokenUsage
from proxy.limiter.base import Clamp, KeyVerdict
from proxy.limiter.core import edge
from proxy.money.pricing import Price, bound, format_usd, usd
from proxy.money.spend import Spend
from proxy.request.call import Admission, Ask, Call
from proxy.shapes import output_caps
from proxy.shapes.base import Shape
from proxy.shapes.ratelimit_headers import format_reset
from proxy.values import value

CLAMPED_HEADER = "x-llm-proxy-clamped"  # the request went with a lower output cap


@value
class Reservation:
    """What the budgets reserve (kind -> amount), and the cap the request must be sent
    with when it set none (``cap_field``: None when it set its own, or generates
    nothing). ``clamp``: the same bound as a function of its output cap (None: not
    asked for, or its cap cannot be lowered); ``cost`` is then that at its cap."""

    cost: Mapping[str, float]
    cap: int = 0
    cap_field: tuple[str, ...] | None = None
    clamp: Clamp | None = None


def reservation(
    body: dict[str, Any],
    raw: bytes,
    shape: Shape,
    default_cap: int,
    price: Price,
    context: float = 0.0,
    *,
    clamp: bool = False,
) -> Reservation:
    """An upper bound of what the request can cost, at ``price`` (the dearest it can
    meet): its body's bytes and the ``context`` tokens it continues in, its shape's output
    estimate (its cap, or ``default_cap``, per choice) out. ``clamp``: also as a
    function of its cap, for budgets that may lower it (``budget_edge: clamp``)."""
    input_bound = float(len(raw)) + context
    output_bound = float(shape.estimate(body, default_cap).get(costs.OUTPUT_TOKENS, 0.0))
    uncapped = output_bound > 0 and not shape.estimate(body, 0).get(costs.OUTPUT_TOKENS, 0.0)
    caps = shape.output_caps
    cap_field = caps.sent if uncapped and caps is not None else None
    linear = _clamp(body, caps, price, input_bound, output_bound) if clamp else None
    if linear is not None:
        return Reservation(edge.at(linear, linear.most), default_cap, cap_field, linear)
    return Reservation(
        cost={
            costs.REQUESTS: 1.0,
            costs.TOKENS: input_bound + output_bound,
            costs.INPUT_TOKENS: input_bound,
            costs.OUTPUT_TOKENS: output_bound,
            costs.USD: bound(price, input_bound, output_bound),
        },
        cap=default_cap,
        cap_field=cap_field,
    )


def _clamp(
    body: dict[str, Any],
    caps: output_caps.OutputCaps | None,
    price: Price,
    input_bound: float,
    output_bound: float,
) -> Clamp | None:
    """The reservation as ``base + per * cap`` (``Clamp``): its input bound, then each
    token of cap in each of its completions; None when its cap cannot be lowered."""
    if output_bound <= 0 or caps is None:
        return None
    n = output_caps.completions(body, caps)
    most = int(output_bound) // n
    least = output_caps.least(body, caps)
    if least >= most:
        return None
    base = {
        costs.REQUESTS: 1.0,
        costs.TOKENS: input_bound,
        costs.INPUT_TOKENS: input_bound,
        costs.OUTPUT_TOKENS: 0.0,
        costs.USD: bound(price, input_bound, 0.0),
    }
    per = {costs.TOKENS: float(n), costs.OUTPUT_TOKENS: float(n), costs.USD: bound(price, 0, n)}
    return Clamp(base, per, most, least)


def lower_cap(ask: Ask, admission: Admission, shape: Shape, cap: int) -> tuple[Ask, Admission]:
    """``ask`` to go with at most ``cap`` output tokens per completion (a budget that
    clamps could pay no more: ``KeyVerdict.cap``), every field that carries its cap set,
    in its body and its bytes; ``admission``'s reservation at that cap."""
    clamp = admission.clamp
    assert clamp is not None  # (a verdict lowers only an ask's clamp)
    fields = output_caps.lowered(ask.body, shape.output_caps, cap)
    return (ask.sent_with(fields) if fields else ask), admission.lowered(replace(clamp, most=cap))


def bound_now(call: Call) -> Mapping[str, float]:
    """What the request's budgets reserve for it as it would go now: its reservation,
    at the cap a budget lowered it to since (a fallback's: its own), if one did."""
    clamp = call.admission.clamp
    return call.admission.reserved if clamp is None else edge.at(clamp, clamp.most)


def real_cost(usage: TokenUsage, price: Price) -> dict[str, float]:
    """What a request that used ``usage`` on a deployment at ``price`` costs."""
    return {costs.REQUESTS: 1.0, **costs.usage_cost(usage), costs.USD: usd(price, usage)}


def usage_of(call: Call) -> TokenUsage | None:
    """What the upstream reported the request used, as its shape read it (None: it did
    not say)."""
    return call.trip.usage


def settled_cost(
    call: Call, price: Price, reserved: Mapping[str, float] | None = None
) -> dict[str, float] | None:
    """What its budgets settle to: the real cost; a stream cut before its usage keeps
    its reservation (``reserved``, if not ``call.admission.reserved``: a fallback's own); None: no
    usage known (the reservation goes back)."""
    usage = usage_of(call)
    if usage is None:
        if call.trip.unreported_tokens is None:
            return None
        return dict(call.admission.reserved if reserved is None else reserved)
    return real_cost(usage, price)


def estimated_spend(call: Call, price: Price) -> Spend | None:
    """What a request charged without usage (a stream cut before it, a 200 whose usage
    cannot be read) reports: what its budgets kept (its reservation), else what its
    windows were charged priced at ``price``; None: nothing was charged."""
    if call.trip.unreported_tokens is None:
        return None
    reserved = call.admission.reserved
    if reserved:
        return Spend(
            reserved.get(costs.USD, 0.0),
            round(reserved.get(costs.INPUT_TOKENS, 0.0)),
            round(reserved.get(costs.OUTPUT_TOKENS, 0.0)),
            estimated=1,
        )
    charged = call.trip.charged_cost(call.ask.cost) or {}
    tokens = TokenUsage(
        round(charged.get(costs.INPUT_TOKENS, 0.0)), round(charged.get(costs.OUTPUT_TOKENS, 0.0))
    )
    return Spend(usd(price, tokens), tokens.input_tokens, tokens.output_tokens, estimated=1)


def correction(real: Mapping[str, float] | None, reserved: Mapping[str, float]) -> dict[str, float]:
    """Real minus reserved, per kind; ``real`` None (no usage known): everything back."""
    if real is None:
        return {kind: -amount for kind, amount in reserved.items()}
    return {kind: real.get(kind, 0.0) - amount for kind, amount in reserved.items()}


def refusal_message(verdict: KeyVerdict) -> str:
    """A budget's 429: which budget, what is left, when it all returns."""
    refused = verdict.budget
    assert refused is not None
    left = next((u for q, u in verdict.budgets if q == refused), None)
    remaining = left.remaining if left is not None else 0.0
    unit = "USD" if refused.kind == costs.USD else refused.kind.replace("_", " ")
    amount = format_usd(remaining) if refused.kind == costs.USD else f"{remaining:g}"
    resets = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + verdict.retry_after))
    scope = f" on {', '.join(refused.models)}" if refused.models else ""
    whose = f"this key's team {refused.owner}" if refused.scope == "team" else "this key"
    return (
        f"Budget reached for {whose}: {refused.limit:g} {unit} per {refused.period}{scope}"
        f" ({amount} {unit} left, less than this request may cost); it resets in"
        f" {format_reset(verdict.retry_after)}, at {resets}."
    )
