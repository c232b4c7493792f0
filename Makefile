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

clean:
	rm -rf $(BIN)

# Each area adds its own targets and appends to TEST_TARGETS / BENCH_TARGETS.
include $(sort $(wildcard hack/make/*.mk))

test: $(TEST_TARGETS)
bench: $(BENCH_TARGETS)
