#!/usr/bin/env bash
# Builds Kubernetes' end-to-end test binary, ginkgo and agnhost from this module into a cache
# directory, once (hack/tools/lib.sh).
#
#   build.sh <bin-dir>
#
# e2e.test is `go test -c k8s.io/kubernetes/test/e2e` (the binary of every release's
# kubernetes-test tarball); ginkgo is the runner at the version k8s.io/kubernetes requires;
# agnhost is the program of the registry.k8s.io/e2e-test-images/agnhost image, which the image
# build (hack/images/build -agnhost) puts in an image under the tag e2e.test expects. The stamp
# is <bin-dir>/.stamp; its key covers go.mod, go.sum, the flags and the Go version.
set -euo pipefail
cd "$(dirname "$0")"
source ../lib.sh

bin_dir=${1:?bin dir}
k8s_version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
k8s_ldflags "${k8s_version}"
key=$(tool_key "${ldflags[*]} CGO_ENABLED=0" go.mod go.sum)

build() {
  local start
  start=$(date +%s)
  echo "k8s-e2e-tools: building e2e.test, ginkgo and agnhost (${k8s_version}) into ${bin_dir}; the first time takes long"
  # Static, as upstream ships them; agnhost runs in an image with nothing else in it.
  export CGO_ENABLED=0
  go build -trimpath -ldflags="${ldflags[*]}" -o "${bin_dir}/" github.com/onsi/ginkgo/v2/ginkgo k8s.io/kubernetes/test/images/agnhost
  echo "k8s-e2e-tools: ginkgo and agnhost built in $(($(date +%s) - start))s"
  go test -c -trimpath -ldflags="${ldflags[*]}" -o "${bin_dir}/e2e.test" k8s.io/kubernetes/test/e2e
}
cached_build k8s-e2e-tools "${bin_dir}/.stamp" "${key}" build
