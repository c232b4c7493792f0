# storagepool-sidecar: StoragePool API generation, unit + integration tests, scale benchmark.
.PHONY: generate-storagepool test-sidecar bench-sidecar
TEST_TARGETS += test-sidecar
BENCH_TARGETS += bench-sidecar
generate: generate-storagepool

# Deepcopy, apply configurations and the CRD of storagepool.storage.k8s.io; the output is committed.
## Generates the StoragePool API: deepcopy, apply configurations, CRD
generate-storagepool: $(CONTROLLER_GEN)
	$(CONTROLLER_GEN) object applyconfiguration crd:crdVersions=v1 \
	  paths=./pkg/apis/storagepool/... output:crd:artifacts:config=deploy/csi/crds

# Unit tests (the publisher, the install check `helm test` runs), then the real driver + real
# sidecar + real API server suite.
## storagepool-sidecar unit tests, then real driver + sidecar + API server
test-sidecar: k8s-tools
	$(GO_TEST) -count=1 ./pkg/poolpublisher/... ./pkg/installcheck/... ./cmd/storagepool-sidecar/...
	$(GO_TEST) -count=1 -v -run 'Test' ./test/storagepool/... | tail -n 200; exit $${PIPESTATUS[0]}

# 1,000 simulated nodes x 4 pools on a real API server; prints its table (figures go to
# docs/benchmarks.md by hand).
## The sidecar with 1,000 simulated nodes x 4 pools on a real API server
bench-sidecar: k8s-tools
	$(GO) test -count=1 -v -run '^$$' -bench BenchmarkSidecarScale -benchtime 1x -timeout 20m ./test/storagepool/ 2>&1 | tail -n 60; exit $${PIPESTATUS[0]}
