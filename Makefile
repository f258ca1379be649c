# tierlimit build. The BPF compiler is pinned here once; the Vagrantfile and
# .ci/run install this same version.
CLANG_VERSION ?= 19
CLANG ?= clang-$(CLANG_VERSION)
STRIP ?= llvm-strip-$(CLANG_VERSION)
# -mcpu=v3: 32-bit atomics and the compare-and-swap of the window (kernel >= 5.12).
BPF2GO_CFLAGS ?= -O2 -g -Wall -Werror -mcpu=v3
GO ?= go
TEST_FLAGS ?=

export BPF2GO_CC := $(CLANG)
export BPF2GO_STRIP := $(STRIP)
export BPF2GO_CFLAGS

.PHONY: all build generate check-generate test test-soak lint bench clean bench-quick vagrant-validate vagrant-box vagrant-e2e provision-check

all: build

build:
	$(GO) build ./...

generate:
	$(GO) generate ./...

# Fails when the committed BPF objects differ from what the pinned clang makes.
check-generate: generate
	@git diff --exit-code --stat -- bpf/ || { echo "generated BPF files are stale: run make generate and commit"; exit 1; }

# The README's test command. BPF tests need root; with TIERLIMIT_REQUIRE_BPF=1
# they fail instead of skipping. One package at a time (-p 1): the packages'
# end-to-end tests send real traffic through veths and judge it by rate and
# by window, and two of them at once on a small machine disturb each other.
test: deps
	$(GO) test -count=1 -p 1 -timeout 30m $(TEST_FLAGS) ./...

# The same suite with the soak-style tests at their long lengths
# (TIERLIMIT_SOAK=1, internal/testenv/soak.go): a nightly target, not CI's.
test-soak: deps
	TIERLIMIT_SOAK=1 $(GO) test -count=1 -p 1 -timeout 60m $(TEST_FLAGS) ./...

# The stage and perf builds (gen.go's second and third lines) are behind the
# tags tlstages and tlperf: vet them too.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); [ -z "$$out" ] || { echo "gofmt: $$out"; exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags tlstages,tlperf ./bpf/
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

