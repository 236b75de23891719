"""The Responses API's stored responses on the request path: a response is remembered
where it was created (``affinity.py``), and what follows it goes there only.

    POST /v1/responses                 -> answered: its id remembered (the plain
                                          answer's; a stream's ``response.created``
                                          event's, before that event reaches the client)
    ... with previous_response_id      -> pinned to the deployment that holds it
    GET / DELETE /v1/responses/{id},   -> the same, for the key that created it only;
    POST .../cancel, GET .../input_items  a DELETE forgets it

An id this proxy did not see created, or created for another key, is 404 (``not_found``,
the same answer for both: ids tell one tenant nothing of another's). A key is its
identity (``ClientKey.identity``), not its name: an API key revoked and created again
under the same name is another key. A pinned request
waits for its deployment (cooling, out of budget) within max_wait, or fails naming it;
it is never sent to another account, where the id does not exist.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

from proxy.catalog.catalog import Catalog, DeploymentRoute, GroupRoute
from proxy.costs import INPUT_TOKENS, TOKENS
from proxy.errors import InvalidRequest, ProxyError
from proxy.pipeline.affinity import MAX_ID, MAX_TOKENS, Affinity, AffinityUnavailable, Owner
from proxy.request.call import Ask, Call, Pin, Reply, StreamSource
from proxy.shapes.responses import RESPONSES, FirstEvent, created_id, final_usage
from proxy.values import value

__all__ = ["FollowUps", "ResponseNotFound", "StoredRoute"]

_PREVIOUS = "previous_response_id"


@value
class StoredRoute:
    """A request for a stored response: its method, id, and its path below
    ``/v1/responses`` (``/{id}``, ``/{id}/cancel``, ``/{id}/input_items?...``);
    ``stream``: its events asked for (``GET /{id}?stream=true``), passed through as a
    created response's stream is."""

    method: str
    response_id: str
    path: str
    stream: bool = False


class ResponseNotFound(ProxyError):
    status = 404
    type = "invalid_request_error"
    default_code = "not_found"


