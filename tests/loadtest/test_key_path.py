"""loadtest/key_path.py measures the key's path it means to: a key with rpm and tpm over
a real Redis, every check allowed (a refusal would raise)."""

from __future__ import annotations

from loadtest import key_path


async def test_the_measured_key_checks_are_allowed(redis_url: str) -> None:
    key, base = await key_path._measure(redis_url, count=20, warmup=5, repeat=1)
    assert base > 0 and key > -base  # a figure, not a verdict: timing is not asserted
