# Install manifests, the end-to-end suite on a real control plane, `make demo`, images and kind.
TEST_TARGETS += e2e

DEMO_DIR ?= /var/tmp/cistern-demo
# Images are tagged with the version (make version: git describe --tags); deploy/csi names them cistern/node and
# cistern/workload-controller, and a kustomize images: entry points it at a registry and tag.
IMAGE_TAG ?= $(VERSION)
IMAGES_DIR := $(CURDIR)/_output/images
# docker: the Dockerfile; oci: go-containerregistry on a Debian root filesystem from mmdebstrap
# (hack/images/release); auto: docker when its daemon answers.
IMAGE_BUILDER ?= auto
REGISTRY ?=
KIND ?= kind
KIND_CLUSTER ?= cistern
KUBECTL ?= kubectl
DOCKER ?= docker

# make images builds the node image's root filesystem with mmdebstrap (hack/images/rootfs.sh).
HOST_PACKAGES += mmdebstrap=mmdebstrap

# The S3 server (versitygw) is built by 30-datasource.mk.
E2E_TOOLS := k8s-tools csi-tools $(VERSITYGW)
E2E_ENV := CISTERN_VERSITYGW=$(VERSITYGW)

.PHONY: e2e demo demo-down images kind-up kind-deploy kind-down

# Runs as root (loop devices, mounts). One control plane for the whole package.
# hack/demo's own tests (its harness session) are unit tests.
## The end-to-end suite on a real control plane with simulated nodes (root)
e2e: $(E2E_TOOLS)
	$(GO_TEST) -count=1 ./hack/demo/
	$(E2E_ENV) $(GO_TEST) -count=1 -timeout 20m ./test/e2e/...

# A local cluster doing real work; see docs/demo.md. `make demo-down` removes it.
# The builds run side by side: on a cold machine they are most of the time, and one go build
# alone leaves a core idle while it links.
## Starts a local cluster doing real work (docs/demo.md)
demo:
	@$(MAKE) --no-print-directory -j4 -Oline $(E2E_TOOLS) demo-binaries
	@$(E2E_ENV) $(BIN)/demo up --dir $(DEMO_DIR)

# The demo and the commands it runs (test/e2e/cluster.BinDir), so the demo itself only links
# what changed: it builds them again with the same flags (testutil.GoBuild, main.version from the
# exported VERSION).
.PHONY: demo-binaries
## Builds hack/demo and the commands it runs
demo-binaries:
	@echo "demo: building hack/demo and ./cmd/..."
	@$(GO) build -o $(BIN)/demo ./hack/demo
	@$(GO) build -ldflags "$(LDFLAGS)" -o $(CURDIR)/_output/bin/ ./cmd/...

## Stops the demo cluster and removes what it made
demo-down:
	@$(GO) build -o $(BIN)/demo ./hack/demo
	@$(BIN)/demo down --dir $(DEMO_DIR)

# Container images into $(IMAGES_DIR) as image tarballs (node.tar, workload-controller.tar) and
# images.json, with Docker or without it (the file builder says which); see docs/kind.md. Without
# Docker, once per content: the same tree and tag reuse the tarballs (hack/images/release.sh).
.PHONY: push kind-load test-images
## Builds the node and workload-controller images as tarballs, with or without Docker
images:
	@builder=$(IMAGE_BUILDER); \
	if [ "$$builder" = auto ]; then if $(DOCKER) info >/dev/null 2>&1; then builder=docker; else builder=oci; fi; fi; \
	mkdir -p $(IMAGES_DIR); echo "images: cistern/node:$(IMAGE_TAG) and cistern/workload-controller:$(IMAGE_TAG) with $$builder"; \
	if [ "$$builder" = docker ]; then \
	  rm -f $(IMAGES_DIR)/.stamp && \
	  $(DOCKER) build --target node -t cistern/node:$(IMAGE_TAG) --build-arg VERSION=$(IMAGE_TAG) . && \
	  $(DOCKER) build --target controller -t cistern/workload-controller:$(IMAGE_TAG) --build-arg VERSION=$(IMAGE_TAG) . && \
	  $(DOCKER) save -o $(IMAGES_DIR)/node.tar cistern/node:$(IMAGE_TAG) && \
	  $(DOCKER) save -o $(IMAGES_DIR)/workload-controller.tar cistern/workload-controller:$(IMAGE_TAG) && \
	  printf '{"node": {"ref": "cistern/node:%s", "tarball": "%s"}, "workload-controller": {"ref": "cistern/workload-controller:%s", "tarball": "%s"}}\n' \
	    $(IMAGE_TAG) $(IMAGES_DIR)/node.tar $(IMAGE_TAG) $(IMAGES_DIR)/workload-controller.tar >$(IMAGES_DIR)/images.json; \
	else \
	  GO=$(GO) hack/images/release.sh $(IMAGE_TAG) $(IMAGES_DIR); \
	fi && echo $$builder >$(IMAGES_DIR)/builder

