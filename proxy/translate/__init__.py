"""Translation between OpenAI's chat completions and Anthropic's Messages API, both ways,
and from chat completions to AWS Bedrock's Converse API (pure): a request for a
deployment that does not speak the client's API, its answer (a buffered one, an error, a
stream event by event) back in the client's API's shape.

Translation happens only when the chosen deployment does not speak the client's API
(design.md): a group may mix providers, and each attempt (a retry, a fallback) builds its
request for its own deployment (upstream/exchange.py, the one seam). What has no faithful
counterpart is a 400 naming the field (refusals.py); docs/translation.md is the table.

    to_messages.py  chat request -> Messages request
    to_chat.py      Messages request -> chat request
    response.py     answers back (buffered, errors), stop reasons, usage
    stream.py       streams back, event by event
    converse.py     Converse's answers and streams back (converse_request.py: the
                    chat request -> Converse request: turns, tools, images)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.costs import TokenUsage
from proxy.errors import InvalidRequest
from proxy.shapes.base import Shape
from proxy.shapes.chat import CHAT
from proxy.shapes.converse import CONVERSE
from proxy.shapes.messages import MESSAGES
from proxy.translate import converse, response, stream
from proxy.translate.refusals import Untranslatable
from proxy.translate.stream import EventStream
from proxy.translate.to_chat import to_chat
from proxy.translate.to_messages import to_messages

__all__ = [
    "LINKS",
    "EventStream",
    "Link",
    "Translations",
    "Untranslatable",
    "link_for",
    "reachable",
]


@dataclass(frozen=True, slots=True)
class Link:
    """How requests of one API reach deployments speaking another, and come back."""

    client: str  # the client's API shape's name
    upstream: Shape  # the API shape the deployment speaks
    # The request translated (the body, the output cap when it sets none); raises
    # InvalidRequest naming what it cannot translate.
    request: Callable[[dict[str, Any], int], dict[str, Any]]
    # A buffered 200 (and epoch seconds): the client's body, and the upstream's usage.
    answer: Callable[[bytes, int], tuple[bytes, TokenUsage | None]]
    # An error body (and its status) in the client's API's shape.
    error: Callable[[int, bytes], bytes]
    # One stream's translation (the client's request, epoch seconds).
    stream: Callable[[dict[str, Any], int], EventStream]


# Each client API's links, in the order they are preferred (a deployment speaking two
# of the APIs translated to takes the first).
LINKS: dict[str, tuple[Link, ...]] = {
    CHAT.name: (
        Link(
            CHAT.name,
            MESSAGES,
            to_messages,
            response.chat_from_message,
            response.chat_error,
            stream.to_chat,
        ),
        Link(
            CHAT.name,
            CONVERSE,
            converse.to_converse,
            converse.chat_from_converse,
            converse.converse_error,
            converse.to_converse_chat_stream,
        ),
    ),
    MESSAGES.name: (
        Link(
            MESSAGES.name,
            CHAT,
            to_chat,
            response.message_from_chat,
            response.messages_error,
            stream.to_messages,
        ),
    ),
}


def link_for(shape: str, speaks: Callable[[str], bool]) -> Link | None:
    """How a request of the API named ``shape`` reaches a deployment that does not speak
    it (``speaks``: which API shapes it does); None: it cannot."""
    return next((link for link in LINKS.get(shape, ()) if speaks(link.upstream.name)), None)


def reachable(spoken: frozenset[str]) -> frozenset[str]:
    """The API shapes served by deployments speaking ``spoken``, with translation."""
    return spoken | {
        name for name, links in LINKS.items() if any(link.upstream.name in spoken for link in links)
    }


class Translations:
    """One request's translations, by the API shape they are for: each made once, on
    first need (a retry or a fallback to a deployment of the same API reuses it), from
    its body as it is then (a budget may have lowered its cap since the first); a
    refusal is kept and raised again."""

    __slots__ = ("_cap", "_made")

    def __init__(self, default_cap: int) -> None:
        self._cap = default_cap
        self._made: dict[str, dict[str, Any] | InvalidRequest] = {}

    def body_for(self, link: Link, body: dict[str, Any]) -> dict[str, Any]:
        """The request (its ``body`` now) translated for ``link`` (raises its refusal)."""
        made = self._made.get(link.upstream.name)
        if made is None:
            try:
                made = link.request(body, self._cap)
            except InvalidRequest as refusal:
                made = refusal
            self._made[link.upstream.name] = made
        if isinstance(made, InvalidRequest):
            raise made
        return made

    def refused(self, link: Link) -> bool:
        """Whether the translation for ``link``, if made, refused the request."""
        return isinstance(self._made.get(link.upstream.name), InvalidRequest)

    def refusal(self) -> InvalidRequest | None:
        """Why the request could not be translated (the first refusal), if it could not."""
        return next((m for m in self._made.values() if isinstance(m, InvalidRequest)), None)
