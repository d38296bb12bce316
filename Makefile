# Everyday commands. `make test` is the README's test command and what CI runs.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install install-dev test lint format typecheck models serve clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python          ## service only (CPU ONNX Runtime), no torch
	$(BIN)/pip install -q -e ".[cpu]"

install-dev: $(BIN)/python      ## service + training + tests
	$(BIN)/pip install -q -e ".[cpu,train,dev]"

test: install-dev               ## the unit suite (CI runs this)
	$(BIN)/ruff check service training tests benchmarks
	$(BIN)/python -m pytest -q

lint: install-dev
	$(BIN)/ruff check service training tests benchmarks
	$(BIN)/ruff format --check service training tests benchmarks

format:
	$(BIN)/ruff format service training tests benchmarks
	$(BIN)/ruff check --fix service training tests benchmarks

typecheck: install-dev
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
