# The two commands of the README:
#   make demo   install and start the proxy on the embedded demo (fake upstream, no Redis)
#   make test   install what the tests need and run the whole suite
#   (make test-fast: the same without the tests marked slow: the end-to-end scenarios,
#    processes, browsers, long property tests, the portable serving path)
# and what the proxy is for, measured: make showcase (a table and showcase.png, here).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test test-fast lint format install install-dev bench bench-compare stack clean showcase admin-screenshots

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.runtime: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[demo]'
	touch $@

$(VENV)/.dev: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.runtime
install-dev: $(VENV)/.dev

demo: install
	$(BIN)/llm-proxy serve

# The showcase's client is the OpenAI SDK (the demo install has it); matplotlib draws
# its timeline and is not a dependency of the proxy.
$(VENV)/.showcase: $(VENV)/.runtime
	$(BIN)/pip install -q matplotlib
	touch $@

showcase: $(VENV)/.showcase
	$(BIN)/llm-proxy showcase

# docs/admin-*.png: the admin page on an idle, a loaded and a saturated proxy, and its
# spend view, from the test that checks them (headless Chromium, a redis-server).
admin-screenshots: install-dev
	ADMIN_SCREENSHOTS=docs $(BIN)/pytest -q tests/api/test_admin_views.py

# The load scenarios spend most of their time waiting on real clocks (rate windows,
# outages, reloads), not on the CPU: one test process per core takes about half the time
# of one. (Four on two cores took a third on a fast host, but on a slower one starved the
# TLS handshakes and pacing scenarios: five tests failed that pass alone.) Each worker
# starts its own redis-server; TEST_WORKERS=0 runs them one by one.
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)

# The yardstick's scenarios (marked serial: 0 upstream 429s, >= 98% of a limit on a
# healthy host) run alone after the rest: beside the parallel suite the host is not
# healthy (the strict upstream's own process is descheduled and reads a burst at once).
# Only the files that hold them are collected for that run (collecting the whole suite
# costs half a minute); tests/test_code_quality.py checks that they are listed here.
SERIAL_TESTS := tests/e2e/test_pacing_margin.py tests/e2e/test_seed.py tests/e2e/test_sentinel.py tests/api/test_vertex.py tests/api/test_vertex_gemini.py tests/api/test_gemini_api.py tests/api/test_bedrock.py
test: install-dev
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not serial"
	$(BIN)/pytest -q -m serial $(SERIAL_TESTS)

test-fast: install-dev
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not slow and not serial"

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/pytest -q tests/test_code_quality.py -k complexity

format: install-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# The stack and the load test (docs/stack.md, docs/benchmarks.md).
.PHONY: stack-locust

stack: install-dev
	$(BIN)/python -m loadtest.stack up

stack-locust: install-dev
	$(BIN)/python -m loadtest.stack locust

# tensorzero is the peer gateway (its wheel embeds the Rust gateway); only the benchmark
# needs it; without it the bench runs, the peer row says why. (matplotlib, which draws the
# chart, comes with the dev extra: the showcase's tests draw too.)
TENSORZERO ?= tensorzero==2026.6.0
$(VENV)/.bench: $(VENV)/.dev
	$(BIN)/pip install -q '$(TENSORZERO)' \
		|| echo "could not install $(TENSORZERO): the bench will run without its peer" >&2
	touch $@

# make bench: real traffic first (2 replicas on one Redis, 1,000 and 100,000 keys, a
# saturated group), then the one-key rows and the peer; it prints its plan and how long
# it should take (about 9 minutes on a 2-core machine; at most 15).
bench: $(VENV)/.bench
	BENCH_COMMAND="make bench" $(BIN)/python -m loadtest.bench

# The proxy as of BASELINE and as of the work tree, side by side in one run.
BASELINE ?= HEAD~1
bench-compare: $(VENV)/.bench
	BENCH_COMMAND="make bench-compare BASELINE=$(BASELINE)" \
		$(BIN)/python -m loadtest.bench --baseline $(BASELINE)
