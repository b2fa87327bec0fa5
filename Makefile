# Thin wrapper over CMake: build/ holds the tree, binaries in build/bin, libraries in build/lib.
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)
CONFIG ?= examples/configs/default.yaml
CMAKE_FLAGS ?=

.PHONY: all deps build demo test asan test-asan check-format cppcheck bench install clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The main demo: the mini engine on a multi-turn workload with the default config.
demo: build
	$(BUILD)/bin/kvs-mini-engine --config $(CONFIG)

# After ctest, the tests that were skipped (exit 77: no GPU, not root, ...) are listed with the
# reason each printed: ctest counts them in "100% tests passed".
test: build
	@cd $(BUILD) && rm -f ctest-junit.xml && rc=0 && ctest --output-on-failure -j $(JOBS) --output-junit ctest-junit.xml || rc=$$?; \
	  $(CURDIR)/scripts/ctest-skipped.sh ctest-junit.xml; exit $$rc

# AddressSanitizer + UndefinedBehaviorSanitizer build: one switch (KVS_SANITIZE). Sanitized code runs
# several times slower, so Check timeouts are tripled there.
asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKVS_SANITIZE=ON -DKVS_WITH_CUDA=OFF \
	  $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

# Tests labelled `timing` measure time by nature and are left out: sanitized code runs at another speed;
# so are those labelled `python` (an ASAN library cannot be loaded into an uninstrumented interpreter).
test-asan: asan
	@cd $(ASAN_BUILD) && rm -f ctest-junit.xml && rc=0 && CK_TIMEOUT_MULTIPLIER=3 ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS) -LE 'timing|python|heavy' \
	  --output-junit ctest-junit.xml || rc=$$?; \
	  $(CURDIR)/scripts/ctest-skipped.sh ctest-junit.xml; exit $$rc

# Every tracked C, header and CUDA file formatted as .clang-format says (`clang-format -i FILE` fixes
# one).
check-format: deps
	@git ls-files -z '*.c' '*.h' '*.cu' | xargs -0 clang-format --dry-run -Werror
	@echo "check-format: every tracked .c, .h and .cu file is formatted"

# Static analysis of the C sources (a finding that is wrong is silenced in place with
# `// cppcheck-suppress <id>` and a reason).
CPPCHECK_DIRS = common connector backends schedulers kernels/cpu kernels/device_module.c tools examples models \
  tests bench
cppcheck: deps
	@cppcheck --quiet --enable=warning,performance,portability --std=c11 -D_GNU_SOURCE -I . \
	  --inline-suppr --error-exitcode=1 -j $(JOBS) $(CPPCHECK_DIRS)
	@echo "cppcheck: no findings in $(CPPCHECK_DIRS)"

bench: build
	@for b in $(BUILD)/bin/kvs-bench-*; do echo "== $$b"; $$b; rc=$$?; \
	  if [ $$rc -eq 77 ]; then echo "   (skipped: needs hardware this machine lacks)"; \
	  elif [ $$rc -ne 0 ]; then exit $$rc; fi; done
	@echo "== $(BUILD)/bin/kvs-bench-dram --threads 2 (device.host_threads: 2, against two copying threads)"
	@$(BUILD)/bin/kvs-bench-dram --threads 2
	@echo "== $(BUILD)/bin/kvs-bench-ucx --shared-memory auto (payloads over shared memory, against one copy)"
	@$(BUILD)/bin/kvs-bench-ucx --shared-memory auto; rc=$$?; \
	  if [ $$rc -eq 77 ]; then echo "   (skipped: needs UCX and ucx_perftest)"; elif [ $$rc -ne 0 ]; then exit $$rc; fi
	@echo "== bench/ucx-netns.sh (the remote tier across two network namespaces, against a TCP stream)"
	@bench/ucx-netns.sh $(BUILD)/bin/kvs-bench-ucx; rc=$$?; \
	  if [ $$rc -eq 77 ]; then echo "   (skipped: needs root and iproute2)"; elif [ $$rc -ne 0 ]; then exit $$rc; fi

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
