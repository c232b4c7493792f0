# Install manifests, the end-to-end suite on a real control plane, `make demo`, images and kind.
TEST_TARGETS += e2e

DEMO_DIR ?= /var/tmp/cistern-demo
IMAGE_TAG ?= dev
NODE_IMAGE ?= cistern/node:$(IMAGE_TAG)
CONTROLLER_IMAGE ?= cistern/workload-controller:$(IMAGE_TAG)
KIND ?= kind
KIND_CLUSTER ?= cistern
KUBECTL ?= kubectl
DOCKER ?= docker

# The S3 server (versitygw) comes from the datasource area's make file when the tree has it.
E2E_TOOLS := k8s-tools csi-tools $(VERSITYGW)
E2E_ENV := $(if $(VERSITYGW),CISTERN_VERSITYGW=$(VERSITYGW))

.PHONY: e2e demo demo-down images kind-up kind-deploy kind-down

# Runs as root (loop devices, mounts). One control plane for the whole package.
e2e: $(E2E_TOOLS)
	$(E2E_ENV) $(GO_TEST) -count=1 -timeout 20m ./test/e2e/...

# A local cluster doing real work; see docs/demo.md. `make demo-down` removes it.
# The builds run side by side: on a cold machine they are most of the time, and one go build
# alone leaves a core idle while it links.
demo:
	@$(MAKE) --no-print-directory -j4 -Oline $(E2E_TOOLS) demo-binaries
	@$(E2E_ENV) $(BIN)/demo up --dir $(DEMO_DIR)

# The demo and the commands it runs (test/e2e/cluster.BinDir), so the demo itself only links
# what changed.
.PHONY: demo-binaries
demo-binaries:
	@echo "demo: building hack/demo and ./cmd/..."
	@$(GO) build -o $(BIN)/demo ./hack/demo
	@$(GO) build -o $(CURDIR)/_output/bin/ ./cmd/...

demo-down:
	@$(GO) build -o $(BIN)/demo ./hack/demo
	@$(BIN)/demo down --dir $(DEMO_DIR)

# Container images (needs Docker with BuildKit); see docs/kind.md.
images:
	$(DOCKER) build --target node -t $(NODE_IMAGE) --build-arg VERSION=$(VERSION) .
	$(DOCKER) build --target controller -t $(CONTROLLER_IMAGE) --build-arg VERSION=$(VERSION) .

kind-up:
	$(KIND) create cluster --name $(KIND_CLUSTER) --config deploy/kind/kind-config.yaml

kind-deploy: images
	$(KIND) load docker-image --name $(KIND_CLUSTER) $(NODE_IMAGE) $(CONTROLLER_IMAGE)
	$(KUBECTL) --context kind-$(KIND_CLUSTER) apply --server-side -k deploy/csi
	$(KUBECTL) --context kind-$(KIND_CLUSTER) wait --for=condition=Established crd --all --timeout=60s
	$(KUBECTL) --context kind-$(KIND_CLUSTER) -n cistern-system rollout status daemonset/cistern-node --timeout=180s

kind-down:
	$(KIND) delete cluster --name $(KIND_CLUSTER)