# Pushes both images as $(REGISTRY)/node:$(IMAGE_TAG) and $(REGISTRY)/workload-controller:$(IMAGE_TAG)
# (go-containerregistry, credentials from the Docker config) and writes _output/deploy, deploy/csi
# pointed at them: `kubectl apply --server-side -k _output/deploy`.
## Pushes the images to REGISTRY and writes _output/deploy pointed at them
push: images
	@test -n "$(REGISTRY)" || { echo "usage: make push REGISTRY=registry.example.com/path"; exit 1; }
	@cd hack/images && $(GO) run ./release push -registry $(REGISTRY) -overlay $(CURDIR)/_output/deploy \
	  -base $(CURDIR)/deploy/csi $(IMAGES_DIR)/node.tar $(IMAGES_DIR)/workload-controller.tar

# The image tarballs into the kind cluster's nodes.
## Loads the images into the kind cluster
kind-load: images
	$(KIND) load image-archive --name $(KIND_CLUSTER) $(IMAGES_DIR)/node.tar
	$(KIND) load image-archive --name $(KIND_CLUSTER) $(IMAGES_DIR)/workload-controller.tar

# What is in the images built without Docker: files, static binaries, users; every program runs
# (in the image's root filesystem) and prints its version; what the Dockerfile declares (base
# suite, packages, copied binaries, user, entrypoint) is what they hold. Where a Docker engine
# answers, the images are built both ways and compared file by file; elsewhere that comparison
# says it did not run, here and in the test's output. Also the test tooling's own tests.
TEST_TARGETS += test-images
TEST_SECOND_LANE += test-images
## Checks the images' contents against the Dockerfile; the image tooling's tests
test-images: images
	@oci=$(IMAGES_DIR)/images.json; docker=; \
	if [ "$$(cat $(IMAGES_DIR)/builder)" = docker ]; then \
	  docker=$$oci; oci=$(IMAGES_DIR)/oci/images.json; \
	  $(MAKE) --no-print-directory images IMAGE_BUILDER=oci IMAGES_DIR=$(IMAGES_DIR)/oci || exit 1; \
	elif $(DOCKER) info >/dev/null 2>&1; then \
	  docker=$(IMAGES_DIR)/docker/images.json; \
	  $(MAKE) --no-print-directory images IMAGE_BUILDER=docker IMAGES_DIR=$(IMAGES_DIR)/docker || exit 1; \
	else \
	  echo "test-images: no Docker engine answers \`$(DOCKER) info\`: the Dockerfile's images are not built here, so they are not compared with these file by file (TestDockerfileBuildSameFiles runs where an engine answers); TestImagesAsDockerfileDeclares checks these against the Dockerfile"; \
	fi; \
	cd hack/images && CISTERN_IMAGES=$$oci CISTERN_DOCKER_IMAGES=$$docker $(GO_TEST) -count=1 ./release/ ./layer/
	$(GO_TEST) -count=1 ./hack/testreport/... ./hack/standins/...

## Creates a kind cluster (deploy/kind)
kind-up:
	$(KIND) create cluster --name $(KIND_CLUSTER) --config deploy/kind/kind-config.yaml

# deploy/csi with the images of this build (kustomize images: entries in _output/deploy-kind), and
# the replacements that copy the controller's image into COMPARE_IMAGE and STAGER_IMAGE after them.
# KIND_S3_ALLOW_PLAIN_HTTP=true adds the driver's --s3-allow-plain-http (the quick start's S3
# server is a pod on plain HTTP).
KIND_S3_ALLOW_PLAIN_HTTP ?=
## Installs deploy/csi with this build's images into the kind cluster
kind-deploy: kind-load
	@mkdir -p _output/deploy-kind
	@printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- ../../deploy/csi\nimages:\n- name: cistern/node\n  newTag: \"%s\"\n- name: cistern/workload-controller\n  newTag: \"%s\"\n%s\n' \
	  $(IMAGE_TAG) $(IMAGE_TAG) "$$(sed -n '/^replacements:/,$$p' deploy/csi/workload-controller/kustomization.yaml)" >_output/deploy-kind/kustomization.yaml
	@if [ "$(KIND_S3_ALLOW_PLAIN_HTTP)" = true ]; then \
	  printf 'patches:\n- target: {kind: DaemonSet, name: cistern-node}\n  patch: |-\n    - op: test\n      path: /spec/template/spec/containers/0/name\n      value: driver\n    - op: add\n      path: /spec/template/spec/containers/0/args/-\n      value: --s3-allow-plain-http\n' \
	    >>_output/deploy-kind/kustomization.yaml; fi
	$(KUBECTL) --context kind-$(KIND_CLUSTER) apply --server-side -k _output/deploy-kind
	$(KUBECTL) --context kind-$(KIND_CLUSTER) wait --for=condition=Established crd --all --timeout=60s
	$(KUBECTL) --context kind-$(KIND_CLUSTER) -n cistern-system rollout status daemonset/cistern-node --timeout=180s

