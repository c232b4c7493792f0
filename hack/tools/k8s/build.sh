#!/usr/bin/env bash
# Builds Kubernetes components from this module into a cache directory, once (hack/tools/lib.sh).
#
#   build.sh <bin-dir> <set-name> <package>...
#
# The stamp is <bin-dir>/.<set-name>.stamp; its key covers go.mod, go.sum, the etcd command of
# this module, the packages, the flags and the Go version.
set -euo pipefail
cd "$(dirname "$0")"
source ../lib.sh

bin_dir=${1:?bin dir}
set_name=${2:?set name}
shift 2

k8s_version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
k8s_ldflags "${k8s_version}"
ldflags+=(
  "-X k8s.io/client-go/pkg/version.gitVersion=${k8s_version}"
  "-X k8s.io/client-go/pkg/version.gitMajor=1"
  "-X k8s.io/client-go/pkg/version.gitMinor=${k8s_minor}"
)
key=$(tool_key "$* ${ldflags[*]} CGO_ENABLED=${CGO_ENABLED:-0}" go.mod go.sum etcd/main.go)

build() {
  echo "${set_name}: building $* (${k8s_version}) into ${bin_dir}; this takes several minutes"
  # One go build for all packages, so shared dependencies compile once. Static binaries, as
  # upstream ships the control plane.
  CGO_ENABLED=${CGO_ENABLED:-0} go build -trimpath -ldflags="${ldflags[*]}" -o "${bin_dir}/" "$@"
}
cached_build "${set_name}" "${bin_dir}/.${set_name}.stamp" "${key}" build "$@"
