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
k8s-e2e-tools:
	@hack/tools/k8se2e/build.sh $(K8S_E2E_BIN)

# csi-snapshotter and snapshot-controller from hack/tools/snapshotter.
snapshotter-tools:
	@hack/tools/csi/build.sh -C ../snapshotter $(SNAPSHOTTER_BIN) \
		github.com/kubernetes-csi/external-snapshotter/v8 \
		github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter \
		github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller

# agnhost (with Debian's static busybox as its shell), csi-snapshotter and snapshot-controller as
# image tarballs for the loopback registry; the pause and busybox images come from node-images.
k8s-e2e-images: $(BUSYBOX) k8s-e2e-tools snapshotter-tools
	@cd hack/images && $(GO) run ./build -out $(K8S_E2E_IMAGES) -busybox $(BUSYBOX) \
	  -agnhost $(K8S_E2E_BIN)/agnhost \
	  -csi-snapshotter $(SNAPSHOTTER_BIN)/csi-snapshotter -snapshot-controller $(SNAPSHOTTER_BIN)/snapshot-controller
