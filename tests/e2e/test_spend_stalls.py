"""The spend report through Redis stalls (issue 51, N5 and N9): a real proxy, a scripted
upstream on loopback and a redis-server this test starts and stops with SIGSTOP.

* A ledger write that times out may still run once Redis wakes; its retry must not
  count the same spend again.
* What a budget is charged, the report shows: a stream cut before its usage and a
  background response (no usage yet) as estimates, marked; a background response's
  usage, once a later ``GET /v1/responses/{id}`` shows it, replaces its estimate in the
  budget and the report, once.
* After ten stalls under load (the limiter falling back to its local share and back),
  the report and the budgets in Redis agree.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from support.proxy_server import ProxyInThread, settings_from
from support.raw_upstream import Conversation, answer, chunked
from support.redis_server import RedisServer, redis_available
from support.scripted_upstream import ScriptedUpstream
from support.waiting import wait_until

pytestmark = pytest.mark.skipif(not redis_available(), reason="needs redis-server")

KEY = "sk-spender"
ADMIN = "admin-secret"
INPUT, OUTPUT = 1000, 10  # the tokens every usage reported says
PRICE = {"input": 1.0, "output": 2.0}  # USD per 1M tokens
REAL_USD = (INPUT * PRICE["input"] + OUTPUT * PRICE["output"]) / 1e6
STALL = 0.6  # seconds Redis is stopped each time
JSON = "content-type: application/json"
SSE = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
ADMIN_HEADERS = {"authorization": f"Bearer {ADMIN}"}


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _response(rid: str, status: str, usage: dict[str, int] | None) -> dict[str, Any]:
    return {"id": rid, "object": "response", "status": status, "output": [], "usage": usage}


RESPONSE_USAGE = {"input_tokens": INPUT, "output_tokens": OUTPUT, "total_tokens": INPUT + OUTPUT}
CHAT_USAGE = {"prompt_tokens": INPUT, "completion_tokens": OUTPUT, "total_tokens": INPUT + OUTPUT}
MESSAGE_START = {
    "type": "message_start",
    "message": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "claude",
        "stop_reason": None,
        "usage": {"input_tokens": INPUT, "output_tokens": 1},
    },
}
TEXT_START = {
    "type": "content_block_start",
    "index": 0,
    "content_block": {"type": "text", "text": ""},
}
TEXT_DELTA = {
    "type": "content_block_delta",
    "index": 0,
    "delta": {"type": "text_delta", "text": "Hi"},
}


class Upstream:
    """Chat answers with usage; Responses and Messages streams cut before their usage
    event; background responses queued when created, over with usage when read."""

    def __init__(self) -> None:
        self.ids = itertools.count()

    async def __call__(self, conversation: Conversation) -> None:
        method, path, _ = conversation.request.request_line.split(" ")
        body = orjson.loads(conversation.request.body) if conversation.request.body else {}
        if path.endswith("/chat/completions"):
            choice = {"index": 0, "message": {"role": "assistant", "content": "ok"}}
            chat = {"id": "c", "object": "chat.completion", "created": 0, "model": "m"}
            chat |= {"choices": [{**choice, "finish_reason": "stop"}], "usage": CHAT_USAGE}
            await conversation.send(answer(orjson.dumps(chat), JSON))
        elif path.endswith("/v1/messages"):
            start, delta = _event("message_start", MESSAGE_START), _event("x", TEXT_DELTA)
            text = _event("content_block_start", TEXT_START)
            await conversation.send(SSE + chunked(start, text, delta))
            conversation.close()  # before message_delta, its usage; no last chunk
        elif method == "GET":  # a background response, read: over, with its usage
            rid = path.rpartition("/")[2].partition("?")[0]
            done = _response(rid, "completed", RESPONSE_USAGE)
            await conversation.send(answer(orjson.dumps(done), JSON))
        elif body.get("background"):
            queued = _response(f"resp_bg{next(self.ids)}", "queued", None)
            await conversation.send(answer(orjson.dumps(queued), JSON))
        else:  # a Responses stream, cut before response.completed
            rid = f"resp_st{next(self.ids)}"
            created = _event(
                "response.created",
                {"type": "response.created", "response": _response(rid, "in_progress", None)},
            )
            delta = {"type": "response.output_text.delta", "item_id": "m", "delta": "Hi"}
            await conversation.send(SSE + chunked(created, _event("x", delta)))
            conversation.close()


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path / "redis") as server:
        yield server


@pytest.fixture
def proxy(redis: RedisServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[ProxyInThread]:
    """A proxy whose ledger writes only when the test says (and at shutdown)."""
    monkeypatch.setattr("proxy.money.ledger.FLUSH_EVERY", 3600.0)
    with (
        ScriptedUpstream(Upstream()) as upstream,
        ProxyInThread(settings_from(config(redis.url, upstream.url))) as server,
    ):
        yield server


def config(redis_url: str, upstream_url: str) -> dict[str, Any]:
    budgets = [{"usd": 100, "period": "month"}, {"tokens": 10**9, "period": "month"}]
    anthropic_deployment = {
        "id": "a",
        "provider": "anthropic",
        "base_url": upstream_url,
        "api_key": "sk-anthropic-upstream",
    }
    return {
        "redis": {"url": redis_url},
        "keys": [{"name": "alice", "key": KEY, "budgets": budgets}],
        "models": [
            {"name": "m", "price": PRICE, "deployments": [{"id": "d", "base_url": upstream_url}]},
            {"name": "claude", "price": PRICE, "deployments": [anthropic_deployment]},
        ],
        # A cut stream is a failure of its deployment: never enough to cool it down here.
        "routing": {"retries": 0, "cooldown": {"allowed_fails": 1000}},
        "admin": {"keys": [ADMIN]},
    }


def sdk(proxy: ProxyInThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0)


def settled(proxy: ProxyInThread) -> None:
    """The answers' bookkeeping done (settlements, held estimates settled)."""
    proxy.settled()
    pipeline = proxy.app.state.pipeline
    wait_until(lambda: not pipeline.background._tasks, 10.0, "bookkeeping done")


