# workload-controller: LeaderWorkerSet, NotebookValidationJob, VolumeManager.
CONTROLLER_GEN_VERSION ?= v0.23.0
CONTROLLER_GEN := $(BIN)/tools/controller-gen-$(CONTROLLER_GEN_VERSION)
WORKLOAD_APIS := ./pkg/apis/workloads/... ./pkg/apis/data/...

TEST_TARGETS += test-workloads
BENCH_TARGETS += bench-workloads

.PHONY: generate-workloads test-workloads bench-workloads

$(CONTROLLER_GEN):
	@mkdir -p $(BIN)/tools/cg-$(CONTROLLER_GEN_VERSION)
	GOBIN=$(BIN)/tools/cg-$(CONTROLLER_GEN_VERSION) $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
	mv $(BIN)/tools/cg-$(CONTROLLER_GEN_VERSION)/controller-gen $@

# CRDs and deepcopy come from the Go types; the output is committed.
generate-workloads: $(CONTROLLER_GEN)
	$(CONTROLLER_GEN) object paths=./pkg/apis/workloads/... paths=./pkg/apis/data/...
	$(CONTROLLER_GEN) crd:generateEmbeddedObjectMeta=true,maxDescLen=0 \
	  paths=./pkg/apis/workloads/... paths=./pkg/apis/data/... output:crd:artifacts:config=deploy/csi/crds
