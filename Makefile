PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test demo lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/pytest -q

demo: $(STAMP)
	$(BIN)/convoq demo

lint: $(STAMP)
	$(BIN)/ruff check convoq tests bench
	$(BIN)/ruff format --check convoq tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .convoq .pytest_cache .mypy_cache .ruff_cache