def written(proxy: ProxyInThread) -> None:
    """Everything the proxy's ledger holds written, as its next writes would (Redis
    awake): a few writes, as a write cut by a stall is tried again with the next."""
    settled(proxy)
    ledger = proxy.app.state.ledger
    for _ in range(3):
        proxy.run(ledger.flush())


def spend_rows(proxy: ProxyInThread) -> list[dict[str, Any]]:
    answer = httpx.get(f"{proxy.url}/admin/spend", headers=ADMIN_HEADERS, timeout=10)
    assert answer.status_code == 200, answer.text
    rows: list[dict[str, Any]] = answer.json()["current"]["spend"]
    return rows


def total(rows: list[dict[str, Any]], field: str) -> float:
    return sum(r.get(field, 0) for r in rows)


def charged(proxy: ProxyInThread) -> dict[str, float]:
    """What alice's budgets hold, as the shared limiter reads them (Redis awake, and
    paid what it was owed: at the first heartbeat after an outage)."""
    limiter = proxy.app.state.pipeline.limiter
    wait_until(lambda: limiter.storage_available, 10.0, "the limiter back on Redis")
    wait_until(lambda: not limiter.owed, 10.0, "the budgets' settlements paid")
    state = httpx.get(f"{proxy.url}/admin/state", headers=ADMIN_HEADERS, timeout=10).json()
    [alice] = state["keys"]
    return {b["kind"]: b["spent"] for b in alice["budgets"]}


def report_and_budgets(proxy: ProxyInThread) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The report's rows once everything is written, and what the budgets hold."""
    written(proxy)
    rows, budget = spend_rows(proxy), charged(proxy)
    print(f"\nreported {rows}\nbudgets {budget}")
    return rows, budget


def spent_metric(proxy: ProxyInThread, model: str) -> float:
    text = httpx.get(f"{proxy.url}/metrics", timeout=5).text
    pattern = rf'^llmproxy_spend_usd_total\{{key="alice",model="{model}",team=""\}} (\S+)$'
    match = re.search(pattern, text, re.M)
    return 0.0 if match is None else float(match.group(1))


