#!/usr/bin/env bash
# Builds Kueue's controller manager from this module into <dir>/bin and copies the manifests the
# tests install next to it (its CRDs and webhook configurations) into <dir>/config, once per
# version: hack/tools/csi/build.sh keeps the stamp.
#
#   build.sh <dir>
set -euo pipefail
cd "$(dirname "$0")"
dir=${1:?dir}
../csi/build.sh -C ../kueue "${dir}/bin" sigs.k8s.io/kueue sigs.k8s.io/kueue/cmd/kueue
src=$(go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
exec 9>"${dir}/config.lock"
flock 9
if [[ ! -f "${dir}/config/.done" ]]; then
  rm -rf "${dir}/config"
  mkdir -p "${dir}/config/crd"
  cp "${src}"/config/components/crd/bases/*.yaml "${dir}/config/crd/"
  cp "${src}/config/components/webhook/manifests.yaml" "${dir}/config/webhooks.yaml"
  chmod -R u+w "${dir}/config"
  touch "${dir}/config/.done"
fi
