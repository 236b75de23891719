"""Which configured upstream keys can be secrets (pure): only those are redacted from
answers (``upstream/redact.py``), and start-up names the others."""

from __future__ import annotations

__all__ = ["MIN_SECRET_LENGTH", "redaction_warning", "secret_like"]

# Shorter keys are not secrets worth the name (and would match inside ordinary words).
MIN_SECRET_LENGTH = 8
# Placeholders local servers' docs suggest (vLLM's EMPTY, Ollama's ollama, LM Studio's
# lm-studio...), compared lower-cased: they are not secrets either.
_PLACEHOLDERS = frozenset(
    {
        "anything",
        "api-key",
        "api_key",
        "apikey",
        "changeme",
        "default",
        "dummy-key",
        "fake-key",
        "lm-studio",
        "no-key-required",
        "nokey",
        "not-needed",
        "not-used",
        "password",
        "placeholder",
        "sk-no-key-required",
        "sk-xxxxxxxx",
        "unused-key",
    }
)


def redaction_warning(key: str) -> str | None:
    """What start-up says of a deployment's key that is not redacted (None: it is, or
    there is no key)."""
    if not key or secret_like(key):
        return None
    return (
        "too short or too common to be a secret (under"
        f" {MIN_SECRET_LENGTH} characters, a placeholder or one repeated character):"
        " answers are passed on without redacting it"
    )


def secret_like(key: str) -> bool:
    """Whether ``key`` can be a secret: long enough, not a placeholder, not one character
    repeated."""
    return len(key) >= MIN_SECRET_LENGTH and key.lower() not in _PLACEHOLDERS and len(set(key)) > 1