def failed_writes(caplog: pytest.LogCaptureFixture) -> int:
    return sum("spend report not written yet" in r.getMessage() for r in caplog.records)


def cut_write(proxy: ProxyInThread, redis: RedisServer, caplog: pytest.LogCaptureFixture) -> bool:
    """A ledger write cut by a stall: sent to a stopped Redis, given up on (it times
    out), run once Redis wakes. False: there was nothing to write."""
    before = failed_writes(caplog)
    redis.freeze()
    try:
        proxy.run(proxy.app.state.ledger.flush())
        time.sleep(STALL)
    finally:
        redis.thaw()
    return failed_writes(caplog) == before + 1


def chat(client: openai.OpenAI) -> None:
    client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=OUTPUT
    )


def cut_response_stream(client: openai.OpenAI) -> None:
    """A Responses stream the upstream cuts: the proxy ends it with the API's error
    event, which the SDK raises (an error status, before the stream, is raised)."""
    events = client.responses.create(model="m", input="hi", stream=True)
    try:
        for _ in events:
            pass
    except openai.APIError:
        return
    raise AssertionError("the stream was not cut")


def cut_message_stream(proxy: ProxyInThread) -> None:
    """A Messages stream the upstream cuts before its usage (``message_delta``)."""
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    body = {"role": "user", "content": "hi"}
    events = client.messages.create(model="claude", max_tokens=OUTPUT, messages=[body], stream=True)
    try:
        for _ in events:
            pass
    except anthropic.APIError:
        return
    raise AssertionError("the stream was not cut")


@pytest.fixture
def cut_writes(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger="proxy.limiter.ledger")
    return caplog


def test_a_ledger_write_cut_by_a_stall_is_not_counted_twice(
    proxy: ProxyInThread, redis: RedisServer, cut_writes: pytest.LogCaptureFixture
) -> None:
    client = sdk(proxy)
    chat(client)
    written(proxy)  # a first write lands: the ledger's script is loaded in Redis
    for _ in range(9):
        chat(client)
    settled(proxy)
    assert cut_write(proxy, redis, cut_writes)
    assert cut_write(proxy, redis, cut_writes)  # the same write, sent again, cut again
    [row], budget = report_and_budgets(proxy)
    assert (row["requests"], row["input_tokens"], row["output_tokens"]) == (
        10,
        10 * INPUT,
        10 * OUTPUT,
    )
    assert row["usd"] == pytest.approx(10 * REAL_USD)
    assert row["estimated"] == 0
    assert budget["usd"] == pytest.approx(row["usd"])
    assert budget["tokens"] == row["input_tokens"] + row["output_tokens"]


def test_streams_cut_before_their_usage_are_reported_as_what_their_budgets_kept(
    proxy: ProxyInThread, redis: RedisServer, cut_writes: pytest.LogCaptureFixture
) -> None:
    client = sdk(proxy)
    chat(client)
    written(proxy)
    cut_response_stream(client)
    cut_message_stream(proxy)
    settled(proxy)
    cut = cut_write(proxy, redis, cut_writes)
    reported, budget = report_and_budgets(proxy)
    rows = {r["model"]: r for r in reported}
    assert sorted(rows) == ["claude", "m"], rows  # the cut Messages stream reported too
    assert (rows["m"]["requests"], rows["m"]["estimated"]) == (2, 1)
    assert (rows["claude"]["requests"], rows["claude"]["estimated"]) == (1, 1)
    # The estimates are what the budgets kept: their reservations.
    assert budget["usd"] == pytest.approx(total(reported, "usd"))
    assert budget["tokens"] == total(reported, "input_tokens") + total(reported, "output_tokens")
    assert spent_metric(proxy, "claude") == pytest.approx(rows["claude"]["usd"])
    assert cut, "the estimates' write met no stall"


