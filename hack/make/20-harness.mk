# Real Kubernetes peers for tests, built from source into $(CISTERN_CACHE) once per version, and
# the control-plane test harness in test/framework (see docs/testing.md).
K8S_VERSION := v1.37.2
K8S_BIN := $(CISTERN_CACHE)/k8s-$(K8S_VERSION)/bin
EXTERNAL_PROVISIONER_VERSION := v6.4.0
EXTERNAL_PROVISIONER_BIN := $(CISTERN_CACHE)/external-provisioner-$(EXTERNAL_PROVISIONER_VERSION)/bin
# Tests find the binaries through these (test/framework.BinDir, envtest).
export CISTERN_K8S_BIN := $(K8S_BIN)
export CISTERN_CSI_BIN := $(EXTERNAL_PROVISIONER_BIN)

K8S_CONTROL_PLANE := ./etcd \
	k8s.io/kubernetes/cmd/kube-apiserver \
	k8s.io/kubernetes/cmd/kube-controller-manager \
	k8s.io/kubernetes/cmd/kube-scheduler \
	k8s.io/kubernetes/cmd/kubectl

.PHONY: k8s-tools kubelet-tools csi-tools test-framework
TEST_TARGETS += test-framework

# The build scripts keep a stamp keyed by go.mod/go.sum, so these are no-ops once built.
## Builds etcd, kube-apiserver, controller-manager, scheduler and kubectl into the cache
k8s-tools:
	@hack/tools/k8s/build.sh $(K8S_BIN) control-plane $(K8S_CONTROL_PLANE)

# kubelet is opt-in: only node-level suites need it.
## Builds kubelet into the cache
kubelet-tools:
	@hack/tools/k8s/build.sh $(K8S_BIN) kubelet k8s.io/kubernetes/cmd/kubelet

## Builds external-provisioner into the cache
csi-tools:
	@hack/tools/csi/build.sh $(EXTERNAL_PROVISIONER_BIN) \
		github.com/kubernetes-csi/external-provisioner/v6 \
		github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner

## The test kit's own tests: the control-plane framework and the pool helpers
test-framework: k8s-tools csi-tools
	$(GO_TEST) -count=1 ./test/framework/... ./test/testutil/...
