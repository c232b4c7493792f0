# workload-controller: LeaderWorkerSet, NotebookValidationJob, VolumeManager.
WORKLOAD_APIS := ./pkg/apis/workloads/... ./pkg/apis/data/...

TEST_TARGETS += test-workloads
BENCH_TARGETS += bench-workloads

.PHONY: generate-workloads test-workloads bench-workloads kueue-tools lws-tools test-lws-upstream

# Kueue's controller manager and manifests, from hack/tools/kueue (its go.mod pins the version).
KUEUE_VERSION := v0.17.0
KUEUE_DIR := $(CISTERN_CACHE)/kueue-$(KUEUE_VERSION)
export CISTERN_KUEUE_BIN := $(KUEUE_DIR)/bin
## Builds Kueue's controller manager and manifests into the tools cache
kueue-tools:
	@hack/tools/kueue/build.sh $(KUEUE_DIR)

# Upstream LeaderWorkerSet's controller manager, CRD, webhooks and samples, from hack/tools/lws
# (its go.mod pins the version), for the differential test.
LWS_VERSION := v0.8.0
LWS_DIR := $(CISTERN_CACHE)/lws-$(LWS_VERSION)
export CISTERN_LWS_BIN := $(LWS_DIR)/bin
## Builds upstream LeaderWorkerSet's controller manager and manifests into the tools cache
lws-tools:
	@hack/tools/lws/build.sh $(LWS_DIR)

generate: generate-workloads

# CRDs and deepcopy come from the Go types; the output is committed.
## Generates the workload APIs: CRDs, deepcopy, RBAC, webhook manifest
generate-workloads: $(CONTROLLER_GEN)
	$(CONTROLLER_GEN) object paths=./pkg/apis/workloads/... paths=./pkg/apis/data/...
	$(CONTROLLER_GEN) crd:generateEmbeddedObjectMeta=true \
	  paths=./pkg/apis/workloads/... paths=./pkg/apis/data/... output:crd:artifacts:config=deploy/csi/crds
	$(GO) run ./hack/crddocs deploy/csi/crds/workloads.cistern.dev_leaderworkersets.yaml \
	  spec.leaderWorkerTemplate.leaderTemplate spec.leaderWorkerTemplate.workerTemplate
	$(CONTROLLER_GEN) rbac:roleName=cistern-workload-controller paths=./pkg/workloads/... \
	  output:rbac:artifacts:config=deploy/csi/workload-controller/rbac
	UPDATE_GOLDEN=1 $(GO) test -count=1 -run TestWebhookConfigurationsManifest ./pkg/workloads/webhookcert/
	UPDATE_GOLDEN=1 $(GO) test -count=1 -run TestDropInCRDManifest ./pkg/workloads/

# Unit tests, then the integration suites, each on a real control plane of its own
# (kube-apiserver, etcd, kube-controller-manager, kube-scheduler built by k8s-tools). The suites
# are one go test run, so two run at a time (-p, the cores): they mostly wait on their control
# planes (alone, the four took 175 s together, test/workloads' 116 s the longest; one after the
# other, 240 s of make test's longer lane).
## workload-controller unit tests, then its suites on a real control plane
test-workloads: k8s-tools kueue-tools
	$(GO_TEST) -count=1 ./pkg/apis/workloads/... ./pkg/apis/data/... ./pkg/workloads/... ./cmd/workload-controller/...
	$(GO_TEST) -count=1 -timeout 20m ./test/workloads/ ./test/workloads/dropin/ ./test/workloads/kueue/ ./test/workloads/snapshots/

# The differential test against upstream LeaderWorkerSet: two control planes, upstream's samples
# and e2e cases on each: 73 s warm (8.5 min more the first time, to build upstream's controller);
# not part of make test, whose warm run is already near its 20 minutes.
## Upstream LeaderWorkerSet and the drop-in on two control planes, compared field by field
test-lws-upstream: k8s-tools lws-tools
	$(GO_TEST) -count=1 -timeout 30m -v ./test/workloads/upstreamdiff/ 2>&1 | \
	  grep -E '^(gate: |=== RUN|\s*--- |ok|FAIL|PASS|panic)|_test.go:[0-9]+|^\s+[0-9]+ [A-Z]' ; exit $${PIPESTATUS[0]}

# LeaderWorkerSet of 500 groups x 8 pods; figures in _output/bench/workloads.txt.
## LeaderWorkerSet of 500 groups x 8 pods on a real control plane
bench-workloads: k8s-tools
	$(GO) test -tags bench -count=1 -timeout 30m -v -run TestLeaderWorkerSetScale ./test/workloads/bench/ 2>&1 | tail -n 40; exit $${PIPESTATUS[0]}