def test_a_background_response_is_an_estimate_until_read_then_settled_once(
    proxy: ProxyInThread, redis: RedisServer, cut_writes: pytest.LogCaptureFixture
) -> None:
    client = sdk(proxy)
    chat(client)
    written(proxy)
    queued = client.responses.create(model="m", input="later", background=True)
    assert (queued.status, queued.usage) == ("queued", None)
    settled(proxy)
    cuts = [cut_write(proxy, redis, cut_writes)]
    [row], budget = report_and_budgets(proxy)
    assert (row["requests"], row.get("estimated")) == (2, 1)
    assert budget["usd"] == pytest.approx(row["usd"])
    assert budget["tokens"] == row["input_tokens"] + row["output_tokens"]
    # Read: over, with its usage. Its estimate becomes that usage, once, however often
    # it is read (and a stall cuts the write of the correction).
    done = client.responses.retrieve(queued.id)
    assert done.status == "completed"
    settled(proxy)
    cuts.append(cut_write(proxy, redis, cut_writes))
    client.responses.retrieve(queued.id)
    [row], budget = report_and_budgets(proxy)
    # Two answered with usage and read twice (a read is a request, of no tokens).
    assert (row["requests"], row["estimated"]) == (4, 0)
    assert (row["input_tokens"], row["output_tokens"]) == (2 * INPUT, 2 * OUTPUT)
    assert row["usd"] == pytest.approx(2 * REAL_USD)
    assert budget["usd"] == pytest.approx(2 * REAL_USD)
    assert budget["tokens"] == 2 * (INPUT + OUTPUT)
    assert spent_metric(proxy, "m") == pytest.approx(2 * REAL_USD)
    assert cuts == [True, True], "a write met no stall"


@pytest.fixture
def live_proxy(redis: RedisServer) -> Iterator[ProxyInThread]:
    """A proxy whose ledger writes once a second, as it does in service."""
    with (
        ScriptedUpstream(Upstream()) as upstream,
        ProxyInThread(settings_from(config(redis.url, upstream.url))) as server,
    ):
        yield server


class Load:
    """Requests of every kind, from a few threads, each a little apart, until the stalls
    are over (at most ``limit`` in all): how each ended, and the background responses
    made."""

    def __init__(self, proxy: ProxyInThread, limit: int) -> None:
        self.proxy = proxy
        self.limit = limit
        self.started = itertools.count()
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.outcomes: dict[str, int] = {}
        self.background: list[str] = []

    def run(self) -> None:
        client = sdk(self.proxy)
        kinds = ["chat", "responses-cut", "messages-cut", "background"]
        while not self.done.wait(0.02) and (n := next(self.started)) < self.limit:
            kind = kinds[n % len(kinds)]
            self.note(f"{kind} {self.one(client, kind)}")

    def one(self, client: openai.OpenAI, kind: str) -> str:
        try:
            if kind == "chat":
                chat(client)
            elif kind == "responses-cut":
                cut_response_stream(client)
            elif kind == "messages-cut":
                cut_message_stream(self.proxy)
            else:
                queued = client.responses.create(model="m", input="later", background=True)
                with self.lock:
                    self.background.append(queued.id)
        except (openai.APIStatusError, anthropic.APIStatusError) as error:
            return f"failed {error.status_code}"
        return "ok"

    def note(self, outcome: str) -> None:
        with self.lock:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


