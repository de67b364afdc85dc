# The few verbs people type. `run` and `test` bootstrap .venv on a fresh machine.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: run test test-consul eval lint fmt bench bench-registry clean

$(STAMP): pyproject.toml
	@test -d $(VENV) || { echo "creating $(VENV)"; $(PY) -m venv $(VENV); }
	@echo "installing mesh and its dev dependencies into $(VENV) (first run takes a minute)"
	@$(BIN)/pip install -q --upgrade pip
	@$(BIN)/pip install -q -e '.[dev,bench,postgres]'
	@touch $(STAMP)

run: $(STAMP)
	$(BIN)/mesh up agents/mesh.toml

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The tests marked `consul`, against a real Consul agent (docs/production.md, "Running with
# Consul"): CONSUL_HTTP_ADDR=127.0.0.1:8500 make test-consul. For an agent in a container, set
# MESH_TEST_HEALTH_HOST to an address of this machine the agent can reach (its checks call it).
test-consul: $(STAMP)
	@test -n "$$CONSUL_HTTP_ADDR" || { echo "make test-consul: set CONSUL_HTTP_ADDR to a Consul agent (e.g. 127.0.0.1:8500)" >&2; exit 2; }
	$(BIN)/python -m pytest -m consul $(PYTEST_ARGS)

# The loan desk's cases (docs/eval.md) against a fresh `mesh up agents/mesh.toml` on the scripted
# model, on the demo's ports: with the demo already running it stops at once, saying so (stop the
# demo, or test it as it runs: .venv/bin/mesh eval agents/evals/loan_desk.yaml).
eval: $(STAMP)
	MESH_MODEL=scripted $(BIN)/mesh eval agents/evals/loan_desk.yaml --up agents/mesh.toml $(EVAL_ARGS)

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

# The embedded registry at 100, 1,000 and 10,000 simulated instances (~5 minutes; docs/performance.md).
bench-registry: $(STAMP)
	$(BIN)/python -m tests.bench.registry_scale

clean:
	rm -rf $(VENV) .mesh .pytest_cache .mypy_cache .ruff_cache .grimp_cache .import_linter_cache
