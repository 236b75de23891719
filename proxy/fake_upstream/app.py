"""The aiohttp application: OpenAI-compatible endpoints (chat, completions, embeddings,
the Responses API), Anthropic's Messages API, AWS Bedrock's InvokeModel, plus /stats and
/control.

A request's API (`request[API]`: openai, responses, anthropic or bedrock) decides the shape of
its errors and rate-limit headers.

Everything runs on one event loop, so the state needs no locks. The hot path does one
JSON parse, one sliding-window check and one orjson dump; no logging, no middleware.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import random
import time
from collections.abc import Awaitable, Callable
from enum import Enum
from typing import Any

import orjson
from aiohttp import web

from . import anthropic, azure, bedrock, bodies, gemini, responses, vertex
from .bodies import Job
from .config import FakeUpstreamConfig
from .prompt_cache import PromptCache
from .ratelimit import Rejection, ceil_millis, ceil_seconds
from .stats import LastRequest, Stats
from .windows import Windows, input_cost, limited, rate_limit_message

JSON_HEADERS = {"Content-Type": "application/json"}
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
# Which API a request speaks: "openai" (the default), "responses" or "anthropic".
API: web.RequestKey[str] = web.RequestKey("api", str)
# A Messages API request on Vertex AI's paths (its bearer token, Google's errors).
VERTEX: web.RequestKey[bool] = web.RequestKey("vertex", bool)
HANG_POLL_SECONDS = 0.05  # how often a hung request looks whether its client went away
MAX_BODY_BYTES = 16 * 1024 * 1024


class Fault(Enum):
    DROP = "drop"
    HANG = "hang"
    FAIL = "fail"


class _Answered(Exception):
    """Raised by validation steps to answer at once with `response`."""

    def __init__(self, response: web.StreamResponse) -> None:
        super().__init__()
        self.response = response


Parser = Callable[[dict[str, Any], FakeUpstreamConfig], Job | str]
Renderer = Callable[[Job, str, int], bytes]
ChunkRenderer = Callable[[Job, str, int, int], list[bytes]]


class FakeUpstream:
    """The server's state and its request handlers."""

    def __init__(self, config: FakeUpstreamConfig) -> None:
        self.config = config
        self.stats = Stats()
        self.windows = Windows(config)
        self.responses = responses.ResponseStore()
        self.prompt_cache = PromptCache()  # the Messages API's, with `prompt_cache` on
        self.rng = random.Random(config.seed)
        self._ids = itertools.count(1)
        self._id_prefix = os.urandom(4).hex()  # distinct ids across instances
        self._hanging: set[int] = set()  # id() of hung requests: their end is no disconnect
        self._models_body = bodies.models_list(config.models, int(time.time()))
        self.tokens = vertex.TokenIssuer(config.google_service_accounts, config.token_lifetime)

    # ------------------------------------------------------------ state operations

    def control(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply runtime option changes (ValueError if any is bad); returns the options."""
        config = self.config.updated(changes)
        if "seed" in changes:
            self.rng.seed(config.seed)
        self.windows.resize(config)
        if not config.prompt_cache:
            self.prompt_cache.clear()  # turned off: it starts empty when turned on again
        self.config = config
        return config.runtime_options()

    def snapshot(self) -> dict[str, Any]:
        return self.stats.snapshot(self.windows.peak)

    def reset(self) -> None:
        self.stats = self.stats.fresh()
        self.windows.clear()  # (the prompt cache is the account's, kept: `control`)

    # ------------------------------------------------------------ endpoints

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._inference(
            request, _parse_chat, bodies.chat_completion, bodies.chat_chunks, "chatcmpl-"
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._inference(
            request, _parse_completion, bodies.text_completion, bodies.completion_chunks, "cmpl-"
        )

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._inference(request, _parse_embedding, _render_embeddings, None, "emb-")

    async def create_response(self, request: web.Request) -> web.StreamResponse:
        request[API] = "responses"
        return await self._inference(
            request, self._parse_response, self._render_response, self._response_events, "resp_"
        )

    async def get_response(self, request: web.Request) -> web.StreamResponse:
        return await self._stored_response(request, self._answer_get)

    async def delete_response(self, request: web.Request) -> web.StreamResponse:
        return await self._stored_response(request, self._answer_delete)

    async def cancel_response(self, request: web.Request) -> web.StreamResponse:
        return await self._stored_response(request, self._answer_cancel)

    async def list_input_items(self, request: web.Request) -> web.StreamResponse:
        return await self._stored_response(request, self._answer_input_items)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        request[API] = "anthropic"
        return await self._inference(
            request, self._parse_message, anthropic.message, anthropic.events, "msg_"
        )

    async def generate_content(self, request: web.Request) -> web.StreamResponse:
        """The Gemini API: ``{model}:generateContent`` or ``:streamGenerateContent``."""
        request[API] = "gemini"
        model, _, method = request.match_info["target"].partition(":")
        return await self._generate(request, model, method)

    async def vertex_google(self, request: web.Request) -> web.StreamResponse:
        """Google's models on Vertex AI: ``{model}:generateContent`` and
        ``:streamGenerateContent``, the Gemini API's bodies under Vertex's bearer token
        (a body naming ``model`` refused: the path names it)."""
        request[API], request[VERTEX] = "gemini", True
        model, method = vertex.model_action(request.match_info["action"])
        return await self._generate(request, model, method)

    async def _generate(self, request: web.Request, model: str, method: str) -> web.StreamResponse:
        stream = gemini.METHODS.get(method)
        if stream is None:
            self._note_arrival(request)
            message = f"Method {method[:100]!r} is not found for this fake."
            return self._json(404, gemini.error_body(404, message))
        if stream and request.query.get("alt") != "sse":
            self._note_arrival(request)
            return self._bad_request("This fake streams only with alt=sse.", api="gemini")

        def parse(body: dict[str, Any], config: FakeUpstreamConfig) -> Job | str:
            if request.get(VERTEX) and "model" in body:
                return 'Invalid JSON payload received. Unknown name "model": Cannot find field.'
            job = gemini.parse(body, model, stream, config.completion_tokens)
            if isinstance(job, Job):
                job.cache_read = config.cache_read_tokens
            return job

        return await self._inference(request, parse, gemini.response, gemini.events, "gem-")

    async def invoke_model(self, request: web.Request) -> web.StreamResponse:
        """Bedrock's InvokeModel and InvokeModelWithResponseStream (the path says which):
        the Messages API's body and answers, signed requests, an event stream."""
        request[API] = "bedrock"
        model = request.match_info["model_id"]
        stream = request.match_info["action"].endswith("stream")

        def parse(body: dict[str, Any], config: FakeUpstreamConfig) -> Job | str:
            problem = bedrock.body_problem(body)
            if problem is not None:
                return problem
            job = self._parse_message({**body, "model": model}, config)
            if not isinstance(job, str):
                job.stream = stream
            return job

        def frames(job: Job, rid: str, created: int, parts: int) -> list[bytes]:
            return bedrock.frames(anthropic.events(job, rid, created, parts))

        return await self._inference(request, parse, anthropic.message, frames, "msg_")

    async def converse(self, request: web.Request) -> web.StreamResponse:
        """Bedrock's Converse and ConverseStream: its own body and answers, answered as
        the Messages API's would be."""
        request[API] = "bedrock"
        model = request.match_info["model_id"]
        stream = request.match_info["action"] == "converse-stream"

        def parse(body: dict[str, Any], config: FakeUpstreamConfig) -> Job | str:
            given = bedrock.messages_body(body, config.completion_tokens)
            if isinstance(given, str):
                return given
            job = self._parse_message({**given, "model": model}, config)
            if not isinstance(job, str):
                job.stream = stream
            return job

        def render(job: Job, rid: str, created: int) -> bytes:
            return bedrock.converse_answer(anthropic.message(job, rid, created))

        def frames(job: Job, rid: str, created: int, parts: int) -> list[bytes]:
            return bedrock.converse_frames(anthropic.events(job, rid, created, parts))

        return await self._inference(request, parse, render, frames, "msg_")

    async def count_tokens(self, request: web.Request) -> web.StreamResponse:
        request[API] = "anthropic"
        arrival = self._note_arrival(request)
        try:
            self._check_anthropic_headers(request)
            body = await self._read_body(request, arrival)
        except _Answered as answered:
            return answered.response
        tokens = anthropic.input_tokens(body)
        if isinstance(tokens, str):
            return self._bad_request(tokens, api="anthropic")
        self.stats.served += 1
        return self._json(200, orjson.dumps({"input_tokens": tokens}))

    async def google_token(self, request: web.Request) -> web.StreamResponse:
        """Google's OAuth2 token endpoint: the JWT bearer grant (vertex.py)."""
        self._note_arrival(request)
        form = await request.post()
        fields = {name: value for name, value in form.items() if isinstance(value, str)}
        audience = str(request.url.with_query(None))
        status, body = self.tokens.grant(fields, audience)
        return self._json(status, body)  # (not counted as served: no model answered)

    async def vertex_anthropic(self, request: web.Request) -> web.StreamResponse:
        """Anthropic's models on Vertex AI: ``{model}:rawPredict`` and
        ``:streamRawPredict``, ``count-tokens:rawPredict``."""
        request[API], request[VERTEX] = "anthropic", True
        model, method = vertex.model_action(request.match_info["action"])
        if model == "count-tokens" and method == "rawPredict":
            return await self._vertex_count_tokens(request)
        if method not in ("rawPredict", "streamRawPredict"):
            self._note_arrival(request)
            return self._json(404, vertex.google_error(404, f"Unknown method {method!r}."))

        def parse(body: dict[str, Any], config: FakeUpstreamConfig) -> Job | str:
            problem = _vertex_body_problem(body, method == "streamRawPredict")
            return problem or self._parse_message({**body, "model": model}, config)

        return await self._inference(request, parse, anthropic.message, anthropic.events, "msg_")

    async def _vertex_count_tokens(self, request: web.Request) -> web.StreamResponse:
        arrival = self._note_arrival(request)
        if not self.tokens.valid(request.headers.get("Authorization")):
            return self._google_unauthenticated()
        try:
            body = await self._read_body(request, arrival)
        except _Answered as answered:
            return answered.response
        problem = vertex.version_problem(body.get("anthropic_version"))
        if problem is not None:
            return self._bad_request(problem, api="anthropic")
        tokens = anthropic.input_tokens(body)
        if isinstance(tokens, str):
            return self._bad_request(tokens, api="anthropic")
        self.stats.served += 1
        return self._json(200, orjson.dumps({"input_tokens": tokens}))

    def _google_unauthenticated(self) -> web.Response:
        return self._json(401, vertex.google_error(401, vertex.UNAUTHENTICATED))

    async def models(self, request: web.Request) -> web.StreamResponse:
        self._note_arrival(request)
        if not self._authorized(request):
            return self._unauthorized()
        self.stats.served += 1
        return self._json(200, self._models_body)

    async def not_found(self, request: web.Request) -> web.StreamResponse:
        self._note_arrival(request)
        if self.config.azure:
            return self._json(404, azure.not_found())
        message = f"Invalid URL ({request.method} {request.path})"
        return self._json(404, bodies.error_body(message, "invalid_request_error"))

    async def get_stats(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=orjson.dumps(self.snapshot()), headers=JSON_HEADERS)

    async def reset_stats(self, request: web.Request) -> web.StreamResponse:
        self.reset()
        return web.Response(body=orjson.dumps(self.snapshot()), headers=JSON_HEADERS)

    async def get_control(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=orjson.dumps(self.config.runtime_options()), headers=JSON_HEADERS)

    async def post_control(self, request: web.Request) -> web.StreamResponse:
        try:
            changes = orjson.loads(await request.read())
            if not isinstance(changes, dict):
                raise ValueError("the body must be a JSON object of options")
            options = self.control(changes)
        except (orjson.JSONDecodeError, ValueError) as exc:
            body = bodies.error_body(str(exc), "invalid_request_error", "invalid_option")
            return web.Response(status=400, body=body, headers=JSON_HEADERS)
        return web.Response(body=orjson.dumps(options), headers=JSON_HEADERS)

    # ------------------------------------------------------------ the inference path

    async def _inference(
        self,
        request: web.Request,
        parse: Parser,
        render: Renderer,
        render_chunks: ChunkRenderer | None,
        id_prefix: str,
    ) -> web.StreamResponse:
        arrival = self._note_arrival(request)
        self.stats.enter()
        try:
            job, headers = await self._admit(request, parse, arrival)
            rid = f"{id_prefix}{self._id_prefix}{next(self._ids):x}"
            headers["x-request-id"] = rid
            if request.get(API) == "anthropic":
                headers["request-id"] = self._request_id()
            created = int(time.time())
            if job.stream and render_chunks is not None:
                events = render_chunks(job, rid, created, self.config.stream_chunks)
                errored = 0 < self.config.error_after_chunks < len(events)
                if errored:
                    events = self._end_in_error(events, request, job, rid, created)
                return await self._stream(request, job, events, headers, errored)
            self.stats.count_served(job.prompt_tokens, job.completion_tokens)
            return self._json(200, render(job, rid, created), headers)
        except _Answered as answered:
            return answered.response
        except asyncio.CancelledError:
            # aiohttp cancels the handler when the client disconnects (handler_cancellation).
            if id(request) not in self._hanging:
                self.stats.client_disconnects += 1
            raise
        finally:
            self.stats.in_flight -= 1
            self._hanging.discard(id(request))

    async def _admit(
        self, request: web.Request, parse: Parser, arrival: LastRequest
    ) -> tuple[Job, dict[str, str]]:
        """Auth, body, rate limit, latency and faults; raises _Answered to answer early."""
        api = request.get(API, "openai")
        if api == "bedrock":
            await self._check_signature(request)
        else:
            self._check_credentials(request, api)
        body = await self._read_body(request, arrival)
        if self.config.azure and api == "responses":
            self._check_azure_responses(request, body.get("model") or "")
        elif self.config.azure:
            # The deployment in the path decides; Azure ignores the body's model.
            deployment = request.match_info["deployment"]
            config = self.config
            problem = azure.path_problem(
                request.query.get("api-version"),
                deployment,
                config.azure_api_versions,
                config.models,
            )
            if problem is not None:
                raise _Answered(self._json(*problem))
            body = {**body, "model": deployment}
        job = parse(body, self.config)
        if isinstance(job, str):
            raise _Answered(self._bad_request(job, api=api))
        if self.config.echo_status is not None:
            raise _Answered(await self._echo(request, job, self.config.echo_status))
        headers = self._take_budget(job, request)
        await self._sleep_latency()
        fault = self._draw_fault()
        if fault is not None:
            google = "vertex" if request.get(VERTEX) else api
            raise _Answered(await self._inject(request, fault, headers, google))
        return job, headers

    def _check_credentials(self, request: web.Request, api: str) -> None:
        """The API's credentials (Vertex AI's: a bearer token issued here); raises
        _Answered with its 401 (or an Anthropic version's 400)."""
        if request.get(VERTEX):
            if not self.tokens.valid(request.headers.get("Authorization")):
                raise _Answered(self._google_unauthenticated())
        elif api == "anthropic":
            self._check_anthropic_headers(request)
        elif api == "gemini":
            problem = gemini.key_problem(request.headers, request.query, self.config.api_key)
            if problem is not None:
                raise _Answered(self._json(*problem))
        elif not self._authorized(request):
            raise _Answered(self._unauthorized())

    async def _read_body(self, request: web.Request, arrival: LastRequest) -> dict[str, Any]:
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            message = "We could not parse the JSON body of your request."
            raise _Answered(self._bad_request(message, api=request.get(API, "openai"))) from None
        if not isinstance(body, dict):
            message = "The request body must be a JSON object."
            raise _Answered(self._bad_request(message, api=request.get(API, "openai")))
        arrival.body = body  # shown in /stats while this is still the latest request
        model = body.get("model")
        # their parse checks it (the Gemini API's is in the path)
        anthropic_api = request.get(API) in ("anthropic", "gemini", "bedrock")
        if (
            not self.config.azure
            and not anthropic_api
            and (not isinstance(model, str) or not model)
        ):
            raise _Answered(self._bad_request("you must provide a model parameter", "model"))
        return body

    def _take_budget(self, job: Job, request: web.Request) -> dict[str, str]:
        """Record the request in the sliding windows, or answer 429 if it does not fit."""
        config = self.config
        now = time.monotonic()
        if not limited(config):
            self.windows.main.add(now, job.cost)  # only for peak_window_requests
            self.stats.admitted(now, job.cost)
            self._cached(job, now)
            return dict(JSON_HEADERS)
        rejection = self.windows.check(now, job, config)
        if rejection is not None:
            raise _Answered(self._rate_limited(rejection, job, now, request))
        self.windows.add(now, job, config)
        self.stats.admitted(now, job.cost)
        self._cached(job, now)
        return {**JSON_HEADERS, **self._limit_headers(now, request)}

    def _cached(self, job: Job, now: float) -> None:
        """An admitted job: what it read and wrote of the prompt cache, counted, and its
        prefixes cached."""
        self.stats.input_admitted(input_cost(job), job.cache_read)
        if job.cache_entries:
            self.prompt_cache.store(job.cache_entries, now)

    async def _sleep_latency(self) -> None:
        low, high = self.config.latency_range
        if high > 0:
            await asyncio.sleep(low if low == high else self.rng.uniform(low, high))

    def _draw_fault(self) -> Fault | None:
        config = self.config
        drop, hang, fail = config.drop_rate, config.hang_rate, config.fail_rate
        if drop + hang + fail <= 0:
            return None  # no draw: keeps seeded sequences stable while faults are off
        roll = self.rng.random()
        if roll < drop:
            return Fault.DROP
        if roll < drop + hang:
            return Fault.HANG
        if roll < drop + hang + fail:
            return Fault.FAIL
        return None

    async def _inject(
        self, request: web.Request, fault: Fault, headers: dict[str, str], api: str
    ) -> web.StreamResponse:
        if fault is Fault.FAIL:
            self.stats.failed += 1
            return self._server_error(self.config.fail_status, headers, api)
        if fault is Fault.HANG:
            self.stats.hung += 1
            self._hanging.add(id(request))
            await _wait_for_disconnect(request)
        else:
            self.stats.dropped += 1
        _close_connection(request)
        return web.Response()  # never sent: the connection is already closed

    def _end_in_error(
        self, events: list[bytes], request: web.Request, job: Job, rid: str, created: int
    ) -> list[bytes]:
        """The first `error_after_chunks` events, then the API's in-stream error."""
        kept = events[: self.config.error_after_chunks]
        api = request.get(API)
        if api == "anthropic":
            return [*kept, anthropic.stream_error()]
        if api == "gemini":
            return [*kept, gemini.stream_error()]
        if api == "bedrock":
            return [*kept, bedrock.exception_message("throttlingException", "Too many requests")]
        if api == "responses":
            response = responses.failed(job, rid, created)
            self._remember(job, rid, orjson.dumps(response), None)  # stored as failed
            return [*kept, responses.failed_event(response, len(kept))]
        return [*kept, bodies.stream_error()]

    async def _stream(
        self,
        request: web.Request,
        job: Job | None,
        events: list[bytes],
        headers: dict[str, str],
        errored: bool = False,
    ) -> web.StreamResponse:
        """``events`` written one by one (``chunk_delay`` apart, cut by
        ``fail_after_chunks``); ``job``: the one they answer (its tokens counted as
        served; None: a replay, nothing generated)."""
        headers.update(
            bedrock.EVENTSTREAM_HEADERS if request.get(API) == "bedrock" else SSE_HEADERS
        )
        response = web.StreamResponse(headers=headers)
        cut_after = self.config.fail_after_chunks
        delay = self.config.chunk_delay
        try:
            await response.prepare(request)
            self.stats.count_status(200)
            for index, event in enumerate(events):
                if index and delay:
                    await asyncio.sleep(delay)
                await response.write(event)  # written to the socket now: nothing buffers
                if index + 1 == cut_after and cut_after < len(events):
                    self.stats.streams_cut += 1
                    _close_connection(request)  # no terminating chunk: an incomplete body
                    return response
            await response.write_eof()
        except ConnectionError:
            self.stats.client_disconnects += 1
            return response
        if errored:
            self.stats.streams_errored += 1
        elif job is not None:
            self.stats.count_served(job.prompt_tokens, job.completion_tokens)
        return response

    async def _echo(self, request: web.Request, job: Job, status: int) -> web.StreamResponse:
        """The credentials received, quoted back (``echo_status``)."""
        anthropic_api = request.get(API) == "anthropic"
        received = request.headers.get(_credential_header(request, self.config.azure), "")
        # openai-model is one of the headers a proxy passes on
        headers = {"x-echo-authorization": received, "openai-model": f"echo {received}"}
        if status != 200 or not job.stream:
            message = f"Incorrect API key provided: {received}."
            if anthropic_api:
                return self._anthropic_error(status, message, headers)
            body = bodies.error_body(message, "invalid_request_error", "echo")
            return self._json(status, body, {**JSON_HEADERS, **headers})
        event = bodies.sse(
            {
                "object": "chat.completion.chunk",
                "model": job.model,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": f"you sent {received}"},
                        "finish_reason": None,
                    }
                ],
            }
        )
        middle = event.index(received.encode()) + len(received) // 2
        response = web.StreamResponse(headers={**SSE_HEADERS, **headers})
        await response.prepare(request)
        self.stats.count_status(200)
        await response.write(event[:middle])  # the key split across two writes
        await asyncio.sleep(max(self.config.chunk_delay, 0.01))
        await response.write(event[middle:] + bodies.SSE_DONE)
        await response.write_eof()
        return response

    # ------------------------------------------------------------ the Responses API

    async def _stored_response(
        self,
        request: web.Request,
        answer: Callable[[web.Request, str], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        """Auth, Azure's path checks, then `answer` for a response this instance stored."""
        request[API] = "responses"
        self._note_arrival(request)
        if not self._authorized(request):
            return self._unauthorized()
        try:
            if self.config.azure:
                self._check_azure_responses(request, None)
        except _Answered as answered:
            return answered.response
        rid = request.match_info["response_id"]
        if self.responses.peek(rid) is None:
            self.stats.unknown_response_ids += 1
            message = f"Response with id '{rid}' not found."
            return self._json(404, bodies.error_body(message, "invalid_request_error"))
        self.stats.served += 1
        return await answer(request, rid)

    async def _answer_get(self, request: web.Request, rid: str) -> web.StreamResponse:
        """The response; with ``?stream=true`` its events replayed (``starting_after``:
        from the one after that sequence number), as a stream of it sent them."""
        stored = self.responses.get(rid)
        assert stored is not None  # checked by _stored_response
        if request.query.get("stream", "").lower() != "true":
            return self._json(200, stored.response)
        after = request.query.get("starting_after", "-1")
        if not after.lstrip("-").isdigit():
            message = "Invalid 'starting_after': expected an integer."
            return self._bad_request(message, "starting_after", "invalid_type")
        response = orjson.loads(stored.response)
        events = responses.replay(response, self.config.stream_chunks, int(after))
        return await self._stream(request, None, events, dict(JSON_HEADERS))

    async def _answer_delete(self, request: web.Request, rid: str) -> web.Response:
        self.responses.delete(rid)
        return self._json(200, orjson.dumps(responses.deleted(rid)))

    async def _answer_cancel(self, request: web.Request, rid: str) -> web.Response:
        result = self.responses.cancel(rid)
        assert result is not None  # checked by _stored_response
        if isinstance(result, responses.Invalid):
            return self._bad_request(result.message, result.param, result.code)
        return self._json(200, result)

    async def _answer_input_items(self, request: web.Request, rid: str) -> web.Response:
        stored = self.responses.peek(rid)
        assert stored is not None
        order = request.query.get("order", "desc")
        return self._json(200, orjson.dumps(responses.item_list(stored.items, order)))

    def _parse_message(self, body: dict[str, Any], config: FakeUpstreamConfig) -> Job | str:
        cache = (config.cache_read_tokens, config.cache_write_tokens)
        split = self.prompt_cache.split(body, time.monotonic()) if config.prompt_cache else None
        return anthropic.parse(body, config.completion_tokens, cache, split)

    def _parse_response(self, body: dict[str, Any], config: FakeUpstreamConfig) -> Job | str:
        previous = None
        previous_id = body.get("previous_response_id")
        if previous_id is not None:
            previous = self.responses.peek(previous_id) if isinstance(previous_id, str) else None
            if previous is None:  # created by another account, deleted, or never stored
                self.stats.unknown_response_ids += 1
                message = f"Previous response with id '{previous_id}' not found."
                param, code = "previous_response_id", "previous_response_not_found"
                raise _Answered(self._bad_request(message, param, code))
            self.stats.follow_ups += 1
        job = responses.parse(body, config.completion_tokens, previous)
        if isinstance(job, responses.Invalid):
            raise _Answered(self._bad_request(job.message, job.param, job.code))
        job.cache_read = config.cache_read_tokens
        return job

    def _render_response(self, job: Job, rid: str, created: int) -> bytes:
        done = orjson.dumps(responses.finished(job, rid, created))
        if job.request is not None and job.request.get("background") is True:
            queued = orjson.dumps(responses.response_object(job, rid, created, "queued", []))
            self._remember(job, rid, queued, done)  # done once it is next looked at
            return queued
        self._remember(job, rid, done, None)
        return done

    def _response_events(self, job: Job, rid: str, created: int, parts: int) -> list[bytes]:
        self._remember(job, rid, orjson.dumps(responses.finished(job, rid, created)), None)
        return responses.events(job, rid, created, parts)

    def _remember(self, job: Job, rid: str, response: bytes, finished: bytes | None) -> None:
        body = job.request or {}
        if body.get("store") is False:
            return
        items = responses.input_items(body, f"msg_{rid.removeprefix('resp_')}i")
        tokens = job.prompt_tokens + job.completion_tokens
        background = finished is not None
        stored = responses.Stored(response, orjson.dumps(items), tokens, background, finished)
        self.responses.put(rid, stored)

    def _check_azure_responses(self, request: web.Request, model: object) -> None:
        config = self.config
        problem = azure.responses_problem(
            request.path.startswith("/openai/v1/"),
            request.query.get("api-version"),
            model,
            config.models,
        )
        if problem is not None:
            raise _Answered(self._json(*problem))

    # ------------------------------------------------------------ the Messages API

    def _check_anthropic_headers(self, request: web.Request) -> None:
        if not anthropic.authorized(request.headers, self.config.api_key):
            raise _Answered(self._unauthorized("anthropic"))
        problem = anthropic.version_problem(request.headers.get("anthropic-version"))
        if problem is not None:
            raise _Answered(self._bad_request(problem, api="anthropic"))

    # ------------------------------------------------------------ Bedrock

    async def _check_signature(self, request: web.Request) -> None:
        config = self.config
        url = f"{request.scheme}://{request.host}{request.raw_path}"
        body = await request.read()
        problem = bedrock.signature_problem(
            request.method,
            url,
            request.headers,
            body,
            config.aws_access_key_id,
            config.aws_secret_access_key,
        )
        if problem is not None:
            raise _Answered(self._bedrock_error(bedrock.error(problem)))

    def _bedrock_error(
        self, error: tuple[int, bytes, dict[str, str]], headers: dict[str, str] | None = None
    ) -> web.Response:
        status, body, own = error
        return self._json(status, body, {**(headers or {}), **JSON_HEADERS, **own})

    def _request_id(self) -> str:
        return f"req_{self._id_prefix}{next(self._ids):x}"

    # ------------------------------------------------------------ answers

    def _note_arrival(self, request: web.Request) -> LastRequest:
        stats = self.stats
        stats.requests += 1
        stats.count_endpoint(request)
        arrival = LastRequest(request.method, request.path, request.headers)
        stats.last_request = arrival
        return arrival

    def _authorized(self, request: web.Request) -> bool:
        key = self.config.api_key
        if self.config.azure:
            sent = request.headers.get("api-key")
            bearer = request.headers.get("Authorization", "")
            if sent is None and request.path.startswith("/openai/v1/"):
                # Azure's v1 API also takes the key as a bearer token (the openai client)
                sent = bearer.removeprefix("Bearer ") if bearer.startswith("Bearer ") else None
            return azure.authorized(sent, key)
        return key is None or request.headers.get("Authorization") == f"Bearer {key}"

    def _json(
        self, status: int, body: bytes, headers: dict[str, str] | None = None
    ) -> web.Response:
        self.stats.count_status(status)
        return web.Response(status=status, body=body, headers=headers or JSON_HEADERS)

    def _anthropic_error(
        self, status: int, message: str, headers: dict[str, str] | None = None
    ) -> web.Response:
        rid = self._request_id()
        body = anthropic.error_body(status, message, rid)
        return self._json(status, body, {**JSON_HEADERS, **(headers or {}), "request-id": rid})

    def _unauthorized(self, api: str = "openai") -> web.Response:
        if api == "anthropic":
            return self._anthropic_error(401, "invalid x-api-key")
        if self.config.azure:
            return self._json(401, azure.error_body("401", azure.ACCESS_DENIED))
        message = "Incorrect API key provided. You can find your API key in your account."
        body = bodies.error_body(message, "invalid_request_error", "invalid_api_key")
        return self._json(401, body)

    def _bad_request(
        self,
        message: str,
        param: str | None = None,
        code: str | None = None,
        api: str = "openai",
    ) -> web.Response:
        if api == "anthropic":
            return self._anthropic_error(400, message)
        if api == "gemini":
            return self._json(400, gemini.error_body(400, message))
        if api == "bedrock":
            return self._bedrock_error(bedrock.error("ValidationException", message))
        return self._json(400, bodies.error_body(message, "invalid_request_error", code, param))

    def _server_error(self, status: int, headers: dict[str, str], api: str) -> web.Response:
        if api == "vertex":
            return self._json(status, vertex.google_error(status, "Service unavailable."), headers)
        if api == "anthropic":
            return self._anthropic_error(
                status, "Overloaded" if status == 529 else "Internal server error", headers
            )
        if api == "gemini":
            body = gemini.error_body(status, "Internal error encountered.")
            return self._json(status, body, headers)
        if api == "bedrock":
            return self._bedrock_error(bedrock.server_error(status), headers)
        body = bodies.error_body(bodies.SERVER_ERROR, "server_error")
        return self._json(status, body, headers)

    def _rate_limited(
        self, rejection: Rejection, job: Job, now: float, request: web.Request
    ) -> web.Response:
        self.stats.count_rejection(rejection.kind)
        if request.get(VERTEX):  # Google's answer: no retry-after, a RetryInfo
            publisher = "google" if request.get(API) == "gemini" else "anthropic"
            text = vertex.rate_limit_message(rejection.kind, job.model, publisher)
            delay = ceil_millis(rejection.retry_after) / 1000
            return self._json(429, vertex.google_error(429, text, delay))
        if request.get(API) == "gemini":  # the wait in its body only, as Google says it
            body = gemini.rate_limited(rejection.kind, rejection.limit, rejection.retry_after)
            return self._json(429, body)
        headers = self._limit_headers(now, request)
        headers.update(JSON_HEADERS)
        seconds = ceil_seconds(rejection.retry_after)
        if request.get(API) == "bedrock":  # no retry-after: Bedrock sends none
            return self._bedrock_error(bedrock.error("ThrottlingException"), headers)
        headers["retry-after"] = str(seconds)
        if request.get(API) == "anthropic":
            per_minute = 60.0 / self.config.window
            text = anthropic.rate_limit_message(rejection.kind, rejection.limit, per_minute)
            return self._anthropic_error(429, text, headers)
        headers["retry-after-ms"] = str(ceil_millis(rejection.retry_after))
        if self.config.azure:
            endpoint = request.path.split("/", 4)[-1]  # /openai/deployments/{d}/{endpoint}
            version = request.query.get("api-version", "")
            text = azure.rate_limit_message(endpoint, version, rejection.kind, seconds)
            return self._json(429, azure.error_body("429", text), headers)
        message = rate_limit_message(rejection, job.model, self.config.window)
        body = bodies.error_body(message, rejection.kind, "rate_limit_exceeded")
        return self._json(429, body, headers)

    def _limit_headers(self, now: float, request: web.Request) -> dict[str, str]:
        """The rate-limit headers of the request's API."""
        config = self.config
        api = request.get(API)
        if not config.ratelimit_headers or api in ("gemini", "bedrock") or request.get(VERTEX):
            return {}  # Google, Vertex AI and Bedrock announce no budget in headers
        if request.get(API) == "anthropic":
            return self.windows.anthropic_headers(now, config)
        if config.azure:
            return self.windows.azure_headers(now, config)
        return self.windows.openai_headers(now, config)


def _credential_header(request: web.Request, azure_mode: bool) -> str:
    """The header that carried the key (what `echo_status` quotes)."""
    if azure_mode:
        return "api-key"
    if request.get(API) == "anthropic" and "x-api-key" in request.headers:
        return "x-api-key"
    return "Authorization"


async def _wait_for_disconnect(request: web.Request) -> None:
    """Sleep until the client closes the connection (or the server shuts down)."""
    while True:
        transport = request.transport
        if transport is None or transport.is_closing():
            return
        await asyncio.sleep(HANG_POLL_SECONDS)


def _close_connection(request: web.Request) -> None:
    """Close the TCP connection after what was written so far; aiohttp writes no more."""
    transport = request.transport
    if transport is not None:
        transport.close()


def _parse_chat(body: dict[str, Any], config: FakeUpstreamConfig) -> Job | str:
    return bodies.parse_chat(body, config.completion_tokens)


def _parse_completion(body: dict[str, Any], config: FakeUpstreamConfig) -> Job | str:
    return bodies.parse_completion(body, config.completion_tokens)


def _parse_embedding(body: dict[str, Any], config: FakeUpstreamConfig) -> Job | str:
    return bodies.parse_embedding(body, config.embedding_dims)


def _render_embeddings(job: Job, rid: str, created: int) -> bytes:
    return bodies.embeddings(job)


def _vertex_body_problem(body: dict[str, Any], streamed: bool) -> str | None:
    """What Vertex AI refuses in an Anthropic model's body: a ``model`` (named in the
    path), no ``anthropic_version`` or one it does not take, a stream flag the method
    contradicts."""
    if "model" in body:
        return "model: Extra inputs are not permitted (the model is named in the URL)"
    problem = vertex.version_problem(body.get("anthropic_version"))
    if problem is not None:
        return problem
    if bool(body.get("stream")) != streamed:
        return "stream: must be true with streamRawPredict and false with rawPredict"
    return None


# Google Vertex AI's publisher models (any project and region): Anthropic's, Google's.
_VERTEX_PUBLISHERS = "/v1/projects/{project}/locations/{region}/publishers"
_VERTEX_MODELS = f"{_VERTEX_PUBLISHERS}/anthropic/models"

# Azure OpenAI's paths (azure mode): the deployment is named in the path.
_AZURE_PATH = "/openai/deployments/{deployment}"

UPSTREAM_KEY: web.AppKey[FakeUpstream] = web.AppKey("fake_upstream", FakeUpstream)

Route = tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]


def _responses_routes(upstream: FakeUpstream, base: str) -> list[Route]:
    return [
        ("POST", base, upstream.create_response),
        ("GET", base + "/{response_id}", upstream.get_response),
        ("DELETE", base + "/{response_id}", upstream.delete_response),
        ("POST", base + "/{response_id}/cancel", upstream.cancel_response),
        ("GET", base + "/{response_id}/input_items", upstream.list_input_items),
    ]


def build_app(config: FakeUpstreamConfig | None = None) -> web.Application:
    """The aiohttp application; its state is `app[UPSTREAM_KEY]`.

    Serve it with `handler_cancellation=True` (as `run_in_thread` and the CLI do) so that
    handlers stop as soon as their client goes away.
    """
    upstream = FakeUpstream(dataclasses.replace(config or FakeUpstreamConfig()))
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[UPSTREAM_KEY] = upstream
    api = (
        [
            ("POST", f"{_AZURE_PATH}/chat/completions", upstream.chat_completions),
            ("POST", f"{_AZURE_PATH}/completions", upstream.completions),
            ("POST", f"{_AZURE_PATH}/embeddings", upstream.embeddings),
            *_responses_routes(upstream, "/openai/v1/responses"),
            *_responses_routes(upstream, "/openai/responses"),
            ("*", "/openai/{tail:.*}", upstream.not_found),
        ]
        if upstream.config.azure
        else [
            ("POST", "/v1/chat/completions", upstream.chat_completions),
            ("POST", "/v1/completions", upstream.completions),
            ("POST", "/v1/embeddings", upstream.embeddings),
            ("GET", "/v1/models", upstream.models),
            *_responses_routes(upstream, "/v1/responses"),
            # Anthropic's Messages API, always on: its paths are its own.
            ("POST", "/v1/messages", upstream.messages),
            ("POST", "/v1/messages/count_tokens", upstream.count_tokens),
            # The Gemini API's: the model and the method in one segment.
            ("POST", "/v1beta/models/{target}", upstream.generate_content),
            # Google Vertex AI's models, and the token endpoint of its accounts.
            ("POST", f"{_VERTEX_MODELS}/{{action}}", upstream.vertex_anthropic),
            ("POST", f"{_VERTEX_PUBLISHERS}/google/models/{{action}}", upstream.vertex_google),
            ("POST", "/token", upstream.google_token),
        ]
    )
    # AWS Bedrock's InvokeModel, always on: its paths are its own.
    action = "{action:invoke|invoke-with-response-stream}"
    api.append(("POST", "/model/{model_id}/" + action, upstream.invoke_model))
    converse = "{action:converse|converse-stream}"
    api.append(("POST", "/model/{model_id}/" + converse, upstream.converse))
    routes: list[Route] = [
        *api,
        ("GET", "/stats", upstream.get_stats),
        ("POST", "/stats/reset", upstream.reset_stats),
        ("GET", "/control", upstream.get_control),
        ("POST", "/control", upstream.post_control),
        ("*", "/v1/{tail:.*}", upstream.not_found),  # last: OpenAI-shaped 404s
    ]
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
    return app