def test_after_ten_stalls_under_load_the_report_is_what_the_budgets_were_charged(
    live_proxy: ProxyInThread, redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Requests of every kind through ten stalls of Redis (each cutting a write of the
    ledger, 0.3-0.6 s): key checks and settlements cut, the limiter falling back to its
    local share and back. The report equals what the budgets hold: their real cost, or
    what they kept of requests without usage (marked estimated)."""
    caplog.set_level(logging.WARNING, logger="proxy.limiter")
    proxy = live_proxy
    chat(sdk(proxy))
    written(proxy)  # the ledger's script loaded
    load = Load(proxy, limit=1500)
    with ThreadPoolExecutor(4) as pool:
        workers = [pool.submit(load.run) for _ in range(4)]
        for i in range(10):  # each stall cuts a write of the ledger (and whatever else)
            redis.freeze()
            try:
                proxy.run(proxy.app.state.ledger.flush())
                time.sleep(0.2 + 0.1 * (i % 3))
            finally:
                redis.thaw()
            time.sleep(0.3)
        load.done.set()
        for w in workers:
            w.result()
    settled(proxy)
    client = sdk(proxy)
    read = load.background[:10]  # read: settled to their usage; the others estimates
    for rid in read:
        assert client.responses.retrieve(rid).status == "completed"
    rows, budget = report_and_budgets(proxy)
    messages = [r.getMessage() for r in caplog.records]
    cut = sum("spend report not written yet" in m for m in messages)
    fallbacks = sum("mode: fallback" in m for m in messages)
    reported = {f: total(rows, f) for f in ("usd", "input_tokens", "output_tokens", "estimated")}
    print(f"\n{load.outcomes}; {cut} writes cut, {fallbacks} fallbacks")
    print(f"reported {reported}\nbudgets {budget}")
    assert budget["usd"] == pytest.approx(reported["usd"])
    assert budget["tokens"] == reported["input_tokens"] + reported["output_tokens"]
    ends = load.outcomes.get
    estimated = ends("responses-cut ok", 0) + ends("messages-cut ok", 0) + ends("background ok", 0)
    assert reported["estimated"] == estimated - len(read)
    answered = sum(n for outcome, n in load.outcomes.items() if outcome.endswith("ok"))
    assert total(rows, "requests") == 1 + answered + len(read)  # a read is a request
    assert cut > 0 and fallbacks > 0, "the stalls cut nothing"


class HeldUpstream(Upstream):
    """As ``Upstream``, but a Responses stream is cut only when the test says
    (``cut``), after its first event."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = threading.Event()
        self.cut = threading.Event()

    async def __call__(self, conversation: Conversation) -> None:
        _, path, _ = conversation.request.request_line.split(" ")
        if not path.endswith("/responses"):
            return await super().__call__(conversation)
        created = {"type": "response.created", "response": _response("r", "in_progress", None)}
        await conversation.send(SSE + chunked(_event("response.created", created)))
        self.holding.set()
        await asyncio.to_thread(self.cut.wait, 10.0)
        conversation.close()
        return None


def _read_until_cut_then_leave(proxy: ProxyInThread) -> None:
    """A Responses stream read until the proxy's error event, then left at once."""
    body = {"model": "m", "input": "hi", "stream": True}
    headers = {"authorization": f"Bearer {KEY}"}
    url = f"{proxy.base_url}/responses"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=10) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line.startswith("event: error"):
                return  # the connection closes now


def test_a_stream_its_client_leaves_while_its_bookkeeping_waits_on_redis_is_reported(
    redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream admitted through Redis is cut while Redis is stopped and the limiter,
    fallen back meanwhile, probes it again: the stream's settlement first carries the
    outage's local reservations over, and waits. Its client reads the error event and
    leaves at once. The departure cuts nothing of the bookkeeping: the report has the
    request and the estimate its budget kept."""
    monkeypatch.setattr("proxy.money.ledger.FLUSH_EVERY", 3600.0)
    upstream_script = HeldUpstream()
    with (
        ScriptedUpstream(upstream_script) as upstream,
        ProxyInThread(settings_from(config(redis.url, upstream.url))) as proxy,
        ThreadPoolExecutor(1) as pool,
    ):
        client = sdk(proxy)
        chat(client)
        written(proxy)
        stream = pool.submit(_read_until_cut_then_leave, proxy)
        assert upstream_script.holding.wait(10.0)
        redis.freeze()
        try:
            for _ in range(3):  # each waits out Redis's timeout: the circuit opens
                chat(client)
            time.sleep(1.2)  # the circuit's reset_after: the next call probes Redis
            upstream_script.cut.set()
            stream.result(timeout=10)
            time.sleep(0.5)
        finally:
            redis.thaw()
        [row], budget = report_and_budgets(proxy)
    assert (row["requests"], row["estimated"]) == (5, 1), row
    assert budget["usd"] == pytest.approx(row["usd"])
    assert budget["tokens"] == row["input_tokens"] + row["output_tokens"]
