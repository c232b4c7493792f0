#!/usr/bin/env bash
# Builds the node runtime (containerd, containerd-shim-runc-v2, ctr, runc, the CNI loopback, ptp
# and host-local plugins) from this module into a cache directory, once (hack/tools/lib.sh).
#
#   build.sh <bin-dir>
#
# The stamp is <bin-dir>/.stamp; its key covers go.mod, go.sum, the flags and the Go version. runc
# needs cgo and libseccomp (Debian's libseccomp-dev, from `make host-packages`): without seccomp it
# cannot apply the RuntimeDefault profile kubelet asks for.
set -euo pipefail
cd "$(dirname "$0")"
source ../lib.sh

bin_dir=${1:?bin dir}
version() { go list -m -f '{{.Version}}' "$1"; }
containerd_version=$(version github.com/containerd/containerd/v2)
runc_version=$(version github.com/opencontainers/runc)
cni_version=$(version github.com/containernetworking/plugins)
# containerd's version package is what `containerd --version` and the CRI status report.
containerd_ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=${containerd_version}"
runc_ldflags="-s -w -X main.version=${runc_version#v}"
cni_ldflags="-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=${cni_version}"
key=$(tool_key "${containerd_ldflags} ${runc_ldflags} CGO_ENABLED=1 -tags seccomp ${cni_ldflags}" go.mod go.sum)

build() {
  if [[ ! -f /usr/include/seccomp.h ]]; then
    echo "node runtime: runc needs libseccomp-dev (make host-packages installs it)"
    return 1
  fi
  echo "node runtime: building containerd ${containerd_version}, runc ${runc_version}, CNI plugins ${cni_version} into ${bin_dir}"
  CGO_ENABLED=0 go build -trimpath -o "${bin_dir}/" -ldflags="${containerd_ldflags}" \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr
  CGO_ENABLED=1 go build -trimpath -tags seccomp -o "${bin_dir}/runc" -ldflags="${runc_ldflags}" \
    github.com/opencontainers/runc
  mkdir -p "${bin_dir}/cni"
  CGO_ENABLED=0 go build -trimpath -o "${bin_dir}/cni/" -ldflags="${cni_ldflags}" \
    github.com/containernetworking/plugins/plugins/main/loopback \
    github.com/containernetworking/plugins/plugins/main/ptp \
    github.com/containernetworking/plugins/plugins/ipam/host-local
}
cached_build "node runtime" "${bin_dir}/.stamp" "${key}" build
