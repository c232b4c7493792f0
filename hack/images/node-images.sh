#!/usr/bin/env bash
# `make node-images`: hack/images/build, once per content (hack/tools/lib.sh's stamp, key and
# lock). The key covers the flags, the content of the host executables they name (busybox,
# csi-provisioner, versitygw) and the name and content of every file of this tree the images are
# built from; so the node suites of one `make test` (e2e-node, e2e-install, e2e-k8s-subset) build
# them once.
#
#   node-images.sh OUT_DIR BUILD_FLAGS...
set -euo pipefail
out=${1:?output directory}
shift
cd "$(dirname "$0")/../.."
source hack/tools/lib.sh

host=()
for a in "$@"; do
  if [[ -f ${a} ]]; then host+=("${a}"); fi
done
# The stand-ins come from hack/standins and the root module; the images' own programs from
# hack/images. Tests go into no image.
mapfile -t files < <(find go.mod go.sum cmd pkg hack/standins hack/images -type f ! -name '*_test.go' | LC_ALL=C sort)
key=$(tool_key "${out} $* ${files[*]}" "${files[@]}" "${host[@]}")

build() {
  (cd hack/images && "${GO:-go}" run ./build -out "${out}" "$@")
}
cached_build node-images "${out}/.stamp" "${key}" build "$@"