# The performance suite (issue 6; root, two CPUs, trafgen and nft): figures
# 1-3 from the bpf benchmarks, figure 4 from veth floods, the offered-vs-
# passed plot, and issue 42's table beside the peers (section 6). Writes
# $(BENCH_OUT)/results.md, the PNG and raw/. Every BPF_PROG_TEST_RUN chunk
# spans 100 ticks of the host's clock (bpf/bench_chunks_test.go): about
# 40 min on two shared CPUs (the chunks' length; figure 1 is most of it)
# where BPF_PROG_TEST_RUN's quantum is the 4 ms tick, and longer where it
# reads coarser (15.66-16.26 ms on a KVM guest on 2026-12-03: chunks of
# 120-148 M packets; the timing, live-frames and scaling runs alone took
# over 43 min, so the whole suite takes some 3 h there).
# BENCH_FLAGS=-count=1 runs figures 1-3 once instead of 3 times.
#
# PEERS_DIR: the peers (XDP-Firewall, L3AF ratelimiting, xdp-filter). A
# directory of their built objects (deploy/bench/peers.sh's output), or of
# git snapshots of their repositories, which peers.sh then builds at its
# pinned commits into $(BENCH_TMP)/peers; unset, section 6 compares with
# the floor and names the peers not measured.
BENCH_OUT ?= deploy/bench
BENCH_TMP ?= $(or $(TMPDIR),/tmp)/tierlimit-bench
BENCH_FLAGS ?=
PEERS_DIR ?=
PEERS_OBJ = $(if $(PEERS_DIR),$(if $(wildcard $(PEERS_DIR)/*.o),$(abspath $(PEERS_DIR)),$(abspath $(BENCH_TMP))/peers))

bench:
	@mkdir -p $(BENCH_TMP)
	$(if $(PEERS_DIR),$(if $(wildcard $(PEERS_DIR)/*.o),,CLANG_VERSION=$(CLANG_VERSION) bash deploy/bench/peers.sh $(PEERS_DIR) $(BENCH_TMP)/peers))
	$(GO) test -c -tags tlstages,tlperf -o $(BENCH_TMP)/bpf.test ./bpf/
	$(GO) build -o $(BENCH_TMP)/tierlimit-bench ./cmd/tierlimit-bench
	$(BENCH_TMP)/tierlimit-bench suite -out $(BENCH_OUT) -bpf-test $(BENCH_TMP)/bpf.test \
		-command 'make bench$(if $(PEERS_DIR), PEERS_DIR=$(PEERS_DIR))' $(if $(PEERS_OBJ),-peers $(PEERS_OBJ)) $(BENCH_FLAGS)

# CI's smoke run of the same harness: 1 run each, short floods, no timing
# assertions; writes to a scratch directory, not deploy/bench.
bench-quick:
	@mkdir -p $(BENCH_TMP)
	$(GO) test -c -tags tlstages,tlperf -o $(BENCH_TMP)/bpf.test ./bpf/
	$(GO) build -o $(BENCH_TMP)/tierlimit-bench ./cmd/tierlimit-bench
	$(BENCH_TMP)/tierlimit-bench suite -quick -out $(BENCH_TMP)/quick -bpf-test $(BENCH_TMP)/bpf.test \
		-command 'make bench-quick' $(BENCH_FLAGS)
	@grep -q '^## 4. System-level' $(BENCH_TMP)/quick/results.md && test -s $(BENCH_TMP)/quick/offered-vs-passed.png

# The two-VM path (deploy/README.md). vagrant-box builds the local Debian
# box (debootstrap, Debian packages only; cached); vagrant-e2e boots both VMs
# with vagrant-libvirt (KVM, else TCG) in a sandbox namespace, floods, checks
# every window against tiers.Expected and tears it all down. Make variables:
# BOX (local|public), MAX, WINDOW, WINDOWS, BURST, QUEUES, SANDBOX (1|0), UNIT_CHECK (0 skips the shipped unit under systemd).
VAGRANT ?= vagrant
BOX ?= local

vagrant-validate:
	@command -v $(VAGRANT) >/dev/null || { echo "vagrant not found: deploy/vagrant/provision.sh --packages-only --with-vagrant"; exit 1; }
	$(VAGRANT) validate --ignore-provider

vagrant-box:
	VAGRANT=$(VAGRANT) bash deploy/vagrant/build-box.sh

vagrant-e2e:
	VAGRANT=$(VAGRANT) GO=$(GO) BOX="$(BOX)" MAX="$(MAX)" WINDOW="$(WINDOW)" WINDOWS="$(WINDOWS)" \
		BURST="$(BURST)" QUEUES="$(QUEUES)" SANDBOX="$(SANDBOX)" UNIT_CHECK="$(UNIT_CHECK)" bash deploy/vagrant/vm-e2e.sh

# CI runs the provisioning script on its own Debian machine in the mode that
# installs Debian packages only, then checks that the tools are there.
provision-check:
	bash deploy/vagrant/provision.sh --packages-only
	bash deploy/vagrant/provision.sh --check
	@go=$$(sed -n 's/^go //p' go.mod); \
	grep -q "^GO_VERSION *= \"$$go\"" Vagrantfile || { echo "Vagrantfile: GO_VERSION is not go.mod's $$go"; exit 1; }; \
	grep -q "^CLANG_VERSION *= \"$(CLANG_VERSION)\"" Vagrantfile || { echo "Vagrantfile: CLANG_VERSION is not the Makefile's $(CLANG_VERSION)"; exit 1; }; \
	grep -q "^CLANG_VERSION=\$${CLANG_VERSION:-$(CLANG_VERSION)}" deploy/vagrant/provision.sh || { echo "provision.sh: CLANG_VERSION is not the Makefile's"; exit 1; }; \
	grep -q "^GO_VERSION=\$${GO_VERSION:-$$go}" deploy/vagrant/provision.sh || { echo "provision.sh: GO_VERSION is not go.mod's"; exit 1; }; \
	echo "provision-check: Vagrantfile and provision.sh pin go$$go and clang-$(CLANG_VERSION)"

# deps installs the Debian packages (deploy/vagrant/provision.sh
# --packages-only) only when a command the tests run is missing, and prints
# what it installs; as a user other than root it only warns.
.PHONY: deps
deps:
	@bash deploy/vagrant/provision.sh --deps

# Release (issue 16): static binaries (CGO off) for each of RELEASE_ARCHES,
# stamped with VERSION and COMMIT (tierlimit version prints them), then a
# .deb per architecture (nfpm) and a multi-arch OCI image built without a
# container daemon (go-containerregistry), by deploy/release, a Go program
# in the nested module deploy/ (its dependencies stay out of go.mod).
DIST ?= dist
RELEASE_ARCHES ?= amd64 arm64
VERSION ?= $(shell v=$$(git describe --tags --match 'v[0-9]*' 2>/dev/null) && echo "$${v#v}" || echo 0.0.0-dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
RELEASE_LDFLAGS = -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)

.PHONY: release
release:
	@mkdir -p $(DIST)
	@for arch in $(RELEASE_ARCHES); do \
		echo "go build tierlimit $(VERSION) ($(COMMIT)) for linux/$$arch"; \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -trimpath -ldflags '$(RELEASE_LDFLAGS)' \
			-o $(DIST)/tierlimit-linux-$$arch ./cmd/tierlimit || exit 1; \
	done
	cd deploy && $(GO) run ./release -version $(VERSION) -commit $(COMMIT) -repo .. \
		-dist $(abspath $(DIST)) -arch $(shell echo $(RELEASE_ARCHES) | tr ' ' ,)

# The nested module deploy/ (the release tool, the Kubernetes manifests'
# tests): lint and test it; with dist/ from make release, its release test
# checks those packages (both architectures) instead of building its own.
.PHONY: deploy-test monitoring-check
deploy-test:
	cd deploy && $(GO) vet ./... && $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	cd deploy && TIERLIMIT_RELEASE_DIST=$(if $(wildcard $(DIST)/tierlimit-linux-*),$(abspath $(DIST))) $(GO) test -count=1 ./...

# The alert rules and their unit tests (promtool, Debian's prometheus).
monitoring-check:
	promtool check rules deploy/prometheus/alerts.yaml
	promtool test rules deploy/prometheus/alerts_test.yaml

clean:
	rm -f bench.txt
	rm -rf $(DIST)
