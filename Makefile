PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-slowpaths demo lint bench docs clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# Two processes (pytest-xdist), each test file whole in one of them, so a module's worker
# pool starts once; most of a test's time is spent waiting on workers and Redis, so two
# processes halve the suite. The 25 slowest tests are printed at the end.
test: $(STAMP)
	$(BIN)/pytest -q -n 2 --dist loadfile --durations=25

# The behaviour tests again with CONVOQ_FAST_PATHS=off: redis-py, send_task and the broker
# instead of convoq's shortcuts (the tests marked `slowpaths`, about two minutes): worker
# end to end, the kick, the turn protocol, replay safety, plain reads, the fair line, a
# chaos run (Redis killed mid-run) and the switch's own tests. Tests of a shortcut itself
# (marked `fast_paths`) skip.
test-slowpaths: $(STAMP)
	CONVOQ_FAST_PATHS=off $(BIN)/pytest -q -n 2 --dist loadfile -m slowpaths

demo: $(STAMP)
	$(BIN)/convoq demo

lint: $(STAMP)
	$(BIN)/ruff check convoq tests bench
	$(BIN)/ruff format --check convoq tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

# The documentation site (docs/, the API reference from the docstrings) into site/; any
# warning (a broken link, a docstring griffe cannot read) fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .convoq .pytest_cache .mypy_cache .ruff_cache site
