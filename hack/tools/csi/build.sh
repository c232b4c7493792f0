#!/usr/bin/env bash
# Builds upstream CSI sidecars from this module (or, with -C, the tools module in that directory)
# into a cache directory, once.
#
#   build.sh [-C <module dir>] <bin-dir> <module> <package>...
#
# A stamp file <bin-dir>/.stamp holds a hash of go.mod, go.sum, the flags and the Go version;
# when it matches nothing is rebuilt.
set -euo pipefail
cd "$(dirname "$0")"
if [[ ${1:-} == -C ]]; then
  cd "${2:?module dir}"
  shift 2
fi

bin_dir=${1:?bin dir}
module=${2:?module path}
shift 2
pkg="${*:?package}"
name=$(basename "${module%/v[0-9]*}")

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
  echo "${name}: up to date in ${bin_dir}"
  exit 0
fi

start=$(date +%s)
echo "${name}: building ${version} into ${bin_dir}"
# main.version is what the sidecar logs and prints for --version, as in upstream's release build.
# shellcheck disable=SC2086 # one word per package
CGO_ENABLED=0 go build -trimpath -ldflags="${ldflags}" -o "${bin_dir}/" ${pkg}
echo "${key}" >"${stamp}"
echo "${name}: built in $(( $(date +%s) - start ))s"
