"""The README's example: the OpenAI SDK through the proxy (start it with `make demo`).

    .venv/bin/python example.py

OPENAI_BASE_URL and OPENAI_API_KEY point it elsewhere (default: the demo on
http://127.0.0.1:8000/v1 with its client key, demo-key), e.g. at `make stack`:

    OPENAI_BASE_URL=http://127.0.0.1:8080/v1 OPENAI_API_KEY=sk-stack-team-a \
        .venv/bin/python example.py

(A shell that exports a real OpenAI key as OPENAI_API_KEY sends it to the proxy, which
answers 401: unset it, or set it to the proxy's key.)
"""

import os

from openai import OpenAI

# demo-key: the demo's client key (10 requests a minute of its own).
client = OpenAI(
    base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"),
    api_key=os.environ.get("OPENAI_API_KEY", "demo-key"),
)

completion = client.chat.completions.create(
    model="gpt-4o-mini",
    messages=[{"role": "user", "content": "Say hello"}],
)
print(completion.choices[0].message.content)

stream = client.chat.completions.create(
    model="gpt-4o-mini",
    messages=[{"role": "user", "content": "Count to five"}],
    stream=True,
)
for chunk in stream:
    if chunk.choices:
        print(chunk.choices[0].delta.content or "", end="", flush=True)
print()
