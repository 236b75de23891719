"""loadtest/translation_cost.py measures what it says: its requests, answers and streams
translate (none is refused), and every figure is a time."""

from __future__ import annotations

from loadtest import translation_cost
from proxy.translate.stream import ToChat, ToMessages
from proxy.translate.to_chat import to_chat
from proxy.translate.to_messages import to_messages


def test_the_measured_shapes_translate_whole() -> None:
    chat = to_messages(translation_cost.chat_request(), 256)
    assert len(chat["tools"]) == 3 and chat["system"]
    messages = to_chat(translation_cost.messages_request(), 256)
    assert len(messages["tools"]) == 10 and messages["messages"][0]["role"] == "system"
    streamed = b"".join(ToChat(True, 0).feed(e) for e in translation_cost.messages_events(3))
    assert streamed.count(b"data: ") == 3
    chunks = translation_cost.chat_chunks(3)
    assert b"text_delta" in b"".join(ToMessages().feed(c) for c in chunks)


def test_every_figure_is_measured() -> None:
    figures = translation_cost.measure(calls=3, repeats=1)
    assert len(figures) == 8 and all(micros > 0 for micros in figures.values())
