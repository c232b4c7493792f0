#!/usr/bin/env bash
# Builds the node runtime (containerd, containerd-shim-runc-v2, ctr, runc, the CNI loopback, ptp
# and host-local plugins) from this module into a cache directory, once.
#
#   build.sh <bin-dir>
#
# A stamp file <bin-dir>/.stamp holds a hash of go.mod, go.sum, this script and the Go version;
# when it matches nothing is rebuilt. runc needs cgo and libseccomp (Debian's libseccomp-dev):
# without seccomp it cannot apply the RuntimeDefault profile kubelet asks for.
set -euo pipefail
cd "$(dirname "$0")"

bin_dir=${1:?bin dir}
key=$( { cat go.mod go.sum build.sh; go env GOVERSION; } | sha256sum | cut -d' ' -f1)
stamp="${bin_dir}/.stamp"
if [[ -f "${stamp}" && "$(cat "${stamp}")" == "${key}" ]]; then
  echo "node runtime: up to date in ${bin_dir}"
  exit 0
fi

if ! pkg-config --exists libseccomp 2>/dev/null; then
  echo "node runtime: installing libseccomp-dev for runc"
  apt-get install -y -qq libseccomp-dev >/dev/null || { apt-get update -qq && apt-get install -y -qq libseccomp-dev >/dev/null; }
fi

version() { go list -m -f '{{.Version}}' "$1"; }
containerd_version=$(version github.com/containerd/containerd/v2)
runc_version=$(version github.com/opencontainers/runc)
cni_version=$(version github.com/containernetworking/plugins)

mkdir -p "${bin_dir}"
start=$(date +%s)
echo "node runtime: building containerd ${containerd_version}, runc ${runc_version}, CNI plugins ${cni_version} into ${bin_dir}"

# containerd's version package is what `containerd --version` and the CRI status report.
CGO_ENABLED=0 go build -trimpath -o "${bin_dir}/" \
  -ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=${containerd_version}" \
  github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr
CGO_ENABLED=1 go build -trimpath -tags seccomp -o "${bin_dir}/runc" \
  -ldflags="-s -w -X main.version=${runc_version#v}" \
  github.com/opencontainers/runc
mkdir -p "${bin_dir}/cni"
CGO_ENABLED=0 go build -trimpath -o "${bin_dir}/cni/" \
  -ldflags="-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=${cni_version}" \
  github.com/containernetworking/plugins/plugins/main/loopback \
  github.com/containernetworking/plugins/plugins/main/ptp \
  github.com/containernetworking/plugins/plugins/ipam/host-local

echo "${key}" >"${stamp}"
echo "node runtime: built in $(( $(date +%s) - start ))s"
