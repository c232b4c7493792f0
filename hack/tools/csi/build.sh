#!/usr/bin/env bash
# Builds an upstream CSI sidecar from this module into a cache directory, once.
#
#   build.sh <bin-dir> <module> <package>
#
# A stamp file <bin-dir>/.stamp holds a hash of go.mod, go.sum, the flags and the Go version;
# when it matches nothing is rebuilt.
set -euo pipefail
cd "$(dirname "$0")"

bin_dir=${1:?bin dir}
module=${2:?module path}
pkg=${3:?package}

version=$(go list -m -f '{{.Version}}' "${module}")
ldflags="-s -w -X main.version=${version}"
# The key covers what decides the binary, not this script's text.
key=$( { cat go.mod go.sum; go env GOVERSION; echo "${pkg} ${ldflags}"; } | sha256sum | cut -d' ' -f1)
stamp="${bin_dir}/.stamp"
mkdir -p "${bin_dir}"
# Concurrent invocations (parallel makes, several checkouts sharing the cache) wait for one build.
exec 9>"${stamp}.lock"
flock 9
if [[ -f "${stamp}" && "$(cat "${stamp}")" == "${key}" ]]; then
  echo "$(basename "${pkg}"): up to date in ${bin_dir}"
  exit 0
fi

start=$(date +%s)
echo "$(basename "${pkg}"): building ${version} into ${bin_dir}"
# main.version is what the sidecar logs and prints for --version, as in upstream's release build.
CGO_ENABLED=0 go build -trimpath -ldflags="${ldflags}" -o "${bin_dir}/" "${pkg}"
echo "${key}" >"${stamp}"
echo "$(basename "${pkg}"): built in $(( $(date +%s) - start ))s"
