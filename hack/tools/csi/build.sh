#!/usr/bin/env bash
# Builds upstream CSI sidecars from this module (or, with -C, the tools module in that directory)
# into a cache directory, once (hack/tools/lib.sh).
#
#   build.sh [-C <module dir>] <bin-dir> <module> <package>...
#
# The stamp is <bin-dir>/.stamp; its key covers go.mod, go.sum, the packages, the flags and the
# Go version.
set -euo pipefail
cd "$(dirname "$0")"
source ../lib.sh
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
key=$(tool_key "${pkg} ${ldflags}" go.mod go.sum)

build() {
  echo "${name}: building ${version} into ${bin_dir}"
  # main.version is what the sidecar logs and prints for --version, as in upstream's release build.
  # shellcheck disable=SC2086 # one word per package
  CGO_ENABLED=0 go build -trimpath -ldflags="${ldflags}" -o "${bin_dir}/" ${pkg}
}
cached_build "${name}" "${bin_dir}/.stamp" "${key}" build
