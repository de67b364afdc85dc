# The few verbs people type. `run` and `test` bootstrap .venv on a fresh machine.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: run test lint fmt bench clean

$(STAMP): pyproject.toml
	@test -d $(VENV) || { echo "creating $(VENV)"; $(PY) -m venv $(VENV); }
	@echo "installing mesh and its dev dependencies into $(VENV) (first run takes a minute)"
	@$(BIN)/pip install -q --upgrade pip
	@$(BIN)/pip install -q -e '.[dev,bench]'
	@touch $(STAMP)

run: $(STAMP)
	$(BIN)/mesh up agents/mesh.toml

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/python -m tests.bench

clean:
	rm -rf $(VENV) .mesh .pytest_cache .mypy_cache .ruff_cache .grimp_cache .import_linter_cache
