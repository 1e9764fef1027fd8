# Rivora: `make` builds release binaries; `make test` is what CI runs.

CARGO ?= cargo
BPF_SOURCES := $(wildcard bpf/*.bpf.c) $(wildcard bpf/lib/*.h) include/rivora/abi.h
# Test peers and tools used by the test suites, beyond the build's needs.
TEST_PKGS := iputils-ping

.PHONY: all build deps lint fmt test test-unit test-packets test-e2e bench demo clean

all: build

build: deps
	$(CARGO) build --release --bins

deps:
	@scripts/deps.sh

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings
	clang-format --dry-run -Werror $(BPF_SOURCES)

fmt:
	$(CARGO) fmt --all
	clang-format -i $(BPF_SOURCES)

# Everything, as root: lint, unit and property tests, packet tests, end to end.
test: deps
	@scripts/deps.sh $(TEST_PKGS)
	@scripts/bpffs.sh
	$(MAKE) lint
	$(CARGO) test --all-targets --no-fail-fast

test-unit: deps
	$(CARGO) test --lib --bins

test-packets: deps
	@scripts/bpffs.sh
	$(CARGO) test --test 'packets_*'

test-e2e: deps
	@scripts/deps.sh $(TEST_PKGS)
	@scripts/bpffs.sh
	$(CARGO) test --test 'e2e_*'

bench: deps
	@scripts/bpffs.sh
	$(CARGO) build --release --bin rivora-bench
	./target/release/rivora-bench

demo:
	@echo "make demo arrives with rivorad's static configuration (issue 4): not yet available." >&2
	@exit 1

clean:
	$(CARGO) clean
