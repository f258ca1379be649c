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

.PHONY: all build generate check-generate test lint bench clean

all: build

build:
	$(GO) build ./...

generate:
	$(GO) generate ./...

# Fails when the committed BPF objects differ from what the pinned clang makes.
check-generate: generate
	@git diff --exit-code --stat -- bpf/ || { echo "generated BPF files are stale: run make generate and commit"; exit 1; }

# The README's test command. BPF tests need root; with TIERLIMIT_REQUIRE_BPF=1
# they fail instead of skipping.
test:
	$(GO) test -count=1 $(TEST_FLAGS) ./...

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); [ -z "$$out" ] || { echo "gofmt: $$out"; exit 1; }
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

bench:
	$(GO) test -run '^$$' -bench . -benchtime 2s -count 5 ./bpf/ | tee bench.txt

clean:
	rm -f bench.txt
