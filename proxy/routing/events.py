"""What the dispatcher reports as a request goes: one event per upstream attempt, and the
few that are not about an attempt (waiting, refusals, health). Metrics and logs consume
them (``proxy/observability/telemetry.py``), and traces when they are on
(``proxy/observability/tracing.py``); the dispatcher itself touches none of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from proxy.limiter.base import NEUTRAL, HealthChange, Outcome
from proxy.providers.ratelimits import UpstreamBudget

if TYPE_CHECKING:
    from proxy.request.call import Call, Reply

__all__ = ["Attempt", "Events", "WaitCause"]

# Why a request waited: for its reserved turn (the deployment's pace), behind other
# requests of its key or for others' fair share (routing.lookahead), or for a cooling
# deployment to come back (or a probe's answer).
WaitCause = Literal["pacing", "fair_share", "cooldown"]


@dataclass(slots=True)
class Attempt:
    """One upstream call of a request, from the moment it is sent until it ended."""

    request_id: str
    model: str  # the deployment's group (a configured name: safe as a label)
    deployment: str  # its configured id
    started: float  # perf_counter
    ended: float = 0.0
    # "200"/"429"/... for an answer, else the failure's reason ("timeout", ...) or how a
    # stream ended ("interrupted", "abandoned").
    label: str = ""
    outcome: Outcome = NEUTRAL
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    call: Call | None = None  # the request it is for
    # The headers it forwards, still to be sent when ``attempt_started`` is heard: where a
    # tracer writes the attempt's ``traceparent``.
    headers: dict[str, str] | None = None

    @property
    def duration(self) -> float:
        return self.ended - self.started


class Events(Protocol):
    def attempt_started(self, attempt: Attempt) -> None: ...

    def answered(self, attempt: Attempt, reply: Reply) -> None:
        """The upstream's answer to pass on (before it is on its way): its body, or its
        stream still to be read (``reply.stream``, which a listener may wrap)."""
        ...

    def first_token(self, attempt: Attempt, seconds: float) -> None:
        """A streamed answer's first chunk arrived ``seconds`` after it was sent."""
        ...

    def attempt_ended(self, attempt: Attempt) -> None:
        """Once per attempt, with its label, outcome, duration and usage."""
        ...

    def health_changed(
        self, model: str, deployment: str, outcome: Outcome, change: HealthChange
    ) -> None: ...

    def upstream_budget(self, model: str, deployment: str, budget: UpstreamBudget) -> None:
        """What an upstream's rate-limit headers said it has left."""
        ...

    def usage_unreadable(self, shape: str, attempt: Attempt) -> None:
        """A 200 whose usage its API shape could not read: settled at the estimate."""
        ...

    def limits_announced(self, deployment: str, lowered: dict[str, int]) -> None:
        """Configured limits were lowered to what the upstream announces."""
        ...

    def queued(self, model: str, delta: int, tier: str) -> None:
        """A request started (+1) or stopped (-1) waiting for its turn (``tier``: its
        key's priority, as configured)."""
        ...

    def waited(self, call: Call, seconds: float, cause: WaitCause) -> None:
        """``call`` waited ``seconds``, until now, for the reason ``cause``."""
        ...

    def refused(self, scope: str, model: str) -> None:
        """The proxy refused a request because of ``scope``'s limit (a 429 or 503)."""
        ...
