# Cistern. `make demo` and `make test` are the two entry points (see README.md).
SHELL := /bin/bash
GO ?= go
export GOFLAGS ?= -mod=mod
BIN := $(CURDIR)/bin
# Built peers (Kubernetes, etcd, CSI sidecars, S3 server, ...) are cached per version here.
export CISTERN_CACHE ?= $(HOME)/.cache/cistern

.PHONY: all build test bench proto clean
all: build

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
build:
	@mkdir -p $(BIN)
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN)/ ./cmd/...

proto: $(BIN)/tools/protoc-gen-go $(BIN)/tools/protoc-gen-go-grpc
	PATH=$(BIN)/tools:$$PATH protoc -I proto -I /usr/include \
	  --go_out=. --go_opt=module=github.com/cistern-csi/cistern \
	  --go-grpc_out=. --go-grpc_opt=module=github.com/cistern-csi/cistern \
	  proto/cistern/storagepool/v1alpha1/storagepool.proto

$(BIN)/tools/protoc-gen-go:
	GOBIN=$(BIN)/tools $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
$(BIN)/tools/protoc-gen-go-grpc:
	GOBIN=$(BIN)/tools $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2

# controller-gen for CRDs, deepcopy, apply configurations and RBAC. Keyed by version through its
# directory: the binary keeps its name, which it writes into the generated headers.
CONTROLLER_GEN_VERSION := v0.23.0
CONTROLLER_GEN := $(BIN)/tools/controller-tools-$(CONTROLLER_GEN_VERSION)/controller-gen
$(CONTROLLER_GEN):
	GOBIN=$(dir $@) $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)

.PHONY: generate
generate:

clean:
	rm -rf $(BIN)

# go test for the targets: `go test -json` shown as go test shows it, the events kept in
# _output/test-results/<target>.jsonl for the summary of `make test` (hack/make/gotest.sh).
GO_TEST = GO=$(GO) $(CURDIR)/hack/make/gotest.sh $@

# Static checks first: go vet over every package, gofmt over every Go file of the tree.
.PHONY: vet
TEST_TARGETS := vet
vet:
	$(GO) vet ./...
	@unformatted=$$(gofmt -l .); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi

# Each area adds its own targets and appends to TEST_TARGETS / BENCH_TARGETS.
include $(sort $(wildcard hack/make/*.mk))

# Every target of TEST_TARGETS, going on after a failure (make -k); at the end, the targets and
# tests that failed or skipped and the totals (hack/make/run-tests.sh).
test:
	@MAKE="$(MAKE)" hack/make/run-tests.sh $(TEST_TARGETS)
bench: $(BENCH_TARGETS)
