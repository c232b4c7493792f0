#!/usr/bin/env bash
# `make images` without Docker: hack/images/release on the root filesystem of rootfs.sh, once per
# content (hack/tools/lib.sh's stamp, key and lock). The key covers the tag, the root filesystem
# (its tar is named by its own key), the output directory, and the name and content of every file
# the three binaries and the two images are made from; so `make images` again on the same tree
# (make test needs the images for test-images, e2e-install and e2e-k8s-subset) reuses the
# tarballs instead of building them again.
#
#   release.sh TAG OUT_DIR
set -euo pipefail
tag=${1:?tag} out=${2:?output directory}
cd "$(dirname "$0")/../.."
source hack/tools/lib.sh

rootfs=$(hack/images/rootfs.sh Dockerfile)
# What the Dockerfile's build stage copies, and the image builder; tests go into no image.
mapfile -t files < <(find go.mod go.sum cmd pkg hack/images/go.mod hack/images/go.sum \
  hack/images/release hack/images/layer -type f ! -name '*_test.go' | LC_ALL=C sort)
key=$(tool_key "${tag} ${rootfs} ${out} ${files[*]}" "${files[@]}")

build() {
  (cd hack/images && "${GO:-go}" run ./release build -version "${tag}" -rootfs "${rootfs}" -out "${out}")
}
cached_build images "${out}/.stamp" "${key}" build
