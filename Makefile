# Cistern. `make demo` and `make test` are the two entry points (see README.md).
SHELL := /bin/bash
GO ?= go
# Every module's go.mod and go.sum are complete and tidy: builds read them, never edit them.
export GOFLAGS ?= -mod=readonly
# Every build and test make runs has the libnfs tag: the node plugin reads NFSv4 datasets through
# libnfs (cgo; pkg/datasource/nfs4source, Debian's libnfs-dev from HOST_PACKAGES). Static builds
# (CGO_ENABLED=0: the controller image's) leave it out by the tag's cgo constraint. A -tags on a
# command line replaces this one. GO_TAGS= builds without it.
GO_TAGS ?= libnfs
GOFLAGS := $(strip $(filter-out -tags=$(GO_TAGS),$(GOFLAGS)) $(if $(GO_TAGS),-tags=$(GO_TAGS)))
BIN := $(CURDIR)/bin
# Built peers (Kubernetes, etcd, CSI sidecars, S3 server, ...) are cached per version here.
export CISTERN_CACHE ?= $(HOME)/.cache/cistern
# Generators and linters, pinned and installed once per version into the cache (not bin/), so a
# warm CI machine reuses them.
TOOLS := $(CISTERN_CACHE)/tools

.PHONY: all build test bench proto clean
## Builds the binaries (same as build)
all: build

# Every path that builds the binaries (build, demo, e2e, images) stamps this; --version prints it,
# and it is the images' tag. A release is its tag (`git describe --tags`: v0.2.0, or
# v0.2.0-3-gabc1234 after it); before any tag, the chart's version with the commit, so that an
# untagged build never takes the release's name; without git, the chart's version.
CHART_VERSION := $(shell sed -n 's/^version: *//p' charts/cistern/Chart.yaml)
VERSION ?= $(shell git describe --tags --dirty 2>/dev/null || \
  { c=$$(git describe --always --dirty 2>/dev/null) && echo v$(CHART_VERSION)-dev-$$c; } || echo v$(CHART_VERSION))
export VERSION
.PHONY: version
## Prints the version make stamps the binaries and images with
version:
	@echo $(VERSION)
LDFLAGS := -X main.version=$(VERSION)
## Builds Cistern's commands into bin/
build:
	@mkdir -p $(BIN)
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...

# protoc is Debian bookworm's protobuf-compiler (.ci/run installs it); its version is written into
# the generated headers, so another one would fail `make verify`.
PROTOC_VERSION := 3.21.12
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
PROTOC_GEN_GO := $(TOOLS)/protoc-gen-go-$(PROTOC_GEN_GO_VERSION)/protoc-gen-go
PROTOC_GEN_GO_GRPC := $(TOOLS)/protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION)/protoc-gen-go-grpc
## Generates the StoragePool gRPC code from proto/ (needs Debian bookworm protoc)
proto: $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC)
	@v=$$(protoc --version 2>/dev/null); [ "$$v" = "libprotoc $(PROTOC_VERSION)" ] || \
	  { echo "proto: needs protoc $(PROTOC_VERSION) (Debian bookworm's protobuf-compiler), found: $${v:-none}"; exit 1; }
	protoc -I proto -I /usr/include \
	  --plugin=protoc-gen-go=$(PROTOC_GEN_GO) --plugin=protoc-gen-go-grpc=$(PROTOC_GEN_GO_GRPC) \
	  --go_out=. --go_opt=module=github.com/cistern-csi/cistern \
	  --go-grpc_out=. --go-grpc_opt=module=github.com/cistern-csi/cistern \
	  proto/cistern/storagepool/v1alpha1/storagepool.proto

$(PROTOC_GEN_GO):
	GOBIN=$(dir $@) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
$(PROTOC_GEN_GO_GRPC):
	GOBIN=$(dir $@) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

# controller-gen for CRDs, deepcopy, apply configurations and RBAC. Keyed by version through its
# directory: the binary keeps its name, which it writes into the generated headers.
CONTROLLER_GEN_VERSION := v0.23.0
CONTROLLER_GEN := $(TOOLS)/controller-tools-$(CONTROLLER_GEN_VERSION)/controller-gen
$(CONTROLLER_GEN):
	GOBIN=$(dir $@) $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)

# staticcheck analyses only code of a Go version it was built with or older, so it is keyed by the
# Go version too.
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(TOOLS)/staticcheck-$(STATICCHECK_VERSION)-$(shell $(GO) env GOVERSION)/staticcheck
$(STATICCHECK):
	GOBIN=$(dir $@) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

.PHONY: generate
## Regenerates CRDs, deepcopy, apply configurations, RBAC and the webhook manifest
generate:

# Debian packages the builds and suites need, as <command or file>=<package>; areas add theirs
# (target-specific, for what only they run). .ci/run installs these before `make test`.
HOST_PACKAGES := protoc=protobuf-compiler mkfs.xfs=xfsprogs mkfs.ext4=e2fsprogs losetup=mount ip=iproute2 \
  /usr/include/nfsc/libnfs.h=libnfs-dev
.PHONY: host-packages help
## Installs the Debian packages the builds and suites need (those missing)
host-packages:
	@hack/make/host-packages.sh $(HOST_PACKAGES)

# The targets with their `## ` lines (hack/make/help.sh); make vet checks that every target has one.
## Lists every target with one line on what it does
help:
	@hack/make/help.sh

## Removes bin/
clean:
	rm -rf $(BIN)

