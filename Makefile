# Thin wrapper over CMake: build/ holds the tree, binaries in build/bin, libraries in build/lib.
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)
CONFIG ?= examples/configs/default.yaml
CMAKE_FLAGS ?=

.PHONY: all deps llama-deps build demo llama test asan test-asan check-format cppcheck bench bench-report install clean

all: build

# Packages are installed by `make demo`, `make test`, `make test-asan`, the checks and
# scripts/install-deps.sh, never by `make build`: building must not need root or the network.
deps:
	@scripts/install-deps.sh

build:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The main demo: the mini engine on a multi-turn workload with the default config.
demo: deps
	@$(MAKE) --no-print-directory build
	$(BUILD)/bin/kvs-mini-engine --config $(CONFIG)

# The test suites include kvs-llama's (label llama): llama.cpp comes from the npm registry, pinned.
llama-deps:
	@scripts/install-llama.sh

# llama.cpp with kvstrata as its prompt cache (docs/llama.md): installs llama.cpp from the npm
# registry into build/llama (scripts/install-llama.sh; the network, once), builds kvs-llama and runs
# two sessions that share a system prompt, every restored state verified.
llama: llama-deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) --target kvs-llama
	$(BUILD)/bin/kvs-llama --gguf $(BUILD)/share/kvstrata/mini-256.gguf --sessions 2 --turns 3 --verify

# After ctest, the tests that were skipped (exit 77: no GPU, not root, ...) are listed with the
# reason each printed: ctest counts them in "100% tests passed".
test: deps llama-deps
	@$(MAKE) --no-print-directory build
	@cd $(BUILD) && rm -f ctest-junit.xml && rc=0 && ctest --output-on-failure -j $(JOBS) --output-junit ctest-junit.xml || rc=$$?; \
	  $(CURDIR)/scripts/ctest-skipped.sh ctest-junit.xml; exit $$rc

# AddressSanitizer + UndefinedBehaviorSanitizer build: one switch (KVS_SANITIZE). Sanitized code runs
# several times slower, so Check timeouts are tripled there.
asan:
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKVS_SANITIZE=ON -DKVS_WITH_CUDA=OFF \
	  $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

# Tests labelled `timing` measure time by nature and are left out: sanitized code runs at another speed;
# so are those labelled `python` (an ASAN library cannot be loaded into an uninstrumented interpreter).
test-asan: deps llama-deps
	@$(MAKE) --no-print-directory asan
	@cd $(ASAN_BUILD) && rm -f ctest-junit.xml && rc=0 && CK_TIMEOUT_MULTIPLIER=3 ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS) -LE 'timing|python|heavy' \
	  --output-junit ctest-junit.xml || rc=$$?; \
	  $(CURDIR)/scripts/ctest-skipped.sh ctest-junit.xml; exit $$rc

# Every tracked C, header and CUDA file formatted as .clang-format says (`clang-format -i FILE` fixes
# one).
check-format: deps
	@git ls-files -z '*.c' '*.h' '*.cu' | xargs -0 clang-format --dry-run -Werror
	@scripts/check-decls.sh
	@echo "check-format: every tracked .c, .h and .cu file is formatted"

# Static analysis of the C sources (a finding that is wrong is silenced in place with
# `// cppcheck-suppress <id>` and a reason).
CPPCHECK_DIRS = common connector backends schedulers kernels/cpu kernels/device_host.c \
  kernels/device_module.c tools examples models tests bench
cppcheck: deps
	@cppcheck --quiet --enable=warning,performance,portability --std=c11 -D_GNU_SOURCE -I . \
	  --inline-suppr --error-exitcode=1 -j $(JOBS) $(CPPCHECK_DIRS)
	@echo "cppcheck: no findings in $(CPPCHECK_DIRS)"

# Every benchmark with its defaults; the outputs stay in bench/results/raw/ (docs/benchmarks.md).
bench: build
	@bench/run-all.sh $(BUILD)

# The tables of docs/benchmarks.md and the pictures in docs/img/ from bench/results/*.jsonl.
bench-report:
	@python3 bench/report.py tables
	@python3 bench/report.py plots docs/img

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