class FollowUps:
    """Per pipeline (its catalog), over the process's one ``affinity`` store."""

    def __init__(self, affinity: Affinity, catalog: Catalog) -> None:
        self.affinity = affinity
        self.catalog = catalog

    async def stored(self, call: Call, route: StoredRoute) -> GroupRoute:
        """The group of the deployment holding ``route``'s response; ``call`` pinned to
        that deployment, with the route's method and path (its stream: the route's, the
        pipeline's to ask)."""
        owner = await self._owner(route.response_id, call.caller.key_identity, None)
        deployment = self._deployment(owner, route.response_id, None)
        call.pin = Pin(deployment.id, route.method, route.path)
        return self.catalog.groups[deployment.group]

    async def prepare(self, call: Call, group: GroupRoute) -> Ask:
        """A create: continuing a stored response, it goes to the deployment that holds
        it (in the model group the request names), and its ask (``call.ask``, returned
        as it goes) grows by the conversation the upstream reads again. (A background one
        answers without usage, the upstream runs it later: it keeps its estimate, as any
        200 whose usage cannot be read.)"""
        ask = call.ask
        previous = ask.body.get(_PREVIOUS)
        if not isinstance(previous, str):
            return ask
        owner = await self._owner(previous, call.caller.key_identity, _PREVIOUS)
        deployment = self._deployment(owner, previous, _PREVIOUS)
        if deployment.group != group.name:
            raise InvalidRequest(
                f"The response '{previous[:MAX_ID]}' is held by the model '{deployment.group}';"
                f" continue it with model '{deployment.group}'.",
                code="previous_response_elsewhere",
                param=_PREVIOUS,
            )
        call.pin = Pin(deployment.id)
        if not owner.tokens:
            return ask
        # The upstream reads the conversation again: its input grows (and its budgets'
        # reservation: budgets.py).
        context = float(owner.tokens)
        cost = {
            **ask.cost,
            TOKENS: ask.cost.get(TOKENS, 0.0) + context,
            INPUT_TOKENS: ask.cost.get(INPUT_TOKENS, 0.0) + context,
        }
        return Ask(
            ask.model,
            ask.requested_model,
            ask.asked_model,
            ask.body,
            ask.raw,
            ask.stream,
            int(cost[TOKENS]),
            cost,
            ask.prefixes,
            owner.tokens,
        )

    async def answered(self, call: Call, route: StoredRoute | None, reply: Reply) -> Reply:
        """Remember the response a create made; forget one a DELETE removed; read the
        usage of one an answer shows over (``call.retrieved``: its held estimate
        settles)."""
        if reply.status != 200 or call.trip.deployment is None:
            return reply
        if route is not None:
            if route.method == "DELETE" and route.path == f"/{route.response_id}":
                await self.affinity.forget(route.response_id)
            elif reply.stream is None and _describes(route):
                usage = final_usage(reply.body, route.response_id)  # a held estimate's
                call.retrieved = None if usage is None else (route.response_id, usage)
            return reply
        if call.ask.body.get("store") is False:  # not stored upstream: nothing follows it
            return reply
        deployment = self._by_id(call.trip.deployment)
        if deployment is None:
            return reply
        owner = Owner(deployment.id, deployment.group, call.caller.key_identity)
        if reply.stream is None:
            response_id = call.created = created_id(reply.body)
            if response_id is not None:
                tokens = RESPONSES.usage(reply.body)
                total = 0 if tokens is None else min(tokens.total, MAX_TOKENS)
                await self.affinity.remember(response_id, replace(owner, tokens=total))
            return reply

        async def ended(response_id: str) -> None:
            """Once the stream is over: its usage (the trip's) sizes what follows it."""
            total = call.trip.real_tokens()
            if total:
                await self.affinity.remember(
                    response_id, replace(owner, tokens=min(total, MAX_TOKENS))
                )

        async def created(response_id: str) -> None:
            call.created = response_id
            await self.affinity.remember(response_id, owner)

        reply.stream = Remembering(reply.stream, created, ended)
        return reply

    async def _owner(self, response_id: str, key: str | None, param: str | None) -> Owner:
        """Its holder, if the key of identity ``key`` created it; else 404 (503: it cannot
        be told)."""
        try:
            owner = None if len(response_id) > MAX_ID else await self.affinity.owner(response_id)
        except AffinityUnavailable:  # its 503: error_table.py
            raise AffinityUnavailable(response_id[:MAX_ID], param) from None
        if owner is None or owner.key != key:
            raise _not_found(response_id, param)
        return owner

    def _deployment(self, owner: Owner, response_id: str, param: str | None) -> DeploymentRoute:
        deployment = self._by_id(owner.deployment)
        if deployment is None:  # removed from the config since: its account is unreachable
            raise ResponseNotFound(
                f"Response with id '{response_id[:MAX_ID]}' is held by the deployment"
                f" '{owner.deployment}', which is no longer configured.",
                param=param,
            )
        return deployment

    def _by_id(self, deployment_id: str) -> DeploymentRoute | None:
        group = self.catalog.groups.get(self.catalog.group_of.get(deployment_id, ""))
        if group is None:
            return None
        return next((d for d in group.deployments if d.id == deployment_id), None)


def _describes(route: StoredRoute) -> bool:
    """Whether the route's answer is the response object (its status and usage)."""
    rid = route.response_id
    return route.path.partition("?")[0] in (f"/{rid}", f"/{rid}/cancel")


def _not_found(response_id: str, param: str | None) -> ResponseNotFound:
    return ResponseNotFound(f"Response with id '{response_id[:MAX_ID]}' not found.", param=param)


class Remembering:
    """A Responses stream whose id (its first event, ``response.created``) is remembered
    before the chunk that carries it goes on: the client cannot follow up on a response
    before every replica can route it."""

    def __init__(
        self,
        stream: StreamSource,
        remember: Callable[[str], Awaitable[None]],
        ended: Callable[[str], Awaitable[None]],
    ) -> None:
        self._stream = stream
        self._remember = remember
        self._ended = ended
        self._id: str | None = None

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        first = FirstEvent()
        async for chunk in self._stream:
            if not first.done:
                self._id = first.feed(chunk)
                if self._id is not None:
                    await self._remember(self._id)
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()  # the trip has the stream's usage then
        response_id, self._id = self._id, None
        if response_id is not None:
            await self._ended(response_id)
