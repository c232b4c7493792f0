#!/usr/bin/env bash
# Builds Kubernetes' end-to-end test binary, ginkgo and agnhost from this module into a cache
# directory, once.
#
#   build.sh <bin-dir>
#
# e2e.test is `go test -c k8s.io/kubernetes/test/e2e` (the binary of every release's
# kubernetes-test tarball); ginkgo is the runner at the version k8s.io/kubernetes requires;
# agnhost is the program of the registry.k8s.io/e2e-test-images/agnhost image, which the image
# build (hack/images/build -agnhost) puts in an image under the tag e2e.test expects. A stamp file
# <bin-dir>/.stamp holds a hash of go.mod, go.sum, the flags and the Go version; when it matches,
# nothing is rebuilt.
set -euo pipefail
cd "$(dirname "$0")"

bin_dir=${1:?bin dir}
k8s_version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=${k8s_version#v1.}
minor=${minor%%.*}
version_pkg=k8s.io/component-base/version
ldflags=(
  -s -w
  "-X ${version_pkg}.gitVersion=${k8s_version}"
  "-X ${version_pkg}.gitMajor=1"
  "-X ${version_pkg}.gitMinor=${minor}"
  "-X ${version_pkg}.gitTreeState=clean"
)

key=$( { cat go.mod go.sum; go env GOVERSION; echo "${ldflags[*]} CGO_ENABLED=0"; } | sha256sum | cut -d' ' -f1)
stamp="${bin_dir}/.stamp"
mkdir -p "${bin_dir}"
# Concurrent invocations (parallel makes, several checkouts sharing the cache) wait for one build.
exec 9>"${stamp}.lock"
flock 9
if [[ -f "${stamp}" && "$(cat "${stamp}")" == "${key}" ]]; then
  echo "k8s-e2e-tools: up to date in ${bin_dir}"
  exit 0
fi

start=$(date +%s)
echo "k8s-e2e-tools: building e2e.test, ginkgo and agnhost (${k8s_version}) into ${bin_dir}; the first time takes long"
# Static, as upstream ships them; agnhost runs in an image with nothing else in it.
export CGO_ENABLED=0
go build -trimpath -ldflags="${ldflags[*]}" -o "${bin_dir}/" github.com/onsi/ginkgo/v2/ginkgo k8s.io/kubernetes/test/images/agnhost
echo "k8s-e2e-tools: ginkgo and agnhost built in $(( $(date +%s) - start ))s"
go test -c -trimpath -ldflags="${ldflags[*]}" -o "${bin_dir}/e2e.test" k8s.io/kubernetes/test/e2e
echo "${key}" >"${stamp}"
echo "k8s-e2e-tools: built in $(( $(date +%s) - start ))s"
