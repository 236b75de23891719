"""What translation adds to a request, measured: the pure translation (proxy/translate) of
a request, of its buffered answer, and of one stream event, each way.

    python -m loadtest.translation_cost            # the figures docs/translation.md quotes
    python -m loadtest.translation_cost --quick    # a short run (the test's)

Each figure is the median of several timed runs of many calls (CPU time of this process
on its own, no I/O): the request translated and serialized (what the exchange sends),
the answer parsed, translated and serialized, and one SSE event of a long stream split,
parsed, translated and written out. The shapes are realistic ones: a chat agent's turn
(a system prompt, a tool loop, three tools with schemas: ~3 KB) and the Messages request
Claude Code sends (system blocks with cache_control, ten tools, a tool loop: ~10 KB),
answers of ~200 tokens with a tool call, and streams of 200 text deltas.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson

from proxy.translate.response import chat_from_message, message_from_chat
from proxy.translate.stream import ToChat, ToMessages
from proxy.translate.to_chat import to_chat
from proxy.translate.to_messages import to_messages

WORDS = ("Lorem", "ipsum", "dolor", "sit", "amet,", "consectetur", "adipiscing", "elit,")


def _text(words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


def _schema(i: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {f"arg{j}": {"type": "string", "description": _text(12)} for j in range(4)},
        "required": ["arg0"],
        "additionalProperties": False,
    }


def chat_request() -> dict[str, Any]:
    """A chat agent's turn: a system prompt, a tool loop, three tools."""
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "tool0", "arguments": '{"arg0": "x"}'},
    }
    return {
        "model": "m",
        "max_tokens": 1024,
        "temperature": 0.2,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": _text(120)},
            {"role": "user", "content": _text(60)},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": _text(150)},
            {"role": "user", "content": _text(30)},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": f"tool{i}",
                    "description": _text(20),
                    "parameters": _schema(i),
                },
            }
            for i in range(3)
        ],
        "tool_choice": "auto",
    }


def messages_request() -> dict[str, Any]:
    """The shape of a Claude Code turn: system blocks, ten tools, a tool loop."""
    cached = {"type": "ephemeral"}
    use = {"type": "tool_use", "id": "toolu_1", "name": "tool0", "input": {"arg0": "x"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": _text(400)}
    return {
        "model": "m",
        "max_tokens": 4096,
        "stream": True,
        "metadata": {"user_id": "user_abc"},
        "system": [
            {"type": "text", "text": _text(40)},
            {"type": "text", "text": _text(600), "cache_control": cached},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": _text(80)}]},
            {"role": "assistant", "content": [{"type": "text", "text": _text(20)}, use]},
            {
                "role": "user",
                "content": [result, {"type": "text", "text": _text(10), "cache_control": cached}],
            },
        ],
        "tools": [
            {"name": f"tool{i}", "description": _text(40), "input_schema": _schema(i)}
            for i in range(10)
        ],
    }


def messages_answer() -> bytes:
    return orjson.dumps(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude",
            "content": [
                {"type": "text", "text": _text(150)},
                {
                    "type": "tool_use",
                    "id": "toolu_2",
                    "name": "tool1",
                    "input": {"arg0": _text(10)},
                },
            ],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 3000, "cache_read_input_tokens": 9000, "output_tokens": 200},
        }
    )


def chat_answer() -> bytes:
    call = {
        "id": "call_2",
        "type": "function",
        "function": {"name": "tool1", "arguments": orjson.dumps({"arg0": _text(10)}).decode()},
    }
    return orjson.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": _text(150), "tool_calls": [call]},
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {
                "prompt_tokens": 12000,
                "completion_tokens": 200,
                "prompt_tokens_details": {"cached_tokens": 9000},
            },
        }
    )


def _named(name: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def messages_events(deltas: int) -> list[bytes]:
    """A Messages stream's text deltas (as they come: one event a chunk)."""
    return [
        _named(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": " word"},
            },
        )
        for _ in range(deltas)
    ]


def chat_chunks(deltas: int) -> list[bytes]:
    chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "gpt",
        "choices": [
            {"index": 0, "delta": {"content": " word"}, "logprobs": None, "finish_reason": None}
        ],
    }
    return [b"data: " + orjson.dumps(chunk) + b"\n\n" for _ in range(deltas)]


def _median_us(run: Callable[[], object], calls: int, repeats: int) -> float:
    """The median over ``repeats`` of the CPU microseconds one of ``calls`` calls took."""
    times = []
    for _ in range(repeats):
        started = time.process_time_ns()
        for _ in range(calls):
            run()
        times.append((time.process_time_ns() - started) / calls / 1000)
    return statistics.median(times)


def measure(calls: int, repeats: int) -> dict[str, float]:
    """Microseconds per call of each translation (and of the same bytes' plain
    parse-and-serialize, for scale)."""
    chat, messages = chat_request(), messages_request()
    chat_raw, messages_raw = orjson.dumps(chat), orjson.dumps(messages)  # their sizes
    from_claude, from_gpt = messages_answer(), chat_answer()
    events, chunks = messages_events(200), chat_chunks(200)

    def stream_to_chat() -> None:
        translation = ToChat(include_usage=True, created=0)
        for event in events:
            translation.feed(event)

    def stream_to_messages() -> None:
        translation = ToMessages()
        translation.feed(chunks[0])
        for chunk in chunks:
            translation.feed(chunk)

    per_stream = max(calls // 50, 1)
    chat_kb, messages_kb = len(chat_raw) / 1024, len(messages_raw) / 1024
    # The pipeline parses every request (the body is a dict already): translation adds
    # the translating and the serializing of what it made.
    return {
        f"chat request -> Messages ({chat_kb:.0f} KB)": _median_us(
            lambda: orjson.dumps(to_messages(chat, 256)), calls, repeats
        ),
        "  (the same request serialized alone)": _median_us(
            lambda: orjson.dumps(chat), calls, repeats
        ),
        f"Messages request -> chat ({messages_kb:.0f} KB)": _median_us(
            lambda: orjson.dumps(to_chat(messages, 256)), calls, repeats
        ),
        "  (the same request serialized alone) ": _median_us(
            lambda: orjson.dumps(messages), calls, repeats
        ),
        "Messages answer -> chat completion": _median_us(
            lambda: chat_from_message(from_claude, 0), calls, repeats
        ),
        "chat completion -> Messages answer": _median_us(
            lambda: message_from_chat(from_gpt, 0), calls, repeats
        ),
        "Messages stream event -> chat chunk": _median_us(stream_to_chat, per_stream, repeats)
        / len(events),
        "chat chunk -> Messages stream event": _median_us(stream_to_messages, per_stream, repeats)
        / len(chunks),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    args = parser.parse_args()
    calls, repeats = (50, 3) if args.quick else (2000, 7)
    print(f"{'translation':<44} {'us per call':>12}")
    for name, micros in measure(calls, repeats).items():
        print(f"{name:<44} {micros:>12.2f}")


if __name__ == "__main__":
    main()