# Every package with tests runs under the race detector (`RACE=` turns it off; see
# docs/testing.md for what it costs).
RACE ?= -race

# go test for the targets: `go test -json` shown as go test shows it, the events kept in
# _output/test-results/<target>.jsonl for the summary of `make test` (hack/make/gotest.sh).
GO_TEST = GO=$(GO) $(CURDIR)/hack/make/gotest.sh $@ $(RACE)

# Static checks first: go vet and staticcheck over every package of the main module (with the
# benchmarks that are built with -tags bench) and of hack/images, gofmt over every Go file of the
# tree, the size limits of product files (700 lines) and functions (80) (hack/codesize), and the
# layering of the product packages, each forbidden import a rule (hack/layering); no merge
# conflict markers left in any file.
.PHONY: vet verify
TEST_TARGETS := vet verify
# How `make test` runs them (below): areas add their node suites to TEST_SECOND_LANE.
TEST_LANES ?= 2
TEST_FIRST := verify
TEST_SECOND_LANE :=
## go vet, staticcheck, gofmt and the make help check over the tree
vet: $(STATICCHECK)
	$(GO) vet -tags bench ./...
	$(STATICCHECK) -tags bench ./...
	$(GO) vet -tags bench,libnfs ./pkg/datasource/...
	$(STATICCHECK) -tags bench,libnfs ./pkg/datasource/...
	cd hack/images && $(GO) vet ./... && $(STATICCHECK) ./...
	@hack/make/help.sh --check
	@unformatted=$$(gofmt -l .); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	@if git grep -nE '^(<<<<<<<|>>>>>>>)( |$$)' -- . ':!*.go.golden'; then echo "merge conflict markers left in the files above"; exit 1; fi
	$(GO_TEST) -count=1 ./hack/codesize/ ./hack/layering/

# The generated code (CRDs, deepcopy, apply configurations, RBAC, the webhook manifest, protobuf)
# is what the generators make from the committed sources: regenerate, then fail on any file they
# changed or added.
## Fails when generated code differs from what the generators make now
verify:
	@hack/verify-generated.sh $(MAKE) --no-print-directory generate proto

# Each area adds its own targets and appends to TEST_TARGETS / BENCH_TARGETS.
include $(sort $(wildcard hack/make/*.mk))

# Every target of TEST_TARGETS, going on after a failure (make -k); at the end, the targets and
# tests that failed or skipped and the totals (hack/make/run-tests.sh). In two lanes side by side
# (TEST_LANES=1: one after the other, in TEST_TARGETS' order): `verify` first, as it rewrites
# generated files other suites read, with test-prereqs; then the suites of TEST_SECOND_LANE (the
# kubelet-node suites, which take turns on the host lock anyway, the images they install, and
# test-chart and test-sidecar, which even the lanes) beside all the others. The node suites mostly wait on
# kubelet, containerd and their pods (e2e-install: 105 CPU-s in 215 s), so the two lanes share
# the 2 cores with little slowdown (docs/testing.md).
## Every suite of TEST_TARGETS (what CI runs), then a summary of failures and skips
test:
	@MAKE="$(MAKE)" GO="$(GO)" TEST_LANES="$(TEST_LANES)" TEST_FIRST="$(TEST_FIRST)" TEST_PREREQS=test-prereqs \
	  TEST_CHECK_PACKAGES=$(if $(filter file,$(origin TEST_TARGETS)),1) \
	  TEST_SECOND_LANE="$(TEST_SECOND_LANE)" hack/make/run-tests.sh $(TEST_TARGETS)

# What make test leaves out to stay within CI's 20 warm minutes: the full Kubernetes storage e2e
# runs, the upstream LeaderWorkerSet comparison, the full fault suite, long fuzzing and every
# benchmark (docs/testing.md, "What make test runs"), after make test itself, going on after a
# failure.
TEST_ALL_EXTRA := test-lws-upstream e2e-k8s chaos fuzz $(BENCH_TARGETS)
.PHONY: test-all
## make test, then the full e2e, LWS comparison, fault, fuzz and benchmark runs it leaves out
test-all:
	@rc=0; $(MAKE) --no-print-directory test || rc=1; \
	  $(MAKE) -k --no-print-directory $(TEST_ALL_EXTRA) || rc=1; exit $$rc

# The tests each target must pass (hack/testreport/gate.go), rewritten from the results of a full
# `make test` (CI=true, so that nothing skipped for want of root or a tool): review the diff, and
# say in the commit why a test left the list.
.PHONY: expected-tests
## Rewrites hack/make/expected-tests.txt from the last make test's results
expected-tests:
	@results=$${CISTERN_TEST_RESULTS:-_output/test-results}; ls $$results/*.jsonl >/dev/null || exit 1; \
	  { sed -n '/^#/p' hack/make/expected-tests.txt; \
	    for f in $$results/*.jsonl; do $(GO) run ./hack/testreport -expected -target $$(basename $$f .jsonl) $$f; done; \
	  } >hack/make/expected-tests.txt.new && mv hack/make/expected-tests.txt.new hack/make/expected-tests.txt

# What suites of both lanes build with a plain go build (no lock, unlike hack/tools), built
# before the lanes start so that two builds never write one file.
.PHONY: test-prereqs
## Builds what suites of both lanes of make test need, before the lanes start
test-prereqs: $(VERSITYGW)
## Every benchmark of BENCH_TARGETS
bench: $(BENCH_TARGETS)
