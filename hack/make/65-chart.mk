# The Helm chart (charts/cistern). Its fixed objects (CRDs, RBAC, admission policies, webhook
# configurations) are copies of deploy/csi's files under charts/cistern/files, made here and
# checked by `make verify`; the objects with settings (the node DaemonSets, the controller, the
# CSIDriver, the pools, the peer NetworkPolicy, the controller's PodDisruptionBudget) are
# templates. test-chart renders the chart and the kustomize base and compares the objects, so the
# two cannot drift, and checks the chart's values, schema and pods with the helm command
# (test/chart).
HELM_VERSION := v3.22.0
HELM := $(TOOLS)/helm-$(HELM_VERSION)/helm
export CISTERN_HELM := $(HELM)
# deploy/csi's files that are templates in the chart, and what the chart leaves to the user
# (the Namespace: `helm install --namespace`; the examples).
CHART_TEMPLATED := namespace.yaml driver/csidriver.yaml driver/pools.yaml driver/peer-networkpolicy.yaml \
  driver/fuse-keeper.yaml driver/node/daemonset.yaml workload-controller/deployment.yaml workload-controller/pdb.yaml snapshots/csi-snapshotter.yaml

.PHONY: generate-chart test-chart helm
generate: generate-chart
## Copies deploy/csi's fixed objects into charts/cistern/files (part of make generate)
generate-chart:
	@rm -rf charts/cistern/files/deploy && cd deploy/csi && \
	  find . -name '*.yaml' ! -name kustomization.yaml ! -path './examples/*' | sed 's|^\./||' | sort | \
	  while read -r f; do \
	    case " $(CHART_TEMPLATED) " in *" $$f "*) continue;; esac; \
	    mkdir -p ../../charts/cistern/files/deploy/$$(dirname $$f) && \
	    { echo "# Generated from deploy/csi/$$f by \`make generate-chart\`: edit that file, not this one."; cat $$f; } \
	      > ../../charts/cistern/files/deploy/$$f; \
	  done

## Builds the helm command into the tools cache
helm: $(HELM)
$(HELM):
	cd test/chart && $(GO) build -o $@ helm.sh/helm/v3/cmd/helm

TEST_TARGETS += test-chart
TEST_SECOND_LANE += test-chart
# The renders run under -race: 54-180 s each with the machine at load 20, where go test's default
# 10 minutes ran out on the fifth of five.
## Lints charts/cistern and compares its rendered objects with the kustomize base
test-chart: $(HELM)
	$(HELM) lint --strict charts/cistern -f charts/cistern/examples/registry.yaml
	$(HELM) lint --strict charts/cistern -f charts/cistern/examples/registry.yaml --set snapshots.enabled=true --set leaderWorkerSet.upstreamAPI=true
	cd test/chart && $(GO) vet ./... && $(GO_TEST) -count=1 -timeout 30m ./...
