# syntax=docker/dockerfile:1
# The proxy image (also runs the fake upstream: `llm-proxy fake-upstream`).
#
#   docker build -t llm-proxy .
#   docker run -p 8000:8000 llm-proxy       # the embedded demo, as `make demo` (it prints what to try)
#   docker run -p 8000:8000 -v $PWD/my.yaml:/etc/llm-proxy/config.yaml:ro \
#       -e LLM_PROXY_WORKERS=2 llm-proxy llm-proxy serve --config /etc/llm-proxy/config.yaml
#
# The default command serves the embedded demo (its fake upstream inside the container);
# pass `llm-proxy serve --config PATH` to serve your config. LLM_PROXY_PORT (8000) and
# LLM_PROXY_WORKERS (1) are read by `llm-proxy serve`.

ARG PYTHON_IMAGE=python:3.12-slim

# --- builder: the project and every dependency as wheels (compilers stay here) ----------
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# Only what the wheel needs, so editing tests or docs does not invalidate this layer.
COPY pyproject.toml README.md LICENSE ./
COPY proxy ./proxy
# With the `otel` extra: `telemetry.traces: true` works in the image as it is.
RUN pip wheel --wheel-dir /wheels '.[otel]'

# --- runtime: slim Python, the wheels, a non-root user -----------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    LLM_PROXY_HOST=0.0.0.0 \
    LLM_PROXY_PORT=8000 \
    LLM_PROXY_WORKERS=1
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels 'llm-proxy[otel]' \
 && groupadd --system --gid 10001 llmproxy \
 && useradd --system --uid 10001 --gid llmproxy --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin llmproxy
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
# Liveness only (the process answers); compose uses /health/ready to order start-up.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health/live' % os.environ.get('LLM_PROXY_PORT', '8000'), timeout=2)"]
# Exec form, no shell: SIGTERM reaches uvicorn (PID 1), which drains in-flight requests.
CMD ["llm-proxy", "serve"]
