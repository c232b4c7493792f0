#!/usr/bin/env bash
# Builds an upstream CSI sidecar from this module into a cache directory, once.
#
#   build.sh <bin-dir> <module> <package>
#
# A stamp file <bin-dir>/.stamp holds a hash of go.mod, go.sum, this script and the Go version;
# when it matches nothing is rebuilt.
set -euo pipefail
cd "$(dirname "$0")"

bin_dir=${1:?bin dir}
module=${2:?module path}
pkg=${3:?package}

version=$(go list -m -f '{{.Version}}' "${module}")
key=$( { cat go.mod go.sum build.sh; go env GOVERSION; echo "${pkg}"; } | sha256sum | cut -d' ' -f1)
stamp="${bin_dir}/.stamp"
if [[ -f "${stamp}" && "$(cat "${stamp}")" == "${key}" ]]; then
  echo "$(basename "${pkg}"): up to date in ${bin_dir}"
  exit 0
fi

mkdir -p "${bin_dir}"
start=$(date +%s)
echo "$(basename "${pkg}"): building ${version} into ${bin_dir}"
# main.version is what the sidecar logs and prints for --version, as in upstream's release build.
CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X main.version=${version}" -o "${bin_dir}/" "${pkg}"
echo "${key}" >"${stamp}"
echo "$(basename "${pkg}"): built in $(( $(date +%s) - start ))s"
