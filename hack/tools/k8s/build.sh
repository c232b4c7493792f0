#!/usr/bin/env bash
# Builds Kubernetes components from this module into a cache directory, once.
#
#   build.sh <bin-dir> <set-name> <package>...
#
# A stamp file <bin-dir>/.<set-name>.stamp holds a hash of everything that decides the output
# (go.mod, go.sum, sources, flags, the Go version). When it matches, nothing is rebuilt;
# a version bump changes go.mod and therefore the hash.
set -euo pipefail
cd "$(dirname "$0")"

bin_dir=${1:?bin dir}
set_name=${2:?set name}
shift 2

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
  "-X k8s.io/client-go/pkg/version.gitVersion=${k8s_version}"
  "-X k8s.io/client-go/pkg/version.gitMajor=1"
  "-X k8s.io/client-go/pkg/version.gitMinor=${minor}"
)

# The key covers what decides the binaries, not this script's text, so that editing a comment
# here does not rebuild everyone's cache.
key=$( { cat go.mod go.sum etcd/main.go; go env GOVERSION; echo "$* ${ldflags[*]} CGO_ENABLED=${CGO_ENABLED:-0}"; } | sha256sum | cut -d' ' -f1)
stamp="${bin_dir}/.${set_name}.stamp"
mkdir -p "${bin_dir}"
# Concurrent invocations (parallel makes, several checkouts sharing the cache) wait for one build.
exec 9>"${stamp}.lock"
flock 9
if [[ -f "${stamp}" && "$(cat "${stamp}")" == "${key}" ]]; then
  echo "${set_name}: up to date in ${bin_dir}"
  exit 0
fi

start=$(date +%s)
echo "${set_name}: building $* (${k8s_version}) into ${bin_dir}; this takes several minutes"
# One go build for all packages, so shared dependencies compile once. Static binaries, as upstream
# ships the control plane.
CGO_ENABLED=${CGO_ENABLED:-0} go build -trimpath -ldflags="${ldflags[*]}" -o "${bin_dir}/" "$@"
echo "${key}" >"${stamp}"
echo "${set_name}: built in $(( $(date +%s) - start ))s"