# The quick start's S3 server image (versitygw, built by this project: `make node-images`), for
# deploy/quickstart, whose images: entry names it localhost/cistern/versitygw:v1.
.PHONY: kind-load-quickstart push-quickstart
## Loads the quick start's S3 server image into the kind cluster
kind-load-quickstart: node-images
	$(KIND) load image-archive --name $(KIND_CLUSTER) $(NODE_IMAGES)/versitygw.tar

# Pushes it as $(REGISTRY)/versitygw:v1 and writes _output/quickstart, deploy/quickstart pointed
# at it: `kubectl apply -k _output/quickstart`.
## Pushes the quick start's S3 server image to REGISTRY and writes _output/quickstart pointed at it
push-quickstart: node-images
	@test -n "$(REGISTRY)" || { echo "usage: make push-quickstart REGISTRY=registry.example.com/path"; exit 1; }
	@cd hack/images && $(GO) run ./release push -registry $(REGISTRY) $(NODE_IMAGES)/versitygw.tar >/dev/null
	@mkdir -p _output/quickstart
	@printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- ../../deploy/quickstart\nimages:\n- name: localhost/cistern/versitygw\n  newName: %s/versitygw\n' \
	  $(REGISTRY) >_output/quickstart/kustomization.yaml
	@echo "_output/quickstart/kustomization.yaml: kubectl apply -k _output/quickstart"

## Deletes the kind cluster
kind-down:
	$(KIND) delete cluster --name $(KIND_CLUSTER)

# Where pods with dataset claims start, and how fast, with the pod placement webhook and without
# it, on four simulated nodes (test/e2e/placement_bench_test.go); figures go to docs/benchmarks.md
# by hand. The full log is kept in _output/bench-placement.txt; the last line is the summary.
BENCH_TARGETS += bench-placement
.PHONY: bench-placement
## Pod placement with and without the placement webhook on four simulated nodes
bench-placement: $(E2E_TOOLS) $(RCLONE)
	@mkdir -p _output
	@echo "bench-placement: running (about 10 minutes); log in _output/bench-placement.txt"
	@$(E2E_ENV) CISTERN_RCLONE=$(RCLONE) CISTERN_REQUIRE_PEERS=1 $(GO) test -count=1 -timeout 60m -run '^$$' -bench BenchmarkPlacement -benchtime 1x \
	  ./test/e2e/ >_output/bench-placement.txt 2>&1; rc=$$?; \
	  sed -n '/^Placement benchmark/,/^API writes at rest/p' _output/bench-placement.txt; \
	  if [ $$rc -ne 0 ]; then tail -n 80 _output/bench-placement.txt; exit $$rc; fi; \
	  grep -E '^(placement|vm): ' _output/bench-placement.txt

# The VolumeManager part of bench-placement alone (replicas 3 against replicas 1, with where the
# time goes, and the bytes each node read from S3 and from peers), on the same four simulated nodes,
# with its independent limit next to each sample: rclone copying the same dataset from the same
# server, alone and three at once. Not in BENCH_TARGETS: bench-placement measures it too.
# BENCH_VM_PEERS=off runs the nodes without peer fan-out (no peer port).
BENCH_VM_PEERS ?= on
.PHONY: bench-vm-replicas
## VolumeManager replicas 3 vs 1 to Running, with the breakdown and rclone's three copies vs one
bench-vm-replicas: $(E2E_TOOLS) $(RCLONE)
	@mkdir -p _output
	@$(E2E_ENV) CISTERN_RCLONE=$(RCLONE) CISTERN_BENCH_VM_PEERS=$(BENCH_VM_PEERS) CISTERN_REQUIRE_PEERS=1 $(GO) test -count=1 -timeout 30m -run '^$$' -bench BenchmarkVolumeManagerReplicas -benchtime 1x \
	  ./test/e2e/ >_output/bench-vm-replicas.txt 2>&1; rc=$$?; \
	  if [ $$rc -ne 0 ]; then tail -n 80 _output/bench-vm-replicas.txt; exit $$rc; fi; \
	  sed -n '/^VolumeManager time to Running/,/^vm: /p' _output/bench-vm-replicas.txt
