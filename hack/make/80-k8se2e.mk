# Kubernetes' own storage e2e suite (the External Storage tests of e2e.test, driven by
# test/k8se2e/testdriver.yaml) against Cistern installed from deploy/csi on kubelet nodes in their
# own network namespaces; see docs/testing.md ("Kubernetes storage e2e").
K8S_E2E_BIN := $(CISTERN_CACHE)/k8s-e2e-$(K8S_VERSION)/bin
SNAPSHOTTER_VERSION := v8.7.0
SNAPSHOTTER_BIN := $(CISTERN_CACHE)/external-snapshotter-$(SNAPSHOTTER_VERSION)/bin
K8S_E2E_IMAGES := $(CURDIR)/_output/k8s-e2e-images
# test/e2enode finds them through these.
export CISTERN_K8S_E2E_BIN := $(K8S_E2E_BIN)
export CISTERN_SNAPSHOTTER_BIN := $(SNAPSHOTTER_BIN)
export CISTERN_K8S_E2E_IMAGES := $(K8S_E2E_IMAGES)/images.json

.PHONY: k8s-e2e-tools snapshotter-tools k8s-e2e-images

# e2e.test (`go test -c k8s.io/kubernetes/test/e2e`), ginkgo and agnhost, from hack/tools/k8se2e.
## Builds e2e.test, ginkgo and agnhost into the cache
k8s-e2e-tools:
	@hack/tools/k8se2e/build.sh $(K8S_E2E_BIN)

# csi-snapshotter and snapshot-controller from hack/tools/snapshotter.
## Builds csi-snapshotter and snapshot-controller into the cache
snapshotter-tools:
	@hack/tools/csi/build.sh -C ../snapshotter $(SNAPSHOTTER_BIN) \
		github.com/kubernetes-csi/external-snapshotter/v8 \
		github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter \
		github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller

# agnhost (with Debian's static busybox as its shell), csi-snapshotter and snapshot-controller as
# image tarballs for the loopback registry; the pause and busybox images come from node-images.
## Builds the Kubernetes e2e suite's images as tarballs
k8s-e2e-images: $(BUSYBOX) k8s-e2e-tools snapshotter-tools
	@cd hack/images && $(GO) run ./build -out $(K8S_E2E_IMAGES) -busybox $(BUSYBOX) \
	  -agnhost $(K8S_E2E_BIN)/agnhost \
	  -csi-snapshotter $(SNAPSHOTTER_BIN)/csi-snapshotter -snapshot-controller $(SNAPSHOTTER_BIN)/snapshot-controller

# The suite (TestK8sStorageE2E in test/e2enode): nodes in their own network namespaces, deploy/csi
# with the snapshots component and the external-resizer stand-in (test/k8se2e/resizer),
# external-snapshotter's CRDs and snapshot-controller, then ginkgo
# runs of e2e.test: "storage" (every External Storage test the testdriver enables, without
# [Disruptive], [Serial] and features needing absent components; offline expansion),
# "expansion" (the expansion tests that grow a volume in use, with xfs as the default
# filesystem: test/k8se2e/testdriver-xfs.yaml), "snapshots"
# ([Feature:VolumeSnapshotDataSource]) and "streaming" (the CSI inline read-only volume test with
# streaming dataset volumes, test/k8se2e/testdriver-streaming.yaml, over a public dataset on an
# S3 server of the test). K8S_E2E_RUNS=subset runs the part `make test` runs;
# K8S_E2E_RUNS=focus K8S_E2E_FOCUS='<regexp>' the tests matching a regular expression.
# Same machine requirements as e2e-node.
K8S_E2E_RUNS ?= storage,expansion,snapshots,streaming
K8S_E2E_NODES ?= 2
SNAPSHOTTER_CLIENT := github.com/kubernetes-csi/external-snapshotter/client/v8
.PHONY: e2e-k8s
## Kubernetes' storage e2e suite against Cistern on kubelet nodes (K8S_E2E_RUNS)
e2e-k8s:
	@$(REQUIRE_NODE); \
	$(MAKE) --no-print-directory k8s-tools kubelet-tools csi-tools node-tools node-images images k8s-e2e-images && \
	(cd hack/images && $(GO) build -o $(REGISTRY_BIN) ./registry) && \
	crds=$$(cd hack/tools/snapshotter && $(GO) mod download $(SNAPSHOTTER_CLIENT) && $(GO) list -m -f '{{.Dir}}' $(SNAPSHOTTER_CLIENT))/config/crd && \
	controller=$$(cd hack/tools/snapshotter && $(GO) list -m -f '{{.Dir}}' github.com/kubernetes-csi/external-snapshotter/v8)/deploy/kubernetes/snapshot-controller && \
	CISTERN_IMAGES=$(IMAGES_DIR)/images.json CISTERN_REGISTRY_BIN=$(REGISTRY_BIN) CISTERN_REQUIRE_PEERS=1 CISTERN_VERSITYGW=$(VERSITYGW) \
	  CISTERN_SNAPSHOT_CRDS=$$crds CISTERN_SNAPSHOT_CONTROLLER=$$controller CISTERN_K8S_E2E_RUNS=$(K8S_E2E_RUNS) CISTERN_K8S_E2E_FOCUS='$(K8S_E2E_FOCUS)' CISTERN_K8S_E2E_NODES=$(K8S_E2E_NODES) \
	  $(GO_TEST) -count=1 -timeout 3h -v -run TestK8sStorageE2E ./test/e2enode/... | \
	  grep -E '^(gate: |=== RUN|--- |\s+--- |ok|FAIL|PASS|panic)|(_test|specgate)\.go:[0-9]+' ; exit $${PIPESTATUS[0]}

# The representative part `make test` runs (K8S_E2E_RUNS=subset: provisioning from a claim,
# volumes, subPath, block, CSI inline and generic ephemeral volumes, a snapshot and its restore),
# on two nodes, so that a restore must find the node that holds its snapshot; and the streaming
# run (one spec, about 15-20 s more of the test: docs/testing.md).
TEST_TARGETS += e2e-k8s-subset
TEST_SECOND_LANE += e2e-k8s-subset
.PHONY: e2e-k8s-subset
## The part of Kubernetes' storage e2e suite that make test runs
e2e-k8s-subset:
	@$(MAKE) --no-print-directory e2e-k8s K8S_E2E_RUNS=subset,streaming K8S_E2E_NODES=2
