"""The README's example: the OpenAI SDK through the proxy (start it with `make demo`).

    .venv/bin/python example.py

OPENAI_BASE_URL points it elsewhere (default: the demo on http://127.0.0.1:8000/v1).
"""

import os

from openai import OpenAI

# The demo has no client keys configured, so any api_key is accepted.
client = OpenAI(
    base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"), api_key="demo"
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
