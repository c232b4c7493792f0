# Node-level end-to-end suite: a one-node cluster on this machine (harness control plane, kubelet,
# containerd, runc) running pods that mount Cistern volumes. See docs/testing.md.
CONTAINERD_VERSION := v2.4.2
NODE_BIN := $(CISTERN_CACHE)/node-runtime-$(CONTAINERD_VERSION)/bin
NODE_IMAGES := $(CURDIR)/_output/node-images
# Static busybox (Debian's busybox-static, unpacked, not installed): /bin/sh of the git image.
BUSYBOX := $(CISTERN_CACHE)/busybox-static/busybox
# test/e2enode finds what it runs through these.
export CISTERN_NODE_BIN := $(NODE_BIN)
export CISTERN_NODE_IMAGES := $(NODE_IMAGES)/images.json

.PHONY: node-tools node-images e2e-node test-registration test-node-images
TEST_TARGETS += test-registration test-node-images e2e-node
TEST_SECOND_LANE += e2e-node

# The node-driver-registrar stand-in's kubelet plugin registration (hack/standins/registration)
# over its real socket.
## The kubelet plugin registration over its real socket
test-registration:
	$(GO_TEST) -count=1 ./hack/standins/registration/... ./hack/standins/node-driver-registrar/...

# The images' programs (the papermill and git stand-ins) as functions; seconds. The release
# images are tested by test-images, which builds them first.
## The test images' programs (papermill and git stand-ins)
test-node-images:
	cd hack/images && $(GO_TEST) -count=1 $$($(GO) list ./... | grep -v -e /release -e /layer)

# containerd, containerd-shim-runc-v2, ctr, runc (cgo, libseccomp) and the CNI loopback, ptp
# and host-local plugins. runc needs libseccomp-dev.
HOST_PACKAGES += /usr/include/seccomp.h=libseccomp-dev
## Builds containerd, runc and the CNI plugins into the cache
node-tools: host-packages
	@hack/tools/node/build.sh $(NODE_BIN)

# The pause, checker, git and papermill images as tarballs for `ctr images import`, and for the
# install suite the sidecar images deploy/csi names (csi-provisioner from csi-tools, stand-ins
# for node-driver-registrar and livenessprobe; the external-resizer stand-in the storage e2e suite
# adds) and the S3 server's (versitygw, static, from
# 30-datasource.mk); seconds to build, once per content (hack/images/node-images.sh).
## Builds the node suites' images as tarballs
node-images: $(BUSYBOX) csi-tools $(VERSITYGW)
	@GO=$(GO) hack/images/node-images.sh $(NODE_IMAGES) -busybox $(BUSYBOX) \
	  -csi-provisioner $(EXTERNAL_PROVISIONER_BIN)/csi-provisioner -versitygw $(VERSITYGW)

$(BUSYBOX):
	@hack/images/busybox.sh $@

# The notebook scenarios serve their repository with the host's `git http-backend`.
HOST_PACKAGES += git=git

# Runs where a node can run (root, loop devices, overlayfs, cgroups; hack/make/require-node.sh);
# elsewhere it says why and skips, or fails under CI=true. Builds kubelet, the node runtime,
# external-provisioner and the S3 server (versitygw, from 30-datasource.mk) first; all are cached
# after the first time.
# TestNode, then TestLWSNodeLoss (make e2e-nodeloss alone); one of them: make e2e-node E2E_NODE_RUN='TestNode$$'
E2E_NODE_RUN ?= TestNode$$|TestLWSNodeLoss$$
REQUIRE_NODE = hack/make/require-node.sh $@; rc=$$?; if [ $$rc = 2 ]; then exit 0; elif [ $$rc != 0 ]; then exit 1; fi
## Node-level suite: kubelet, containerd and pods mounting Cistern volumes (root)
e2e-node:
	@$(REQUIRE_NODE); \
	$(MAKE) --no-print-directory k8s-tools kubelet-tools csi-tools node-tools node-images host-packages $(VERSITYGW) && \
	CISTERN_VERSITYGW=$(VERSITYGW) CISTERN_REQUIRE_PEERS=1 $(GO_TEST) -count=1 -timeout 25m -v -run '$(E2E_NODE_RUN)' ./test/e2enode/... | \
	  grep -E '^(gate: |=== RUN|--- |\s+--- |ok|FAIL|PASS|panic)|e2enode_test.go|_test.go:[0-9]+' ; exit $${PIPESTATUS[0]}

# The install suite (TestInstall in test/e2enode): deploy/csi applied with `kubectl apply
# --server-side -k` (an overlay changing only image references and the pools ConfigMap), then
# charts/cistern installed with the helm command, one after the other on one
# kubelet node whose containerd pulls every image from a registry on loopback
# (hack/images/registry); see docs/testing.md. Same machine requirements as e2e-node; the
# notebook example clones from the host's git (host-packages).
REGISTRY_BIN := $(CURDIR)/_output/bin/registry
# One of the two installs alone: make e2e-install E2E_INSTALL_RUN='TestInstall/helm'
E2E_INSTALL_RUN ?= TestInstall$$
TEST_TARGETS += e2e-install
TEST_SECOND_LANE += e2e-install
.PHONY: e2e-install
## Installs deploy/csi (kustomize, then the Helm chart) on a kubelet node from a loopback registry and runs the examples
e2e-install:
	@$(REQUIRE_NODE); \
	$(MAKE) --no-print-directory k8s-tools kubelet-tools csi-tools node-tools node-images host-packages images helm && \
	(cd hack/images && $(GO) build -o $(REGISTRY_BIN) ./registry) && \
	CISTERN_IMAGES=$(IMAGES_DIR)/images.json CISTERN_REGISTRY_BIN=$(REGISTRY_BIN) CISTERN_REQUIRE_PEERS=1 \
	  $(GO_TEST) -count=1 -timeout 35m -v -run '$(E2E_INSTALL_RUN)' ./test/e2enode/... | \
	  grep -E '^(gate: |=== RUN|--- |\s+--- |ok|FAIL|PASS|panic)|_test.go:[0-9]+' ; exit $${PIPESTATUS[0]}

# Node loss (TestLWSNodeLoss in test/e2enode): a LeaderWorkerSet group on dataset claims runs on
# one of two kubelet nodes in their own network namespaces (the storage e2e suite's nodes), each
# with containerd and Cistern's node plugin; its node is made unreachable (link cut) past the
# workload-controller's grace period, then the other one is deleted, and each time the group must
# be Ready again on the other node on fresh claims (docs/workloads.md, "Node loss"). Same machine
# requirements as e2e-node.
.PHONY: e2e-nodeloss
## A LeaderWorkerSet group back Ready on another kubelet node after its node is lost (root)
e2e-nodeloss:
	@$(REQUIRE_NODE); \
	$(MAKE) --no-print-directory k8s-tools kubelet-tools csi-tools node-tools node-images $(VERSITYGW) && \
	CISTERN_VERSITYGW=$(VERSITYGW) $(GO_TEST) -count=1 -timeout 20m -v -run 'TestLWSNodeLoss$$' ./test/e2enode/... | \
	  grep -E '^(gate: |=== RUN|--- |\s+--- |ok|FAIL|PASS|panic)|_test.go:[0-9]+' ; exit $${PIPESTATUS[0]}
