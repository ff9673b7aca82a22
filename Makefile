# Two entry points for a fresh machine with Python 3.11+:
#   make demo   create .venv, install tradeagent, run the demo
#   make test   create .venv, install tradeagent with dev extras, run ruff, mypy and pytest
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test install-dev lint typecheck

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.demo-installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e '.[demo]'
	touch $@

$(VENV)/.dev-installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e '.[dev,postgres]'
	touch $@

demo: $(VENV)/.demo-installed
	$(BIN)/tradeagent demo

install-dev: $(VENV)/.dev-installed

lint: install-dev
	$(BIN)/ruff check agent feeds storage tests
	$(BIN)/ruff format --check agent feeds storage tests

typecheck: install-dev
	$(BIN)/mypy agent feeds storage

test: lint typecheck
	$(BIN)/python -m pytest -q
