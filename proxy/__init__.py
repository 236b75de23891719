"""llm-proxy: a rate-limiting reverse proxy for OpenAI-compatible LLM APIs."""

__version__ = "0.1.0"
