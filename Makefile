# One-command entry points. Each target does its own set-up on a fresh Debian 12
# machine: missing packages are installed, the build is configured and built.
PRESET ?= release
BUILD  := build/$(PRESET)
JOBS   ?= 2
CTEST_ARGS ?=
FUZZ_SECONDS ?= 60
FUZZ_SEED ?= 0
# ccache keys on paths relative to the checkout, so clones in other folders
# reuse each other's objects (NOHASHDIR: also those built with -g, the asan
# preset's, whose key would otherwise hold the build folder).
export CCACHE_BASEDIR ?= $(CURDIR)
export CCACHE_NOHASHDIR ?= 1

.PHONY: all deps configure build test test-fast demo bench clean asan asan-fast lint fuzz

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake --preset $(PRESET) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900 $(CTEST_ARGS)

test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L 'fast|gpu-interp' $(CTEST_ARGS)

demo: build
	./$(BUILD)/lockstep demo --out runs/demo --force

bench: build
	bash scripts/run-bench.sh $(BUILD)

asan:
	$(MAKE) test PRESET=asan

# The fast label under AddressSanitizer + UBSan (the asan preset; any report fails).
asan-fast:
	$(MAKE) test-fast PRESET=asan

# clang-format and clang-tidy: fails on violations the baseline does not allow
# (scripts/lint.py; needs the release build's compile_commands.json).
lint: configure
	python3 scripts/lint.py check --build build/release --jobs $(JOBS)

# libFuzzer targets of the input parsers (docs/fuzzing.md), FUZZ_SECONDS each.
fuzz: deps
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_SEED=$(FUZZ_SEED) FUZZ_JOBS=$(JOBS) bash scripts/run-fuzz.sh

clean:
	rm -rf build
